"""Memory logs as a typed reproduction, and their swimlane picture.

A ring memory-order failure (the ``ring/memory/*`` checks) and a schedule explorer violation
(``enginewire explore``) both come down to who stored, loaded or fenced what, in which order.
:class:`MemoryLog` is that record: :class:`MemoryEvent` items in their global order, each with
the process that acted, the operation (``store``, ``load``, ``read``, ``write``, ``fence``,
``notify``, ...), the address and the field it decodes to (``chunk 0 written flag``), the
value, and the order number (``step``). A check attaches one as the reproduction note
:data:`NOTE` (``memory_log``).

Renderings, one per reader:

- :meth:`MemoryLog.text_lines`: one line per event, for the terminal, JSON and JUnit reports;
- :func:`swimlane_html`: one column per process, events in order down the page (an HTML grid
  with inline CSS, no external assets), for the HTML report and ``enginewire explore --html``;
- :func:`swimlane_page`: a whole self-contained page around one swimlane.

This module sits in the conformance framework so that both the checks and the fuzz layer's
explorer use it (the explorer may import conformance; conformance never imports fuzz).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The reproduction note a memory log travels under.
NOTE = "memory_log"

#: Operations the picture colours (anything else shows plain).
OPS = ("store", "write", "load", "read", "fence", "notify", "yield", "buffer", "drain",
       "wait", "wait_notify", "wake", "receive")

SWIMLANE_CSS = """
.lanes{display:grid;gap:0 1em;font-family:monospace;font-size:.9em;margin:.4em 0}
.lanes div{padding:.1em .4em;border-left:3px solid #ccc;min-height:1.2em}
.lanes .head{font-weight:bold;border-left:none;background:#f4f4f4}
.lanes .step{color:#888;border-left:none;text-align:right}
.lanes .fence{background:#fde9b6}.lanes .store,.lanes .write{background:#dcecff}
.lanes .load,.lanes .read{background:#e6f5e6}
.lanes .notify,.lanes .wait_notify,.lanes .wake{background:#f1e0f7}
.lanes .receive{background:#eee}.lanes .ev .note{color:#a11}
"""


@dataclass(frozen=True)
class MemoryEvent:
    """One access or event of one process. ``field`` names the location (``chunk 0 read flag
    r1``); ``address`` its byte offset (None for fences and notifications); ``value`` the
    value stored or loaded as text (a length for bulk reads and writes); ``step`` its place
    in the global order (None: the process did it alone between two ordered steps); ``note``
    a remark (``setup``, the violation)."""

    process: str
    op: str
    field: str = ""
    address: int | None = None
    value: str = ""
    step: int | None = None
    note: str = ""

    def text(self) -> str:
        """``store chunk 0 written flag @128 = 1``."""
        parts = [self.op]
        if self.field:
            parts.append(self.field)
        if self.address is not None:
            parts.append(f"@{self.address}")
        if self.value != "":
            parts.append(("-> " if self.op in ("load", "read") else "= ") + self.value)
        text = " ".join(parts)
        if not self.note:
            return text
        note = self.note if self.note.startswith("(") and self.note.endswith(")") \
            else f"({self.note})"
        return f"{text}  {note}"

    def to_builtins(self) -> dict[str, Any]:
        out: dict[str, Any] = {"process": self.process, "op": self.op}
        for name in ("field", "address", "value", "step", "note"):
            value = getattr(self, name)
            if value not in ("", None):
                out[name] = value
        return out


@dataclass
class MemoryLog:
    """Events in their global order (see the module doc)."""

    events: list[MemoryEvent] = field(default_factory=list)
    title: str = ""

    def processes(self) -> list[str]:
        """The processes in the order they first act (one swimlane each)."""
        return list(dict.fromkeys(event.process for event in self.events))

    def text_lines(self) -> list[str]:
        """One line per event: its order number (blank for what a process does alone between
        two ordered steps), the process, what it did."""
        width = max((len(p) for p in self.processes()), default=0)
        lines = []
        for event in self.events:
            step = f"{event.step:>4}" if event.step is not None else f"{'':>4}"
            lines.append(f"{step}  {event.process:<{width}}  {event.text()}")
        return lines

    def to_builtins(self) -> list[dict[str, Any]]:
        return [event.to_builtins() for event in self.events]

    @classmethod
    def coerce(cls, value: Any) -> MemoryLog:
        """A :class:`MemoryLog` from itself, from dicts ``{"process", "op", "offset" |
        "address", "field", "value", "step", "note"}`` or from ``(op, offset, value)`` tuples
        of one process (``memory``)."""
        if isinstance(value, MemoryLog):
            return value
        events = []
        for item in value or ():
            if isinstance(item, MemoryEvent):
                events.append(item)
            elif isinstance(item, dict):
                address = item.get("address", item.get("offset"))
                events.append(MemoryEvent(
                    str(item.get("process", "memory")), str(item.get("op", "")),
                    str(item.get("field", "")),
                    None if address in (None, -1) else int(address),
                    "" if item.get("value") is None else str(item["value"]),
                    item.get("step"), str(item.get("note", ""))))
            elif isinstance(item, list | tuple) and item:
                address = item[1] if len(item) > 1 else None
                value = item[2] if len(item) > 2 else None
                events.append(MemoryEvent(
                    "memory", str(item[0]), "",
                    None if address in (None, -1) else int(address),
                    "" if value is None else str(value)))
        return cls(events)


def swimlane_html(log: MemoryLog | Iterable[Any]) -> str:
    """The log as one column per process, one row per event in order (an empty cell in the
    other lanes), each row numbered. Relies on :data:`SWIMLANE_CSS` being on the page."""
    esc = html.escape
    memory = MemoryLog.coerce(log)
    processes = memory.processes()
    if not processes:
        return ""
    cells = ["<div class='head step'>#</div>"]
    cells += [f"<div class='head lane'>{esc(p)}</div>" for p in processes]
    for event in memory.events:
        number = "" if event.step is None else str(event.step)
        cells.append(f"<div class='step'>{number}</div>")
        op = event.op if event.op in OPS else "other"
        body = esc(event.text())
        for process in processes:
            if process == event.process:
                cells.append(f"<div class='ev {op}' title='{esc(event.process)}'>{body}</div>")
            else:
                cells.append("<div></div>")
    columns = f"3em repeat({len(processes)},minmax(12em,1fr))"
    title = f"<div class='lanes-title'>{esc(memory.title)}</div>" if memory.title else ""
    return (f"{title}<div class='lanes' data-lanes='{len(processes)}' "
            f"data-events='{len(memory.events)}' style='grid-template-columns:{columns}'>"
            f"{''.join(cells)}</div>")


#: One section of a page: lines before the swimlane (what broke), the log, lines after.
Section = tuple[Sequence[str], MemoryLog, Sequence[str]]


def swimlane_page(title: str, sections: Sequence[Section]) -> str:
    """A self-contained HTML page: ``title``, then per section its lines before (what
    broke), its swimlane, its lines after (what each reader saw, how to replay)."""
    esc = html.escape

    def block(lines: Sequence[str]) -> str:
        return f"<pre>{esc(chr(10).join(lines))}</pre>" if lines else ""

    body = "".join(f"<section>{block(before)}{swimlane_html(log)}{block(after)}</section>"
                   for before, log, after in sections)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(title)}</title><style>"
            "body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
            "pre{background:#f8f8f8;padding:.5em;white-space:pre-wrap}"
            "section{border-top:2px solid #a11;margin-top:1em}"
            f"{SWIMLANE_CSS}</style></head><body><h1>{esc(title)}</h1>"
            f"{body}</body></html>\n")
