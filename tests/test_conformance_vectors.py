"""External vectors: ``enginewire vectors write`` records frames in the golden format and
``enginewire check --vectors DIR`` adds them to the golden checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from enginewire.cli import main
from enginewire.conformance.checks.codec_golden import register_vectors
from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select, unregister
from enginewire.conformance.framework.runner import run
from enginewire.conformance.targets.contract import Target
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.spec import load

ABORT = ["01", "92a57265712d31a57265712d32"]


class AcceptsAnything(ReferenceCodec):
    """Broken: decodes any abort payload to an empty list."""

    def decode(self, kind: str, frames: Any) -> Any:
        if kind == "abort":
            return []
        return super().decode(kind, frames)


def _write(tmp: Path, *args: str) -> None:
    assert main(["vectors", "write", "--out", str(tmp), *args]) == 0


def test_recorded_vectors_join_the_golden_checks(tmp_path: Path) -> None:
    folder = tmp_path / "captured"
    _write(folder, "--kind", "abort", "--name", "old_abort", "--release", "0.31.0", *ABORT)
    _write(folder, "--kind", "abort", "--name", "abort_int", "--release", "0.33.0",
           "--expect", "reject", "01", "07")
    _write(folder, "--kind", "abort", "--name", "abort_now", "--release", load().version,
           *ABORT)
    recorded = json.loads((folder / "abort_int.json").read_text())
    assert recorded["expect"] == "reject" and recorded["value"] is None
    assert json.loads((folder / "old_abort.json").read_text())["value"] == ["req-1", "req-2"]
    ids = register_vectors(folder)
    try:
        _check_recorded(ids)
    finally:
        unregister(ids)


def _check_recorded(ids: list[str]) -> None:
    assert ids == ["codec/vectors/captured/abort-int/reject",
                   "codec/vectors/captured/abort-now/encode",
                   "codec/vectors/captured/abort-now/decode",
                   "codec/vectors/captured/old-abort/decode"]  # another release: decode only
    checks = select(all_checks(), patterns=["codec/vectors/captured/*"])
    good = run(checks, Target("reference", codec=ReferenceCodec()), load())
    assert {r.status for r in good.results} == {PASSED}
    bad = run(checks, Target("broken", codec=AcceptsAnything()), load())
    verdicts = {r.check.id: r.status for r in bad.results}
    assert verdicts["codec/vectors/captured/abort-int/reject"] == FAILED
    assert verdicts["codec/vectors/captured/old-abort/decode"] == FAILED


def test_check_command_takes_vectors(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "mine"
    _write(folder, "--kind", "abort", "--name", "a", "--release", "0.30.0", *ABORT)
    try:
        assert main(["check", "--vectors", str(folder), "-k", "codec/vectors/mine/*",
                     "--no-progress"]) == 0
    finally:
        unregister(["codec/vectors/mine/a/decode"])
    assert not select(all_checks(), patterns=["codec/vectors/*"])
    assert capsys.readouterr().out.strip().endswith("1 passed, 0 failed")
    assert main(["check", "--vectors", str(tmp_path / "absent"), "--no-progress"]) == 2
