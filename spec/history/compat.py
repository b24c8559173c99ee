"""What a front end at release A and an engine at release B make of each other's messages.

:func:`predict` walks every message kind of the frames surface in its direction (the sender's
release writes, the other side's release reads) and compares the two layouts by msgspec's
decoding rules, checked empirically for the msgspec in use:

- array-like struct: elements are matched by position; elements past the reader's last field
  are ignored (``forbid_unknown_fields`` is off in vLLM); missing trailing elements take the
  reader's defaults, and a missing required one raises ``Expected `array` of at least length``;
- NamedTuple (``tuple`` encoding): the array length must lie between the reader's required
  count and its field count, else ``Expected `array` of length N to M``;
- map and dataclass: keys are matched by name; unknown keys are ignored, a missing required
  key raises ``Object missing required field``;
- an int enum decodes any value of its members; a value that names another member on the
  other side is a silent misdecode, one the reader lacks is rejected.

Each finding has a kind, ordered by severity: ``identical`` (no finding), ``compatible``
(trailing fields dropped or filled with defaults, widened types), ``silent`` (a position the
two sides read as different fields, and a realistic value passes the reader's type check),
``rejected`` (the reader raises). :func:`confirm` then encodes a filled-in message with the
classes built for the writer's release and decodes it with the reader's
(:func:`enginewire.spec.classes.build`), and says whether the outcome matches.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..loader import REFERENCE_VLLM_VERSION, Spec, load
from ..schema import EnumSpec, StructSpec
from ..types import TypeExpr, TypeVisitor, kind_of, members, parse_type, scalar_type
from .constants import constants_at

_SPECS: dict[tuple[str, str], Spec] = {}


def spec_for(version: str, data_dir: Path | None = None) -> Spec:
    """``load(version)``, kept for the process: comparisons over every release load each
    release once (the loader's own cache holds a few)."""
    key = (version, str(data_dir))
    found = _SPECS.get(key)
    if found is None:
        found = _SPECS[key] = load(version, data_dir)
    return found


SEVERITY = {"identical": 0, "compatible": 1, "silent": 2, "rejected": 3, "absent": 4}
SIDES = {"frontend": "front end", "engine": "engine"}


@dataclass
class Finding:
    """One difference between the writer's and the reader's layout."""

    kind: str
    path: str
    message: str
    position: int | None = None
    writer_field: str | None = None
    reader_field: str | None = None
    writer_type: str | None = None
    reader_type: str | None = None
    #: For ``silent``: whether a realistic value of the writer's type passes the reader's.
    passes_type_check: bool | None = None


@dataclass
class MessageVerdict:
    """The verdict for one message kind in one direction."""

    kind: str
    channel: str
    writer: str
    reader: str
    payload: str
    verdict: str
    findings: list[Finding] = field(default_factory=list)
    confirmed: bool | None = None
    confirmation: str = ""


# --- type compatibility ------------------------------------------------------------------


def accepts(writer: TypeExpr, reader: TypeExpr, wspec: Spec, rspec: Spec) -> bool:
    """Whether a realistic (non-null where possible) value of ``writer`` decodes as
    ``reader``."""
    wfamily, rfamily = kind_of(writer), kind_of(reader)
    if rfamily == "any":
        return True
    if wfamily == "union":
        candidates = members(writer) or writer.args
        return any(accepts(m, reader, wspec, rspec) for m in candidates)
    if rfamily == "union":
        return any(accepts(writer, m, wspec, rspec) for m in reader.args)
    if wfamily == "any":
        return True
    if wfamily == "sequence" and rfamily == "sequence":
        w = writer.args[0] if writer.args else TypeExpr("any")
        r = reader.args[0] if reader.args else TypeExpr("any")
        return accepts(w, r, wspec, rspec)
    if wfamily == "mapping" and rfamily == "mapping":
        return all(accepts(w, r, wspec, rspec) for w, r in zip(writer.args, reader.args,
                                                                strict=True))
    if writer.name == reader.name:
        return True
    wscalar, rscalar = scalar_type(writer), scalar_type(reader)
    if wscalar is int and rscalar is float:
        return True
    wkind = _kind(writer.name, wspec)
    rkind = _kind(reader.name, rspec)
    if wkind == "int-enum" and rscalar is int:
        return True
    if wscalar is int and rkind == "int-enum":
        return True
    if wkind in ("array", "tuple") and (rkind in ("array", "tuple") or rfamily == "sequence"):
        return True
    if wkind in ("map", "dataclass") and (rkind in ("map", "dataclass") or rfamily == "mapping"):
        return True
    if wfamily == "mapping" and rkind in ("map", "dataclass"):
        # A map's unknown keys are ignored: a realistic map (its keys are no field names of
        # the reader) decodes when the reader requires no field, every field at its default.
        return not any(f.required for f in rspec.struct(reader.name).fields)
    return {wfamily, rfamily} <= {"tensor", "nested_tensors"}


def _kind(name: str, spec: Spec) -> str | None:
    item = spec.structs.get(name)
    if isinstance(item, EnumSpec):
        return f"{item.wire}-enum"
    if isinstance(item, StructSpec):
        return item.encoding
    return None


# --- layout comparison -------------------------------------------------------------------


class _Walker:
    def __init__(self, wspec: Spec, rspec: Spec) -> None:
        self.wspec = wspec
        self.rspec = rspec
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, str]] = set()

    def add(self, kind: str, path: str, message: str, **extra: Any) -> None:
        self.findings.append(Finding(kind, path, message, **extra))

    def types(self, wtext: str, rtext: str, path: str) -> None:
        """Compare two field types; recurse into the structs and enums both name."""
        wexpr, rexpr = parse_type(wtext), parse_type(rtext)
        for name in sorted(wexpr.names() & rexpr.names()):
            self.named(name, f"{path}<{name}>")
        if _canonical(wexpr) == _canonical(rexpr):
            return
        structured = [n for n in wexpr.names() if _kind(n, self.wspec) in
                      ("array", "tuple", "map", "dataclass")]
        if kind_of(rexpr) == "any" and structured:
            self.add("silent", path, f"type '{wtext}' written, 'any' read: the reader keeps the "
                     f"raw array or map of {structured[0]} where it expects the bare value",
                     writer_type=wtext, reader_type=rtext, passes_type_check=True)
            return
        if accepts(wexpr, rexpr, self.wspec, self.rspec):
            widened = not accepts(rexpr, wexpr, self.rspec, self.wspec)
            self.add("compatible", path, f"type '{wtext}' written, '{rtext}' read"
                     + (" (the reader's type is wider)" if widened else ""),
                     writer_type=wtext, reader_type=rtext)
        else:
            self.add("rejected", path, f"type '{wtext}' written, '{rtext}' read: the reader "
                     "raises a type error", writer_type=wtext, reader_type=rtext)

    def named(self, name: str, path: str) -> None:
        if (name, path.split("<")[0]) in self._seen:
            return
        self._seen.add((name, path.split("<")[0]))
        witem, ritem = self.wspec.structs.get(name), self.rspec.structs.get(name)
        if witem is None or ritem is None:
            return
        if isinstance(witem, EnumSpec) and isinstance(ritem, EnumSpec):
            self.enum(witem, ritem, path)
        elif isinstance(witem, StructSpec) and isinstance(ritem, StructSpec):
            self.struct(witem, ritem, path)

    def enum(self, w: EnumSpec, r: EnumSpec, path: str) -> None:
        rvalues = {m.value: m.name for m in r.members}
        for member in w.members:
            other = rvalues.get(member.value)
            if other is None:
                self.add("rejected", f"{path}.{member.name}",
                         f"value {member.value!r} ({member.name}) is no member of the reader's "
                         f"{r.name}: the reader raises when it is sent")
            elif other != member.name:
                self.add("silent", f"{path}.{member.name}",
                         f"value {member.value!r} is {member.name} to the writer, {other} to "
                         "the reader", passes_type_check=True)

    def struct(self, w: StructSpec, r: StructSpec, path: str) -> None:
        if w.encoding != r.encoding and {w.encoding, r.encoding} - {"map", "dataclass"}:
            self.add("rejected", path, f"encoding {w.encoding} written, {r.encoding} read")
            return
        if w.encoding in ("array", "tuple"):
            self.positional(w, r, path)
        else:
            self.by_name(w, r, path)

    def positional(self, w: StructSpec, r: StructSpec, path: str) -> None:
        for index, (wf, rf) in enumerate(zip(w.fields, r.fields, strict=False)):
            where = f"{path}[{index}]"
            if wf.name == rf.name:
                self.types(wf.type, rf.type, f"{where} {wf.name}")
                continue
            passes = accepts(parse_type(wf.type), parse_type(rf.type), self.wspec, self.rspec)
            extra = dict(position=index, writer_field=wf.name, reader_field=rf.name,
                         writer_type=wf.type, reader_type=rf.type, passes_type_check=passes)
            if passes:
                self.add("silent", where, f"the writer's {wf.name} ({wf.type}) is read as "
                         f"{rf.name} ({rf.type})", **extra)
            else:
                self.add("rejected", where, f"the writer's {wf.name} ({wf.type}) is read as "
                         f"{rf.name} ({rf.type}): the reader raises a type error at "
                         f"`$[{index}]`", **extra)
        nw, nr = len(w.fields), len(r.fields)
        if nw > nr:
            dropped = [f.name for f in w.fields[nr:]]
            if r.encoding == "tuple":
                self.add("rejected", path, f"{nw} elements written, the reader's NamedTuple "
                         f"takes at most {nr}: `Expected array of length .. to {nr}`")
            else:
                self.add("compatible", path, f"trailing fields {dropped} dropped by the reader")
        elif nr > nw:
            missing = r.fields[nw:]
            required = [f.name for f in missing if f.required]
            if required:
                self.add("rejected", path, f"the reader needs {required} past the writer's "
                         f"{nw} elements: `Expected array of at least length ...`")
            else:
                self.add("compatible", path,
                         f"trailing fields {[f.name for f in missing]} filled with defaults")

    def by_name(self, w: StructSpec, r: StructSpec, path: str) -> None:
        wfields = {f.name: f for f in w.fields}
        rfields = {f.name: f for f in r.fields}
        for name, rf in rfields.items():
            wf = wfields.get(name)
            if wf is None:
                if rf.required:
                    self.add("rejected", f"{path}.{name}", "the reader requires a key the "
                             "writer never sends: `Object missing required field`")
                else:
                    self.add("compatible", f"{path}.{name}", "filled with its default")
                continue
            if rf.required and not wf.required and w.omit_defaults and w.encoding == "map":
                self.add("rejected", f"{path}.{name}", "the writer omits it at its default, "
                         "the reader requires it: `Object missing required field`")
            self.types(wf.type, rf.type, f"{path}.{name}")
        for name in wfields:
            if name not in rfields:
                self.add("compatible", f"{path}.{name}", "dropped by the reader")


