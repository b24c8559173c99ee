"""Merge the layouts of every release into version ranges in ``spec/data``.

Contract of :func:`derive`:

- the scope starts at the first release whose ``EngineCoreRequest`` is a msgspec array struct
  (the V1 engine-core IPC over ZMQ and msgpack) and ends at the newest release given;
- a struct's range is the run of releases, ending at the newest, in which the class exists with
  the encoding the spec gives it (a class of another kind earlier is noted in
  ``history/structs.toml``, not merged);
- a field entry in ``structs/<Name>.toml`` is one (name, type, default) over one run of
  releases; a type or default change, or a move, starts a new entry with the same name, placed
  so that the entries active at any release, in file order, are that release's fields in
  declaration order (the position order of an array struct);
- entries active at the newest release are the hand-written ones: only their ``versions`` line
  is written; older entries are generated (and replaced on every run);
- a ``versions`` key is written where an entry's range differs from its struct's;
- annotations outside the type grammar become ``any`` with the raw annotation in the
  description and in ``history/structs.toml``;
- the request-type table, extension codes, zero-copy threshold, ring constants, handshake keys,
  ready response and the input/output transport per range go to ``history/constants.toml``;
  the releases to ``history/releases.toml``.

The same wheels always give byte-identical files (the reproducibility test relies on it).
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..versions import parse_version
from .extract import ClassFacts, FieldFacts, WheelSource
from .protocol_facts import (
    ENVS_MODULE,
    SERIAL_MODULE,
    SHM_MODULE,
    chunk_framing,
    dp_coordinator,
    engine_core_dead,
    handshake_keys,
    init_message,
    pickle_opt_in,
    ready_response,
    tensor_form,
    utility_payload,
)
from .transport_facts import transport
from .wheels import write_releases

#: Where vLLM keeps the non-struct facts (module, name); the serial, envs and ring modules
#: are :mod:`.protocol_facts`'.
ENGINE_MODULE = "vllm.v1.engine"
THRESHOLD_ENV = "VLLM_MSGPACK_ZERO_COPY_THRESHOLD"

#: spec encoding -> extracted kinds that travel the same way.
_KINDS = {"array": {"array"}, "map": {"map"}, "dataclass": {"dataclass"}, "tuple": {"tuple"}}


@dataclass
class ReleaseFacts:
    """What one release defines."""

    version: str
    classes: dict[str, ClassFacts | None] = field(default_factory=dict)
    request_types: list[tuple[str, int]] = field(default_factory=list)
    ext_codes: dict[str, int] = field(default_factory=dict)
    threshold: int | None = None
    ring: dict[str, int | float] = field(default_factory=dict)
    #: HELLO / READY -> required and optional keys (:mod:`.protocol_facts`).
    handshake: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    ready_response: str = "none"
    chunk_framing: dict[str, int | str] = field(default_factory=dict)
    #: The input/output channels' sockets, binds, identity and readiness
    #: (:mod:`.transport_facts`).
    transport: dict[str, Any] = field(default_factory=dict)
    #: How the engine reads the init message (:func:`.protocol_facts.init_message`).
    init_message: dict[str, Any] = field(default_factory=dict)
    #: how the encoder writes a tensor and an array (:func:`.protocol_facts.tensor_form`).
    tensor_form: dict[str, int | str] = field(default_factory=dict)
    #: The UTILITY payload's items (:func:`.protocol_facts.utility_payload`).
    utility_payload: list[str] = field(default_factory=list)
    #: The insecure-serialization opt-in (:func:`.protocol_facts.pickle_opt_in`).
    pickle_opt_in: dict[str, Any] = field(default_factory=dict)
    #: The sentinel of a dying engine (:func:`.protocol_facts.engine_core_dead`).
    engine_core_dead: dict[str, Any] = field(default_factory=dict)
    #: The DP coordinator (:func:`.protocol_facts.dp_coordinator`).
    dp_coordinator: dict[str, Any] = field(default_factory=dict)


@dataclass
class SpecStruct:
    """What the spec files say about one struct or enum (the parts derivation needs)."""

    name: str
    kind: str  # "enum" or the struct encoding
    module: str
    path: Path


def spec_structs(data_dir: Path) -> dict[str, SpecStruct]:
    found = {}
    for path in sorted((data_dir / "structs").glob("*.toml")):
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
        kind = "enum" if raw.get("kind") == "enum" else raw["encoding"]
        found[raw["name"]] = SpecStruct(raw["name"], kind, raw["vllm_class"].split(":")[0], path)
    return found


# --- one release -------------------------------------------------------------------------


def extract_release(version: str, wheel: Path, structs: dict[str, SpecStruct],
                    hints: dict[str, list[str]]) -> ReleaseFacts:
    """Every spec struct and constant as the wheel of ``version`` defines them.

    ``hints`` (struct name -> modules) is read and updated: where a class was found is where
    the next (older) release is searched first.
    """
    facts = ReleaseFacts(version)
    known = set(structs)
    with WheelSource(wheel) as source:
        enums: dict[str, dict[str, int | str]] = {}
        order = sorted(structs.values(), key=lambda s: (s.kind != "enum", s.name))
        for item in order:
            where = hints.setdefault(item.name, [item.module])
            found = source.describe_class(item.name, where, known, enums)
            facts.classes[item.name] = found
            if found is None:
                continue
            if found.module not in where:
                where.insert(0, found.module)
            if found.kind == "enum":
                enums[item.name] = dict(found.members)
        request_types = source.describe_class("EngineCoreRequestType", [ENGINE_MODULE], known)
        if request_types is not None:
            facts.request_types = [(n, v) for n, v in request_types.members if isinstance(v, int)]
        for name in ("CUSTOM_TYPE_TENSOR", "CUSTOM_TYPE_PICKLE", "CUSTOM_TYPE_CLOUDPICKLE",
                     "CUSTOM_TYPE_RAW_VIEW"):
            value = source.module_constant(SERIAL_MODULE, name)
            if isinstance(value, int):
                facts.ext_codes[name.removeprefix("CUSTOM_TYPE_").lower()] = value
        facts.threshold = _env_default(source, THRESHOLD_ENV)
        facts.ring = _ring_constants(source)
        facts.handshake = handshake_keys(source)
        facts.ready_response = ready_response(source)
        facts.chunk_framing = chunk_framing(source)
        facts.transport = transport(source, bool(facts.handshake), facts.ready_response)
        facts.init_message = init_message(source)
        facts.tensor_form = tensor_form(source)
        facts.utility_payload = utility_payload(source)
        facts.pickle_opt_in = pickle_opt_in(source)
        facts.engine_core_dead = engine_core_dead(source)
        facts.dp_coordinator = dp_coordinator(source)
    return facts


def _env_default(source: WheelSource, name: str) -> int | None:
    filename = source.module_file(ENVS_MODULE)
    if filename is None:
        return None
    match = re.search(rf'os\.getenv\(\s*"{name}"\s*,\s*"(\d+)"', source.text(filename))
    return int(match.group(1)) if match else None


def _ring_constants(source: WheelSource) -> dict[str, int | float]:
    """The ring constants ``spec diff`` also checks, where the wheel has them as literals."""
    found: dict[str, int | float] = {}
    filename = source.module_file(SHM_MODULE)
    if filename is None:
        return found
    for key, name in (("reader_recheck_interval_ms", "SHM_READER_RECHECK_INTERVAL_MS"),
                      ("notify_poll_interval_s", "SHM_NOTIFY_POLL_INTERVAL_S")):
        value = source.module_constant(SHM_MODULE, name)
        if isinstance(value, int | float):
            found[key] = value
    queue_class = source.find_class("MessageQueue", [SHM_MODULE])
    for node in [queue_class[1]] if queue_class else []:
        if isinstance(node, ast.ClassDef) and node.name == "MessageQueue":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args.args[len(item.args.args) - len(item.args.defaults):]
                    for arg, default in zip(args, item.args.defaults, strict=True):
                        if arg.arg in ("max_chunk_bytes", "max_chunks"):
                            try:
                                value = ast.literal_eval(default)
                            except ValueError:
                                continue
                            if isinstance(value, int):
                                found[f"{arg.arg}_default"] = value
    return found


# --- merging -----------------------------------------------------------------------------


def _identity(f: FieldFacts) -> tuple[Any, ...]:
    # Annotations outside the grammar are all ``any`` in the spec: one entry for all of them
    # (history/structs.toml keeps the raw text per release).
    return (f.name, f.type or "any", f.required, f.default, f.default_factory, f.raw_default)


@dataclass
class Entry:
    """One field (or enum member) entry: an identity over a run of releases."""

    key: tuple[Any, ...]
    releases: list[str]
    facts: Any
    #: The hand-written block (entries active at the newest release).
    block: str | None = None


def merge_runs(sequences: list[tuple[str, list[tuple[Any, ...]], list[Any]]]) -> list[Entry]:
    """Merge per-release sequences (newest first) into ordered entries.

    Each release's keys are matched to the entries active at the next newer release by a
    longest common subsequence; the unmatched ones become new entries placed right after the
    previous key of the same release, so filtering the result by a release gives that
    release's order.
    """
    merged: list[Entry] = []
    newer: str | None = None
    for version, keys, payloads in sequences:
        if newer is None:
            merged = [Entry(k, [version], p) for k, p in zip(keys, payloads, strict=True)]
            newer = version
            continue
        active = [e for e in merged if e.releases[-1] == newer]
        pairs = _lcs([e.key for e in active], keys)
        matched = {j: active[i] for i, j in pairs}
        previous: Entry | None = None
        for j, key in enumerate(keys):
            entry = matched.get(j)
            if entry is not None:
                entry.releases.append(version)
            else:
                entry = Entry(key, [version], payloads[j])
                at = 0 if previous is None else _index(merged, previous) + 1
                merged.insert(at, entry)
            previous = entry
        newer = version
    return merged


def _index(entries: list[Entry], wanted: Entry) -> int:
    return next(i for i, e in enumerate(entries) if e is wanted)


def _lcs(a: list[Any], b: list[Any]) -> list[tuple[int, int]]:
    lengths = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            lengths[i][j] = (lengths[i + 1][j + 1] + 1 if a[i] == b[j]
                             else max(lengths[i + 1][j], lengths[i][j + 1]))
    pairs = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i += 1
            j += 1
        elif lengths[i + 1][j] >= lengths[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


# --- struct files ------------------------------------------------------------------------

_HEADER = re.compile(r"^\[\[?([A-Za-z0-9_.]+)\]\]?\s*$")


def split_chunks(text: str) -> list[tuple[str, str]]:
    """(table name, text) per top-level chunk; the part before the first table is named ''."""
    chunks: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines(keepends=True):
        match = _HEADER.match(line)
        if match:
            chunks.append((match.group(1), [line]))
        else:
            chunks[-1][1].append(line)
    return [(name, "".join(lines)) for name, lines in chunks]


def _chunk_value(chunk: str) -> dict[str, Any]:
    body = chunk.split("\n", 1)[1] if "\n" in chunk else ""
    return tomllib.loads(body)


def _set_versions(chunk: str, versions: str | None, *, after: str) -> str:
    """``chunk`` with its ``versions = ...`` line replaced (None: removed), placed after the
    ``after = ...`` line."""
    lines = [line for line in chunk.splitlines(keepends=True)
             if not line.startswith("versions = ")]
    if versions is None:
        return "".join(lines)
    for index, line in enumerate(lines):
        if line.startswith(f"{after} = "):
            lines.insert(index + 1, f"versions = {json.dumps(versions)}\n")
            return "".join(lines)
    raise ValueError(f"no {after!r} line in chunk {chunk[:60]!r}")


def range_text(releases: list[str], newest: str) -> str:
    ordered = sorted(releases, key=parse_version)
    low, high = ordered[0], ordered[-1]
    if high == newest:
        return f"{low}+"
    return low if low == high else f"{low}-{high}"


def _field_block(facts: FieldFacts, versions: str, structs: set[str]) -> str:
    lines = ["[[fields]]", f"name = {json.dumps(facts.name)}"]
    notes = []
    type_text = facts.type
    if type_text is None:
        type_text = "any"
        notes.append("Its annotation is outside the spec's type grammar: typed any here, the "
                     "raw annotation per release is in history/structs.toml.")
    lines.append(f"type = {json.dumps(type_text)}")
    lines.append(f"versions = {json.dumps(versions)}")
    if facts.required:
        lines.append("required = true")
    elif facts.default_factory is not None:
        lines.append(f"default_factory = {json.dumps(facts.default_factory)}")
    elif facts.default is not None:
        lines.append(f"default = {json.dumps(facts.default)}")
    else:
        default = _raw_default(facts.raw_default or "", type_text, structs)
        lines.append(f"default = {json.dumps(default)}")
        notes.append(f"The default `{facts.raw_default}` is no JSON literal; written as "
                     f"{default}.")
    text = "Derived from the released wheels. " + " ".join(notes)
    lines.append(f"description = {json.dumps(text.strip())}")
    return "\n".join(lines) + "\n\n"


def _raw_default(raw: str, type_text: str, structs: set[str]) -> str:
    """A JSON stand-in for a default written as code: ``Name()`` of a struct is ``{}``."""
    call = re.fullmatch(r"(\w+)\(\)", raw)
    if call and (call.group(1) in structs or call.group(1) == type_text):
        return "{}"
    if "none" in type_text.split(" | ") or type_text == "any":
        return "null"
    return "{}" if type_text in structs else "null"


def _member_block(name: str, value: int | str, versions: str) -> str:
    return (f"[[members]]\nname = {json.dumps(name)}\nvalue = {json.dumps(value)}\n"
            f"versions = {json.dumps(versions)}\n\n")


@dataclass
class StructHistory:
    """What derivation learned about one struct beyond its file."""

    name: str
    first: str | None
    kinds: dict[str, str] = field(default_factory=dict)
    raw_types: dict[str, dict[str, str]] = field(default_factory=dict)
    problem: str | None = None


def derive_struct(item: SpecStruct, releases: list[ReleaseFacts]) -> StructHistory:
    """Rewrite ``item``'s file with ranges from ``releases`` (newest first)."""
    newest = releases[0].version
    history = StructHistory(item.name, None)
    run: list[tuple[str, ClassFacts]] = []
    for release in releases:
        found = release.classes.get(item.name)
        if found is None:
            break
        history.kinds[release.version] = found.kind
        if found.kind != "class" and found.kind not in _KINDS.get(item.kind, {"enum"}):
            break
        run.append((release.version, found))
    if not run:
        history.problem = f"not found in the newest release {newest}"
        return history
    history.first = run[-1][0]
    text = item.path.read_text()
    chunks = split_chunks(text)
    table = "members" if item.kind == "enum" else "fields"
    current: list[tuple[str, str]] = []
    for name, chunk in chunks:
        if name != table:
            continue
        value = _chunk_value(chunk)
        versions = value.get("versions")
        if versions is None or _contains(versions, newest):
            current.append((value["name"], chunk))
    opaque = all(not facts.fields and not facts.members for _, facts in run) or \
        any(facts.kind == "class" for _, facts in run)
    sequences: list[tuple[str, list[tuple[Any, ...]], list[Any]]]
    if item.kind == "enum":
        sequences = [(v, [(n, val) for n, val in f.members], [None] * len(f.members))
                     for v, f in run]
    else:
        sequences = [(v, [_identity(x) for x in f.fields], list(f.fields)) for v, f in run]
        for version, facts in run:
            for fld in facts.fields:
                if fld.type is None:
                    history.raw_types.setdefault(fld.name, {})[version] = fld.raw_type
    names = [n for n, _ in current]
    newest_names = [k[0] for k in sequences[0][1]]
    if opaque:
        entries = None
    elif names != newest_names:
        history.problem = (f"the spec's {table} {names} differ from the newest wheel's "
                           f"{newest_names}: history not derived")
        entries = None
    else:
        entries = merge_runs(sequences)
        for entry, (_, chunk) in zip([e for e in entries if e.releases[0] == newest], current,
                                     strict=True):
            entry.block = chunk
        entries = _split_unfit_defaults(item.name, entries, releases)
    struct_range = range_text([v for v, _ in run], newest)
    out: list[str] = []
    body_written = False
    for name, chunk in chunks:
        if name == "":
            out.append(_set_versions(chunk, struct_range, after="wire" if item.kind == "enum"
                                     else "encoding"))
            continue
        if name == table and entries is not None:
            if not body_written:
                out.extend(_entry_text(e, item, struct_range, newest, table) for e in entries)
                body_written = True
            continue
        out.append(chunk)
    if out and not out[-1].endswith("\n\n") and entries is not None:
        pass
    new_text = "".join(out).rstrip("\n") + "\n"
    item.path.write_text(new_text)
    return history


