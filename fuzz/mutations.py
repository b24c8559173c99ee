"""The catalogue of malformations behind :func:`enginewire.fuzz.mutations.malformed`.

Each case starts from a valid message drawn by :func:`~enginewire.fuzz.strategies.messages`,
encoded by the reference codec, and changes exactly one thing. The payload is edited as plain
msgpack data (:func:`enginewire.conformance.oracle.wire.raw_decode`) at a position whose declared
type the spec gives; positions under a union of several types are left alone, because there the
changed value could still decode as another member (and the input would not be malformed).

Mutations (``name``: what changes, then the clause a decoder must name):

- ``type-byte-unknown``: a type byte outside the request table;
  request_types.unknown-byte-rejected
- ``type-byte-sentinel``: type byte 0x04 or 0x05; the same (also
  request_types.sentinels-never-on-wire)
- ``type-frame-width``: a type frame of 0, 2 or 3 bytes; request_types.one-byte-frame
- ``literal-altered``: a literal frame (ENGINE_CORE_DEAD, READY, 0x01) with other bytes;
  frames.engine-core-dead-literal, else frames.frame-count
- ``literal-extra-frame``: a frame after a literal-only message; the same
- ``missing-payload``: the fixed frames without the msgpack frame; frames.frame-count
- ``extra-frame``: a frame no index refers to; frames.oob-count-matches, or
  frames.untyped-payload-no-oob where the kind carries no out-of-band frames
- ``missing-oob``: the last out-of-band frame dropped; tensors.index-in-range (also
  frames.oob-count-matches)
- ``msgpack-truncated``, ``msgpack-trailing``, ``msgpack-invalid``: the msgpack frame cut
  short, followed by extra bytes, or starting with the never-used byte 0xc1;
  frames.payload-matches-type
- ``missing-required``: an array or tuple struct cut before its last required field, or a
  required key removed from a map; structs.array.missing-required-rejected,
  structs.tuple.array, structs.map.absent-key-default
- ``wrong-type``: a struct field (or an element of a tuple payload) holding a msgpack type its
  type rejects; structs.array.type-checked in array structs, else frames.payload-matches-type
- ``nil-not-nullable``: nil in a field whose type has no none; structs.none.nil
- ``enum-value``: an enum field holding a value that is not a member; structs.enum.value
- ``tuple-extra``: a tuple struct with one element too many;
  structs.tuple.extra-elements-rejected
- ``array-as-map``: an array struct sent as a map; structs.array.type-checked
- ``tensor-dtype``: a dtype outside the vocabulary; tensors.torch-dtype-name or
  tensors.numpy-dtype-str
- ``tensor-shape-bytes``: a shape that does not match the byte count;
  tensors.byte-length-matches-shape
- ``tensor-shape-negative``: a negative or boolean shape entry; tensors.shape-non-negative
- ``tensor-index``: an index 0, negative, or past the last frame; tensors.index-in-range
- ``tensor-index-negative-alias``: an inline tensor's data moved to a new last out-of-band
  frame and named by index -1, which a decoder indexing a Python list reads as that frame;
  tensors.index-in-range
- ``tensor-index-reused``: two tensors naming one frame; tensors.index-used-once
- ``tensor-data-form``: data neither Ext(3) nor an index; tensors.data-form
- ``tensor-tuple-layout``: a tensor tuple of 4 elements; tensors.tuple-layout
- ``tensor-ipc-handle``: a map in a tensor's data position;
  tensors.ipc-handle-needs-side-channel
- ``ext-pickle``: extension type 1 or 2 without the opt-in; tensors.ext-pickle-opt-in
- ``ext-unknown``: an extension type outside 1-3; tensors.ext-codes-known
- ``exclusive-params``: an ADD with both or neither of sampling_params and pooling_params;
  structs.exclusive-params
- ``utility-reply-shape``: outputs with a utility output, a utility reply without one or with
  request outputs; frames.utility-reply
- ``coordinator-outputs``: coordinator outputs with request outputs;
  frames.coordinator-outputs-single-frame
- ``utility-type-info``: a non-nil UtilityResult.type_info;
  structs.utility-result.type-info-insecure-only
- ``handshake-keys``: HELLO/READY without a required key, with another status, or with a key
  of the wrong type; handshake.message-keys
- ``identity-width``: (routed cases) an identity frame of 0, 1, 3 or 8 bytes;
  identity.width-two-bytes

Extension types in the handshake, ready response and coordinator messages also break
frames.plain-msgpack-control, which such cases list in ``also``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from hypothesis import strategies as st

from enginewire.conformance.oracle.wire import raw_decode
from enginewire.fuzz.strategies import Malformed, SpecStrategies, generator
from enginewire.reference.codec import Codec
from enginewire.spec import load
from enginewire.spec.schema import EnumSpec, FieldSpec, StructSpec
from enginewire.spec.types import TypeExpr, TypeVisitor, kind_of, members, parse_type

Ext = msgspec.msgpack.Ext
#: The extension codes that need the insecure opt-in (tensors surface, ext_codes).
_PICKLE_CODES = [load().ext_code(name) for name in ("pickle", "cloudpickle")]

#: A broken message: frames, clause, description, other clauses it breaks.
Broken = tuple[list[bytes], str, str, tuple[str, ...]]
Mutation = Callable[[st.DrawFn], Broken]

PAYLOAD_TYPE = "frames.payload-matches-type"
ARRAY_TYPE = "structs.array.type-checked"
PLAIN_CONTROL = "frames.plain-msgpack-control"

_BAD_TORCH_DTYPES = ("half", "float", "long", "qint8", "torch.float32", "int4", "Float32", "")
_BAD_NUMPY_DTYPES = ("int32", "f", "<M8[ns]", "|S4", "<U3", "|V4", "float32", "<f16", "")
#: One value of each msgpack type, for fields of another type.
_WRONG_VALUES: tuple[tuple[str, Any], ...] = (
    ("str", "not-this-type"), ("int", 7), ("float", 0.5), ("bool", True), ("array", [1]),
    ("map", {"k": 1}), ("bin", b"\x00\x01"),
)


@dataclass(frozen=True)
class Site:
    """One position in a decoded payload whose type the spec gives without ambiguity.

    ``declared`` is the type written at the position (a nullable union included); ``resolved``
    the single non-nil member (None when the union has several, and nothing below is visited);
    ``parent``/``field`` name the struct field the position is, if it is one.
    """

    path: tuple[Any, ...]
    declared: TypeExpr
    resolved: TypeExpr | None
    raw: Any
    parent: StructSpec | None = None
    field: FieldSpec | None = None
    #: The position is an element of a top-level tuple payload (utility, start_dp_wave, ...).
    element: bool = False


def _resolve(expr: TypeExpr) -> TypeExpr | None:
    if kind_of(expr) != "union":
        return expr
    candidates = members(expr)
    return candidates[0] if len(candidates) == 1 else None


def walk(raw: Any, declared: TypeExpr, spec: Any, path: tuple[Any, ...] = (),
         parent: StructSpec | None = None, field: FieldSpec | None = None,
         element: bool = False) -> Iterator[Site]:
    """Every unambiguous position of ``raw`` (plain msgpack data of type ``declared``)."""
    resolved = _resolve(declared)
    yield Site(path, declared, resolved, raw, parent, field, element)
    if raw is None or resolved is None:
        return
    yield from _Inside(spec).visit(resolved, raw, path)


class _Inside(TypeVisitor[Iterator[Site]]):
    """The positions inside one resolved (not union) position of :func:`walk`."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec.structs)
        self.spec = spec

    def visit_struct(self, expr: TypeExpr, item: StructSpec, raw: Any,
                     path: tuple[Any, ...]) -> Iterator[Site]:
        if item.encoding in ("array", "tuple") and isinstance(raw, list):
            for index, fld in enumerate(item.fields[: len(raw)]):
                yield from walk(raw[index], parse_type(fld.type), self.spec, (*path, index),
                                item, fld)
        elif isinstance(raw, dict):
            for fld in item.fields:
                if fld.name in raw:
                    yield from walk(raw[fld.name], parse_type(fld.type), self.spec,
                                    (*path, fld.name), item, fld)

    def visit_list(self, expr: TypeExpr, raw: Any, path: tuple[Any, ...]) -> Iterator[Site]:
        if not isinstance(raw, list):
            return
        if expr.fixed_tuple:
            for index, (value, arg) in enumerate(zip(raw, expr.args, strict=False)):
                yield from walk(value, arg, self.spec, (*path, index), element=not path)
            return
        for index, value in enumerate(raw):
            yield from walk(value, expr.args[0], self.spec, (*path, index))

    visit_set = visit_tuple = visit_list

    def visit_dict(self, expr: TypeExpr, raw: Any, path: tuple[Any, ...]) -> Iterator[Site]:
        if isinstance(raw, dict):
            for key, value in raw.items():
                yield from walk(value, expr.args[1], self.spec, (*path, key))

    def _leaf(self, expr: TypeExpr, raw: Any, path: tuple[Any, ...], *_: Any) -> Iterator[Site]:
        return iter(())

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _leaf
    visit_any = visit_slice = visit_tensor = visit_ndarray = visit_nested_tensors = _leaf
    visit_union = _leaf

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, raw: Any,
                   path: tuple[Any, ...]) -> Iterator[Site]:
        return iter(())


