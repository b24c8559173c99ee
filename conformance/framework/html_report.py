"""The HTML report (``enginewire check --html PATH``): one self-contained page people read.

It leads with what needs action (failures, unexpected passes, changed failures, each with
its clauses linked to the rendered spec page, or with ``--spec-site`` to the documentation
site, and its reproduction), then lists every check in
suite order with filters by status and surface (a few lines of inline script; without script
every row shows). Reproductions render as what they are:

- frames: one row per frame, hex beside its decoded meaning (the request type of a one-byte
  type frame, the msgpack value of a payload, the literal it spells);
- memory logs: the note ``memory_log`` (a :class:`~.memory_log.MemoryLog`, or event dicts /
  ``(op, offset, value)`` tuples) becomes a swimlane, one column per process, stores, loads
  and fences in order (:func:`.memory_log.swimlane_html`, which ``enginewire explore --html``
  shares); received items that are text lines show as text, not as the hex of their bytes.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import msgspec

from enginewire.conformance.framework.memory_log import NOTE as MEMORY_LOG
from enginewire.conformance.framework.memory_log import SWIMLANE_CSS, swimlane_html
from enginewire.conformance.framework.outcomes import (
    FAILED,
    STATUSES,
    CheckResult,
    RunResult,
)

#: Where the rendered spec pages live, relative to the report (``docs/spec/<surface>.md``).
SPEC_PAGES = "docs/spec"



def _type_names(version: str | None) -> dict[int, str]:
    """One-byte type frames of the input channel at vLLM ``version`` (the reference release
    where None): byte -> name, from the loaded spec's request_types surface."""
    from enginewire.spec import load

    return {t.byte: t.name + ("" if t.on_wire else " (sentinel)")
            for t in load(version).surface("request_types").types}

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.5em}
table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}
.passed{color:#17632a}.failed,.unexpected_failure,.unexpected_pass,.changed_failure{color:#a11}
.skipped,.not_run,.not_implemented,.not_applicable,.spec_only{color:#777}
.expected_failure{color:#a60}
pre{background:#f8f8f8;padding:.5em;white-space:pre-wrap;word-break:break-all;margin:.3em 0}
code{font-size:.92em}.summary td{border:none;padding:.1em .8em .1em 0}
.failure{border:2px solid #a11;border-radius:6px;padding:.5em 1em;margin:1em 0}
.frames td.hex{font-family:monospace;word-break:break-all;width:50%}
#filters label{margin-right:1em}
"""

_SCRIPT = """
function applyFilters(){
  var statuses={};document.querySelectorAll('#filters input[data-status]').forEach(
    function(b){statuses[b.dataset.status]=b.checked;});
  var surface=document.getElementById('surface').value;
  document.querySelectorAll('tr.check').forEach(function(r){
    var show=statuses[r.dataset.status]&&(surface==='all'||r.dataset.surface===surface);
    r.style.display=show?'':'none';});
}
document.querySelectorAll('#filters input,#filters select').forEach(
  function(e){e.addEventListener('change',applyFilters);});
"""


def clause_link(clause_id: str, spec_pages: str = SPEC_PAGES,
                spec_site: str | None = None) -> str:
    """An HTML link from a clause ID to the element whose ``id`` is the clause ID on the page
    of its surface (the ID's first part): the Markdown page ``<spec_pages>/<surface>.md``, or
    with ``spec_site`` (the root of the site ``enginewire docs build`` writes, a URL or a path
    relative to the report) the HTML page ``<spec_site>/spec/<surface>.html``."""
    page = clause_id.split(".", 1)[0]
    href = (f"{spec_site.rstrip('/')}/spec/{page}.html" if spec_site is not None
            else f"{spec_pages}/{page}.md")
    return (f"<a href='{html.escape(href)}#{html.escape(clause_id)}'>"
            f"<code>{html.escape(clause_id)}</code></a>")


def frame_meaning(frame: bytes, version: str | None = None) -> str:
    """What a frame says, for a reader: its request type at vLLM ``version`` (the reference
    release where None), the text it spells, or its msgpack value (shortened)."""
    names = _type_names(version) if len(frame) == 1 else {}
    if len(frame) == 1 and frame[0] in names:
        return f"type byte: {names[frame[0]]}"
    if not frame:
        return "(empty frame)"
    try:
        value = msgspec.msgpack.decode(frame)
    except (msgspec.DecodeError, ValueError):
        try:
            text = frame.decode("ascii")
        except UnicodeDecodeError:
            return f"{len(frame)} raw bytes (not msgpack)"
        return f"text {text!r}" if text.isprintable() else f"{len(frame)} raw bytes"
    text = _short(value)
    return f"msgpack: {text}"


def _short(value: Any, limit: int = 300) -> str:
    if isinstance(value, msgspec.msgpack.Ext):
        text = f"Ext({value.code}, {memoryview(value.data).nbytes} bytes)"
    elif isinstance(value, list):
        text = "[" + ", ".join(_short(v, limit) for v in value) + "]"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{_short(k, limit)}: {_short(v, limit)}"
                               for k, v in value.items()) + "}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _frames_table(title: str, frames: Sequence[Any], version: str | None) -> str:
    esc = html.escape
    rows = []
    for index, frame in enumerate(frames):
        raw = bytes(frame)
        shown = raw[:256].hex() + (f"... ({len(raw)} bytes)" if len(raw) > 256 else "")
        rows.append(f"<tr><td>{index}</td><td class='hex'>{esc(shown) or '(empty)'}</td>"
                    f"<td>{esc(frame_meaning(raw, version))}</td></tr>")
    return (f"<table class='frames'><tr><th colspan='3'>{esc(title)}</th></tr>"
            f"<tr><th>#</th><th>hex</th><th>meaning</th></tr>{''.join(rows)}</table>")


def _text_lines(items: Sequence[Any]) -> list[str] | None:
    """Received items that are all printable text (a log, not frames), as lines."""
    lines = []
    for item in items:
        if not isinstance(item, bytes | bytearray | memoryview):
            return None
        try:
            text = bytes(item).decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not text.isprintable() or len(text) < 2:
            return None
        lines.append(text)
    return lines


def render_reproduction(result: CheckResult, version: str | None = None) -> str:
    """A failure's reproduction as what it is: frames with meanings (type bytes those of vLLM
    ``version``, the reference release where None), logs as lanes."""
    esc = html.escape
    repro = result.reproduction
    if repro is None:
        return ""
    parts = []
    if repro.sent:
        parts.append(_frames_table("sent", repro.sent, version))
    received = repro.received
    if isinstance(received, list | tuple) and received and all(
            isinstance(r, bytes | bytearray | memoryview) for r in received):
        lines = _text_lines(received)
        if lines is not None:
            parts.append("<pre class='log'>" + esc("\n".join(lines)) + "</pre>")
        else:
            parts.append(_frames_table("received", received, version))
    elif received is not None:
        parts.append(f"<pre>received: {esc(_short(received, 2000))}</pre>")
    notes = dict(repro.notes)
    log = notes.pop(MEMORY_LOG, None)
    if log:
        parts.append(swimlane_html(log))
    if notes:
        rendered = json.dumps({k: _plain(v) for k, v in notes.items()}, indent=1)
        parts.append(f"<pre>{esc(rendered)}</pre>")
    return "".join(parts)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)[:500]


def _needs_action(result: CheckResult) -> bool:
    return result.unexpected or (result.status == FAILED and not result.expectation)


def _failure_block(result: CheckResult, spec_site: str | None = None,
                   version: str | None = None) -> str:
    esc = html.escape
    status = result.expectation or result.status
    return (
        f"<div class='failure' id='fail-{esc(result.check.id)}'>"
        f"<h3 class='{esc(status)}'>{esc(status.replace('_', ' ').upper())} "
        f"<code>{esc(result.check.id)}</code> ({esc(result.level)})</h3>"
        f"<div>{esc(result.check.description)}</div>"
        f"<div>clauses: "
        f"{', '.join(clause_link(c, spec_site=spec_site) for c in result.check.clauses)}</div>"
        f"<pre>{esc(result.message)}</pre>"
        f"{render_reproduction(result, version)}"
        + (f"<details><summary>traceback</summary><pre>{esc(result.traceback)}</pre>"
           "</details>" if result.traceback else "")
        + "</div>"
    )


def render_html(run: RunResult, spec_site: str | None = None) -> str:
    """The report page; clause links go to the Markdown spec pages under ``docs/spec/``, or
    with ``spec_site`` to the built documentation site there (see :func:`clause_link`)."""
    esc = html.escape
    totals = run.counts()
    verdict = "PASSED" if run.ok else "FAILED"
    action = [r for r in run.results if _needs_action(r)]
    expected = [r for r in run.results if r.expectation == "expected_failure"]
    summary = "".join(
        f"<tr><td class='{key}'>{esc(key.replace('_', ' '))}</td><td>{count}</td></tr>"
        for key, count in totals.items() if count)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>enginewire check {esc(run.target)}: {verdict}</title>",
        f"<style>{_CSS}{SWIMLANE_CSS}</style></head><body>",
        f"<h1>enginewire conformance: <span class='{'passed' if run.ok else 'failed'}'>"
        f"{verdict}</span></h1>",
        f"<p>Target <code>{esc(run.target)}</code>, spec for vLLM {esc(run.spec_version)}, "
        f"{'strict' if run.strict else 'MUST checks only'}, started {esc(run.started)}, "
        f"{run.duration_s:.1f} s.</p>",
        f"<table class='summary'>{summary}</table>",
        f"<h2 id='failures'>Needs action ({len(action)})</h2>",
    ]
    if action:
        parts += [_failure_block(r, spec_site, run.spec_version) for r in action]
    else:
        parts.append("<p class='passed'>Nothing: every failure is expected.</p>")
    if expected:
        parts.append(f"<details><summary>Expected failures ({len(expected)})</summary>")
        parts += [_failure_block(r, spec_site, run.spec_version) for r in expected]
        parts.append("</details>")
    boxes = "".join(
        f"<label><input type='checkbox' data-status='{s}' "
        f"checked> {s.replace('_', ' ')} "
        f"({totals[s]})</label>" for s in STATUSES)
    surfaces = "".join(f"<option value='{s}'>{s}</option>" for s in run.surfaces())
    parts += [
        "<h2 id='all'>All checks, in suite order</h2>",
        f"<div id='filters'>{boxes}<select id='surface'><option value='all'>every surface"
        f"</option>{surfaces}</select></div>",
        "<table id='checks'><tr><th>check</th><th>surface</th><th>clauses</th><th>level</th>"
        "<th>result</th></tr>",
    ]
    for result in run.results:
        status = result.expectation or result.status
        link = (f" <a href='#fail-{esc(result.check.id)}'>details</a>"
                if _needs_action(result) or result.expectation == "expected_failure" else "")
        parts.append(
            f"<tr class='check' data-status='{esc(result.status)}' "
            f"data-surface='{esc(result.check.surface)}'>"
            f"<td><code>{esc(result.check.id)}</code><div>{esc(result.check.description)}"
            f"</div></td><td>{esc(result.check.surface)}</td>"
            f"<td>{'<br>'.join(clause_link(c, spec_site=spec_site) for c in result.check.clauses)}"
            "</td>"
            f"<td>{esc(result.level)}</td><td class='{esc(status)}'>"
            f"{esc(status.replace('_', ' '))}{link}"
            + (f"<div>{esc(result.first_line)}</div>" if result.first_line else "")
            + "</td></tr>")
    parts += ["</table>", f"<script>{_SCRIPT}applyFilters();</script>", "</body></html>\n"]
    return "\n".join(parts)