def _canonical(expr: TypeExpr) -> str:
    if kind_of(expr) == "union":
        return " | ".join(sorted(_canonical(a) for a in expr.args))
    if not expr.args:
        return expr.name
    inner = ", ".join(_canonical(a) for a in expr.args)
    return f"{expr.name}[{inner}{', ...' if expr.variadic else ''}]"


def _verdict(findings: list[Finding]) -> str:
    return max((f.kind for f in findings), key=SEVERITY.__getitem__, default="identical")


def _request_type(walker: _Walker, name: str, writer: str, reader: str) -> None:
    """The request-type byte ``name`` travels as at the writer, read with the reader's table."""
    wtable = constants_at(writer, "request_types")
    rtable = constants_at(reader, "request_types")
    if not wtable or not rtable:
        return
    byte = wtable.get(name)
    if byte is None:
        walker.add("absent", f"request type {name}", f"release {writer} has no {name} request "
                   "type")
        return
    meaning = {v: k for k, v in rtable.items()}.get(byte)
    if meaning == name:
        return
    if meaning is None:
        walker.add("rejected", f"request type {name}", f"byte {byte:#04x} is no request type to "
                   f"{reader}: its EngineCoreRequestType(...) raises", position=0)
    else:
        walker.add("silent", f"request type {name}", f"byte {byte:#04x} is {name} to {writer}, "
                   f"{meaning} to {reader}: the payload is handled as a {meaning}",
                   position=0, writer_field=name, reader_field=meaning, passes_type_check=True)


