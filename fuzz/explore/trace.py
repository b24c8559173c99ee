"""Printing a violation: what broke, the steps that led there, what each reader saw; as text
(:func:`format_events`) or as a typed memory log (:func:`memory_log`) whose swimlane picture
``enginewire explore --html`` writes with the conformance report's renderer."""

from __future__ import annotations

from collections.abc import Sequence

from enginewire.conformance.framework.memory_log import MemoryEvent, MemoryLog
from enginewire.fuzz.explore.checks import hex_bytes
from enginewire.fuzz.explore.execution import Event, Violation
from enginewire.fuzz.explore.model import AddressMap, Region

_VERBS = {
    "load": "load", "read": "read", "store": "store", "write": "write", "buffer": "buffer",
    "drain": "visible", "fence": "fence", "wait": "wait", "wake": "wake", "receive": "got",
}


def _value(amap: AddressMap, event: Event) -> str:
    if event.kind in ("fence", "wait", "wake"):
        return ""
    if event.kind == "receive":
        return hex_bytes(event.value)
    if event.hi - event.lo == 1 and amap.place(event.lo).region is not Region.DATA:
        return str(event.value[0])
    if all(amap.place(o).region is not Region.DATA for o in range(event.lo, event.hi)):
        return " ".join(str(b) for b in event.value)
    return hex_bytes(event.value)


def format_events(amap: AddressMap, events: Sequence[Event]) -> list[str]:
    """One line per event: step number (blank for what a thread does alone), thread, what it
    did, where (decoded: ``chunk 0 read flag r1``), the value, and a note."""
    rows = []
    for event in events:
        where = amap.describe(event.lo, event.hi) if event.hi > event.lo else ""
        if event.kind in ("fence", "wait", "wake", "receive"):
            where = ""
        step = f"{event.step:>4}" if event.step is not None else "    "
        value = _value(amap, event)
        arrow = "->" if event.kind in ("load", "read") else ("=" if value else "")
        body = f"{where} {arrow} {value}".strip() if where else value
        line = f"{step}  {event.actor:<10} {_VERBS.get(event.kind, event.kind):<7} {body}"
        if event.note:
            line = f"{line:<62} {event.note}" if len(line) < 62 else f"{line}  {event.note}"
        rows.append(line.rstrip())
    return rows


def format_received(payloads: Sequence[bytes], received: dict[str, list[bytes]]) -> list[str]:
    """``reader r0: 0 1 1 (expected 0 1 2)``: each message as the index of the payload it
    equals, ``?`` for bytes the writer never sent."""
    expected = " ".join(str(i) for i in range(len(payloads)))
    lines = []
    for name, got in received.items():
        seen = " ".join(str(payloads.index(p)) if p in payloads else "?" for p in got)
        lines.append(f"{name}: {seen or '(nothing)'}   (expected {expected})")
    return lines


def format_violation(violation: Violation) -> str:
    clause = f" [{violation.clause}]" if violation.clause else ""
    return f"{violation.kind}{clause} at step {violation.step}: {violation.message}"


def memory_log(amap: AddressMap, events: Sequence[Event], title: str = "") -> MemoryLog:
    """The trace as a :class:`MemoryLog`: one event per line of :func:`format_events`, the
    thread as the process, the step as the order number, the place decoded as the field."""
    out = []
    for event in events:
        ranged = event.hi > event.lo and event.kind not in ("fence", "wait", "wake", "receive")
        out.append(MemoryEvent(
            process=event.actor, op=_VERBS.get(event.kind, event.kind),
            field=amap.describe(event.lo, event.hi) if ranged else "",
            address=event.lo if ranged else None, value=_value(amap, event),
            step=event.step, note=event.note))
    return MemoryLog(out, title)