def replace_at(raw: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of ``raw`` with the value at ``path`` replaced (containers copied on the way)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(raw, list):
        out_list = list(raw)
        out_list[head] = replace_at(raw[head], rest, new)
        return out_list
    out_map = dict(raw)
    out_map[head] = replace_at(raw[head], rest, new)
    return out_map


def msgpack_kinds(expr: TypeExpr, spec: Any) -> frozenset[str] | None:
    """The msgpack types a decoder accepts for ``expr``; None where that is not a fixed set
    (any, tensors, slices: their checks belong to other clauses)."""
    return _MsgpackKinds(spec.structs).visit(expr)


class _MsgpackKinds(TypeVisitor["frozenset[str] | None"]):
    _SIMPLE = {"str": {"str"}, "int": {"int"}, "float": {"int", "float"}, "bool": {"bool"},
               "bytes": {"bin"}, "none": {"nil"}}

    def _simple(self, expr: TypeExpr) -> frozenset[str] | None:
        return frozenset(self._SIMPLE[expr.name])

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _simple

    def _array(self, expr: TypeExpr) -> frozenset[str] | None:
        return frozenset({"array"})

    visit_list = visit_set = visit_tuple = _array

    def visit_dict(self, expr: TypeExpr) -> frozenset[str] | None:
        return frozenset({"map"})

    def _open(self, expr: TypeExpr) -> frozenset[str] | None:
        return None

    visit_any = visit_slice = visit_tensor = visit_ndarray = visit_nested_tensors = _open

    def visit_union(self, expr: TypeExpr) -> frozenset[str] | None:
        found: set[str] = set()
        for arg in expr.args:
            kinds = self.visit(arg)
            if kinds is None:
                return None
            found |= kinds
        return frozenset(found)

    def visit_struct(self, expr: TypeExpr, item: StructSpec) -> frozenset[str] | None:
        return frozenset({"array"} if item.encoding in ("array", "tuple") else {"map"})

    def visit_enum(self, expr: TypeExpr, item: EnumSpec) -> frozenset[str] | None:
        return frozenset({"int"} if item.wire == "int" else {"str"} if item.wire == "str"
                         else {"bin"})


def _is_control(layout: Any) -> bool:
    """Kinds that frames.plain-msgpack-control covers."""
    if layout is None:
        return False
    return (layout.channel in ("handshake", "stats_publish")
            or layout.channel.startswith("coordinator") or layout.kind == "ready_response")


class _Case:
    """Everything the mutations of one drawn message need."""

    def __init__(self, gen: SpecStrategies, kind: str, frames: list[bytes]) -> None:
        self.gen = gen
        self.spec = gen.spec
        self.kind = kind
        self.layout = gen.layout(kind)
        self.frames = frames
        layout = self.layout
        self.prefix_count = len(layout.prefix) if layout is not None else 0
        self.payload_type = layout.payload if layout is not None else kind
        self.oob = layout.oob if layout is not None else True
        self.control = _is_control(layout)
        self.raw: Any = None
        self.sites: list[Site] = []
        body = frames[self.prefix_count:]
        if self.payload_type is not None and body and body[0]:
            self.raw = raw_decode(body[0])
            self.sites = list(walk(self.raw, parse_type(self.payload_type), self.spec))

    @property
    def body_index(self) -> int:
        return self.prefix_count

    @property
    def oob_count(self) -> int:
        return max(0, len(self.frames) - self.prefix_count - 1)

    def with_raw(self, raw: Any) -> list[bytes]:
        frames = list(self.frames)
        frames[self.body_index] = msgspec.msgpack.encode(raw)
        return frames

    def at(self, site: Site, new: Any) -> list[bytes]:
        return self.with_raw(replace_at(self.raw, site.path, new))

    def where(self, site: Site) -> str:
        path = "".join(f"[{p!r}]" for p in site.path)
        owner = f" ({site.parent.name}.{site.field.name})" if site.parent and site.field else ""
        return f"$ {path}{owner}".replace("$ ", "$")

    def ext_also(self) -> tuple[str, ...]:
        return (PLAIN_CONTROL,) if self.control else ()


# --- framing ----------------------------------------------------------------------------------


def _framing(case: _Case) -> Iterator[tuple[str, Mutation]]:
    layout = case.layout
    frames = case.frames
    if layout is not None and layout.prefix_content[:1] == ("type_byte",):
        table = case.spec.surface("request_types").types
        on_wire = {t.byte for t in table}
        sentinels = sorted(t.byte for t in table if not t.on_wire)
        unknown = [b for b in range(256) if b not in on_wire]

        def type_unknown(draw: st.DrawFn) -> Broken:
            byte = draw(st.sampled_from(unknown))
            return ([bytes([byte]), *frames[1:]], "request_types.unknown-byte-rejected",
                    f"type byte 0x{byte:02x} is not in the request type table", ())

        def type_sentinel(draw: st.DrawFn) -> Broken:
            byte = draw(st.sampled_from(sentinels))
            return ([bytes([byte]), *frames[1:]], "request_types.unknown-byte-rejected",
                    f"type byte 0x{byte:02x} is an internal sentinel",
                    ("request_types.sentinels-never-on-wire",))

        def type_width(draw: st.DrawFn) -> Broken:
            head = draw(st.sampled_from([b"", frames[0] + b"\x00", b"\x00" + frames[0],
                                         frames[0] * 3]))
            return ([head, *frames[1:]], "request_types.one-byte-frame",
                    f"type frame of {len(head)} bytes", ())

        yield "type-byte-unknown", type_unknown
        if sentinels:
            yield "type-byte-sentinel", type_sentinel
        yield "type-frame-width", type_width

    if layout is not None and layout.prefix_content[:1] == ("literal",):
        clause = ("frames.engine-core-dead-literal" if case.kind == "engine_core_dead"
                  else "frames.frame-count")
        literal = frames[0]

        def literal_altered(draw: st.DrawFn) -> Broken:
            variants = [literal[:-1], literal + b"\x00", literal.lower(), b"",
                        bytes([literal[0] ^ 0x20]) + literal[1:]]
            other = draw(st.sampled_from([v for v in variants if v != literal]))
            return ([other], clause, f"literal frame {other!r} instead of {literal!r}", ())

        def literal_extra(draw: st.DrawFn) -> Broken:
            extra = draw(st.binary(max_size=8))
            return ([*frames, extra], clause, "a frame after a literal-only message", ())

        yield "literal-altered", literal_altered
        yield "literal-extra-frame", literal_extra
        return

    if case.payload_type is None:
        return
    if case.prefix_count:
        def missing_payload(draw: st.DrawFn) -> Broken:
            return (frames[: case.prefix_count], "frames.frame-count",
                    "the fixed frames without the msgpack frame", ())

        yield "missing-payload", missing_payload

    def extra_frame(draw: st.DrawFn) -> Broken:
        extra = draw(st.binary(max_size=16))
        if case.oob:
            return ([*frames, extra], "frames.oob-count-matches",
                    "an out-of-band frame no index refers to", ())
        return ([*frames, extra], "frames.untyped-payload-no-oob",
                f"{case.kind} carries no out-of-band frames, got one", ())

    yield "extra-frame", extra_frame

    if case.oob_count:
        def missing_oob(draw: st.DrawFn) -> Broken:
            return (frames[:-1], "tensors.index-in-range",
                    f"the last of {case.oob_count} out-of-band frames dropped",
                    ("frames.oob-count-matches",))

        yield "missing-oob", missing_oob


def _msgpack(case: _Case) -> Iterator[tuple[str, Mutation]]:
    if case.raw is None:
        return
    body = case.frames[case.body_index]

    def truncated(draw: st.DrawFn) -> Broken:
        # A proper prefix of one msgpack object never is a whole object; the empty frame is
        # left out where it means something (ready_response: None).
        low = 1 if case.kind == "ready_response" else 0
        cut = draw(st.integers(low, len(body) - 1))
        frames = list(case.frames)
        frames[case.body_index] = body[:cut]
        return (frames, PAYLOAD_TYPE, f"msgpack frame cut to {cut} of {len(body)} bytes", ())

    def trailing(draw: st.DrawFn) -> Broken:
        extra = draw(st.binary(min_size=1, max_size=4))
        frames = list(case.frames)
        frames[case.body_index] = body + extra
        return (frames, PAYLOAD_TYPE, f"{len(extra)} byte(s) after the msgpack object", ())

    def invalid(draw: st.DrawFn) -> Broken:
        frames = list(case.frames)
        frames[case.body_index] = b"\xc1" + body[1:]
        return (frames, PAYLOAD_TYPE, "first byte 0xc1, which msgpack never uses", ())

    if len(body) > (1 if case.kind == "ready_response" else 0):
        yield "msgpack-truncated", truncated
    yield "msgpack-trailing", trailing
    yield "msgpack-invalid", invalid


# --- typed positions --------------------------------------------------------------------------


def _struct_sites(case: _Case) -> Iterator[tuple[str, Mutation]]:
    spec = case.spec
    required_sites: list[tuple[Site, StructSpec]] = []
    typed_sites: list[Site] = []
    nil_sites: list[Site] = []
    enum_sites: list[tuple[Site, EnumSpec]] = []
    tuple_sites: list[Site] = []
    array_sites: list[tuple[Site, StructSpec]] = []
    for site in case.sites:
        resolved = site.resolved
        item = spec.structs.get(resolved.name) if resolved is not None else None
        if isinstance(item, StructSpec) and site.raw is not None:
            if any(f.required for f in item.fields):
                required_sites.append((site, item))
            if item.encoding == "tuple":
                tuple_sites.append(site)
            if item.encoding == "array" and isinstance(site.raw, list):
                array_sites.append((site, item))
        if isinstance(item, EnumSpec) and site.raw is not None and site.parent is not None:
            enum_sites.append((site, item))
        if msgpack_kinds(site.declared, spec) is not None and (
            site.parent is not None or site.element or not site.path
        ):
            typed_sites.append(site)
            if site.path and not site.declared.nullable:
                nil_sites.append(site)

    if required_sites:
        def missing_required(draw: st.DrawFn) -> Broken:
            site, item = draw(st.sampled_from(required_sites))
            required = [i for i, f in enumerate(item.fields) if f.required]
            if item.encoding in ("array", "tuple"):
                cut = required[-1]
                clause = ("structs.array.missing-required-rejected" if item.encoding == "array"
                          else "structs.tuple.array")
                return (case.at(site, site.raw[:cut]), clause,
                        f"{item.name} at {case.where(site)} cut to {cut} elements, "
                        f"before required field {item.fields[cut].name!r}", ())
            name = draw(st.sampled_from([item.fields[i].name for i in required]))
            reduced = {k: v for k, v in site.raw.items() if k != name}
            return (case.at(site, reduced), "structs.map.absent-key-default",
                    f"{item.name} at {case.where(site)} without required key {name!r}", ())

        yield "missing-required", missing_required

    if typed_sites:
        def wrong_type(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(typed_sites))
            accepted = msgpack_kinds(site.declared, spec) or frozenset()
            kind, value = draw(st.sampled_from(
                [(k, v) for k, v in _WRONG_VALUES if k not in accepted]))
            array_owner = (site.parent if site.parent is not None else
                           spec.structs.get(site.resolved.name) if not site.path
                           and site.resolved is not None else None)
            clause = (ARRAY_TYPE if isinstance(array_owner, StructSpec)
                      and array_owner.encoding == "array" else PAYLOAD_TYPE)
            return (case.at(site, value), clause,
                    f"{case.where(site)} of type {site.declared} holds a msgpack {kind}", ())

        yield "wrong-type", wrong_type

    if nil_sites:
        def nil_not_nullable(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(nil_sites))
            return (case.at(site, None), "structs.none.nil",
                    f"nil at {case.where(site)} of type {site.declared}", ())

        yield "nil-not-nullable", nil_not_nullable

    if enum_sites:
        def enum_value(draw: st.DrawFn) -> Broken:
            site, item = draw(st.sampled_from(enum_sites))
            members = [m.value for m in item.members]
            if item.wire == "int":
                numbers = [v for v in members if isinstance(v, int)]
                value: Any = draw(st.sampled_from([max(numbers) + 1, min(numbers) - 1, 255]))
            elif item.wire == "str":
                value = draw(st.sampled_from(["not-a-member", "", str(members[0]).upper()]))
                if value in members:
                    value = "not-a-member"
            else:
                value = b"\xff\xfe"
            return (case.at(site, value), "structs.enum.value",
                    f"{item.name} value {value!r} at {case.where(site)} is not a member", ())

        yield "enum-value", enum_value

    if tuple_sites:
        def tuple_extra(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(tuple_sites))
            return (case.at(site, [*site.raw, 0]), "structs.tuple.extra-elements-rejected",
                    f"{site.resolved} at {case.where(site)} with one element too many", ())

        yield "tuple-extra", tuple_extra

    if array_sites:
        def array_as_map(draw: st.DrawFn) -> Broken:
            site, item = draw(st.sampled_from(array_sites))
            as_map = {f.name: v for f, v in zip(item.fields, site.raw, strict=False)}
            return (case.at(site, as_map), ARRAY_TYPE,
                    f"{item.name} at {case.where(site)} sent as a map", ())

        yield "array-as-map", array_as_map


def _tensor_sites(case: _Case) -> Iterator[tuple[str, Mutation]]:
    vocab = case.gen.vocab
    tensors = [s for s in case.sites if s.resolved is not None
               and kind_of(s.resolved) == "tensor"
               and isinstance(s.raw, list) and len(s.raw) == 3]
    inline = [s for s in tensors if isinstance(s.raw[2], Ext)]
    indexed = [s for s in tensors if type(s.raw[2]) is int]
    payload_frames = len(case.frames) - case.prefix_count
    dtype_clause = {"tensor": "tensors.torch-dtype-name", "ndarray": "tensors.numpy-dtype-str"}

    def family(site: Site) -> str:
        assert site.resolved is not None
        return site.resolved.name

    def itemsize(site: Site) -> int:
        table = vocab.torch if family(site) == "tensor" else vocab.numpy
        return table[site.raw[0]]

    def nbytes(site: Site) -> int:
        data = site.raw[2]
        if isinstance(data, Ext):
            return len(data.data)  # type: ignore[arg-type]
        return len(case.frames[case.prefix_count + data])

    if not tensors:
        return

    def dtype(draw: st.DrawFn) -> Broken:
        site = draw(st.sampled_from(tensors))
        fam = family(site)
        bad = draw(st.sampled_from(_BAD_TORCH_DTYPES if fam == "tensor" else _BAD_NUMPY_DTYPES))
        return (case.at(site, [bad, *site.raw[1:]]), dtype_clause[fam],
                f"{fam} at {case.where(site)} with dtype {bad!r}", ())

    def shape_bytes(draw: st.DrawFn) -> Broken:
        site = draw(st.sampled_from(tensors))
        count = nbytes(site) // itemsize(site)
        shape = draw(st.sampled_from([[count + 1], [count + 1, 1], [2, count + 1]]))
        return (case.at(site, [site.raw[0], shape, site.raw[2]]),
                "tensors.byte-length-matches-shape",
                f"shape {shape} for {nbytes(site)} bytes of {site.raw[0]}", ())

    def shape_negative(draw: st.DrawFn) -> Broken:
        site = draw(st.sampled_from(tensors))
        shape = draw(st.sampled_from([[-1], [-nbytes(site) - 1], [True], [1, -1]]))
        return (case.at(site, [site.raw[0], shape, site.raw[2]]), "tensors.shape-non-negative",
                f"shape {shape} at {case.where(site)}", ())

    def layout(draw: st.DrawFn) -> Broken:
        site = draw(st.sampled_from(tensors))
        return (case.at(site, [*site.raw, 0]), "tensors.tuple-layout",
                f"a 4-element tensor tuple at {case.where(site)}", ())

    yield "tensor-dtype", dtype
    yield "tensor-shape-bytes", shape_bytes
    yield "tensor-shape-negative", shape_negative
    yield "tensor-tuple-layout", layout

    if inline:
        def index(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(inline))
            value = draw(st.sampled_from([0, -1, -payload_frames, payload_frames,
                                          payload_frames + 7, 2**63 - 1]))
            # An index past the last frame also names a frame that is not there.
            also = ("frames.oob-count-matches",) if value >= payload_frames else ()
            return (case.at(site, [*site.raw[:2], value]), "tensors.index-in-range",
                    f"index {value} with {payload_frames - 1} out-of-band frame(s)", also)

        def data_form(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(inline))
            value = draw(st.sampled_from(["x", 1.5, None, bytes(site.raw[2].data), [1]]))
            return (case.at(site, [*site.raw[:2], value]), "tensors.data-form",
                    f"data {type(value).__name__} at {case.where(site)}", ())

        def ext_pickle(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(inline))
            code = draw(st.sampled_from(_PICKLE_CODES))
            return (case.at(site, [*site.raw[:2], Ext(code, b"\x80\x05N.")]),
                    "tensors.ext-pickle-opt-in", f"Ext({code}) as tensor data", case.ext_also())

        def ext_unknown(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(inline))
            code = draw(_unknown_ext_codes())
            return (case.at(site, [*site.raw[:2], Ext(code, bytes(site.raw[2].data))]),
                    "tensors.ext-codes-known", f"Ext({code}) as tensor data", case.ext_also())

        yield "tensor-index", index
        yield "tensor-data-form", data_form
        yield "ext-pickle", ext_pickle
        yield "ext-unknown", ext_unknown

        torch_inline = [s for s in inline if family(s) == "tensor"]
        if torch_inline:
            def ipc_handle(draw: st.DrawFn) -> Broken:
                site = draw(st.sampled_from(torch_inline))
                handle = {"sender_id": 0, "message_id": 1, "tensor_id": 2}
                return (case.at(site, [*site.raw[:2], handle]),
                        "tensors.ipc-handle-needs-side-channel",
                        f"tensor IPC handle at {case.where(site)}", ())

            yield "tensor-ipc-handle", ipc_handle

    if inline and case.oob:
        def negative_alias(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(inline))
            frames = [*case.at(site, [*site.raw[:2], -1]), bytes(site.raw[2].data)]
            return (frames, "tensors.index-in-range",
                    f"the data of {case.where(site)} moved to a new last out-of-band frame "
                    "and named by index -1, which a Python list of the frames reads as that "
                    "frame", ())

        yield "tensor-index-negative-alias", negative_alias

    if len(indexed) >= 2:
        def reused(draw: st.DrawFn) -> Broken:
            first, second = draw(st.sampled_from(
                [(a, b) for a in indexed for b in indexed if a.path < b.path]))
            raw = replace_at(case.raw, second.path, [*second.raw[:2], first.raw[2]])
            return (case.with_raw(raw), "tensors.index-used-once",
                    f"{case.where(second)} names frame {first.raw[2]} like {case.where(first)}",
                    ("frames.oob-count-matches",))

        yield "tensor-index-reused", reused


def _unknown_ext_codes() -> st.SearchStrategy[int]:
    """Application extension codes (-128..127) outside the spec's ext_codes table. -1 is
    msgpack's timestamp, which decoders handle themselves."""
    known = {ext.code for ext in load().surface("tensors").ext_codes}
    return st.one_of(st.sampled_from([0, 127, -2, -128]), st.integers(0, 127),
                     st.integers(-128, -2)).filter(lambda code: code not in known)


def _any_sites(case: _Case) -> Iterator[tuple[str, Mutation]]:
    untyped = [s for s in case.sites if s.resolved is not None and kind_of(s.resolved) == "any"]
    if not untyped:
        return

    def ext_pickle(draw: st.DrawFn) -> Broken:
        site = draw(st.sampled_from(untyped))
        code = draw(st.sampled_from(_PICKLE_CODES))
        return (case.at(site, Ext(code, b"\x80\x05N.")), "tensors.ext-pickle-opt-in",
                f"Ext({code}) at untyped position {case.where(site)}", case.ext_also())

    def ext_unknown(draw: st.DrawFn) -> Broken:
        site = draw(st.sampled_from(untyped))
        code = draw(_unknown_ext_codes())
        return (case.at(site, Ext(code, b"\x00")), "tensors.ext-codes-known",
                f"Ext({code}) at untyped position {case.where(site)}", case.ext_also())

    yield "ext-pickle", ext_pickle
    yield "ext-unknown", ext_unknown


# --- rules a type cannot say ------------------------------------------------------------------


def _raw_of(case: _Case, struct: str, **fields: Any) -> Any:
    """Plain msgpack data of a reference struct instance (for splicing into payloads)."""
    value = case.gen.structs.classes[struct](**fields)
    return raw_decode(msgspec.msgpack.encode(value))


def _index(item: StructSpec, name: str) -> int:
    return [f.name for f in item.fields].index(name)


def _field_path(item: StructSpec, site: Site, name: str) -> tuple[Any, ...]:
    key = _index(item, name) if item.encoding in ("array", "tuple") else name
    return (*site.path, key)


def _subtree_also(case: _Case) -> tuple[str, ...]:
    """What else a rule that drops or copies in a whole subtree may be rejected for: a tensor
    in the subtree leaves its out-of-band frame unreferenced (dropped) or referenced twice
    (copied in), which the codec may see before the rule."""
    if len(case.frames) - case.prefix_count > 1:
        return ("frames.oob-count-matches", "tensors.index-used-once")
    return ()


def _rules(case: _Case) -> Iterator[tuple[str, Mutation]]:
    spec = case.spec
    if case.raw is None:
        return
    by_struct: dict[str, list[Site]] = {}
    for site in case.sites:
        if site.resolved is not None and site.raw is not None:
            by_struct.setdefault(site.resolved.name, []).append(site)

    requests = by_struct.get("EngineCoreRequest", [])
    rules = spec.constraints("EngineCoreRequest", "exactly-one-of") if requests else []
    if rules:
        item = spec.struct("EngineCoreRequest")
        types = {f.name: parse_type(f.type).without_none() for f in item.fields}

        def exclusive(draw: st.DrawFn) -> Broken:
            """Every field of an exactly-one-of group set (both), or none (neither)."""
            site = draw(st.sampled_from(requests))
            rule = draw(st.sampled_from(rules))
            both = draw(st.booleans())
            raw = case.raw
            for name in rule.fields:
                value = _raw_of(case, types[name].name) if both else None
                raw = replace_at(raw, _field_path(item, site, name), value)
            return (case.with_raw(raw), rule.clause,
                    f"EngineCoreRequest with {'all' if both else 'none'} of "
                    f"{' and '.join(rule.fields)}", _subtree_also(case))

        yield "exclusive-params", exclusive

    outputs_item = spec.struct("EngineCoreOutputs")
    root_is_outputs = (not case.sites[0].path and case.sites[0].resolved is not None
                       and case.sites[0].resolved == TypeExpr("EngineCoreOutputs"))
    if root_is_outputs and case.kind in ("outputs", "utility_reply", "coordinator_outputs"):
        root = case.sites[0]
        utility_path = _field_path(outputs_item, root, "utility_output")
        outputs_path = _field_path(outputs_item, root, "outputs")
        one_output = [_raw_of(case, "EngineCoreOutput", request_id="r", new_token_ids=[1])]

        def reply_shape(draw: st.DrawFn) -> Broken:
            if case.kind == "outputs":
                utility = _raw_of(case, "UtilityOutput", call_id=1, failure_message="x")
                return (case.with_raw(replace_at(case.raw, utility_path, utility)),
                        "frames.utility-reply", "outputs carrying a utility_output",
                        _subtree_also(case))
            if draw(st.booleans()):
                return (case.with_raw(replace_at(case.raw, utility_path, None)),
                        "frames.utility-reply", "a utility reply without utility_output",
                        _subtree_also(case))
            return (case.with_raw(replace_at(case.raw, outputs_path, one_output)),
                    "frames.utility-reply", "a utility reply with request outputs",
                    _subtree_also(case))

        def coordinator(draw: st.DrawFn) -> Broken:
            return (case.with_raw(replace_at(case.raw, outputs_path, one_output)),
                    "frames.coordinator-outputs-single-frame",
                    "coordinator outputs with request outputs", _subtree_also(case))

        if case.kind == "coordinator_outputs":
            yield "coordinator-outputs", coordinator
        else:
            yield "utility-reply-shape", reply_shape

    results = by_struct.get("UtilityResult", [])
    if results and not case.gen.codec.pickle_allowed:
        item = spec.struct("UtilityResult")

        def type_info(draw: st.DrawFn) -> Broken:
            site = draw(st.sampled_from(results))
            info = draw(st.sampled_from([["builtins", "int"], "builtins.int", [None]]))
            raw = replace_at(case.raw, _field_path(item, site, "type_info"), info)
            return (case.with_raw(raw), "structs.utility-result.type-info-insecure-only",
                    f"UtilityResult.type_info {info!r} at {case.where(site)}", ())

        yield "utility-type-info", type_info

    keys = case.gen.handshake_keys.get(case.kind)
    if keys and isinstance(case.raw, dict):
        required = [k for k in keys if k.required]

        def handshake(draw: st.DrawFn) -> Broken:
            key = draw(st.sampled_from(required))
            how = draw(st.sampled_from(["missing", "type"] + (["value"] if key.value else [])))
            if how == "missing":
                reduced = {k: v for k, v in case.raw.items() if k != key.name}
                return (case.with_raw(reduced), "handshake.message-keys",
                        f"{case.kind} without key {key.name!r}", ())
            if how == "value" and key.value is not None:
                return (case.with_raw({**case.raw, key.name: key.value.lower() + "?"}),
                        "handshake.message-keys", f"{case.kind} with another {key.name}", ())
            accepted = msgpack_kinds(parse_type(key.type), spec) or frozenset()
            kind, value = draw(st.sampled_from(
                [(k, v) for k, v in _WRONG_VALUES if k not in accepted]))
            return (case.with_raw({**case.raw, key.name: value}), "handshake.message-keys",
                    f"{case.kind} key {key.name!r} holds a msgpack {kind}", ())

        yield "handshake-keys", handshake


def mutations(case: _Case) -> list[tuple[str, Mutation]]:
    """Every mutation that applies to the drawn message."""
    return [*_framing(case), *_msgpack(case), *_struct_sites(case), *_tensor_sites(case),
            *_any_sites(case), *_rules(case)]


# --- the strategy -----------------------------------------------------------------------------


def malformed_strategy(gen: SpecStrategies, kind: str, *, routed: bool = False
                       ) -> st.SearchStrategy[Malformed]:
    """See :func:`enginewire.fuzz.mutations.malformed`."""
    layout = gen.layout(kind)
    if layout is None and kind not in gen.structs.classes:
        raise KeyError(f"unknown message kind or struct {kind!r}")
    if routed and (layout is None or not layout.routed):
        raise ValueError(f"{kind} does not travel through a ROUTER; routed=True does not apply")
    identity = gen.spec.surface("identity")
    width = identity.width

    @st.composite
    def build(draw: st.DrawFn) -> Malformed:
        value = draw(gen.message(kind))
        frames = [bytes(memoryview(f).cast("B")) for f in gen.codec.encode(kind, value)]
        case = _Case(gen, kind, frames)
        options = mutations(case)
        if routed:
            options.append(("identity-width", _identity_width(frames, width)))
        name, mutation = draw(st.sampled_from(options))
        broken, clause, description, also = mutation(draw)
        if routed and name != "identity-width":
            rank = draw(st.integers(0, 2 ** (8 * width) - 1))
            broken = [rank.to_bytes(width, identity.byteorder), *broken]
        return Malformed(kind=kind, frames=tuple(broken), clause=clause,
                         description=description, mutation=name, also=also, routed=routed)

    return build()


def _identity_width(frames: list[bytes], width: int) -> Mutation:
    def mutate(draw: st.DrawFn) -> Broken:
        size = draw(st.sampled_from([n for n in (0, 1, width + 1, width * 4) if n != width]))
        identity = draw(st.binary(min_size=size, max_size=size))
        return ([identity, *frames], "identity.width-two-bytes",
                f"identity frame of {size} bytes", ())

    return mutate


def catalogue() -> list[str]:
    """The mutation names listed in this module's docstring, in order."""
    return re.findall(r"``([a-z]+(?:-[a-z]+)+)``", (__doc__ or "").split("Mutations (", 1)[1])


def malformed(kind: str, *, codec: Codec | None = None, routed: bool = False
              ) -> st.SearchStrategy[Malformed]:
    """Near-valid frames of ``kind`` breaking exactly one rule, labelled with its clause.

    ``routed=True`` puts a valid identity frame in front of every case (frames as a ROUTER
    receives them; decode them with ``codec.decode_routed``) and adds identity defects; only
    for kinds that travel through a ROUTER.
    """
    return malformed_strategy(generator(codec), kind, routed=routed)
