"""A ``--target-cmd`` program that cannot start is a target error, on every surface: one line
naming the surface, the program and what went wrong (not found, not executable, exited at
start with its status and the end of its stderr), exit status 2 as for a target that cannot
be loaded; never an internal error, never a column of failed checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from enginewire.cli import main

#: Per surface: the words after the program that make the command that surface's.
SURFACE_ARGS = {
    "codec": "{version}",
    "ring": "{version}",
    "frontend": "{handshake} {input} {output} {engines}",
    "engine": "--handshake {handshake} --input {engine_input} --output {engine_output}",
}


def _check(surface: str, program: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["check", "--no-progress", "--target", "none", "--surface", surface,
                 "--target-cmd", f"{surface}={program} {SURFACE_ARGS[surface]}"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "internal error" not in captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "passed" not in captured.out and "FAIL" not in captured.out, captured.out
    return code, lines[0]


@pytest.mark.parametrize("surface", sorted(SURFACE_ARGS))
def test_a_program_that_does_not_exist(surface: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = _check(surface, "/no/such/program", capsys)
    assert code == 2
    assert line == (f"enginewire check: --target-cmd {surface}: cannot start "
                    "'/no/such/program': no such file")


@pytest.mark.parametrize("surface", ["codec", "engine"])
def test_a_name_not_on_path(surface: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = _check(surface, "enginewire-no-such-program", capsys)
    assert code == 2
    assert "'enginewire-no-such-program': not found on PATH" in line


@pytest.mark.parametrize("surface", sorted(SURFACE_ARGS))
def test_a_program_that_is_not_executable(surface: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    program = tmp_path / "prog"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o644)
    code, line = _check(surface, str(program), capsys)
    assert code == 2
    assert line.endswith(f"--target-cmd {surface}: cannot start '{program}': is not executable")


def test_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = _check("ring", str(tmp_path), capsys)
    assert code == 2
    assert line.endswith(f"cannot start '{tmp_path}': is a directory")


@pytest.mark.parametrize("surface", sorted(SURFACE_ARGS))
def test_a_program_that_exits_at_start(surface: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """It starts, writes to stderr and exits 3 before its first answer (first message)."""
    script = tmp_path / "dies.py"
    script.write_text("import sys\nsys.stderr.write('dies.py: no configuration file\\n')\n"
                      "sys.exit(3)\n")
    code, line = _check(surface, f"{sys.executable} {script}", capsys)
    assert code == 2
    assert line.startswith(f"enginewire check: --target-cmd {surface}: '{sys.executable}' "
                           "exited at start with status 3; its stderr ends: "), line
    assert line.endswith("dies.py: no configuration file"), line


def test_a_silent_exit_at_start_says_so(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, line = _check("codec", "true", capsys)
    assert code == 2
    assert line.endswith("'true' exited at start with status 0 and wrote nothing on stderr")


def test_spec_match_reports_a_codec_program_that_cannot_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``spec match`` probes a codec program too: one that exits at start is an error (exit
    2), not a list of structs it "encoded no sample" of."""
    script = tmp_path / "dies.py"
    script.write_text("import sys\nsys.exit(4)\n")
    code = main(["spec", "match", "none", "--target-cmd", f"codec={sys.executable} {script}"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.strip().splitlines() == [
        f"enginewire spec match: error: --target-cmd codec: '{sys.executable}' exited at start "
        "with status 4 and wrote nothing on stderr"]
    assert "encoded no release's sample" not in captured.out


def test_an_exit_between_the_liveness_check_and_the_first_write_failed_to_start() -> None:
    """The race a loaded machine hits with ``true``: the program is alive when the request is
    checked and gone when it is written. The write's broken pipe is the start failure, and
    closing the stdin that still holds the unsent line raises nothing."""
    from enginewire.conformance.targets.contract import TargetStartError
    from enginewire.conformance.targets.external import LineRpc

    rpc = LineRpc(["true"], surface="codec")
    try:
        rpc.peer.popen.wait(10)
        rpc.peer.alive = lambda: True  # type: ignore[method-assign]  # the exit lands after it
        with pytest.raises(TargetStartError, match="'true' exited at start with status 0"):
            rpc.call("hello")
    finally:
        del rpc.peer.alive  # the instance attribute: the class's check again
        rpc.close()
