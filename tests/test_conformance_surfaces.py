"""The ring, engine and front-end checks against the reference, their power against broken
peers, external-program targets, and the pytest plugin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from enginewire.cli import main
from enginewire.conformance.framework.outcomes import FAILED, NOT_IMPLEMENTED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.targets.contract import Target
from enginewire.conformance.targets.reference import (
    ReferenceEngines,
    ReferenceRing,
    reference_target,
)
from enginewire.spec import load

REPO = Path(__file__).resolve().parents[1]
REFERENCE_EXPECTED = REPO / "conformance" / "data" / "expected" / "reference.txt"
ADAPTER = f"{sys.executable} -m enginewire.conformance.targets.command_server"


@pytest.fixture(scope="module")
def spec() -> Any:
    return load()


def _last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


# --- deliberately broken peers ----------------------------------------------------------------


def _big_endian_target() -> Target:
    import enginewire.reference.connection as connection_module

    engines = ReferenceEngines()
    original = connection_module.EngineConnection.__init__

    class Engines:
        def start_engine(self, launch: Any) -> Any:
            def patched(self_: Any, rank: int, *args: Any, **kwargs: Any) -> None:
                original(self_, rank, *args, **kwargs)
                self_.identity = rank.to_bytes(2, "big")

            connection_module.EngineConnection.__init__ = patched  # type: ignore[method-assign]
            try:
                return engines.start_engine(launch)
            finally:
                connection_module.EngineConnection.__init__ = original  # type: ignore[method-assign]

    return Target(name="big-endian-identity", engine=Engines())


class SkipsReadFlagClear(ReferenceRing):
    """A ring writer that sets written = 1 before clearing the read flags."""

    def memory_writer(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int) -> Any:
        from enginewire.reference.ring import RingLayout
        from enginewire.reference.ring.framing import write_chunk

        layout = RingLayout(n_reader, max_chunk_bytes, max_chunks)

        class Writer:
            def write(self, buffers: list[bytes]) -> bool:
                row = layout.metadata_row_offset(0)
                memory.fence()
                memory.store(row, 0)
                write_chunk(memory.write, buffers, base=layout.chunk_offset(0))
                memory.fence()
                memory.store(row, 1)
                for reader in range(n_reader):
                    memory.store(row + 1 + reader, 0)
                memory.fence()
                return True

        return Writer()


# --- the reference passes ----------------------------------------------------------------------


def test_whole_suite_against_the_reference_passes(capsys: Any) -> None:
    code = main(["check", "--no-progress", "--expected-failures", str(REFERENCE_EXPECTED)])
    out = capsys.readouterr().out
    assert code == 0, out[-4000:]
    assert _last_line(out).endswith(" failed")
    for surface in ("codec", "ring", "engine", "frontend"):
        assert f"  {surface} " in out


@pytest.mark.parametrize("surface", ["ring", "engine", "frontend"])
def test_each_peer_surface_has_checks_that_pass_on_the_reference(surface: str,
                                                                spec: Any) -> None:
    checks = select(all_checks(), surfaces=[surface])
    assert len(checks) >= 20
    target = reference_target()
    implemented = [c for c in checks if all(target.has(r) for r in c.requires)]
    result = run(implemented[:6], target, spec, strict=True)
    assert [r.status for r in result.results] == [PASSED] * 6, [
        (r.check.id, r.message) for r in result.results if r.status != PASSED]


# --- check power -----------------------------------------------------------------------------


def test_big_endian_identity_is_caught(spec: Any) -> None:
    checks = select(all_checks(), patterns=["engine/identity/rank-3", "engine/identity/rank-258"])
    result = run(checks, _big_endian_target(), spec)
    assert [r.status for r in result.results] == [FAILED, FAILED]
    assert "expected 0201" in next(r.message for r in result.results
                                   if r.check.id.endswith("258"))


def test_written_before_read_flags_cleared_is_caught(spec: Any) -> None:
    target = Target(name="bad-ring", ring=SkipsReadFlagClear())
    check = select(all_checks(), patterns=["ring/memory/read-flags-cleared-before-written"])
    result = run(check, target, spec)
    assert result.results[0].status == FAILED
    honest = run(check, Target(name="ok", ring=ReferenceRing()), spec)
    assert honest.results[0].status == PASSED


def test_a_codec_only_target_is_not_implemented_on_peer_surfaces(spec: Any) -> None:
    target = Target(name="codec-only", codec=reference_target().codec)
    checks = select(all_checks(), surfaces=["engine", "frontend"])
    result = run(checks, target, spec)
    assert {r.status for r in result.results} <= {NOT_IMPLEMENTED, "not_run"}
    assert result.count(PASSED) == 0 and result.ok


# --- external programs -----------------------------------------------------------------------


def test_codec_as_external_program(capsys: Any) -> None:
    code = main(["check", "--target", "none", "--no-progress",
                 "--target-cmd", f"codec={ADAPTER} --surface codec",
                 "-k", "codec/tensor/*", "-k", "codec/golden/add-minimal/*",
                 "-k", "codec/reject/*"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    passed = int(_last_line(out).split()[0])
    assert passed > 40


def test_engine_as_external_program(capsys: Any) -> None:
    command = (f"{sys.executable} -m enginewire serve-engine --handshake {{handshake}} "
               "--rank {rank} --dp-size {dp_size} --handshake-timeout {init_timeout}")
    code = main(["check", "--target", "none", "--no-progress", "--target-cmd", command,
                 "-k", "engine/handshake/hello-first", "-k", "engine/identity/rank-3",
                 "-k", "engine/serve/add-generates", "-k", "engine/garbage/unknown-type-byte"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert _last_line(out) == "4 passed, 0 failed"


# --- pytest plugin -----------------------------------------------------------------------------


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )


def _pytest_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str],
                       *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`_pytest` without a new interpreter: ``pytest.main`` in ``tmp_path`` (the
    plugin loads from its entry point as there; test_plugin_adds_nothing_without_a_target
    runs it in a fresh interpreter)."""
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as python -m puts the working directory
    capsys.readouterr()
    try:
        code = pytest.main(["-p", "no:cacheprovider", "-q", *args])
    finally:
        sys.modules.pop("test_plain", None)  # the next run's test_plain.py is another file
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, int(code), out, err)


