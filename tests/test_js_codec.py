"""A codec in JavaScript, driven only by ``enginewire spec export``, passes every check of
the kinds it implements through ``--target-cmd`` (tests/js_codec/codec.mjs); it answers
"unsupported" for tensors, which are NOT IMPLEMENTED, never failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ci_tools import require_tool

from enginewire.cli import main

CODEC = Path(__file__).parent / "js_codec" / "codec.mjs"


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_tool("node", why="the JavaScript codec is not tested")
    path = tmp_path_factory.mktemp("js") / "export.json"
    from enginewire.spec import load

    path.write_text(json.dumps(load().to_builtins()))
    return path


def _check(export: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    report = tmp_path / "report.json"
    main(["check", "--target", "none", "--target-cmd",
          f"codec=node {CODEC} {export}", "--surface", "codec", "--strict", "--no-progress",
          "--json", str(report), *extra])
    return json.loads(report.read_text())


def test_js_codec_passes_what_it_implements(export: Path, tmp_path: Path) -> None:
    report = _check(export, tmp_path)
    summary = report["summary"]
    failed = [r["id"] + ": " + r["message"] for r in report["results"]
              if r["status"] == "failed"]
    assert failed == []
    assert summary["passed"] > 200
    assert summary["not_implemented"] > 0  # tensors: answered "unsupported"


def test_js_codec_with_a_byte_level_bug_fails(export: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JS_CODEC_BREAK", "map-header")
    report = _check(export, tmp_path, "-k", "codec/golden/*")
    failed = {r["id"] for r in report["results"] if r["status"] == "failed"}
    # add_minimal's SamplingParams writes a few keys under a map16 header (de 00 0N).
    assert failed == {"codec/golden/add-minimal/encode"}


def test_js_codec_declaring_a_front_end_role(export: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """JS_CODEC_ROLE=frontend in its hello answer: what a front end never does (encode
    outputs, decode requests) is NOT APPLICABLE, never sent to the program; no failure."""
    monkeypatch.setenv("JS_CODEC_ROLE", "frontend")
    report = _check(export, tmp_path, "-k", "codec/golden/*")
    status = {r["id"]: r["status"] for r in report["results"]}
    assert status["codec/golden/add-minimal/encode"] == "passed"
    assert status["codec/golden/add-minimal/decode"] == "not_applicable"
    assert status["codec/golden/outputs/decode"] == "passed"
    assert status["codec/golden/outputs/encode"] == "not_applicable"
    assert report["summary"]["failed"] == 0
