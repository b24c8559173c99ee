"""The HTML report people read: failures first, filters, clause links, frames with their
meaning, memory logs as swimlanes; looked at in a real headless browser when one is here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import msgspec
import pytest
from ci_tools import chromium_segments, remove_chromium_leftovers, require_tool

from enginewire.conformance.framework.html_report import frame_meaning, render_html
from enginewire.conformance.framework.memory_log import MemoryLog, swimlane_html
from enginewire.conformance.framework.outcomes import FAILED, PASSED, CheckResult, RunResult
from enginewire.conformance.framework.registry import Reproduction, all_checks, select


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
    assert ("<div class='head lane'>writer</div><div class='head lane'>reader 0</div>"
            in page)
    assert "data-status='passed'" in page and "<select id='surface'>" in page


def test_frame_meaning_and_swimlane() -> None:
    assert frame_meaning(b"\x01") == "type byte: ABORT"
    assert frame_meaning(b"ENGINE_CORE_DEAD") == "text 'ENGINE_CORE_DEAD'"
    lanes = swimlane_html([("store", 0, 1), ("fence", -1, None)])
    assert "store @0 = 1" in lanes and ">fence</div>" in lanes
    assert "data-lanes='1' data-events='2'" in lanes


def _browser() -> str:
    """chromium's path (see ci_tools: a loud skip without it, a failure under .ci/run)."""
    return require_tool("chromium", "chromium-browser",
                        why="the HTML report is not looked at in a browser")


def _base(browser: str, tmp_path: Path) -> list[str]:
    return [browser, "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}"]


def _screenshot(browser: str, page: Path, tmp_path: Path) -> None:
    shot = tmp_path / (page.stem + ".png")
    before = chromium_segments()
    try:
        subprocess.run([*_base(browser, tmp_path), f"--screenshot={shot}",
                        "--window-size=1200,1600", page.as_uri()],
                       check=True, timeout=120, capture_output=True)
    finally:
        remove_chromium_leftovers(before)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def _dom(browser: str, page: Path, tmp_path: Path) -> str:
    before = chromium_segments()
    try:
        return subprocess.run([*_base(browser, tmp_path), "--dump-dom", page.as_uri()],
                              check=True, timeout=120, capture_output=True, text=True).stdout
    finally:
        remove_chromium_leftovers(before)


def test_page_in_a_headless_browser(tmp_path: Path) -> None:
    browser = _browser()
    page = tmp_path / "report.html"
    page.write_text(render_html(_run()))
    _screenshot(browser, page, tmp_path)
    dom = _dom(browser, page, tmp_path)
    assert "Needs action (1)" in dom
    # The filter script ran: every row is shown (no inline display:none) with all boxes set.
    assert "display: none" not in dom


# --- ring memory-order failures: a swimlane, not the hex of a text log -----------------------


FLAG_ORDER = "ring/memory/read-flags-cleared-before-written"
MARKS_READ = "ring/memory/reader-releases-after-reading"


def _broken_ring_run() -> RunResult:
    """mutant:flag-order (written = 1 before the read flags are cleared) and
    mutant:marks-read-before-copy's reader, against their memory-order checks."""
    from enginewire.conformance.framework.runner import run
    from enginewire.fuzz.mutants import mutant_target
    from enginewire.spec import load

    results = []
    for name, check_id in (("flag-order", FLAG_ORDER), ("marks-read-before-copy", MARKS_READ)):
        checks = select(all_checks(), patterns=[check_id])
        results += run(checks, mutant_target(name), load()).results
    return RunResult("broken-ring", "0.33.0", False, results, "2026-01-01T00:00:00", 1.0)


def test_a_broken_ring_fails_with_a_swimlane_per_process() -> None:
    run = _broken_ring_run()
    assert [r.status for r in run.results] == [FAILED, FAILED], [r.message for r in run.results]
    for result in run.results:
        assert result.reproduction is not None
        log = result.reproduction.notes["memory_log"]
        assert isinstance(log, MemoryLog)
        assert result.reproduction.received is None  # no more hex of a text log
        target_events = [e for e in log.events if e.note != "setup"]
        assert target_events and all(e.op in ("store", "load", "read", "write", "fence",
                                              "notify", "yield") for e in log.events)
    writer_log = run.results[0].reproduction.notes["memory_log"]  # type: ignore[union-attr]
    assert writer_log.processes() == ["suite (readers)", "writer (target)"]
    assert any(e.op == "store" and e.field == "chunk 0 written flag" and e.value == "1"
               and e.process == "writer (target)" for e in writer_log.events)
    page = render_html(run)
    logs = [r.reproduction.notes["memory_log"] for r in run.results]  # type: ignore[union-attr]
    for result, log in zip(run.results, logs, strict=True):
        assert f"data-lanes='2' data-events='{len(log.events)}'" in page, result.check.id
    # every event drawn once, in its own lane (the other lanes hold empty cells)
    assert page.count("<div class='ev ") == sum(len(log.events) for log in logs)
    assert page.count("<div class='head lane'>") == 4
    assert "<div class='head lane'>reader r1 (target)</div>" in page
    assert "received 0: 28" not in page
    # JSON and JUnit keep a readable text form: one line per event.
    from enginewire.conformance.framework.reports import junit_tree, to_builtins

    notes = to_builtins(run)["results"][0]["reproduction"]["notes"]["memory_log"]
    assert isinstance(notes, list) and len(notes) == len(writer_log.events)
    assert any("writer (target)" in line and "chunk 0 written flag @" in line for line in notes)
    import xml.etree.ElementTree as ET

    text = ET.tostring(junit_tree(run), encoding="unicode")
    assert "memory_log:" in text and "store chunk 0 written flag" in text


@pytest.mark.slow
def test_broken_ring_page_in_a_headless_browser(tmp_path: Path) -> None:
    browser = _browser()
    page = tmp_path / "ring.html"
    page.write_text(render_html(_broken_ring_run()))
    _screenshot(browser, page, tmp_path)
    dom = _dom(browser, page, tmp_path)
    assert dom.count("class=\"head lane\"") == 4  # two failures, two lanes each


def test_clause_links_go_to_the_markdown_pages_or_the_docs_site() -> None:
    run = _run()
    clause = run.results[-1].check.clauses[0]
    surface = clause.split(".", 1)[0]
    assert f"href='docs/spec/{surface}.md#{clause}'" in render_html(run)
    on_site = render_html(run, spec_site="https://docs.example/")
    assert f"href='https://docs.example/spec/{surface}.html#{clause}'" in on_site
    assert "docs/spec/" not in on_site
