"""Every wire change between consecutive releases, with the encode/decode that shows whether it
breaks.

:func:`find_changes` compares each struct, enum and constant table at consecutive derived
releases. A change is one of: ``insertion`` (a field added before the end of an array),
``removal``, ``reorder``, ``type change``, ``new required field``, ``renumbered code`` (an enum
value, request-type byte or extension code that names another thing). Array structs that only
append defaulted fields, and map structs that only add defaulted keys, are no change.

Each change is then tried both ways (old writes, new reads; new writes, old reads) with the
classes built for each release (:func:`enginewire.spec.classes.build`) and the sampler of
:mod:`.compat`. It is a ``break`` when a direction raises or a field both sides have decodes to
another value; otherwise it is listed with ``break = false`` (both sides decode it the same).
:func:`write_changes` writes ``history/changes.toml``; the docs page lists the breaks.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..schema import EnumSpec, StructSpec
from ..versions import VersionRange
from .compat import _SKIP, _dec_hook, _named, _same, _Sampler, spec_for


@dataclass
class Change:
    """One wire change of one struct (or table) between two consecutive releases."""

    subject: str
    old: str
    new: str
    kinds: list[str]
    detail: str
    is_break: bool = False
    evidence: str = ""


def _struct_kinds(old: StructSpec, new: StructSpec) -> tuple[list[str], str]:
    kinds: list[str] = []
    notes: list[str] = []
    before = [f.name for f in old.fields]
    after = [f.name for f in new.fields]
    old_by, new_by = {f.name: f for f in old.fields}, {f.name: f for f in new.fields}
    positional = new.encoding in ("array", "tuple")
    if old.encoding != new.encoding:
        kinds.append("encoding change")
        notes.append(f"encoding {old.encoding} -> {new.encoding}")
    removed = [n for n in before if n not in new_by]
    added = [n for n in after if n not in old_by]
    if removed:
        kinds.append("removal")
        notes.append(f"removed {removed}")
    if positional:
        inserted = [n for n in added if after.index(n) < len(after) - len(
            [a for a in after[after.index(n):] if a in added])]
        if inserted:
            kinds.append("insertion")
            notes.append(f"inserted {inserted}")
        common_old = [n for n in before if n in new_by]
        common_new = [n for n in after if n in old_by]
        if common_old != common_new:
            kinds.append("reorder")
            notes.append(f"order {common_old} -> {common_new}")
    required = [n for n in added if new_by[n].required]
    if required:
        kinds.append("new required field")
        notes.append(f"new required {required}")
    retyped = [n for n in after if n in old_by and old_by[n].type != new_by[n].type]
    if retyped:
        kinds.append("type change")
        notes.append("; ".join(f"{n}: {old_by[n].type} -> {new_by[n].type}" for n in retyped))
    return kinds, "; ".join(notes)


def _try(writer: str, reader: str, name: str) -> tuple[str, str]:
    """Encode a filled ``name`` with ``writer``'s classes, decode with ``reader``'s."""
    from enginewire.spec.classes import build

    wspec = spec_for(writer)
    sample = _Sampler(wspec).struct(wspec.struct(name))
    if sample is _SKIP:
        return "untried", "no sample value for a required field"
    wobj = msgspec.convert(sample, build(writer)[name], dec_hook=_dec_hook)
    data = msgspec.msgpack.encode(wobj)
    try:
        robj = msgspec.msgpack.decode(data, type=build(reader)[name], dec_hook=_dec_hook)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return "rejected", f"{writer} -> {reader}: the reader raised: {exc}"
    wvalues, rvalues = _named(wobj), _named(robj)
    moved = sorted(k for k in rvalues if k in wvalues and not _same(rvalues[k], wvalues[k]))
    if moved:
        return "silent", f"{writer} -> {reader}: decoded with other values in {moved}"
    return "decoded", f"{writer} -> {reader}: every field both sides have kept its value"


def _enum_change(name: str, old: EnumSpec, new: EnumSpec, a: str, b: str) -> Change | None:
    old_map = {m.name: m.value for m in old.members}
    new_map = {m.name: m.value for m in new.members}
    new_by_value = {m.value: m.name for m in new.members}
    moved = [n for n, v in old_map.items() if n in new_map and new_map[n] != v]
    renamed = [(n, new_by_value[v]) for n, v in old_map.items()
               if v in new_by_value and new_by_value[v] != n and n not in new_map
               and new_by_value[v] in old_map]
    removed = [n for n in old_map if n not in new_map and n not in dict(renamed)]
    if not (moved or renamed or removed):
        return None
    change = Change(name, a, b, ["renumbered code"] if moved or renamed else ["removal"],
                    f"old {old_map}, new {new_map}")
    # Confirm: each old member's value, encoded, decoded by the new enum.
    evidence = []
    for member, value in old_map.items():
        if member not in new_map and new_by_value.get(value) not in (None, *old_map):
            continue  # renamed in place: the same value, a name the old enum lacks
        data = msgspec.msgpack.encode(value)
        decoded = msgspec.msgpack.decode(data)
        meaning = new_by_value.get(decoded)
        if meaning != member:
            evidence.append(f"{member}={value} decodes as {meaning or 'no member (rejected)'}")
    change.is_break = bool(evidence)
    change.evidence = "; ".join(evidence) or "every old value decodes to the same name"
    return change


def _table_changes(data_dir: Path, releases: list[str]) -> list[Change]:
    path = data_dir / "history" / "constants.toml"
    with path.open("rb") as handle:
        raw = tomllib.load(handle)
    out = []
    for table in ("request_types", "ext_codes"):
        def at(version: str, rows: list[dict[str, Any]] = raw[table]) -> dict[str, Any]:
            return next(r["values"] for r in rows if version in VersionRange.parse(r["versions"]))

        for a, b in zip(releases, releases[1:], strict=False):
            old, new = at(a), at(b)
            if old == new:
                continue
            new_by_code = {v: k for k, v in new.items()}
            evidence = []
            renamed = [f"{name} -> {new_by_code[code]}" for name, code in old.items()
                       if name not in new and code in new_by_code
                       and new_by_code[code] not in old]
            for name, code in old.items():
                if name not in new and new_by_code.get(code) not in old:
                    continue  # renamed in place (same code, a name the old table lacks)
                frame = msgspec.msgpack.encode(msgspec.msgpack.Ext(code, b"x")
                                               if table == "ext_codes" else bytes([code]))
                decoded = msgspec.msgpack.decode(frame)
                got = decoded.code if table == "ext_codes" else decoded[0]
                meaning = new_by_code.get(got)
                if meaning != name:
                    evidence.append(f"{name}={code} is {meaning or 'unknown'} to {b}")
            kinds = ["renumbered code"] if evidence else ["rename"] if renamed else ["addition"]
            out.append(Change(table, a, b, kinds, f"{old} -> {new}", bool(evidence),
                              "; ".join(evidence) or "every old code keeps its meaning"
                              + (f" (renamed: {', '.join(renamed)})" if renamed else "")))
    return out


def find_changes(data_dir: Path, releases: list[str]) -> list[Change]:
    changes: list[Change] = []
    for a, b in zip(releases, releases[1:], strict=False):
        old_spec, new_spec = spec_for(a, data_dir), spec_for(b, data_dir)
        for name in sorted(set(old_spec.structs) & set(new_spec.structs)):
            old, new = old_spec.structs[name], new_spec.structs[name]
            if isinstance(old, EnumSpec) and isinstance(new, EnumSpec):
                found = _enum_change(name, old, new, a, b)
                if found is not None:
                    changes.append(found)
                continue
            if not (isinstance(old, StructSpec) and isinstance(new, StructSpec)):
                continue
            kinds, detail = _struct_kinds(old, new)
            if not kinds:
                continue
            change = Change(name, a, b, kinds, detail)
            outcomes = [_try(a, b, name), _try(b, a, name)]
            change.is_break = any(o in ("rejected", "silent") for o, _ in outcomes)
            change.evidence = " | ".join(text for _, text in outcomes)
            changes.append(change)
    changes.extend(_table_changes(data_dir, releases))
    return changes


def write_changes(data_dir: Path, changes: list[Change]) -> None:
    lines = ["# Wire changes between consecutive derived releases (`enginewire spec history`).",
             "# break: an encode with one release's classes and a decode with the other's",
             "# raised or moved a value (evidence says which); false: both decode it the same.",
             ""]
    for change in sorted(changes, key=lambda c: (c.subject, _key(c.old))):
        lines += ["[[changes]]", f"subject = {json.dumps(change.subject)}",
                  f"old = {json.dumps(change.old)}", f"new = {json.dumps(change.new)}",
                  f"kinds = {json.dumps(change.kinds)}", f"break = {str(change.is_break).lower()}",
                  f"detail = {json.dumps(change.detail)}",
                  f"evidence = {json.dumps(change.evidence)}", ""]
    (data_dir / "history" / "changes.toml").write_text("\n".join(lines).rstrip("\n") + "\n")


def read_changes(data_dir: Path) -> list[Change]:
    path = data_dir / "history" / "changes.toml"
    if not path.exists():
        return []
    with path.open("rb") as handle:
        rows = tomllib.load(handle).get("changes", [])
    return [Change(r["subject"], r["old"], r["new"], r["kinds"], r["detail"], r["break"],
                   r["evidence"]) for r in rows]


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))