def predict(frontend: str, engine: str) -> list[MessageVerdict]:
    """One verdict per message kind of the frames surface, in its direction."""
    specs = {"frontend": spec_for(frontend), "engine": spec_for(engine)}
    versions = {"frontend": frontend, "engine": engine}
    reference = spec_for(REFERENCE_VLLM_VERSION)
    out: list[MessageVerdict] = []
    for message in reference.surface("frames").messages:
        writer = message.sender if message.sender in specs else None
        if writer is None:
            continue
        reader = "engine" if writer == "frontend" else "frontend"
        wspec, rspec = specs[writer], specs[reader]
        payloads = [f.payload for f in message.frames if f.payload]
        walker = _Walker(wspec, rspec)
        if message.request_type:
            _request_type(walker, message.request_type, versions[writer], versions[reader])
        for payload in payloads:
            names = parse_type(payload).names()
            missing = [n for n in sorted(names) if n not in wspec.structs or
                       n not in rspec.structs]
            if missing:
                for name in missing:
                    side = [s for s, sp in (("writer", wspec), ("reader", rspec))
                            if name not in sp.structs]
                    walker.add("absent", payload, f"{name} does not exist in the "
                               f"{' and '.join(side)}'s release")
                continue
            walker.types(payload, payload, message.kind)
        out.append(MessageVerdict(
            kind=message.kind, channel=message.channel,
            writer=f"{SIDES[writer]} {versions[writer]}",
            reader=f"{SIDES[reader]} {versions[reader]}",
            payload=", ".join(payloads) or "(no payload)",
            verdict=_verdict(walker.findings), findings=walker.findings))
    return out


