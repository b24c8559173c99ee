"""The documentation site (``enginewire docs build``): built once into a temporary folder,
then checked: every clause of the spec is an anchor on its page and the HTML report's clause
links reach it, links resolve, the diagrams are SVG drawn at build time, nothing comes from
another host, and in a real headless chromium a page renders and the search finds a clause.
The checker itself is shown to fail on a broken site."""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Browser
from ci_tools import require_tool

from enginewire.cli import main
from enginewire.conformance.framework.html_report import clause_link
from enginewire.diagrams import (
    _label_box,
    parse_state_diagram,
    state_diagram_layout,
    state_diagram_svg,
)
from enginewire.docsite import NAV, ROOT, build_site, check_site, clause_pages
from enginewire.spec import Spec, load

CLAUSE = "frames.outputs-payload"


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, spec: Spec) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    problems = build_site(out, spec=spec)
    assert problems == [], "\n".join(problems)
    return out


def test_every_clause_is_an_anchor_on_its_page_and_the_report_links_there(
        site: Path, spec: Spec) -> None:
    assert len(spec.clauses) > 100
    pages = clause_pages(spec)
    for clause_id, page in pages.items():
        html = (site / page).read_text(encoding="utf-8")
        assert f'id="{clause_id}"' in html, f"{clause_id}: no anchor on {page}"
        # The conformance report, pointed at the site, links the clause to that anchor.
        assert f"href='./{page}#{clause_id}'" in clause_link(clause_id, spec_site=".")
    assert pages[CLAUSE] == "spec/frames.html"


def test_navigation_names_every_required_page(site: Path) -> None:
    named = {page for _, pages in NAV for page in pages}
    for page in ("index.md", "spec/structs.md", "spec/ring.md", "spec/frames.md",
                 "spec/history.md", "spec/breaks.md", "conformance.md",
                 "conformance-vllm.md", "interop.md", "explorer.md", "fuzzing.md", "mutants.md",
                 "hardening.md", "tap.md", "bench.md", "vllm-findings/index.md",
                 "compat/index.md"):
        assert page in named
        assert (site / page.replace(".md", ".html")).is_file()
    # Every page of docs/ is in the site (in NAV or under "Other pages").
    for source in (ROOT / "docs").rglob("*.md"):
        built = site / source.relative_to(ROOT / "docs").with_suffix(".html")
        assert built.is_file(), f"{source} was not built"
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="spec/structs.html"' in home and 'href="vllm-findings/index.html"' in home


def test_diagrams_are_svg_drawn_at_build_time(site: Path) -> None:
    drawings = sorted((site / "spec" / "diagrams").glob("*.svg"))
    assert {p.name for p in drawings} >= {"ring-layout.svg", "ring-state-1.svg",
                                          "handshake-state-1.svg", "handshake-state-2.svg",
                                          "frames-layout.svg"}
    for drawing in drawings:
        root = ElementTree.parse(drawing).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    ring = (site / "spec" / "ring.html").read_text(encoding="utf-8")
    assert 'src="diagrams/ring-layout.svg"' in ring and 'src="diagrams/ring-state-1.svg"' in ring
    layout = (site / "spec" / "diagrams" / "ring-layout.svg").read_text(encoding="utf-8")
    assert "chunk[2]" in layout and "R = read_flag" in layout and "W = written_flag" in layout
    frames = (site / "spec" / "diagrams" / "frames-layout.svg").read_text(encoding="utf-8")
    assert ">EngineCoreRequest<" in frames and ">ENGINE_CORE_DEAD<" in frames
    assert 'src="diagrams/frames-layout.svg"' in (site / "spec" / "frames.html").read_text(
        encoding="utf-8")
    for page in site.rglob("*.html"):
        assert "mermaid" not in page.read_text(encoding="utf-8"), f"{page}: an undrawn diagram"
    # The compatibility heatmaps and benchmark plots are there as pictures.
    compat = (site / "compat" / "index.html").read_text(encoding="utf-8")
    assert ".png" in compat and any((site / "compat").glob("*.png"))


def test_state_diagram_drawing_follows_the_source() -> None:
    source = """stateDiagram-v2
    state "A" as s0
    state "B" as s1
    state "C" as s2
    [*] --> s0
    s0 --> s1 : go
    s1 --> s1 : stay
    s0 --> s2 : jump
    s2 --> s0 : back
"""
    diagram = parse_state_diagram(source)
    assert diagram.initial == "s0" and len(diagram.edges) == 4
    svg = state_diagram_svg(source, title="t")
    for text in (">A<", ">B<", ">C<", ">go<", ">stay<", ">jump<", ">back<"):
        assert text in svg
    assert svg.count("marker-end=") == 5  # the initial arrow and one arrow per transition
    with pytest.raises(ValueError, match="not understood"):
        parse_state_diagram("stateDiagram-v2\n    s0 -> s1")


def _frontend_state_diagram() -> str:
    page = (ROOT / "docs" / "spec" / "handshake.md").read_text(encoding="utf-8")
    section = page.split('<a id="machine-frontend"></a>', 1)[1]
    return section.split("```mermaid\n", 1)[1].split("```", 1)[0]


