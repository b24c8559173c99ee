"""The HTML report people read: failures first, filters, clause links, frames with their
meaning, memory logs as swimlanes; looked at in a real headless browser when one is here."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path

import msgspec
import pytest

from enginewire.conformance.framework.html_report import frame_meaning, render_html, swimlane
from enginewire.conformance.framework.outcomes import FAILED, PASSED, CheckResult, RunResult
from enginewire.conformance.framework.registry import Reproduction, all_checks


def _run() -> RunResult:
    checks = all_checks()
    passed = [CheckResult(c, "MUST", PASSED) for c in checks[:30]]
    ring = next(c for c in checks if c.surface == "ring")
    request = msgspec.msgpack.encode(["req-1", [1, 2]])
    failed = CheckResult(
        ring, "MUST", FAILED, "the writer stored written = 1 before the fence",
        Reproduction(sent=[b"\x00", request], notes={"memory_log": [
            {"process": "writer", "op": "store", "offset": 0, "value": 0},
            {"process": "writer", "op": "store", "offset": 8, "value": 1},
            {"process": "reader 0", "op": "load", "offset": 8, "value": 1},
            {"process": "writer", "op": "fence"},
        ]}))
    return RunResult("demo", "0.33.0", True, [*passed, failed], "2026-01-01T00:00:00", 1.0)


def test_page_leads_with_failures_and_renders_reproductions() -> None:
    page = render_html(_run())
    assert page.index("Needs action (1)") < page.index("All checks, in suite order")
    assert page.index("the writer stored written = 1") < page.index("id='checks'")
    assert "type byte: ADD" in page and "msgpack: [&#x27;req-1&#x27;, [1, 2]]" in page
    assert "<div class='head'>writer</div><div class='head'>reader 0</div>" in page
    assert "data-status='passed'" in page and "<select id='surface'>" in page


def test_frame_meaning_and_swimlane() -> None:
    assert frame_meaning(b"\x01") == "type byte: ABORT"
    assert frame_meaning(b"ENGINE_CORE_DEAD") == "text 'ENGINE_CORE_DEAD'"
    lanes = swimlane([("store", 0, 1), ("fence", -1, None)])
    assert "store @0 = 1" in lanes and "<div class='fence'>fence</div>" in lanes


def test_page_in_a_headless_browser(tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        warnings.warn("chromium is not installed: the HTML report is not looked at in a "
                      "browser", stacklevel=1)
        pytest.skip("SKIPPED LOUDLY: chromium is not installed (apt-get install chromium)")
    page = tmp_path / "report.html"
    page.write_text(render_html(_run()))
    shot = tmp_path / "report.png"
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,1600",
                    page.as_uri()], check=True, timeout=120, capture_output=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], check=True, timeout=120,
                         capture_output=True, text=True).stdout
    assert "Needs action (1)" in dom
    # The filter script ran: every row is shown (no inline display:none) with all boxes set.
    assert "display: none" not in dom


def test_clause_links_go_to_the_markdown_pages_or_the_docs_site() -> None:
    run = _run()
    clause = run.results[-1].check.clauses[0]
    surface = clause.split(".", 1)[0]
    assert f"href='docs/spec/{surface}.md#{clause}'" in render_html(run)
    on_site = render_html(run, spec_site="https://docs.example/")
    assert f"href='https://docs.example/spec/{surface}.html#{clause}'" in on_site
    assert "docs/spec/" not in on_site
