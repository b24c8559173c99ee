"""The history pages of ``enginewire spec docs``: ``history.md`` and ``breaks.md``.

``history.md`` has, for every array-like struct (array and tuple encodings, where position is
meaning), a position x release table: one column per run of consecutive releases with the same
layout, each cell the field at that position (its type where it differs from the previous
column). ``breaks.md`` lists every change of ``history/changes.toml``: first the breaks (an
encode with one release's classes and a decode with the other's raised or moved a value), each
with its release pair, kinds and evidence; then the changes both sides decode the same.
"""

from __future__ import annotations

import json
from typing import Any

from ..loader import DATA_DIR, load
from ..schema import StructSpec
from .breaks import read_changes
from .wheels import read_releases


def history_pages(mark: str) -> dict[str, str]:
    releases = read_releases(DATA_DIR)
    if not releases:
        return {}
    return {"history.md": _history(mark, releases), "breaks.md": _breaks(mark, releases)}


def _history(mark: str, releases: list[str]) -> str:
    specs = {v: load(v) for v in releases}
    lines = [mark, "", "# Struct history: what each array position means, release by release",
             "",
             f"Derived from the {len(releases)} vLLM releases {releases[0]} to {releases[-1]} "
             "(`enginewire spec history`; the list is `spec/data/history/releases.toml`). For "
             "each struct whose position is its meaning, one column per run of releases with "
             "the same layout; a cell is the field at that position, with its type where the "
             "type differs from the column before. Field ranges are in each struct's file and "
             "on the structs page; [breaks.md](breaks.md) lists the changes that break the "
             "wire.", ""]
    names = sorted({n for s in specs.values() for n, item in s.structs.items()
                    if isinstance(item, StructSpec) and item.encoding in ("array", "tuple")})
    for name in names:
        eras: list[tuple[list[str], list[tuple[str, str]]]] = []
        for version in releases:
            item = specs[version].structs.get(name)
            if not isinstance(item, StructSpec):
                continue
            layout = [(f.name, f.type) for f in item.fields]
            if eras and eras[-1][1] == layout:
                eras[-1][0].append(version)
            else:
                eras.append(([version], layout))
        lines += [f"## {name}", ""]
        headers = ["#"] + [vs[0] if len(vs) == 1 else f"{vs[0]}-{vs[-1]}" for vs, _ in eras]
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + " --- |" * len(headers))
        depth = max(len(layout) for _, layout in eras)
        for position in range(depth):
            row = [str(position)]
            previous: tuple[str, str] | None = None
            for _, layout in eras:
                cell = layout[position] if position < len(layout) else None
                if cell is None:
                    row.append("")
                elif previous is not None and previous[0] == cell[0] and previous[1] == cell[1]:
                    row.append(f"`{cell[0]}`")
                elif previous is not None and previous[0] == cell[0]:
                    row.append(f"`{cell[0]}`: `{_pipe(cell[1])}`")
                else:
                    row.append(f"**`{cell[0]}`**: `{_pipe(cell[1])}`")
                previous = cell
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += _constants()
    return "\n".join(lines).rstrip("\n") + "\n"


def _constants() -> list[str]:
    """The tables of ``history/constants.toml``: each with its comment and one row per range
    (request types, extension codes, threshold, ring constants, chunk framing, handshake
    keys, ready response, transport)."""
    import tomllib

    path = DATA_DIR / "history" / "constants.toml"
    if not path.exists():
        return []
    text = path.read_text()
    raw = tomllib.loads(text)
    comments: dict[str, str] = {}
    previous = ""
    for line in text.splitlines():
        if line.startswith("# "):
            previous = line[2:]
        elif line.startswith("[[") and line.strip("[]") not in comments:
            comments[line.strip("[]")] = previous
    lines = ["## Wire constants, handshake keys and chunk framing per release", "",
             "From `spec/data/history/constants.toml` (derived from the wheels like the "
             "structs; newest range first).", ""]
    for table, rows in raw.items():
        if table == "transport":
            lines += _transport(rows, comments.get(table, ""))
            continue
        lines += [f"### {table}", "", _pipe(comments.get(table, "")), "",
                  "| releases | values |", "| --- | --- |"]
        for row in rows:
            value = json.dumps(row["values"], sort_keys=False) if row["values"] else "(none)"
            lines.append(f"| {row['versions']} | `{_pipe(value)}` |")
        lines.append("")
    return lines


def _transport(rows: list[dict[str, Any]], comment: str) -> list[str]:
    """The ``[[transport]]`` table: one row per range, a column per fact."""
    def channel(value: dict[str, Any]) -> str:
        if not value:
            return "(not found)"
        front, engine = value.get("frontend"), value.get("engine")
        bound = {"frontend": f"{front} binds, {engine} connects",
                 "engine": f"{engine} binds, {front} connects"}
        return f"front end {front} / engine {engine} ({bound.get(str(value.get('binds')), '?')})"

    lines = ["### transport", "", _pipe(comment), "",
             "| releases | input | engine identity on input | output | socket pairs | "
             "readiness |", "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        values = row["values"]
        identity = "yes" if values.get("input", {}).get("identity") else "no"
        lines.append(f"| {row['versions']} | {channel(values.get('input', {}))} | {identity} | "
                     f"{channel(values.get('output', {}))} | {values.get('clients', '')} | "
                     f"`{values.get('readiness', '')}` |")
    lines.append("")
    return lines


def _pipe(text: str) -> str:
    return text.replace("|", "\\|")


def _breaks(mark: str, releases: list[str]) -> str:
    changes = read_changes(DATA_DIR)
    breaks = [c for c in changes if c.is_break]
    same = [c for c in changes if not c.is_break]
    lines = [mark, "", "# Wire-breaking changes between vLLM releases", "",
             "Every change between two consecutive derived releases "
             f"({releases[0]} to {releases[-1]}) of a struct, enum, request-type byte or "
             "msgpack extension code (`spec/data/history/changes.toml`, written by `enginewire "
             "spec history`). A change is listed as a break only when it was tried: a value "
             "encoded with the classes built for one release and decoded with the other's "
             "raised or came out with another value in a field both have (the evidence column "
             "says which, each direction). A difference both sides decode the same is no "
             "break; it is listed below the breaks. Kinds: insertion, removal, reorder, type "
             "change, new required field, renumbered code, encoding change.", "",
             f"## Breaks ({len(breaks)})", "",
             "| releases | subject | kinds | what changed | evidence |",
             "| --- | --- | --- | --- | --- |"]
    order = {v: i for i, v in enumerate(releases)}
    for change in sorted(breaks, key=lambda c: (order.get(c.old, 0), c.subject)):
        lines.append(f"| {change.old} → {change.new} | `{change.subject}` | "
                     f"{', '.join(change.kinds)} | {_pipe(change.detail)} | "
                     f"{_pipe(change.evidence)} |")
    lines += ["", f"## Changes both sides decode the same ({len(same)})", "",
              "| releases | subject | kinds | what changed | evidence |",
              "| --- | --- | --- | --- | --- |"]
    for change in sorted(same, key=lambda c: (order.get(c.old, 0), c.subject)):
        lines.append(f"| {change.old} → {change.new} | `{change.subject}` | "
                     f"{', '.join(change.kinds)} | {_pipe(change.detail)} | "
                     f"{_pipe(change.evidence)} |")
    return "\n".join(lines).rstrip("\n") + "\n"