def test_frontend_state_diagram_labels_overlap_nothing() -> None:
    """The front end's state machine (arcs in two lanes, labels on both sides): no label's
    text box overlaps another label or a state box, and none sits on a line of the picture
    (an arc's horizontal or vertical part, an arrow between neighbours). The boxes are the
    layout's, and the SVG draws exactly those."""
    source = _frontend_state_diagram()
    layout = state_diagram_layout(source)
    labels, states = layout.label_boxes(), layout.state_boxes()
    assert len(labels) == 8 and len({lane for *_, lane in layout.arcs}) == 2
    boxes = [*labels, *states]
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert not overlapping
    crossed = [(label, segment) for label in labels for segment in layout.segments()
               if label.crosses(segment)]
    assert not crossed
    drawn = re.findall(r"<rect x='([\d.-]+)' y='([\d.-]+)' width='([\d.]+)' height='15' "
                       r"fill='white'", state_diagram_svg(source))
    assert drawn == [(f"{b.x:.1f}", f"{b.y:.1f}", f"{b.width:.1f}") for b in labels]
    assert all(b.x >= 0 and b.x + b.width <= layout.width for b in boxes)


def test_label_check_sees_a_label_on_a_line() -> None:
    """The check of the test above fails on a label placed on an arc's line (as the front
    end's ``external_handshake`` once sat on the ``engine_core_dead`` arc out of CONNECTED)."""
    layout = state_diagram_layout(_frontend_state_diagram())
    source, _, label, lane_x = next(a for a in layout.arcs if a[2] == "external_handshake")
    y = layout.box_top("s1") + layout.box_h / 2 + 4  # CONNECTED's row, where an arc leaves
    moved = _label_box(lane_x - 6, y, label, "end")
    assert any(moved.crosses(segment) for segment in layout.segments())


def test_search_index_holds_every_clause(site: Path, spec: Spec) -> None:
    text = (site / "search" / "search_index.json").read_text(encoding="utf-8")
    missing = [clause_id for clause_id in spec.clauses if clause_id not in text]
    assert not missing


def test_site_loads_nothing_from_another_host(site: Path) -> None:
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        for marker in ("<script src=\"http", "<link href=\"http", "cdnjs", "googleapis"):
            assert marker not in html, f"{page}: {marker}"


def test_the_checker_fails_on_a_broken_site(site: Path, spec: Spec, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(site, broken)
    frames = broken / "spec" / "frames.html"
    text = frames.read_text(encoding="utf-8")
    text = text.replace(f'id="{CLAUSE}"', 'id="gone"', 1)
    text = text.replace("</body>", "<a href='nowhere.html'>x</a><a href='ring.html#no-such'>y"
                        "</a><script src='https://cdn.example/x.js'></script>"
                        "<p id='frames.abort-payload'></p></body>")
    frames.write_text(text, encoding="utf-8")
    problems = "\n".join(check_site(broken, spec))
    assert f"clause {CLAUSE}: no element with id='{CLAUSE}'" in problems
    assert "broken link nowhere.html" in problems
    assert "broken link ring.html#no-such (no id 'no-such'" in problems
    assert "loads https://cdn.example/x.js from another host" in problems
    assert "spec/frames.html: id 'frames.abort-payload' is used more than once" in problems
    (broken / "search" / "search_index.json").write_text('{"docs": []}', encoding="utf-8")
    assert f"search index: clause {CLAUSE} is not in it" in "\n".join(check_site(broken, spec))


def test_command_refuses_a_folder_that_is_not_a_site(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("not a site")
    assert main(["docs", "build", "--out", str(tmp_path)]) == 2
    assert "expected an empty folder or an earlier build" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").exists()


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site over http on localhost (the search loads its index with a web worker, which
    file:// pages may not start)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_site_in_a_headless_browser_renders_and_search_finds_a_clause(
        served: str, tmp_path: Path) -> None:
    executable = require_tool("chromium", "chromium-browser",
                              why="the docs site is not looked at in a browser")
    with Browser(executable, tmp_path / "profile") as browser:
        browser.open(f"{served}/spec/ring.html")
        assert "Shared-memory broadcast ring" in browser.evaluate("document.title")
        # The diagrams loaded and have a size (a broken image has naturalWidth 0).
        widths = browser.wait_for(
            "Array.from(document.images).filter(i => i.src.endsWith('.svg') && i.complete)"
            ".map(i => i.naturalWidth)")
        assert len(widths) >= 2 and all(width > 100 for width in widths)
        # The navigation lists the spec pages.
        nav = browser.evaluate("document.querySelector('.navbar').textContent")
        assert "Specification" in nav and "vLLM findings" in nav
        # Search: the page reads ?q=, its web worker loads the index and lists the results.
        browser.open(f"{served}/index.html?q={CLAUSE}")
        results = browser.wait_for(
            "document.getElementById('mkdocs-search-results').innerHTML", timeout_s=60)
        first = browser.evaluate(
            "document.querySelector('#mkdocs-search-results article a').getAttribute('href')")
    assert CLAUSE in results
    assert first == f"./spec/frames.html#{CLAUSE}", first


def test_union_types_in_table_cells_read_as_on_github(site: Path) -> None:
    """``\\|`` in a code span of a table cell shows as ``|`` (GitHub's reading), not as a
    backslash and a pipe."""
    for name in ("structs", "history", "breaks"):
        html = (site / "spec" / f"{name}.html").read_text(encoding="utf-8")
        assert "\\|" not in html, name
        assert "&#124;" in html or " | none" in html, name
