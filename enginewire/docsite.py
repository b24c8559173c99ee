"""The documentation site: ``enginewire docs build [--out DIR]``.

:func:`build_site` turns the checkout's README.md and ``docs/`` into a static HTML site with
MkDocs (the ``docs`` extra): the built-in ``mkdocs`` theme with highlight.js turned off and
MkDocs' own search plugin (lunr, shipped inside the mkdocs package), so the site loads nothing
from the network and its search works offline. The steps:

1. stage a copy of ``docs/`` in a temporary folder, README.md as its ``index.md`` (links to
   ``docs/X`` become ``X``);
2. give each heading that has an anchor line above it (every clause, message, struct and
   state machine of ``docs/spec/``) that anchor as its own ``id``, and draw the diagrams as
   SVG files next to the pages (:mod:`enginewire.diagrams`): every Mermaid
   ``stateDiagram-v2`` block (the handshake state machines and the ring's slot states in
   ``docs/spec/``) is replaced by its picture, the ring page gets the picture of its example
   segment from the spec's layout formulas, and the frames page the frames of every message
   from ``frames.toml``. The heatmaps of ``docs/compat/`` and the plots of ``docs/bench/`` are
   PNG files the project's commands already write; they are copied as they are;
3. write the MkDocs configuration with the navigation of :data:`NAV` (any page of ``docs/``
   that the navigation does not name goes into an "Other pages" section, so none is lost) and
   build strictly: a link to a missing page or anchor fails the build;
4. check the built site (:func:`check_site`): every clause of the spec has an element whose
   ``id`` is the clause ID on ``spec/<surface>.html`` (the page the conformance HTML report
   links it to with ``--spec-site``), every internal link and image resolves, no page loads a
   script, style sheet or image from another host, no id is used twice on a page, and the
   search index holds every clause ID.

Exit status of the command: 0 built and checked; 1 the build or the check failed (each problem
on stderr); 2 a usage error (no ``docs/`` here, mkdocs not installed).
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from enginewire.cliargs import EXIT_USAGE, writable_dir
from enginewire.conformance.framework.html_report import clause_link
from enginewire.diagrams import (
    FrameBox,
    Region,
    frames_layout_svg,
    ring_layout_svg,
    state_diagram_svg,
)
from enginewire.spec import Spec, load
from enginewire.spec.render import GENERATED_MARK, ring_example_regions
from enginewire.spec.schema import Frame, FramesFile

#: The checkout this module belongs to (the editable install runs from it).
ROOT = Path(__file__).resolve().parent.parent

#: The site's navigation: (section title, pages relative to docs/). ``None`` as a title puts
#: the page at the top level; a ``*`` pattern stands for the pages it matches not named
#: before it, in name order.
NAV: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("index.md",)),
    ("Specification", (
        "spec/index.md", "spec/transport.md", "spec/frames.md", "spec/request_types.md",
        "spec/identity.md", "spec/handshake.md", "spec/tensors.md", "spec/ring.md",
        "spec/structs.md", "spec/history.md", "spec/breaks.md",
    )),
    ("Compatibility", ("compat/index.md",)),
    ("Conformance", ("conformance.md", "conformance-vllm.md", "interop.md")),
    ("Tools", ("explorer.md", "fuzzing.md", "mutants.md", "hardening.md", "tap.md")),
    ("Performance", ("bench.md", "bench/results.md")),
    ("vLLM findings", ("vllm-findings/index.md", "vllm-findings/*.md")),
)

#: Titles for pages without a level-1 heading of their own (MkDocs titles the others by it).
TITLES = {"bench/results.md": "Benchmark results"}

_MERMAID = re.compile(r"^```mermaid\n(?P<body>.*?)^```\n", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,6} (?P<title>.+)$", re.MULTILINE)
#: An anchor line right above a heading, as ``enginewire spec docs`` writes for every clause,
#: message, struct and state machine.
_ANCHORED_HEADING = re.compile(r'^<a id="(?P<id>[^"\s{}]+)"></a>\n(?P<heading>#{1,6} .+)$',
                               re.MULTILINE)
_RING_EXAMPLE = re.compile(r"^### Example: the segment of a ring.*\n", re.MULTILINE)
_FIRST_MESSAGE = re.compile(r"^### Message ", re.MULTILINE)
#: A code span (a run of backticks, its text, the same run), found left to right.
_CODE_SPAN = re.compile(r"(?<!`)(?P<fence>`+)(?!`)(?P<code>.+?)(?<!`)(?P=fence)(?!`)")


class SiteError(Exception):
    """The site could not be built; the message says what was expected and what came."""


# --- staging -------------------------------------------------------------------------------


def stage(root: Path, staging: Path, spec: Spec) -> list[str]:
    """Copy ``root``'s docs and README into ``staging`` and draw the diagrams; return the
    SVG files written (relative to ``staging``)."""
    docs = root / "docs"
    if not docs.is_dir():
        raise SiteError(f"expected the docs folder {docs}: run from a source checkout")
    shutil.copytree(docs, staging, ignore=shutil.ignore_patterns("__pycache__"))
    readme = (root / "README.md").read_text(encoding="utf-8")
    (staging / "index.md").write_text(readme.replace("](docs/", "]("), encoding="utf-8")
    drawn: list[str] = []
    for page in sorted(staging.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        # The generated-page mark is for editors of the repository; without it the page's
        # first heading is its first element, which MkDocs takes as the page title.
        new_text = text.replace(GENERATED_MARK + "\n", "", 1)
        # The heading itself takes the anchor's id (so the table of contents, the heading's
        # permalink and search results point at the clause ID, and no id is used twice).
        new_text = _ANCHORED_HEADING.sub(r"\g<heading> {#\g<id>}", new_text)
        new_text = _table_code_pipes(new_text)
        new_text = _draw_state_diagrams(page, new_text, drawn, staging)
        if page.relative_to(staging).as_posix() == "spec/ring.md":
            new_text = _draw_ring_example(page, new_text, spec, drawn, staging)
        if page.relative_to(staging).as_posix() == "spec/frames.md":
            new_text = _draw_frames(page, new_text, spec, drawn, staging)
        if new_text != text:
            page.write_text(new_text, encoding="utf-8")
    return drawn


def _table_code_pipes(text: str) -> str:
    """Code spans with ``\\|`` in table rows as HTML ``<code>`` with a plain ``|``.

    GitHub shows ``\\|`` inside a code span of a table cell as ``|``; Python-Markdown keeps the
    backslash (code spans take no escapes). An HTML ``<code>`` with ``&#124;`` shows ``|``
    and is no cell separator."""

    def html_code(match: re.Match[str]) -> str:
        if "\\|" not in match["code"]:
            return match[0]
        code = html.escape(match["code"].replace("\\|", "|").strip(), quote=False)
        return f"<code>{code.replace('|', '&#124;')}</code>"

    return "\n".join(_CODE_SPAN.sub(html_code, line) if line.startswith("|") else line
                     for line in text.split("\n"))


def _svg_file(page: Path, name: str, svg: str, drawn: list[str], staging: Path) -> str:
    """Write ``svg`` into ``diagrams/`` beside ``page``; return its link from the page."""
    folder = page.parent / "diagrams"
    folder.mkdir(exist_ok=True)
    path = folder / f"{page.stem}-{name}.svg"
    path.write_text(svg, encoding="utf-8")
    drawn.append(path.relative_to(staging).as_posix())
    return f"diagrams/{path.name}"


def _draw_state_diagrams(page: Path, text: str, drawn: list[str], staging: Path) -> str:
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        body = match["body"]
        if not body.lstrip().startswith("stateDiagram-v2"):
            raise SiteError(f"{page.name}: expected Mermaid blocks to be stateDiagram-v2 "
                            f"diagrams (the only kind the site draws), got {body[:40]!r}")
        headings = _HEADING.findall(text[:match.start()])
        title = (re.sub(r"\s*\{#[^}]*\}$", "", headings[-1]).strip("` ") if headings
                 else page.stem)
        count += 1
        try:
            svg = state_diagram_svg(body, title=f"State diagram: {title}")
        except ValueError as exc:
            raise SiteError(f"{page.name}: {exc}") from exc
        link = _svg_file(page, f"state-{count}", svg, drawn, staging)
        return f"![State diagram: {title}]({link})\n"

    return _MERMAID.sub(replace, text)


def _draw_ring_example(page: Path, text: str, spec: Spec, drawn: list[str],
                       staging: Path) -> str:
    match = _RING_EXAMPLE.search(text)
    regions = [Region(*region) for region in ring_example_regions(spec)]
    if match is None or not regions:
        raise SiteError(f"{page.name}: expected the ring's example segment (a heading "
                        "'### Example: the segment of a ring' and layout regions in the spec)")
    svg = ring_layout_svg(regions, title=match[0].lstrip("# ").strip())
    link = _svg_file(page, "layout", svg, drawn, staging)
    picture = f"\n![The example segment, byte by byte]({link})\n\nThe same as text:\n"
    return text[:match.end()] + picture + text[match.end():]


def _draw_frames(page: Path, text: str, spec: Spec, drawn: list[str], staging: Path) -> str:
    surface = spec.surfaces.get("frames")
    match = _FIRST_MESSAGE.search(text)
    if not isinstance(surface, FramesFile) or match is None:
        raise SiteError(f"{page.name}: expected the frames surface and its '### Message' "
                        "sections")
    messages = [(message.kind, message.routed,
                 [FrameBox(frame.name, frame.content, frame.repeated, _frame_detail(frame))
                  for frame in message.frames])
                for message in surface.messages]
    link = _svg_file(page, "layout", frames_layout_svg(messages, title="Frames of every message"),
                     drawn, staging)
    picture = (f"![The frames of every message, in order]({link})\n\nEach row is one message "
               "as the sending socket writes it; a dashed identity frame is seen and written "
               "only by the ROUTER end, a stacked frame repeats zero or more times.\n\n")
    return text[:match.start()] + picture + text[match.start():]


def _frame_detail(frame: Frame) -> str:
    """What a frame holds, in a few words: its payload type, or its literal bytes."""
    if frame.literal_hex is not None:
        raw = bytes.fromhex(frame.literal_hex)
        printable = len(raw) > 1 and all(0x20 < byte < 0x7F for byte in raw)
        return raw.decode("ascii") if printable else f"byte {raw.hex(' ')}"
    return frame.payload or ""


# --- configuration and build ---------------------------------------------------------------


def navigation(staging: Path) -> list[object]:
    """MkDocs' ``nav``: :data:`NAV` with its patterns expanded, then an "Other pages" section
    with the pages it does not name. A page it names that does not exist stays in (the strict
    build fails on it, and :func:`missing_nav_pages` names it)."""
    named: set[str] = set()
    sections: list[tuple[str | None, list[str]]] = []
    for title, patterns in NAV:
        pages: list[str] = []
        for pattern in patterns:
            matches = ([pattern] if "*" not in pattern else
                       sorted(p.relative_to(staging).as_posix() for p in staging.glob(pattern)))
            pages += [page for page in matches if page not in named]
            named.update(matches)
        sections.append((title, pages))
    nav: list[object] = []
    for title, pages in sections:
        entries = [{TITLES[page]: page} if page in TITLES else page for page in pages]
        if title is None:
            nav.extend(entries)
        else:
            nav.append({title: entries})
    others = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*.md")
                    if p.relative_to(staging).as_posix() not in named)
    if others:
        nav.append({"Other pages": others})
    return nav


def missing_nav_pages(staging: Path) -> list[str]:
    """Pages :data:`NAV` names that are not in the staged docs."""
    return [page for _, pages in NAV for page in pages
            if "*" not in page and not (staging / page).is_file()]


def site_config(staging: Path, out: Path) -> dict[str, object]:
    """The MkDocs configuration (written as JSON, which YAML reads) of a staged site."""
    return {
        "site_name": "enginewire",
        "site_description": "Wire specification and conformance suite for vLLM V1's "
                            "engine-core IPC",
        "docs_dir": str(staging),
        "site_dir": str(out),
        "use_directory_urls": False,
        "theme": {"name": "mkdocs", "highlightjs": False, "navigation_depth": 3,
                  "locale": "en"},
        "plugins": ["search"],
        "markdown_extensions": ["tables", "fenced_code", "attr_list",
                                {"toc": {"permalink": True}}],
        "nav": navigation(staging),
        "validation": {
            "omitted_files": "warn", "absolute_links": "warn", "unrecognized_links": "warn",
            "anchors": "warn", "not_found": "warn",
        },
        "strict": True,
    }


def build_site(out: Path, root: Path = ROOT, spec: Spec | None = None) -> list[str]:
    """Build the site into ``out`` (replacing it) and check it; return the problems found
    (empty: built and checked). Raises :class:`SiteError` when it cannot build at all."""
    try:
        from mkdocs.commands.build import build
        from mkdocs.config import load_config
        from mkdocs.exceptions import MkDocsException
    except ModuleNotFoundError as exc:
        raise SiteError("expected mkdocs to be installed: pip install -e '.[docs]'") from exc
    spec = spec if spec is not None else load()
    out = Path(out).resolve()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="enginewire-docs-") as tmp:
        staging = Path(tmp) / "docs"
        stage(root, staging, spec)
        problems += [f"NAV names {page}, which is not in docs/"
                     for page in missing_nav_pages(staging)]
        config_file = Path(tmp) / "mkdocs.yml"
        config_file.write_text(json.dumps(site_config(staging, out), indent=1),
                               encoding="utf-8")
        warnings = _Collect()
        logger = logging.getLogger("mkdocs")
        logger.addHandler(warnings)
        try:
            config = load_config(config_file=str(config_file))
            build(config)
        except MkDocsException as exc:
            problems.append(f"mkdocs: {exc}")
        finally:
            logger.removeHandler(warnings)
        problems += [f"mkdocs: {message}" for message in warnings.messages]
    if not problems:
        problems += check_site(out, spec)
    return problems


class _Collect(logging.Handler):
    """Keeps MkDocs' warnings, so the command can list them as problems."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(" ".join(record.getMessage().split()))