def _split_unfit_defaults(struct: str, entries: list[Entry],
                          releases: list[ReleaseFacts]) -> list[Entry]:
    """Cut a hand-written entry whose default is an object of a struct at the first older
    release whose struct lacks one of the object's keys; the older releases get a generated
    entry with their own default (a hand-written default describes the newest release)."""
    by_version = {r.version: r for r in releases}
    out: list[Entry] = []
    for entry in entries:
        cut = _unfit_release(entry, by_version) if entry.block is not None else None
        if cut is None:
            out.append(entry)
            continue
        index = entry.releases.index(cut)
        newer, older = entry.releases[:index], entry.releases[index:]
        found = by_version[cut].classes[struct]
        facts = next(f for f in found.fields if f.name == entry.key[0]) if found else entry.facts
        out.append(Entry(entry.key, older, facts))
        entry.releases = newer
        out.append(entry)
    return out


def _unfit_release(entry: Entry, by_version: dict[str, ReleaseFacts]) -> str | None:
    value = _chunk_value(entry.block or "\n")
    default = value.get("default")
    if default is None:
        return None
    try:
        parsed = json.loads(default)
    except json.JSONDecodeError:
        return None
    names = [n for n in re.findall(r"[A-Za-z_]\w*", value.get("type", ""))
             if n[0].isupper()]
    if not isinstance(parsed, dict) or len(names) != 1:
        return None
    for version in entry.releases:
        nested = by_version[version].classes.get(names[0])
        if nested is not None and set(parsed) - {f.name for f in nested.fields}:
            return version
    return None


