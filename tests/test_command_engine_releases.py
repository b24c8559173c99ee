"""An engine program (``check --target-cmd engine=COMMAND --version X``) at every release.

Before 0.9.0 there is no HELLO/READY handshake: the suite gives the engine its input and output
addresses (``{engine_input}``, ``{engine_output}``); at 0.9.0 ``{handshake}`` is the input
ROUTER, on which that release holds the handshake; ``{version}`` names the release. The
reference engine as a program (``enginewire serve-engine``) passes the engine checks at
0.7.3, 0.8.4, 0.9.0 and 0.33.0 with one command line; a command without the release's address
placeholders is NOT IMPLEMENTED, naming them; an engine program that opens another release's
sockets, or ignores its addresses, fails.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from enginewire.cli import main
from enginewire.conformance.framework.outcomes import (
    FAILED,
    NOT_APPLICABLE,
    NOT_IMPLEMENTED,
    NOT_RUN,
    PASSED,
)
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run_check
from enginewire.conformance.targets.contract import EngineLaunch, Unsupported
from enginewire.conformance.targets.external import (
    CommandEngine,
    _argv,
    placeholders,
    split_command,
)
from enginewire.conformance.targets.resolve import load_target
from enginewire.spec import load
from enginewire.spec.history.release_facts import handshake_gap

SERVE_ENGINE = f"{sys.executable} -m enginewire serve-engine"
#: The reference engine as an engine program, one command line for every release.
COMMAND = (f"engine={SERVE_ENGINE} --version {{version}} --handshake {{handshake}} "
           "--input {engine_input} --output {engine_output} --rank {rank} "
           "--dp-size {dp_size} --remote {remote} --headless {headless} "
           "--handshake-timeout {init_timeout}")
RELEASES = ["0.7.3", "0.8.4", "0.9.0", "0.33.0"]


def _run(version: str, patterns: list[str], command: str = COMMAND,
         timeout_scale: float = 1.0) -> list[Any]:
    target = load_target("none", [command], version=version)
    spec = load(version)
    try:
        return [run_check(item, target, spec, timeout_scale=timeout_scale)
                for item in select(all_checks(), patterns=patterns)]
    finally:
        target.close()


def _statuses(results: list[Any]) -> dict[str, tuple[str, str]]:
    return {r.check.id: (r.status, r.message) for r in results}


# --- placeholders ------------------------------------------------------------------------


def test_engine_address_placeholders_name_the_engine_surface() -> None:
    assert split_command("prog {engine_input} {engine_output}")[0] == "engine"
    assert split_command("prog --in {engine_input}")[0] == "engine"
    assert split_command("prog {handshake} {input} {output}")[0] == "frontend"
    assert split_command("prog {handshake}")[0] == "engine"
    assert placeholders("prog --a {engine_input} '--b={version}' {{literal}}") == {
        "engine_input", "version"}


def test_placeholders_fill_whole_words_and_an_empty_one_stays_a_word() -> None:
    argv = _argv("prog --handshake {handshake} --input {engine_input} '--name={version}'",
                 handshake="", engine_input="tcp://[::1]:5 x", version="0.8.4")
    assert argv == ["prog", "--handshake", "", "--input", "tcp://[::1]:5 x", "--name=0.8.4"]


def _direct(version: str) -> EngineLaunch:
    return EngineLaunch(None, input_addresses=("ipc:///tmp/in",),
                        output_addresses=("ipc:///tmp/out",))


def test_a_command_without_the_release_addresses_is_not_implemented() -> None:
    """Before 0.9.0 the engine needs {engine_input} and {engine_output}; from 0.9.0
    {handshake}. Without them the suite starts nothing: Unsupported, naming the missing
    placeholder and the release."""
    handshake_only = CommandEngine(f"{SERVE_ENGINE} --handshake {{handshake}}", "0.8.4")
    with pytest.raises(Unsupported, match=r"no \{engine_input\} or \{engine_output\} "
                                          r"placeholder: vLLM 0.8.4 has no HELLO/READY"):
        handshake_only.start_engine(_direct("0.8.4"))
    input_only = CommandEngine(f"{SERVE_ENGINE} --input {{engine_input}}", "0.7.3")
    with pytest.raises(Unsupported, match=r"no \{engine_output\} placeholder: vLLM 0.7.3"):
        input_only.start_engine(_direct("0.7.3"))
    direct_only = CommandEngine(f"{SERVE_ENGINE} --input {{engine_input}} "
                                "--output {engine_output}", "0.9.0")
    with pytest.raises(Unsupported, match=r"no \{handshake\} placeholder: vLLM 0.9.0's engine"):
        direct_only.start_engine(EngineLaunch("ipc:///tmp/in"))
    two = EngineLaunch(None, input_addresses=("ipc:///a", "ipc:///b"),
                       output_addresses=("ipc:///c", "ipc:///d"))
    with pytest.raises(Unsupported, match="one {engine_input}"):
        CommandEngine(COMMAND.removeprefix("engine="), "0.8.4").start_engine(two)


def test_the_checks_of_a_command_without_the_release_addresses_are_not_implemented(
        capsys: Any) -> None:
    """Through ``check``: NOT IMPLEMENTED with the reason, never passed."""
    code = main(["check", "--target", "none", "--no-progress", "--version", "0.8.4", "-v",
                 "--target-cmd", f"{SERVE_ENGINE} --handshake {{handshake}} --version {{version}}",
                 "-k", "engine/serve/add-generates"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "0 passed, 0 failed" in out
    assert "1 not implemented" in out
    assert "no {engine_input} or {engine_output} placeholder: vLLM 0.8.4" in out


# --- the reference engine as a program at every release -----------------------------------


#: A few engine checks: serving, the handshake and HELLO's flags as launched ({remote},
#: {headless}; NOT APPLICABLE before 0.9.0), an identity (NOT APPLICABLE at 0.7.3, whose input
#: carries none).
FEW = ["engine/serve/add-generates", "engine/handshake/hello-first",
       "engine/handshake/flags-follow-launch", "engine/identity/rank-3"]


@pytest.mark.parametrize("version", RELEASES)
def test_serve_engine_as_a_command_passes_at_the_release(version: str) -> None:
    by_id = _statuses(_run(version, FEW))
    assert by_id["engine/serve/add-generates"][0] == PASSED, by_id
    for check_id in ("engine/handshake/hello-first", "engine/handshake/flags-follow-launch"):
        handshake = by_id[check_id]
        if handshake_gap(version) is not None:
            assert handshake[0] == NOT_APPLICABLE, handshake
            assert f"vLLM {version} has no HELLO/READY handshake" in handshake[1]
        else:
            assert handshake[0] == PASSED, handshake
    identity = by_id["engine/identity/rank-3"]
    assert identity[0] == (NOT_APPLICABLE if version == "0.7.3" else PASSED), identity


def test_serve_engine_as_a_command_through_check(capsys: Any) -> None:
    code = main(["check", "--target", "none", "--no-progress", "--version", "0.8.4",
                 "--target-cmd", COMMAND, "-k", "engine/utility/call-ids-echoed",
                 "-k", "engine/garbage/unknown-type-byte"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert out.strip().splitlines()[-1] == "2 passed, 0 failed"


#: The checks needing a capability an engine program does not have, at every release.
CAPABILITY_CHECKS = {"engine/dead/sentinel-last": "engine.die",
                     "engine/transport/high-water-marks-zero": "engine.sockets"}


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_every_engine_check_of_the_command_engine_at_the_release(version: str) -> None:
    """Every engine/* check passes or is NOT APPLICABLE for a reason of the release (SHOULD
    checks are not run); NOT IMPLEMENTED only the two capabilities no program has at any
    release (``engine.die``, ``engine.sockets``: in-process introspection), never for lack
    of a placeholder."""
    results = _run(version, ["engine/*"])
    by_id = _statuses(results)
    assert [i for i, (s, _) in by_id.items() if s == FAILED] == [], by_id
    not_implemented = {i: m for i, (s, m) in by_id.items() if s == NOT_IMPLEMENTED}
    assert sorted(not_implemented) == list(CAPABILITY_CHECKS), not_implemented
    for check_id, message in not_implemented.items():
        assert f"does not implement {CAPABILITY_CHECKS[check_id]}" in message, message
    assert sum(s == PASSED for s, _ in by_id.values()) > 10
    for check_id, (status, message) in by_id.items():
        assert status in (PASSED, NOT_APPLICABLE, NOT_RUN, NOT_IMPLEMENTED), (check_id, status)
        if status == NOT_APPLICABLE:
            assert f"vLLM {version}" in message, (check_id, message)


# --- power: an engine program of another release fails ------------------------------------


#: An engine program that takes its addresses and never opens them.
IGNORES = (f"engine={sys.executable} -c 'import sys, time; time.sleep(120)' "
           "{engine_input} {engine_output}")


def test_an_engine_program_not_speaking_0_8_2_fails() -> None:
    """serve-engine without {version} opens the newest release's sockets (a DEALER with an
    identity on the input, connecting its output where 0.8.2's engine binds it); a program
    that ignores its addresses opens none. Both fail where the honest command passes."""
    check = ["engine/serve/add-generates"]
    for command in (COMMAND.replace("--version {version} ", ""), IGNORES):
        # Shorter waits: the output these never deliver would not come later either.
        [result] = _run("0.8.2", check, command, timeout_scale=0.3)
        assert result.status == FAILED, (command, result.status, result.message)
    [honest] = _run("0.8.2", check)
    assert honest.status == PASSED, honest.message