# --- confirmation by encode/decode --------------------------------------------------------


class _Sampler(TypeVisitor[Any]):
    """Builtins for a type: every value differs from its default and from its neighbours, so
    a value read into the wrong field shows. Tensor-like and ``any`` values are left out
    (null where the type allows, else the field keeps its default). One walk over the type
    expression (:class:`TypeVisitor`: a handler per type constructor, structs and enums from
    the spec); a handler returns :data:`_SKIP` for a value it cannot make."""

    def __init__(self, spec: Spec, *, minimal: bool = False, any_str: bool = False) -> None:
        super().__init__(spec.structs)
        self.spec = spec
        self.counter = 0
        #: Null for every nullable value and defaults for optional fields: the sample other
        #: classes (vLLM's own, with custom field types) can build.
        self.minimal = minimal
        #: A string for ``any`` (as in the transfer-parameter maps vLLM sends) instead of null,
        #: so that a ``dict[str, any]`` read as ``dict[str, str]`` decodes as it would in use.
        self.any_str = any_str

    def next_int(self) -> int:
        self.counter += 1
        return 100 + self.counter

    def value(self, expr: TypeExpr, depth: int) -> Any:
        if self.minimal and expr.nullable:
            return None
        return self.visit(expr, depth)

    def visit_union(self, expr: TypeExpr, depth: int) -> Any:
        for arg in members(expr):
            found = self.value(arg, depth)
            if found is not _SKIP:
                return found
        return None if expr.nullable else _SKIP

    def visit_str(self, expr: TypeExpr, depth: int) -> Any:
        return f"s{self.next_int()}"

    def visit_int(self, expr: TypeExpr, depth: int) -> Any:
        return self.next_int()

    def visit_float(self, expr: TypeExpr, depth: int) -> Any:
        return self.next_int() + 0.5

    def visit_bool(self, expr: TypeExpr, depth: int) -> Any:
        return True

    def visit_any(self, expr: TypeExpr, depth: int) -> Any:
        return f"s{self.next_int()}" if self.any_str else None

    def _left_out(self, expr: TypeExpr, depth: int) -> Any:
        return _SKIP

    visit_bytes = visit_none = visit_slice = visit_tensor = visit_ndarray = _left_out
    visit_nested_tensors = _left_out

    def _items(self, expr: TypeExpr, depth: int) -> Any:
        item = self.value(expr.args[0], depth + 1) if depth < 4 else _SKIP
        return [] if item is _SKIP else [item]

    visit_list = visit_set = _items

    def visit_tuple(self, expr: TypeExpr, depth: int) -> Any:
        if expr.variadic:
            return self._items(expr, depth)
        items = [self.value(a, depth + 1) for a in expr.args]
        return _SKIP if any(i is _SKIP for i in items) else items

    def visit_dict(self, expr: TypeExpr, depth: int) -> Any:
        key = self.value(expr.args[0], depth + 1)
        val = self.value(expr.args[1], depth + 1)
        return {} if _SKIP in (key, val) else {key: val}

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, depth: int) -> Any:
        return item.members[-1].value if item.members else _SKIP

    def visit_struct(self, expr: TypeExpr, item: StructSpec, depth: int) -> Any:
        return self.struct(item, depth + 1) if depth < 4 else _SKIP

    def struct(self, item: StructSpec, depth: int = 0) -> Any:
        """The struct in its wire form: an array for array and tuple encodings, else a map.
        Nested optional fields keep their defaults (values stay small)."""
        values: dict[str, Any] = {}
        for fld in item.fields:
            found = _SKIP
            if fld.required or (depth <= 3 and not self.minimal):
                found = self.value(parse_type(fld.type), depth)
            if found is _SKIP:
                if fld.required:
                    return _SKIP
                found = _default_value(fld)
            values[fld.name] = found
        if item.encoding in ("array", "tuple"):
            return list(values.values())
        return values