def _entry_text(entry: Entry, item: SpecStruct, struct_range: str, newest: str,
                table: str) -> str:
    versions = range_text(entry.releases, newest)
    if entry.block is not None:
        shown = None if versions == struct_range else versions
        block = _set_versions(entry.block, shown, after="value" if table == "members" else "type")
        return block if block.endswith("\n\n") else block.rstrip("\n") + "\n\n"
    if table == "members":
        name, value = entry.key
        return _member_block(name, value, versions)
    return _field_block(entry.facts, versions, set())


def _contains(versions: str, version: str) -> bool:
    from ..versions import VersionRange

    return version in VersionRange.parse(versions)


# --- the whole derivation ----------------------------------------------------------------


def first_ipc_release(facts: ReleaseFacts) -> bool:
    found = facts.classes.get("EngineCoreRequest")
    return found is not None and found.kind == "array"


def derive(data_dir: Path, wheels: dict[str, Path], log: Callable[[str], None] = print,
           *, use_cache: bool = True, changes: bool = True) -> list[StructHistory]:
    """Derive the history of every struct in ``data_dir`` from ``wheels`` (version -> path).

    With ``use_cache``, what a wheel gave is kept beside it (``.enginewire-extract/``) under a
    key made of the wheel's name and size, the extractor's source, the structs asked for and
    the search hints; a change to any of them reads the wheel again. With ``changes``, the
    changes between consecutive releases are tried and written (``history/changes.toml``).
    """
    structs = spec_structs(data_dir)
    hints: dict[str, list[str]] = {}
    releases: list[ReleaseFacts] = []
    skipped: dict[str, str] = {}
    for version in sorted(wheels, key=parse_version, reverse=True):
        facts = _cached_extract(version, wheels[version], structs, hints, use_cache)
        if not first_ipc_release(facts):
            skipped[version] = "EngineCoreRequest is no msgspec array struct (no V1 msgpack IPC)"
            log(f"{version}: before the V1 engine-core IPC, left out")
            continue
        releases.append(facts)
        log(f"{version}: read")
    histories = [derive_struct(item, releases) for item in structs.values()]
    write_releases(data_dir, [r.version for r in releases], skipped)
    write_history(data_dir, releases, histories)
    if not changes:  # a data directory without surfaces (tests) cannot load
        return histories
    from .breaks import find_changes, write_changes

    ordered = sorted((r.version for r in releases), key=parse_version)
    write_changes(data_dir, find_changes(data_dir, ordered))
    return histories


