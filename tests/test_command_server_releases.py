"""Codec, ring and front-end programs (``check --target-cmd SURFACE=COMMAND --version X``) at
older releases (the codec at 0.9.1, the front end at 0.9.1 and 0.8.5): ``{version}`` is filled
for every surface, and the worked example ``command_server --version {version}`` serves the
reference target of release X.

The same program without ``--version {version}`` speaks the newest release's layouts and
handshake, and fails where the honest command passes (the placeholder matters).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from enginewire.cli import main
from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run_check
from enginewire.conformance.targets.contract import TargetError
from enginewire.conformance.targets.external import (
    CommandCodec,
    CommandFrontend,
    CommandRing,
    command_surfaces,
)
from enginewire.conformance.targets.resolve import load_target
from enginewire.spec import load
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

SERVER = f"{sys.executable} -m enginewire.conformance.targets.command_server"
CODEC = f"codec={SERVER} --surface codec --version {{version}}"
FRONTEND = (f"frontend={SERVER} --surface frontend --handshake {{handshake}} --input {{input}} "
            "--output {output} --engines {engines} --version {version}")

#: Codec checks whose layouts differ between 0.9.1 and the newest release: HELLO's keys,
#: EngineCoreOutputs' field count, SamplingParams' fields.
CODEC_CHECKS = ["codec/message/hello/round-trip", "codec/message/outputs/round-trip",
                "codec/struct/declared-fields-only"]
#: Front-end checks that need the release's handshake (0.9.1's init map and ready response)
#: or, at 0.8.5, which has none, its input and output sockets.
FRONTEND_CHECKS = {
    "0.9.1": ["frontend/handshake/init-answers-hello", "frontend/requests/add-frames"],
    "0.8.5": ["frontend/requests/add-frames", "frontend/requests/abort-frames"],
}


def _run(version: str, command: str, patterns: list[str],
         timeout_scale: float = 1.0) -> dict[str, tuple[str, str]]:
    target = load_target("none", [command], version=version)
    spec = load(version)
    try:
        results = [run_check(item, target, spec, timeout_scale=timeout_scale)
                   for item in select(all_checks(), patterns=patterns)]
    finally:
        target.close()
    return {r.check.id: (r.status, r.message) for r in results}


def _check(capsys: Any, command: str, version: str, checks: list[str]) -> tuple[int, str]:
    args = ["check", "--target", "none", "--no-progress", "--version", version,
            "--target-cmd", command]
    for check_id in checks:
        args += ["-k", check_id]
    code = main(args)
    return code, capsys.readouterr().out


# --- {version} for every surface ---------------------------------------------------------


def test_every_command_surface_fills_version() -> None:
    surfaces = command_surfaces([
        "codec=cat --v {version}", "ring=cat --v={version}",
        "frontend=cat {handshake} {input} {output} {engines} {version}"], "0.8.5")
    codec, ring, frontend = surfaces["codec"], surfaces["ring"], surfaces["frontend"]
    assert isinstance(codec, CommandCodec) and isinstance(ring, CommandRing)
    assert isinstance(frontend, CommandFrontend)
    assert codec.argv() == ["cat", "--v", "0.8.5"]
    # A threshold variant shares the program and keeps the release (a stand-in program and
    # declaration: nothing is started here).
    codec._rpc, codec._declaration = Any, {"role": "both", "unsupported": []}
    assert codec.with_threshold(64).argv() == ["cat", "--v", "0.8.5"]
    codec._rpc = None
    assert ring.argv() == ["cat", "--v=0.8.5"]
    assert frontend.argv(handshake="h", input="i", output="o", engines=1) == [
        "cat", "h", "i", "o", "1", "0.8.5"]
    # Without --version: the spec's reference release.
    assert command_surfaces(["codec=cat {version}"])["codec"].argv() == [
        "cat", REFERENCE_VLLM_VERSION]


def test_an_unknown_placeholder_stays_a_clear_error() -> None:
    codec = command_surfaces(["codec=cat {release}"], "0.9.1")["codec"]
    with pytest.raises(TargetError, match=r"unknown placeholder 'release' in .*known: version"):
        codec.argv()


def test_command_server_refuses_an_unknown_release(capsys: Any) -> None:
    """An unknown ``--version`` is a usage error naming the releases, not a traceback."""
    from enginewire.conformance.targets.command_server import main as serve

    with pytest.raises(SystemExit) as exited:
        serve(["--surface", "codec", "--version", "9.9.9"])
    assert exited.value.code == 2
    assert "vLLM 9.9.9 is not a release the spec was derived from" in capsys.readouterr().err


# --- the worked example at 0.9.1 ---------------------------------------------------------


def test_command_server_codec_at_0_9_1_passes_through_check(capsys: Any) -> None:
    code, out = _check(capsys, CODEC, "0.9.1", CODEC_CHECKS)
    assert code == 0, out[-3000:]
    assert out.strip().splitlines()[-1] == f"{len(CODEC_CHECKS)} passed, 0 failed", out[-3000:]


def test_command_server_codec_without_version_fails_at_0_9_1() -> None:
    """Power: without ``--version {version}`` the program encodes 0.33.0's layouts."""
    by_id = _run("0.9.1", CODEC.replace(" --version {version}", ""), CODEC_CHECKS)
    assert sorted(by_id) == sorted(CODEC_CHECKS)
    assert all(status == FAILED for status, _ in by_id.values()), by_id
    honest = _run("0.9.1", CODEC, CODEC_CHECKS)
    assert all(status == PASSED for status, _ in honest.values()), honest


@pytest.mark.parametrize("version", sorted(FRONTEND_CHECKS))
def test_command_server_frontend_passes_through_check(capsys: Any, version: str) -> None:
    checks = FRONTEND_CHECKS[version]
    code, out = _check(capsys, FRONTEND, version, checks)
    assert code == 0, out[-3000:]
    assert out.strip().splitlines()[-1] == f"{len(checks)} passed, 0 failed", out[-3000:]


@pytest.mark.parametrize("version", sorted(FRONTEND_CHECKS))
def test_command_server_frontend_without_version_fails(version: str) -> None:
    """Power: without ``--version {version}`` the front end speaks 0.33.0: at 0.9.1 it answers
    HELLO with the newest init map, which that release's engine never completes; at 0.8.5 it
    waits for a handshake that release's engine never starts."""
    # Shorter waits: what this front end never sends would not come later either.
    by_id = _run(version, FRONTEND.replace(" --version {version}", ""),
                 FRONTEND_CHECKS[version], timeout_scale=0.3)
    assert sorted(by_id) == sorted(FRONTEND_CHECKS[version])
    assert all(status == FAILED for status, _ in by_id.values()), by_id