def test_plugin_adds_nothing_without_a_target(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "--co")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_plain.py::test_plain" in done.stdout
    assert "enginewire-conformance" not in done.stdout
    assert "1 test collected" in done.stdout


def test_plugin_turns_checks_into_items(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    done = _pytest_in_process(tmp_path, monkeypatch, capsys, "--enginewire-target=reference",
                              "--co", "--enginewire-surface=codec")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("enginewire-conformance::codec::codec/tensor/inline-threshold-exact"
            "[tensors.tensor-inline-below-threshold]") in done.stdout
    assert "test_plain.py::test_plain" in done.stdout


def test_plugin_version_selects_the_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``--enginewire-version=X`` is ``check --version X``: X's spec (a check X has no clause
    for is a skip saying not applicable) and the reference target at X's layouts (0.8.4's
    EngineCoreRequest carries ``prompt``, which the newest layout refuses: the layout check
    fails against the reference at the newest release). An unknown release is a usage
    error."""
    checks = ["-k", "codec/ext/pickle-rejected or codec/struct/engine-core-request/layout"]
    old = _pytest_in_process(tmp_path, monkeypatch, capsys, "--enginewire-target=reference",
                             "--enginewire-version=0.8.4", "--enginewire-only", "-rs", *checks)
    assert old.returncode == 0, old.stdout + old.stderr
    assert "1 passed, 1 skipped" in old.stdout, old.stdout
    assert ("not applicable: not in this release: vLLM 0.8.4 has no insecure-serialization "
            "opt-in") in old.stdout, old.stdout
    unknown = _pytest_in_process(tmp_path, monkeypatch, capsys, "--enginewire-target=reference",
                                 "--enginewire-version=9.9.9", "--enginewire-only")
    assert unknown.returncode == pytest.ExitCode.USAGE_ERROR, unknown.stdout + unknown.stderr
    assert ("--enginewire-version: history/releases.toml: vLLM 9.9.9 is not a release the spec "
            "was derived from (0.7.3 to 0.33.0") in unknown.stderr, unknown.stderr
    assert "Traceback" not in unknown.stdout + unknown.stderr


def test_plugin_stops_at_a_program_that_cannot_start(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """As ``check`` does: the session ends with the target error, not a failure per check."""
    done = _pytest_in_process(tmp_path, monkeypatch, capsys, "--enginewire-only",
                              "--enginewire-target-cmd=codec=/no/such/program")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert "enginewire: --target-cmd codec: cannot start '/no/such/program': no such file" \
        in text, text
    assert "failed" not in done.stdout, done.stdout


def test_plugin_runs_checks_and_reports_failures(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return _pytest_in_process(tmp_path, monkeypatch, capsys, *args)

    broken = tmp_path / "broken_target.py"
    broken.write_text(
        "from enginewire.conformance.targets.reference import ReferenceCodec\n"
        "class Inclusive(ReferenceCodec):\n"
        "    def __init__(self, threshold=None, insecure=False):\n"
        "        super().__init__((256 if threshold is None else threshold) + 1, insecure)\n"
        "class Target:\n"
        "    codec = Inclusive()\n"
    )
    passing = _pytest(tmp_path, "--enginewire-target=reference", "--enginewire-only",
                      "-k", "codec/tensor/inline-threshold")
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "3 passed" in passing.stdout
    failing = _pytest(tmp_path, "--enginewire-target=broken_target:Target", "--enginewire-only",
                      "-k", "codec/tensor/inline-threshold", "-p", "no:randomly")
    assert failing.returncode == 1
    assert "codec/tensor/inline-threshold-exact [tensors.tensor-inline-below-threshold]" \
        in failing.stdout
    assert "1 failed, 2 passed" in failing.stdout
    expected = tmp_path / "expected.txt"
    expected.write_text("codec/tensor/inline-threshold-exact\n")
    listed = _pytest(tmp_path, "--enginewire-target=broken_target:Target", "--enginewire-only",
                     "-k", "codec/tensor/inline-threshold",
                     f"--enginewire-expected-failures={expected}")
    assert listed.returncode == 0, listed.stdout
    assert "1 xfailed" in listed.stdout