def _runs(values: list[tuple[str, Any]], newest: str) -> list[tuple[str, Any]]:
    """(range, value) for each run of equal values; ``values`` newest first."""
    runs: list[tuple[list[str], Any]] = []
    for version, value in values:
        if runs and runs[-1][1] == value:
            runs[-1][0].append(version)
        else:
            runs.append(([version], value))
    return [(range_text(vs, newest), value) for vs, value in runs]


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '"none"'
    return json.dumps(value)


def _threshold_row(release: ReleaseFacts) -> dict[str, Any]:
    """The ``tensor_threshold`` row of one release: the environment variable's default, else
    the module constant the encoder compares with (not configurable), else none."""
    if release.threshold is not None:
        return {"threshold_default": release.threshold}
    fixed = release.tensor_form.get("fixed_threshold")
    if isinstance(fixed, int):
        return {"threshold_default": fixed, "configurable": False}
    return {"threshold_default": None}


def write_history(data_dir: Path, releases: list[ReleaseFacts],
                  histories: list[StructHistory]) -> None:
    """``history/constants.toml`` and ``history/structs.toml``."""
    newest = releases[0].version
    lines = ["# Wire constants per release range, derived from the released wheels",
             "# (`enginewire spec history`); newest range first.", ""]
    tables: list[tuple[str, str, Callable[[ReleaseFacts], Any]]] = [
        ("request_types", "EngineCoreRequestType: name = byte",
         lambda r: dict(r.request_types)),
        ("ext_codes", "msgpack extension codes in vllm/v1/serial_utils.py",
         lambda r: dict(r.ext_codes)),
        ("tensor_threshold", f"default of {THRESHOLD_ENV}, or the module constant the "
         "encoder compares nbytes with (configurable: false) (none: no zero-copy threshold)",
         _threshold_row),
        ("tensor_form", "how the encoder hook writes a tensor and an ndarray (pickle: an "
         "extension type wrapping a pickle stream; numpy: the [dtype, shape, data] tuple of "
         "the numpy view, numpy's dtype.str; tuple: the tuple with the torch dtype name)",
         lambda r: {k: v for k, v in r.tensor_form.items() if k != "fixed_threshold"}),
        ("ring", "shared-memory ring constants found as literals", lambda r: dict(r.ring)),
        ("chunk_framing", "how MessageQueue.enqueue lays a message into a ring chunk after the "
         "overflow byte (buffers: big-endian count and lengths of these widths; pickle: one "
         "pickle stream)", lambda r: dict(r.chunk_framing) or {"framing": None}),
        ("handshake", "keys of the engine's handshake maps (required: in the literal; "
         "optional: added under a condition)", lambda r: dict(r.handshake)),
        ("ready_response", "the engine's ready message on each input DEALER (struct: msgpack "
         "EngineCoreReadyResponse; empty: an empty frame; READY: the bytes b\"READY\"; "
         "handshake: the msgpack READY handshake map, sent on the input socket; none: no such "
         "message)",
         lambda r: {"payload": r.ready_response}),
        ("transport", "the input and output channels: each end's socket type, which end binds, "
         "whether the engine's input socket carries its identity; clients: one input/output "
         "pair per engine or one per front-end client; readiness: how the engine says it is "
         "ready (handshake: the READY map on the handshake socket; handshake-on-input: the "
         "handshake runs on the input socket; input-literal: the bytes b\"READY\" on the input "
         "socket; pipe: a map sent to the parent process over a pipe, no wire form)",
         lambda r: dict(r.transport)),
        ("init_message", "how the engine reads the front end's init message (struct: decoded "
         "as that struct; map: a plain msgpack map read by these keys; none: no such message)",
         lambda r: dict(r.init_message) or {"form": "none"}),
        ("utility_payload", "the UTILITY request's payload items in order, as the engine "
         "unpacks them (none: no UTILITY request)",
         lambda r: {"items": list(r.utility_payload) or "none"}),
        ("pickle_opt_in", "the setting a side turns on before vllm/v1/serial_utils.py "
         "unpickles extension types pickle and cloudpickle (decoder) or falls back to pickle "
         "for a value its hooks cannot carry (encoder), and the sides it guards (none: both "
         "pickle and unpickle without any opt-in)",
         lambda r: dict(r.pickle_opt_in) or {"setting": None}),
        ("engine_core_dead", "the sentinel a dying engine sends as its last message on every "
         "output socket, the bytes of EngineCoreProc.ENGINE_CORE_DEAD (none: the engine dies "
         "without one)", lambda r: dict(r.engine_core_dead) or {"literal": None}),
        ("dp_coordinator", "the DP coordinator process, which owns the coordinator_input, "
         "coordinator_output and stats_publish channels: its class in "
         "vllm/v1/engine/coordinator.py (none: no coordinator, no such channels)",
         lambda r: dict(r.dp_coordinator) or {"class": None}),
    ]
    for key, what, get in tables:
        lines.append(f"# {what}")
        for versions, value in _runs([(r.version, get(r)) for r in releases], newest):
            lines.append(f"[[{key}]]")
            lines.append(f"versions = {json.dumps(versions)}")
            lines.append(f"values = {_toml_value(value)}")
            lines.append("")
    (data_dir / "history").mkdir(exist_ok=True)
    (data_dir / "history" / "constants.toml").write_text("\n".join(lines).rstrip("\n") + "\n")

    lines = ["# Per struct: the first release of its range, the kind of class it was in the",
             "# releases before (where it existed as another kind), annotations recorded raw,",
             "# and why a history could not be derived (problem).", ""]
    for history in sorted(histories, key=lambda h: h.name):
        lines.append(f"[{history.name}]")
        lines.append(f"first = {json.dumps(history.first or 'none')}")
        in_range = set()
        if history.first is not None:
            in_range = {r.version for r in releases
                        if parse_version(r.version) >= parse_version(history.first)}
        earlier = {v: k for v, k in history.kinds.items() if v not in in_range}
        if earlier:
            lines.append(f"earlier_kinds = {_toml_value(earlier)}")
        if history.problem:
            lines.append(f"problem = {json.dumps(history.problem)}")
        if history.raw_types:
            raw = {}
            for name, per in history.raw_types.items():
                ordered = sorted(per.items(), key=lambda kv: parse_version(kv[0]), reverse=True)
                raw[name] = {versions: text for versions, text in _runs(ordered, newest)}
            lines.append(f"raw_types = {_toml_value(raw)}")
        lines.append("")
    (data_dir / "history" / "structs.toml").write_text("\n".join(lines).rstrip("\n") + "\n")