# --- checking the built site ---------------------------------------------------------------


class _Page(HTMLParser):
    """The ids, links and loaded resources of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.repeated_ids: set[str] = set()
        self.links: list[str] = []
        self.resources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            if values["id"] in self.ids:
                self.repeated_ids.add(values["id"])
            self.ids.add(values["id"])
        if tag == "a" and "name" in values:
            self.ids.add(values["name"])
        if tag == "a" and "href" in values:
            self.links.append(values["href"])
        elif tag == "link" and "href" in values:
            self.resources.append(values["href"])
        elif tag in ("script", "img", "iframe", "source") and "src" in values:
            self.resources.append(values["src"])


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _external(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.scheme or parts.netloc)


def clause_pages(spec: Spec) -> dict[str, str]:
    """Every clause ID -> the site page (relative to the site root) that defines it."""
    return {clause_id: f"spec/{ref.surface}.html" for clause_id, ref in spec.clauses.items()}


def check_site(out: Path, spec: Spec) -> list[str]:
    """The problems of a built site (see the module docstring); empty when it is sound."""
    out = Path(out)
    pages = {path.relative_to(out).as_posix(): _parse(path)
             for path in sorted(out.rglob("*.html"))}
    problems: list[str] = []
    for clause_id, page in sorted(clause_pages(spec).items()):
        if page not in pages:
            problems.append(f"clause {clause_id}: expected its page {page}, which was not built")
        elif clause_id not in pages[page].ids:
            problems.append(f"clause {clause_id}: no element with id={clause_id!r} on {page}")
        report_link = re.search(r"href='([^']*)'", clause_link(clause_id, spec_site="."))
        if report_link is None or report_link[1].lstrip("./") != f"{page}#{clause_id}":
            problems.append(f"clause {clause_id}: the HTML report links it to "
                            f"{report_link[1] if report_link else None}, expected "
                            f"./{page}#{clause_id}")
    for name, parsed in pages.items():
        problems += [f"{name}: id {repeated!r} is used more than once"
                     for repeated in sorted(parsed.repeated_ids)]
        for url in parsed.resources:
            if _external(url):
                problems.append(f"{name}: loads {url} from another host (the site must work "
                                "offline)")
            else:
                problems += _resolve(out, pages, name, url, anchor=False)
        for url in parsed.links:
            if not _external(url) and not url.startswith(("mailto:", "javascript:")):
                problems += _resolve(out, pages, name, url, anchor=True)
    problems += _check_search_index(out, spec)
    return problems


def _resolve(out: Path, pages: dict[str, _Page], name: str, url: str,
             anchor: bool) -> Iterator[str]:
    parts = urlsplit(url)
    path = unquote(parts.path)
    if path.startswith("/"):  # site-root relative (the 404 page's links)
        target = path.lstrip("/")
    else:
        target = (Path(name).parent / path).as_posix() if path else name
    target_path = (out / target).resolve()
    if not target_path.is_relative_to(out.resolve()) or not target_path.exists():
        yield f"{name}: broken link {url} (no {target} in the site)"
        return
    if target_path.is_dir():
        target_path = target_path / "index.html"
        if not target_path.exists():
            yield f"{name}: broken link {url} (a folder without index.html)"
            return
    if anchor and parts.fragment:
        key = target_path.relative_to(out.resolve()).as_posix()
        fragment = unquote(parts.fragment)
        if key in pages and fragment not in pages[key].ids:
            yield f"{name}: broken link {url} (no id {fragment!r} on {key})"


def _check_search_index(out: Path, spec: Spec) -> list[str]:
    index_file = out / "search" / "search_index.json"
    if not index_file.is_file():
        return ["search/search_index.json is missing: the search plugin did not run"]
    index = json.loads(index_file.read_text(encoding="utf-8"))
    text = "\n".join(f"{doc.get('title', '')} {doc.get('text', '')}"
                     for doc in index.get("docs", []))
    return [f"search index: clause {clause_id} is not in it"
            for clause_id in sorted(spec.clauses) if clause_id not in text]


# --- command line --------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    docs = subparsers.add_parser("docs", help="build the documentation site")
    docs_sub = docs.add_subparsers(dest="docs_command", metavar="SUBCOMMAND", required=True)
    build_parser = docs_sub.add_parser(
        "build", help="build README.md and docs/ into a static site with search (MkDocs)")
    build_parser.add_argument("--out", default="site", metavar="DIR", type=writable_dir,
                              help="where the site goes (an earlier build there is replaced; "
                                   "default: site/)")
    build_parser.set_defaults(handler=cmd_build)


def cmd_build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not is_site(out):
        print(f"enginewire docs build: --out {out}: expected an empty folder or an earlier "
              "build (MkDocs empties it first), got a folder with other files",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        problems = build_site(out)
    except SiteError as exc:
        print(f"enginewire docs build: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _print_problems(problems)
    if problems:
        return 1
    print(f"{out}: site built and checked ({_count(out.rglob('*.html'))} pages); open "
          f"{out / 'index.html'}")
    return 0


def is_site(folder: Path) -> bool:
    """Whether ``folder`` holds a site this command built (its search index and home page)."""
    return (folder / "search" / "search_index.json").is_file() and (
        folder / "index.html").is_file()


def _count(items: Iterable[object]) -> int:
    return sum(1 for _ in items)


def _print_problems(problems: list[str]) -> None:
    for problem in problems:
        print(f"enginewire docs build: {problem}", file=sys.stderr)
