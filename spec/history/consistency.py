"""Consistency of the committed history, checked without any wheel.

:func:`problems` returns one line per broken rule (empty: consistent):

- ``history/releases.toml`` lists releases, sorted and unique, and every one of them loads;
- every range in a struct file starts at a listed release and, when closed, ends at one;
- a field or member entry's range lies inside its struct's range;
- entries of one name never overlap (the loader refuses that too);
- in ``history/constants.toml`` each table's ranges cover every release once, and the
  handshake keys derived for the newest release are the ones ``handshake.toml`` specifies;
- the ``[[transport]]`` row of the newest release agrees with the transport, handshake and
  frames surfaces: each end's socket type and bind of the input and output channels, the
  engine identity on the input channel, a handshake channel with HELLO and READY, the ready
  response as the first input message, one socket pair per client;
- the UTILITY payload's items derived for the newest release (``[[utility_payload]]``) type
  as the frames surface's utility payload;
- the sentinel of a dying engine derived for the newest release (``[[engine_core_dead]]``)
  is the literal frames.toml gives engine_core_dead, and the newest release has a DP
  coordinator (``[[dp_coordinator]]``) exactly where the transport surface has channels
  with a coordinator end;
- at every release the request type table of ``load(release)`` (``request_types.toml``, its
  entries' ``versions``) is the ``[[request_types]]`` row of the release, name for name and
  byte for byte;
- the insecure-serialization opt-in (``[[pickle_opt_in]]``): the newest release's setting is
  the one ``tensors.toml`` names, and at every release the clauses about the opt-in
  (:data:`OPT_IN_CLAUSES`) hold exactly where the release has it and
  ``tensors.pickle-without-opt-in`` exactly where it has none;
- every default fits its field's type with the structs of each release it holds for;
- ``history/changes.toml`` lists exactly the struct changes the struct files show between
  consecutive releases (so an array struct that changes other than by appending defaulted
  fields inside one range is always listed, with its encode/decode evidence).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from ..loader import DATA_DIR, UTILITY_ITEM_TYPES, Spec, SpecError, load
from ..schema import StructSpec
from ..versions import VersionError, VersionRange, parse_version
from .wheels import read_releases


def problems(data_dir: Path = DATA_DIR) -> list[str]:
    found: list[str] = []
    releases = read_releases(data_dir)
    if not releases:
        return ["history/releases.toml is missing or lists no release"]
    listed = {parse_version(v) for v in releases}
    if len(listed) != len(releases):
        found.append("history/releases.toml lists a release twice")
    for path in sorted((data_dir / "structs").glob("*.toml")):
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
        found.extend(_check_ranges(f"structs/{path.name}", raw, listed))
    found.extend(_check_constants(data_dir, releases))
    found.extend(_check_handshake(data_dir, releases))
    found.extend(_check_transport(data_dir, releases))
    found.extend(_check_utility_payload(data_dir, releases))
    found.extend(_check_messages(data_dir, releases))
    specs = {}
    for version in releases:
        try:
            specs[version] = load(version, data_dir)
        except SpecError as exc:
            found.append(f"release {version} does not load: {exc}")
    found.extend(_check_request_types(data_dir, specs))
    found.extend(_check_pickle_opt_in(data_dir, releases, specs))
    found.extend(_check_append_only(data_dir, releases, specs))
    found.extend(_check_defaults(specs))
    return found


def _check_defaults(specs: dict[str, Spec]) -> list[str]:
    """Every field's default fits its type with the structs of each release it holds for (a
    default object naming a field the nested struct of that release lacks does not)."""
    import json

    from ..loader import _default_problem
    from ..types import parse_type

    out = []
    for version, spec in specs.items():
        for item in spec.structs.values():
            if not isinstance(item, StructSpec):
                continue
            for fld in item.fields:
                if fld.default is None:
                    continue
                problem = _default_problem(json.loads(fld.default), parse_type(fld.type),
                                           spec.structs)
                if problem:
                    out.append(f"{item.name}.{fld.name} at {version}: default {fld.default} "
                               f"does not fit: {problem}")
    return out


def _check_ranges(file: str, raw: dict[str, Any], listed: set[tuple[int, int, int]]) -> list[str]:
    out = []
    try:
        struct_range = VersionRange.parse(raw["versions"])
    except (KeyError, VersionError) as exc:
        return [f"{file}: struct range: {exc}"]
    for rng, where in [(struct_range, "struct")]:
        out.extend(_endpoints(file, where, rng, listed))
    entries = raw.get("fields", raw.get("members", []))
    by_name: dict[str, list[VersionRange]] = {}
    for entry in entries:
        where = f"{entry.get('name')}"
        rng = VersionRange.parse(entry["versions"]) if "versions" in entry else struct_range
        out.extend(_endpoints(file, where, rng, listed))
        if rng.low < struct_range.low or (struct_range.high is not None and (
                rng.high is None or rng.high > struct_range.high)):
            out.append(f"{file}: {where}: range {rng} outside the struct's {struct_range}")
        if any(rng.overlaps(other) for other in by_name.get(where, [])):
            out.append(f"{file}: {where}: entries of one name overlap")
        by_name.setdefault(where, []).append(rng)
    return out


def _endpoints(file: str, where: str, rng: VersionRange,
               listed: set[tuple[int, int, int]]) -> list[str]:
    out = []
    if rng.low not in listed:
        out.append(f"{file}: {where}: range {rng} starts at an unlisted release")
    if rng.high is not None and rng.high not in listed:
        out.append(f"{file}: {where}: range {rng} ends at an unlisted release")
    return out


def _check_constants(data_dir: Path, releases: list[str]) -> list[str]:
    path = data_dir / "history" / "constants.toml"
    if not path.exists():
        return ["history/constants.toml is missing"]
    with path.open("rb") as handle:
        raw = tomllib.load(handle)
    out = []
    for table, rows in raw.items():
        for version in releases:
            hits = sum(version in VersionRange.parse(row["versions"]) for row in rows)
            if hits != 1:
                out.append(f"history/constants.toml: [[{table}]] covers {version} {hits} times")
    return out


def _check_handshake(data_dir: Path, releases: list[str]) -> list[str]:
    """The handshake keys derived for the newest release are the keys ``handshake.toml``
    specifies for HELLO and READY (required there iff in the engine's literal)."""
    path = data_dir / "history" / "constants.toml"
    if not path.exists():
        return []
    with path.open("rb") as handle:
        rows = tomllib.load(handle).get("handshake", [])
    newest = releases[-1]
    derived = next((row["values"] for row in rows
                    if newest in VersionRange.parse(row["versions"])), None)
    if derived is None:
        return [f"history/constants.toml: no [[handshake]] row covers {newest}"]
    spec = load(newest, data_dir)
    out = []
    for message in spec.surface("handshake").messages:
        if message.name not in ("HELLO", "READY"):
            continue
        keys = derived.get(message.name, {})
        wanted = {"required": sorted(k.name for k in message.keys if k.required),
                  "optional": sorted(k.name for k in message.keys if not k.required)}
        for kind in ("required", "optional"):
            if sorted(keys.get(kind, [])) != wanted[kind]:
                out.append(f"history/constants.toml: {message.name} {kind} keys at {newest} "
                           f"are {sorted(keys.get(kind, []))}, handshake.toml says "
                           f"{wanted[kind]}")
    return out


def _check_utility_payload(data_dir: Path, releases: list[str]) -> list[str]:
    """The ``[[utility_payload]]`` items of the newest release, typed, are the frames
    surface's utility payload (the reference release's, which the loader keeps)."""
    from .constants import constants_at

    newest = releases[-1]
    items = constants_at(newest, "utility_payload", data_dir).get("items")
    if not isinstance(items, list):
        return [f"history/constants.toml: no [[utility_payload]] row covers {newest}"]
    unknown = [i for i in items if i not in UTILITY_ITEM_TYPES]
    if unknown:
        return [f"history/constants.toml: UTILITY items {unknown} at {newest} have no type"]
    derived = f"tuple[{', '.join(UTILITY_ITEM_TYPES[str(i)] for i in items)}]"
    spec = load(newest, data_dir)
    payload = next((f.payload for m in spec.surface("frames").messages if m.kind == "utility"
                    for f in m.frames if f.content == "msgpack"), None)
    if payload != derived:
        return [f"history/constants.toml: UTILITY items {items} at {newest} type as "
                f"{derived}, frames.toml says {payload}"]
    return []


def _check_messages(data_dir: Path, releases: list[str]) -> list[str]:
    """The ``[[engine_core_dead]]`` and ``[[dp_coordinator]]`` rows of the newest release
    agree with the frames and transport surfaces (module docstring)."""
    from .constants import constants_at

    newest = releases[-1]
    spec = load(newest, data_dir)
    out = []
    literal = constants_at(newest, "engine_core_dead", data_dir).get("literal")
    sentinel = next((f.literal_hex for m in spec.surface("frames").messages
                     if m.kind == "engine_core_dead" for f in m.frames), None)
    derived = literal.encode("ascii").hex() if isinstance(literal, str) and literal != "none" \
        else None
    if derived != sentinel:
        out.append(f"history/constants.toml: ENGINE_CORE_DEAD at {newest} is {literal!r}, "
                   f"frames.toml gives engine_core_dead the bytes {sentinel}")
    coordinator = constants_at(newest, "dp_coordinator", data_dir).get("class")
    owned = sorted(c.name for c in spec.surface("transport").channels
                   if any(e.role == "coordinator" for e in c.ends))
    if (isinstance(coordinator, str) and coordinator != "none") != bool(owned):
        out.append(f"history/constants.toml: the DP coordinator at {newest} is "
                   f"{coordinator!r}, transport.toml has coordinator channels {owned}")
    return out


def _check_request_types(data_dir: Path, specs: dict[str, Spec]) -> list[str]:
    """At every release the loaded request type table is the history's ``[[request_types]]``
    row (module docstring); a release without a row is no problem here (the constants check
    says a table must cover every release)."""
    from .constants import constants_at

    out = []
    for version, spec in specs.items():
        derived = {str(k): int(v)
                   for k, v in constants_at(version, "request_types", data_dir).items()}
        if not derived:
            continue
        table = {t.name: t.byte for t in spec.surface("request_types").types}
        if table != derived:
            def show(values: dict[str, int]) -> str:
                return ", ".join(f"{n} 0x{b:02x}" for n, b in sorted(values.items(),
                                                                    key=lambda i: i[1]))
            out.append(f"request_types.toml at {version}: {show(table)}; history/constants.toml "
                       f"[[request_types]] says {show(derived)}")
    return out


#: The clauses that speak of the insecure-serialization opt-in: they hold from the release
#: that introduced it; ``tensors.pickle-without-opt-in`` before it.
OPT_IN_CLAUSES = ("tensors.ext-pickle-opt-in", "tensors.insecure-function-cloudpickle",
                  "structs.no-implicit-pickle")
NO_OPT_IN_CLAUSE = "tensors.pickle-without-opt-in"


def _check_pickle_opt_in(data_dir: Path, releases: list[str],
                         specs: dict[str, Spec]) -> list[str]:
    """The ``[[pickle_opt_in]]`` rows agree with the tensors surface and with the ranges of
    the clauses about the opt-in (module docstring)."""
    from .constants import constants_at

    out = []
    newest = releases[-1]
    setting = constants_at(newest, "pickle_opt_in", data_dir).get("setting")
    if newest in specs:
        with (data_dir / "tensors.toml").open("rb") as handle:
            named = tomllib.load(handle).get("pickle_opt_in")
        if setting != named:
            out.append(f"history/constants.toml: [[pickle_opt_in]] setting at {newest} is "
                       f"{setting!r}, tensors.toml names {named!r}")
    for version, spec in specs.items():
        row = constants_at(version, "pickle_opt_in", data_dir)
        if not row:
            continue
        has = row.get("setting") not in (None, "none")
        where = f"history/constants.toml [[pickle_opt_in]] at {version}"
        for clause in OPT_IN_CLAUSES:
            if (clause in spec.clauses) != has:
                out.append(f"{where}: {'an' if has else 'no'} opt-in, but {clause} "
                           f"{'does not hold' if has else 'holds'} there (its versions)")
        if (NO_OPT_IN_CLAUSE in spec.clauses) == has:
            out.append(f"{where}: {'an' if has else 'no'} opt-in, but {NO_OPT_IN_CLAUSE} "
                       f"{'holds' if has else 'does not hold'} there (its versions)")
    return out


def _check_transport(data_dir: Path, releases: list[str]) -> list[str]:
    """The derived ``[[transport]]`` row of the newest release says what the transport,
    handshake and frames surfaces specify (module docstring)."""
    from .constants import constants_at

    newest = releases[-1]
    row = constants_at(newest, "transport", data_dir)
    if not row:
        return [f"history/constants.toml: no [[transport]] row covers {newest}"]
    spec = load(newest, data_dir)
    where = f"history/constants.toml [[transport]] at {newest}"
    out = []
    channels = {c.name: c for c in spec.surface("transport").channels}
    for name in ("input", "output"):
        derived = row.get(name, {})
        channel = channels.get(name)
        if channel is None:
            out.append(f"transport.toml has no {name} channel")
            continue
        ends = {end.role: end for end in channel.ends}
        for role in ("frontend", "engine"):
            end = ends[role]
            if derived.get(role) != end.socket:
                out.append(f"{where}: the {role}'s {name} socket is {derived.get(role)}, "
                           f"transport.toml says {end.socket}")
            if (derived.get("binds") == role) != end.binds:
                out.append(f"{where}: the {name} channel is bound by {derived.get('binds')}, "
                           f"transport.toml says the {role} end binds={end.binds}")
        if name == "input" and bool(derived.get("identity")) != (
                ends["engine"].identity is not None):
            out.append(f"{where}: input identity {derived.get('identity')}, transport.toml's "
                       f"engine input end has identity {ends['engine'].identity!r}")
    handshake = spec.surface("handshake")
    on_handshake = {m.name for m in handshake.messages if m.channel == "handshake"}
    spec_readiness = ("handshake" if "handshake" in channels and {"HELLO", "READY"} <= on_handshake
                      else "none")
    if row.get("readiness") != spec_readiness:
        out.append(f"{where}: readiness {row.get('readiness')}, the surfaces give "
                   f"{spec_readiness} (a handshake channel with HELLO and READY)")
    first = [m.kind for m in spec.surface("frames").messages if m.channel == "input"
             and m.kind == "ready_response"]
    if row.get("readiness") == "handshake" and not first:
        out.append(f"{where}: frames.toml has no ready_response message on the input channel")
    clause = any(c.id == "transport.one-socket-pair-per-client"
                 for c in spec.surface("transport").clauses)
    if (row.get("clients") == "per-client") != clause:
        out.append(f"{where}: clients {row.get('clients')}, transport.toml "
                   f"{'has' if clause else 'lacks'} transport.one-socket-pair-per-client")
    return out


def _check_append_only(data_dir: Path, releases: list[str],
                       specs: dict[str, Spec]) -> list[str]:
    """The changes ``history/changes.toml`` lists are exactly the ones the struct files show
    between consecutive releases (an array struct that changes other than by appending
    defaulted fields is always among them)."""
    from .breaks import _struct_kinds, read_changes

    listed = {(c.subject, c.old, c.new): c.kinds for c in read_changes(data_dir)
              if c.subject not in ("request_types", "ext_codes")}
    shown: dict[tuple[str, str, str], list[str]] = {}
    for old_v, new_v in zip(releases, releases[1:], strict=False):
        if old_v not in specs or new_v not in specs:
            continue
        for name, new in specs[new_v].structs.items():
            old = specs[old_v].structs.get(name)
            if isinstance(new, StructSpec) and isinstance(old, StructSpec):
                kinds, _ = _struct_kinds(old, new)
                if kinds:
                    shown[(name, old_v, new_v)] = kinds
    out = []
    for key in sorted(set(shown) - set(listed)):
        out.append(f"{key[0]}: its layout changes from {key[1]} to {key[2]} ({shown[key]}) "
                   "and history/changes.toml does not list it")
    for key in sorted(set(listed) & set(shown)):
        if listed[key] != shown[key]:
            out.append(f"history/changes.toml: {key}: kinds {listed[key]}, the files show "
                       f"{shown[key]}")
    for key in sorted(k for k in set(listed) - set(shown)
                      if isinstance(specs.get(k[2], None) and specs[k[2]].structs.get(k[0]),
                                    StructSpec)):
        out.append(f"history/changes.toml lists {key}, but the struct files show no change")
    return out


def layout_change(old: StructSpec, new: StructSpec) -> bool:
    """Whether ``new`` is anything but ``old`` with defaulted fields appended."""
    before = [(f.name, f.type) for f in old.fields]
    after = [(f.name, f.type) for f in new.fields]
    if old.encoding != new.encoding or after[:len(before)] != before:
        return True
    return any(f.required for f in new.fields[len(before):])
