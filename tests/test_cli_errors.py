"""Bad invocations of every command: each ends with one line on stderr naming what is wrong and
exit status 2 (usage) or 1 (the thing checked failed), never a traceback, never a silent
success, and before any long run starts. Run in-process through ``main(argv)``."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginewire.cli import main
from enginewire.cliargs import EXIT_INTERNAL

SPEC_DATA = Path(__file__).resolve().parent.parent / "spec" / "data"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("cli")
    (root / "bin.txt").write_bytes(b"\x00\x01\x02\xff\xfe")
    (root / "adir").mkdir()
    (root / "empty.txt").write_text("")
    deep = root / "deep"
    shutil.copytree(SPEC_DATA, deep)
    (deep / "identity.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    binary = root / "binary"
    shutil.copytree(SPEC_DATA, binary)
    (binary / "ring.toml").write_bytes(b"\x00\xff\xfe binary")
    broken = root / "broken"
    shutil.copytree(SPEC_DATA, broken)
    (broken / "frames.toml").write_text("surface = [unclosed\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        yield {"root": str(root), "bin": str(root / "bin.txt"), "dir": str(root / "adir"),
               "empty": str(root / "empty.txt"), "deep": str(deep), "binary": str(binary),
               "broken": str(broken), "busy": f"tcp://127.0.0.1:{port}"}


# (argv with {placeholders}, exit status, a word the message must contain)
CASES: list[tuple[str, int, str]] = [
    ("", 2, "COMMAND"),
    ("nosuchcommand", 2, "invalid choice"),
    # frontend
    ("frontend --handshake ipc:///nonexistent-dir/x ready", 2, "does not exist"),
    ("frontend --handshake notaurl ready", 2, "not an address"),
    ("frontend --handshake tcp://127.0.0.1:99999 ready", 2, "port"),
    ("frontend --handshake tcp://127.0.0.1 ready", 2, "port"),
    ("frontend --handshake udp://127.0.0.1:5 ready", 2, "transport"),
    ("frontend --handshake {busy} --timeout 1 ready", 1, "cannot open"),
    ("frontend --engines 0 ready", 2, "--engines"),
    ("frontend --engines -1 ready", 2, "--engines"),
    ("frontend --engines 70000 ready", 2, "--engines"),
    ("frontend --engines x ready", 2, "--engines"),
    ("frontend --timeout -5 ready", 2, "--timeout"),
    ("frontend --timeout abc ready", 2, "--timeout"),
    ("frontend --timeout nan ready", 2, "--timeout"),
    ("frontend --timeout inf ready", 2, "--timeout"),
    ("frontend send --count -1", 2, "--count"),
    ("frontend send --count 0", 2, "--count"),
    ("frontend send --prompt a,b", 2, "--prompt"),
    ("frontend send --prompt ,", 2, "--prompt"),
    ("frontend send --max-tokens 0", 2, "--max-tokens"),
    ("frontend nosuchaction", 2, "invalid choice"),
    ("frontend", 2, "ACTION"),
    ("frontend utility", 2, "method"),
    ("frontend utility m " + "[" * 10_000 + "]" * 10_000, 2, "too deep"),
    # serve-engine
    ("serve-engine", 2, "--handshake"),
    ("serve-engine --handshake notaurl", 2, "not an address"),
    ("serve-engine --handshake tcp://127.0.0.1:99999", 2, "port"),
    ("serve-engine --handshake ipc:///nonexistent-dir/x", 2, "does not exist"),
    ("serve-engine --input tcp://127.0.0.1:1", 2, "--output"),
    ("serve-engine --output tcp://127.0.0.1:1", 2, "--handshake"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --input tcp://127.0.0.1:1 "
     "--output tcp://127.0.0.1:2", 2, "one of the two"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --remote maybe", 2, "true or false"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --headless 1", 2, "true or false"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --rank -1", 2, "--rank"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --rank 70000", 2, "--rank"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --tokens -1", 2, "--tokens"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --dp-size 0", 2, "--dp-size"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --step-delay -1", 2, "--step-delay"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --handshake-timeout 0", 2,
     "--handshake-timeout"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --max-model-len 0", 2, "--max-model-len"),
    ("serve-engine --handshake tcp://127.0.0.1:5555 --parent-pid -3", 2, "--parent-pid"),
    # check
    ("check --expected-failures {dir}", 2, "not a file"),
    ("check --expected-failures {bin}", 2, "UTF-8"),
    ("check --expected-failures /nonexistent.txt", 2, "does not exist"),
    ("check --json /nonexistent-dir/x.json", 2, "does not exist"),
    ("check --json {dir}", 2, "is a directory"),
    ("check --junit /nonexistent-dir/x.xml", 2, "does not exist"),
    ("check --html /nonexistent-dir/x.html", 2, "does not exist"),
    ("check --markdown /nonexistent-dir/x.md", 2, "does not exist"),
    ("check --target nosuch", 2, "nosuch"),
    ("check --surface nosuch", 2, "invalid choice"),
    ("check --timeout-scale -1", 2, "--timeout-scale"),
    ("check --timeout-scale 0", 2, "--timeout-scale"),
    ("check -k [", 2, "no check"),
    ("check -k nosuch-check-*", 2, "no check"),
    ("check --update-expected", 2, "--expected-failures"),
    # spec
    ("spec", 2, "ACTION"),
    ("spec check --version abc", 2, "version"),
    ("spec check --version 9.9.9", 2, "is not a release the spec was derived from"),
    ("spec check --version 0.1.0", 2, "is not a release the spec was derived from"),
    ("spec export --version 9.9.9", 2, "is not a release the spec was derived from"),
    ("spec docs --version abc", 2, "version"),
    ("spec check --data-dir /nonexistent", 2, "not a directory"),
    ("spec check --data-dir {dir}", 1, "missing"),
    ("spec check --data-dir {deep}", 1, "too deep"),
    ("spec check --data-dir {binary}", 1, "UTF-8"),
    ("spec check --data-dir {broken}", 1, "TOML"),
    ("spec show nosuch.clause", 2, "nosuch.clause"),
    ("spec show", 2, "clause_id"),
    ("spec docs --out /nonexistent-dir/x/y", 2, "cannot create"),
    ("spec docs --out {bin}", 2, "not a directory"),
    ("spec diff --against nosuch", 2, "invalid choice"),
    # bench
    ("bench --target nosuch", 2, "nosuch"),
    ("bench --bench nosuch", 2, "invalid choice"),
    ("bench --rounds 0", 2, "--rounds"),
    ("bench --json /nonexistent-dir/x.json --quick", 2, "does not exist"),
    ("bench --markdown /nonexistent-dir/x.md --quick", 2, "does not exist"),
    ("bench --plot /nonexistent-dir/x --quick", 2, "cannot create"),
    ("bench --from-json /nonexistent.json", 2, "nonexistent"),
    ("bench --from-json {bin}", 2, "cannot read"),
    # fuzz, explore, mutants
    ("fuzz --target nosuch", 2, "nosuch"),
    ("fuzz --max-examples 0", 2, "max-examples"),
    ("fuzz --kind nosuch", 2, "nosuch"),
    ("fuzz --timeout -1", 2, "--timeout"),
    ("fuzz --shrink-seconds -1", 2, "--shrink-seconds"),
    ("fuzz --database {bin}", 2, "not a directory"),
    ("explore --readers 0", 2, "readers"),
    ("explore --chunks 0", 2, "chunks"),
    ("explore --messages -1", 2, "messages"),
    ("explore --target nosuch", 2, "nosuch"),
    ("explore --replay notaschedule", 2, "schedule"),
    ("mutants --only nosuch", 2, "nosuch"),
    ("mutants --json /nonexistent-dir/x.json --bounded", 2, "does not exist"),
    # ring
    ("ring", 2, "ACTION"),
    ("ring clean --ipc-dir /nonexistent", 2, "not a directory"),
    ("ring clean --shm-dir {bin}", 2, "not a directory"),
]


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 50


@pytest.mark.parametrize(("argv", "status", "word"), CASES,
                         ids=[c[0][:60] or "(none)" for c in CASES])
def test_bad_invocation(argv: str, status: int, word: str, files: dict[str, str],
                        capsys: pytest.CaptureFixture[str]) -> None:
    args = [part.format(**files) for part in argv.split()]
    code = main(args)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert "Traceback" not in captured.err
    assert code == status, captured.err
    assert word in captured.err, captured.err
    problem = [line for line in lines if "error" in line.lower() or word in line]
    assert len(problem) == 1 and problem[0] == lines[-1], lines


def test_serve_engine_reads_an_empty_address_as_not_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    """What ``--target-cmd`` fills into the address placeholders a release does not give."""
    assert main(["serve-engine", "--handshake", "", "--input", "", "--output", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --handshake ADDR or --input ADDR" in err


def test_an_unexpected_exception_is_one_line_and_exit_70(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import enginewire.reference.ring.commands as ring_commands

    def boom(args: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(ring_commands, "cmd_clean", boom)
    assert main(["ring", "clean"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError" in err
    assert "Traceback" not in err


def test_the_installed_command_reports_one_line() -> None:
    result = subprocess.run([sys.executable, "-m", "enginewire.cli", "frontend", "--engines",
                             "0", "ready"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--engines" in result.stderr


@pytest.mark.parametrize(("flags", "local", "headless"), [
    ([], True, False), (["--remote"], False, False), (["--remote", "--headless"], False, True),
    (["--remote", "true", "--headless", "false"], False, False),
    (["--remote", "false", "--headless", "true"], True, True), (["--local"], True, False),
])
def test_serve_engine_flags_with_and_without_values(flags: list[str], local: bool,
                                                    headless: bool) -> None:
    """``--remote``/``--headless`` alone (``engine_argv``) or with ``true``/``false`` (an
    engine ``--target-cmd`` filling ``{remote}``/``{headless}``)."""
    from enginewire.cli import build_parser
    from enginewire.reference.commands import reports_local

    args = build_parser().parse_args(["serve-engine", "--handshake", "tcp://127.0.0.1:5555",
                                      *flags])
    assert reports_local(args) is local
    assert args.headless is headless


# --- which modules a command line imports ------------------------------------------------------


def test_each_command_module_adds_exactly_the_commands_its_entry_names() -> None:
    """COMMAND_MODULES's table is what the modules register: a command missing from it would
    import every module, one listed under the wrong module would not be found."""
    import importlib

    from enginewire.cli import COMMAND_MODULES
    from enginewire.cliargs import Parser

    subparsers = Parser(prog="enginewire").add_subparsers(dest="command")
    for module_name, commands in COMMAND_MODULES.items():
        before = set(subparsers.choices)
        importlib.import_module(module_name).register(subparsers)
        assert tuple(c for c in subparsers.choices if c not in before) == commands, module_name


def _modules_after_parsing(command: str) -> set[str]:
    """The enginewire modules a fresh interpreter holds after ``build_parser(command)``."""
    code = ("import sys\nfrom enginewire.cli import build_parser\n"
            f"build_parser({command!r})\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('enginewire.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return set(done.stdout.split())


def test_a_named_command_imports_its_module_only() -> None:
    loaded = _modules_after_parsing("serve-engine")
    assert "enginewire.reference.commands" in loaded
    assert not {"enginewire.fuzz.mutants", "enginewire.conformance.commands",
                "enginewire.tap.vllm_dp", "enginewire.bench.commands"} & loaded, loaded


@pytest.mark.parametrize(("command", "extension"), [
    ("interop", "enginewire.tap.vllm_dp"), ("spec", "enginewire.conformance.commands")])
def test_a_command_gets_the_modules_that_extend_it(command: str, extension: str) -> None:
    """Without them ``interop`` would lose its topology cells and ``spec match`` could not
    probe a codec target (test_release_match.py drives that one end to end)."""
    assert extension in _modules_after_parsing(command)


def test_the_mutant_provider_is_imported_when_a_target_names_it() -> None:
    code = ("import sys\nfrom enginewire.cli import build_parser\n"
            "from enginewire.conformance.targets.resolve import load_target, providers\n"
            "build_parser('check')\n"
            "assert 'mutant' in providers()\n"
            "assert 'enginewire.fuzz.mutants' not in sys.modules\n"
            "from enginewire.conformance.targets.contract import TargetError\n"
            "try:\n    load_target('mutant:no-such-mutant')\n"
            "except TargetError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert "mutant:no-such-mutant: no such mutant" in done.stdout, done.stdout + done.stderr


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    from enginewire.cli import COMMAND_MODULES

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for commands in COMMAND_MODULES.values():
        for command in commands:
            assert command in out