_EXTRACTOR_FILES = ("extract.py", "derive.py", "protocol_facts.py", "transport_facts.py")


def _cached_extract(version: str, wheel: Path, structs: dict[str, SpecStruct],
                    hints: dict[str, list[str]], use_cache: bool) -> ReleaseFacts:
    import hashlib

    import msgspec

    key_source = hashlib.sha256()
    for name in _EXTRACTOR_FILES:
        key_source.update((Path(__file__).parent / name).read_bytes())
    key_source.update(json.dumps([wheel.name, wheel.stat().st_size,
                                  sorted((s.name, s.kind, s.module) for s in structs.values()),
                                  sorted(hints.items())]).encode())
    cache = wheel.parent / ".enginewire-extract" / f"{version}-{key_source.hexdigest()[:20]}.json"
    if use_cache and cache.exists():
        facts = msgspec.json.decode(cache.read_bytes(), type=ReleaseFacts)
        for name, found in facts.classes.items():
            where = hints.setdefault(name, [structs[name].module])
            if found is not None and found.module not in where:
                where.insert(0, found.module)
        return facts
    facts = extract_release(version, wheel, structs, hints)
    if use_cache:
        cache.parent.mkdir(exist_ok=True)
        cache.write_bytes(msgspec.json.encode(facts))
    return facts