def _default_value(fld: Any) -> Any:
    if fld.default_factory is not None:
        return {"list": [], "dict": {}, "set": []}[fld.default_factory]
    return json.loads(fld.default or "null")


_SKIP = object()


def _dec_hook(_type: Any, value: Any) -> Any:
    return value


def confirm(verdict: MessageVerdict, frontend: str, engine: str) -> None:
    """Encode the message's payload struct with the writer release's classes and decode it
    with the reader's; set ``verdict.confirmed`` and ``verdict.confirmation``. A request-type
    finding is confirmed on its own frame: the writer's byte, sent as a one-byte frame, looked
    up in the reader's table."""
    _confirm_payload(verdict)
    typed = [f for f in verdict.findings if f.path.startswith("request type")]
    if not typed:
        return
    writer_version = verdict.writer.rsplit(" ", 1)[1]
    reader_version = verdict.reader.rsplit(" ", 1)[1]
    wtable = constants_at(writer_version, "request_types")
    rtable = {v: k for k, v in constants_at(reader_version, "request_types").items()}
    outcomes = []
    agree = True
    for finding in typed:
        name = finding.path.removeprefix("request type ")
        if name not in wtable:
            continue
        frame = msgspec.msgpack.decode(msgspec.msgpack.encode(bytes([wtable[name]])))
        meaning = rtable.get(frame[0])
        outcome = "rejected" if meaning is None else "silent" if meaning != name else "decoded"
        agree = agree and outcome == finding.kind
        outcomes.append(f"request-type byte {frame[0]:#04x} read as {meaning or 'nothing'}")
    if outcomes:
        verdict.confirmed = agree and verdict.confirmed is not False
        verdict.confirmation = "; ".join([*outcomes, verdict.confirmation])


def _confirm_payload(verdict: MessageVerdict) -> None:
    from enginewire.spec.classes import build

    payload = verdict.payload
    writer_version = verdict.writer.rsplit(" ", 1)[1]
    reader_version = verdict.reader.rsplit(" ", 1)[1]
    if verdict.verdict == "absent":
        verdict.confirmed = None
        verdict.confirmation = "not run: the payload does not exist on one side"
        return
    try:
        expr = parse_type(payload)
    except ValueError:
        verdict.confirmation = "not run: no single payload type"
        return
    wspec = spec_for(writer_version)
    if expr.name not in wspec.structs or not isinstance(wspec.structs[expr.name], StructSpec):
        verdict.confirmation = "not run: the payload is no struct"
        verdict.confirmed = None
        return
    wset, rset = build(writer_version), build(reader_version)
    sample = _Sampler(wspec).struct(wspec.struct(expr.name))
    if sample is _SKIP:
        verdict.confirmation = "not run: a required field has no sample value"
        return
    try:
        wobj = msgspec.convert(sample, wset[expr.name], dec_hook=_dec_hook)
        data = msgspec.msgpack.encode(wobj)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        verdict.confirmation = f"not run: the writer's classes refuse the sample ({exc})"
        return
    try:
        robj = msgspec.msgpack.decode(data, type=rset[expr.name], dec_hook=_dec_hook)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        outcome, detail = "rejected", f"the reader raised: {exc}"
    else:
        wvalues = _named(wobj)
        rvalues = _named(robj)
        moved = sorted(k for k in rvalues if k in wvalues and not _same(rvalues[k], wvalues[k]))
        if moved:
            outcome, detail = "silent", f"decoded; fields with another value: {moved}"
        else:
            outcome, detail = "decoded", "decoded; every field both sides have kept its value"
    # The request-type byte is a frame of its own: only the payload's findings predict the
    # payload's decode.
    payload_verdict = _verdict([f for f in verdict.findings
                                if not f.path.startswith("request type")])
    expected = {"identical": {"decoded"}, "compatible": {"decoded"}, "silent": {"silent"},
                "rejected": {"rejected", "silent", "decoded"}}[payload_verdict]
    if payload_verdict == "rejected":
        # A type error the sample's value avoids (an empty list, a null) decodes: only a
        # rejection of a top-level position or required key must show.
        expected = {"rejected"} if _top_level_rejection(verdict) else expected
    verdict.confirmed = outcome in expected
    verdict.confirmation = detail


def _top_level_rejection(verdict: MessageVerdict) -> bool:
    return any(f.kind == "rejected" and "<" not in f.path for f in verdict.findings)


def _named(obj: Any) -> Any:
    """``obj`` as builtins with every struct, NamedTuple and dataclass as a map by field name
    (so values compare by meaning, not by position)."""
    import dataclasses
    import enum

    if isinstance(obj, msgspec.Struct):
        return {f.name: _named(getattr(obj, f.name)) for f in msgspec.structs.fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {name: _named(getattr(obj, name)) for name in obj._fields}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _named(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple | set | frozenset):
        return [_named(item) for item in obj]
    if isinstance(obj, dict):
        return {key: _named(value) for key, value in obj.items()}
    return obj


def _same(a: Any, b: Any) -> bool:
    """Equal on everything both sides have (keys one side lacks are drops, not changes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_same(a[k], b[k]) for k in a.keys() & b.keys())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- reports -----------------------------------------------------------------------------


def analyse(frontend: str, engine: str, *, confirm_run: bool = True) -> list[MessageVerdict]:
    verdicts = predict(frontend, engine)
    if confirm_run:
        for verdict in verdicts:
            confirm(verdict, frontend, engine)
    return verdicts


def render_text(frontend: str, engine: str, verdicts: list[MessageVerdict]) -> str:
    lines = [f"front end vLLM {frontend} <-> engine vLLM {engine}"]
    for v in verdicts:
        check = {True: "confirmed", False: "NOT CONFIRMED", None: "unconfirmed"}[v.confirmed]
        lines.append(f"{v.channel:9} {v.kind:15} {v.writer} -> {v.reader}: {v.verdict.upper()}"
                     f" [{check}: {v.confirmation}]" if v.confirmation else
                     f"{v.channel:9} {v.kind:15} {v.writer} -> {v.reader}: {v.verdict.upper()}")
        for f in sorted(v.findings, key=lambda f: -SEVERITY[f.kind]):
            extra = ""
            if f.kind == "silent" and f.passes_type_check is not None:
                extra = " (a realistic value passes the reader's type check)"
            lines.append(f"    {f.kind:10} {f.path}: {f.message}{extra}")
    return "\n".join(lines)


def run_compat(frontend: str, engine: str, *, confirm: bool = True,
               as_json: bool = False) -> int:
    verdicts = analyse(frontend, engine, confirm_run=confirm)
    if as_json:
        json.dump([asdict(v) for v in verdicts], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_text(frontend, engine, verdicts))
    return 1 if any(v.confirmed is False for v in verdicts) else 0


@dataclass
class RealWheelResult:
    """One message of one pair, sent by the writer wheel's own class to the reader wheel's."""

    struct: str
    writer: str
    reader: str
    predicted: str
    outcome: str  # see realwheels.RealOutcome
    detail: str

    @property
    def agrees(self) -> bool | None:
        """Whether the real classes did what the prediction says (None: skipped). A SILENT
        prediction agrees with ``misdecoded``; IDENTICAL and COMPATIBLE with ``decoded``."""
        if self.outcome == "skipped":
            return None
        expected = {"rejected": "rejected", "silent": "misdecoded"}.get(self.predicted,
                                                                         "decoded")
        return self.outcome == expected


def _top_level_sample(spec: Spec, name: str, minimal: Any,
                      realistic: frozenset[str] = frozenset()) -> Any:
    """The full sample of ``name`` with every nested struct value taken from ``minimal``,
    except the fields named in ``realistic``, which keep the full sample's nested values."""
    full = _Sampler(spec).struct(spec.struct(name))
    rich = _Sampler(spec, any_str=True).struct(spec.struct(name)) if realistic else full
    names = [f.name for f in spec.struct(name).fields]

    def nested(value: Any) -> bool:
        return isinstance(value, dict) or (isinstance(value, list)
                                           and any(isinstance(v, (dict, list)) for v in value))

    if isinstance(full, list) and isinstance(minimal, list) and len(full) == len(minimal):
        return [r if n in realistic else m if nested(f) else f
                for n, f, m, r in zip(names, full, minimal, rich, strict=True)]
    if isinstance(full, dict) and isinstance(minimal, dict):
        return {k: rich[k] if k in realistic else minimal.get(k) if nested(v) else v
                for k, v in full.items()}
    return full


#: ``kind<Payload>[i] field<Nested>...`` or ``kind<Payload>.field<Nested>...``: a finding
#: inside the nested struct (or list of structs) of the payload's top-level ``field``.
_NESTED_PATH = re.compile(r"^\w+<\w+>(?:\[\d+\] |\.)(\w+)<")


def nested_breaks(verdict: MessageVerdict) -> frozenset[str]:
    """The payload's top-level fields inside whose nested structs the prediction finds a
    rejection or a silent misdecode (their sample must carry a realistic nested value for a
    decode to show it)."""
    found = set()
    for finding in verdict.findings:
        match = _NESTED_PATH.match(finding.path)
        if match and finding.kind in ("rejected", "silent"):
            found.add(match.group(1))
    return frozenset(found)


def real_wheel_check(frontend: str, engine: str, *, echo: bool = True) -> list[RealWheelResult]:
    """What the wheels' own classes do with the add and outputs messages of a front end at
    ``frontend`` and an engine at ``engine`` (printed with ``echo``). The sample sets every
    top-level field it can (distinct values) and keeps nested structs minimal (vLLM's classes
    validate nested values such as sampling parameters), except where the prediction finds a
    nested rejection or misdecode: those fields carry a full nested value (every field set,
    ``any`` values as strings), so that the decode meets the nested layout difference. When
    the writer's class refuses a sample, the next is tried: nested minimal, then the minimal
    sample (nulls and defaults); the detail says which sample the outcome is for."""
    from .realwheels import try_pair
    from .wheels import default_wheel_dir, find_wheel

    folder = default_wheel_dir()
    predictions = {v.kind: v for v in predict(frontend, engine)}
    results = []
    for name, writer, reader, kind in (("EngineCoreRequest", frontend, engine, "add"),
                                       ("EngineCoreOutputs", engine, frontend, "outputs")):
        wheels = find_wheel(folder, writer), find_wheel(folder, reader)
        prediction = predictions.get(kind)
        verdict = prediction.verdict if prediction is not None else "absent"
        if wheels[0] is None or wheels[1] is None:
            result = RealWheelResult(name, writer, reader, verdict, "skipped",
                                     f"no wheel in {folder}")
        else:
            wspec = spec_for(writer)
            realistic = nested_breaks(prediction) if prediction is not None else frozenset()
            minimal = _Sampler(wspec, minimal=True).struct(wspec.struct(name))
            samples = [(f"sample with realistic nested {', '.join(sorted(realistic))}",
                        _top_level_sample(wspec, name, minimal, realistic))] if realistic else []
            samples += [("sample with minimal nested structs",
                         _top_level_sample(wspec, name, minimal)),
                        ("minimal sample", minimal)]
            outcome = None
            refused = []
            for label, sample in samples:
                outcome = try_pair(wheels[0], wheels[1], name, sample,
                                   [f.name for f in wspec.struct(name).fields])
                if not outcome.detail.startswith("the writer's class refused"):
                    break
                refused.append(f"{label}: {outcome.detail}")
            assert outcome is not None
            detail = f"{label}: {outcome.detail}"
            if refused and outcome.outcome != "skipped":
                detail += f" (refused before: {'; '.join(refused)})"
            result = RealWheelResult(name, writer, reader, verdict, outcome.outcome, detail)
        results.append(result)
        if echo:
            agrees = {None: "", True: " (agrees with the prediction)",
                      False: f" (DISAGREES with the prediction {verdict})"}[result.agrees]
            print(f"real wheels {name} {writer} -> {reader}: {result.outcome}{agrees}: "
                  f"{result.detail}")
    return results
