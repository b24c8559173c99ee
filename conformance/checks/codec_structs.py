"""Struct layout checks, generated from ``spec/data/structs/*.toml``.

For every struct the spec defines (except those that only travel inside vLLM's multimodal
encoding, :data:`~enginewire.conformance.oracle.samples.CONTEXTUAL`) the suite registers:

- ``codec.struct.<name>.layout``: a value with every field set encodes to the spec's wire form
  (array: every field in spec order; map: by name, defaults omitted when the struct omits
  them; dataclass: every field by name);
- ``codec.struct.<name>.round-trip``: decoding that encoding gives the value back;
- ``codec.struct.<name>.defaults`` (structs with optional fields): a wire value holding only
  the required fields decodes with every other field at its spec default;
- ``codec.struct.<name>.missing-required`` (structs with required fields): a wire value short of
  a required field is rejected;
- for the structs that are whole message payloads (:data:`PAYLOADS`), also
  ``codec.struct.<name>.extra-trailing`` (arrays: an extra trailing element is ignored, the way
  a newer peer's appended field is) and ``codec.struct.<name>.wrong-type`` (a field of the
  wrong msgpack type is rejected).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from enginewire.conformance.checks._helpers import (
    decode,
    encode,
    expect_rejection,
    expect_value,
    expect_wire,
    require_struct,
)
from enginewire.conformance.framework.context import CheckContext
from enginewire.conformance.framework.registry import (
    CheckFailure,
    NotInRelease,
    Reproduction,
    check,
)
from enginewire.conformance.oracle.samples import CONTEXTUAL, Sampler
from enginewire.conformance.oracle.values import default_of, neutral
from enginewire.conformance.oracle.wire import expected_wire, raw_decode
from enginewire.conformance.targets.contract import CodecSurface
from enginewire.spec import load
from enginewire.spec.schema import StructSpec
from enginewire.spec.types import parse_type, scalar_type

#: Structs that are a whole message payload (frame 0 of a message kind).
PAYLOADS = (
    "EngineCoreRequest",
    "EngineCoreOutputs",
    "EngineCoreReadyResponse",
    "EngineHandshakeMetadata",
)

#: The clauses each generated check enforces, by the struct's encoding.
LAYOUT_CLAUSES = {
    "array": ["structs.array.field-order", "structs.array.every-field-written"],
    "tuple": ["structs.tuple.array"],
    "map": ["structs.map.keyed-by-field-name"],
    "dataclass": ["structs.dataclass.all-fields"],
}
DEFAULTS_CLAUSES = {
    "array": "structs.array.trailing-defaults",
    "tuple": "structs.tuple.array",
    "map": "structs.map.absent-key-default",
    "dataclass": "structs.map.absent-key-default",
}
REQUIRED_CLAUSES = {
    "array": "structs.array.missing-required-rejected",
    "tuple": "structs.tuple.array",
    "map": "structs.map.absent-key-default",
    "dataclass": "structs.map.absent-key-default",
}
#: A rejection may also cite the general rule that a payload must match its type.
GENERAL = "frames.payload-matches-type"
OMIT_CLAUSE = "structs.map.omit-defaults"
UNKNOWN_KEYS_CLAUSE = "structs.map.unknown-keys-ignored"
EXTRA_CLAUSE = "structs.array.extra-trailing-ignored"
TUPLE_EXTRA_CLAUSE = "structs.tuple.extra-elements-rejected"
TYPE_CLAUSE = "structs.array.type-checked"


def slug(name: str) -> str:
    """``EngineCoreRequest`` -> ``engine-core-request``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", name).lower()


def _full_sample(spec: Any, name: str) -> dict[str, Any]:
    return Sampler(spec).struct(name)


def _wire_of(spec: Any, item: StructSpec, value: dict[str, Any]) -> Any:
    wire = expected_wire(value, item.name, spec).value
    return dict(wire) if isinstance(wire, dict) else wire


def _minimal_wire(spec: Any, name: str) -> tuple[dict[str, Any], Any]:
    """A minimal sample of ``name`` and its wire form cut to the fields the sample sets."""
    item = spec.struct(name)
    value = Sampler(spec).required(name)
    kept = {f.name for f in item.fields if f.required} | set(value)
    wire = _wire_of(spec, item, value)
    if item.encoding in ("array", "tuple"):
        names = [f.name for f in item.fields]
        wire = wire[: max((names.index(n) + 1 for n in kept), default=0)]
    else:
        wire = {k: v for k, v in wire.items() if k in kept}
    return value, wire


def _register_struct(item: StructSpec) -> None:
    name = item.name
    encoding = item.encoding
    base = f"codec/struct/{slug(name)}"
    layout = LAYOUT_CLAUSES[encoding]
    is_array = encoding in ("array", "tuple")

    @check(f"{base}/layout", clauses=layout, surface="codec",
           description=f"{name} with every field set encodes as the spec's {encoding}")
    def _layout(codec: CodecSurface, ctx: CheckContext) -> None:
        require_struct(ctx, name)
        value = _full_sample(ctx.spec, name)
        frames = encode(codec, name, value)
        expect_wire(frames, value, name, ctx.spec, what=name)

    if encoding == "map" and item.omit_defaults:

        @check(f"{base}/omit-defaults", clauses=[OMIT_CLAUSE], surface="codec",
               description=f"{name} leaves fields at their default out of the map")
        def _omit(codec: CodecSurface, ctx: CheckContext) -> None:
            require_struct(ctx, name)
            value = Sampler(ctx.spec).required(name)
            frames = encode(codec, name, value)
            expect_wire(frames, value, name, ctx.spec, what=name, strict_omit=True)

    @check(f"{base}/round-trip", clauses=layout, surface="codec",
           description=f"{name} decodes back to the value it was encoded from")
    def _round_trip(codec: CodecSurface, ctx: CheckContext) -> None:
        require_struct(ctx, name)
        value = _full_sample(ctx.spec, name)
        frames = encode(codec, name, value)
        decoded = decode(codec, name, frames)
        expect_value(decoded, value, name, ctx.spec, what=f"{name} round trip", sent=frames,
                     fields=list(value))

    optional = [f for f in item.fields if not f.required]
    required = [f for f in item.fields if f.required]
    if optional:

        @check(f"{base}/defaults", clauses=[DEFAULTS_CLAUSES[encoding]], surface="codec",
               description=f"{name} with only its required fields decodes with spec defaults")
        def _defaults(codec: CodecSurface, ctx: CheckContext) -> None:
            require_struct(ctx, name)
            value, wire = _minimal_wire(ctx.spec, name)
            frames = [msgspec.msgpack.encode(wire)]
            decoded = decode(codec, name, frames)
            public = [f.name for f in ctx.spec.struct(name).fields
                      if not f.required and not f.name.startswith("_")]
            expect_value(decoded, value, name, ctx.spec, what=f"{name} defaults", sent=frames,
                         fields=public)

    if required:

        @check(f"{base}/missing-required", clauses=[REQUIRED_CLAUSES[encoding]], surface="codec",
               description=f"{name} without its last required field is rejected")
        def _missing(codec: CodecSurface, ctx: CheckContext) -> None:
            require_struct(ctx, name)
            spec_item = ctx.spec.struct(name)
            _, wire = _minimal_wire(ctx.spec, name)
            needed = [f.name for f in spec_item.fields if f.required]
            if not needed:
                raise NotInRelease(f"vLLM {ctx.spec.version} has no required field in {name}")
            if is_array:
                wire = wire[: len(needed) - 1]
            else:
                wire = {k: v for k, v in wire.items() if k != needed[-1]}
            expect_rejection(
                codec, name, [msgspec.msgpack.encode(wire)], [REQUIRED_CLAUSES[encoding], GENERAL],
                f"{name} without required field {needed[-1]!r}",
            )

    if encoding == "tuple":

        @check(f"{base}/extra-rejected", clauses=[TUPLE_EXTRA_CLAUSE], surface="codec",
               description=f"{name} (a tuple) with one element too many is rejected")
        def _tuple_extra(codec: CodecSurface, ctx: CheckContext) -> None:
            require_struct(ctx, name)
            wire = _wire_of(ctx.spec, ctx.spec.struct(name), _full_sample(ctx.spec, name))
            expect_rejection(
                codec, name, [msgspec.msgpack.encode([*wire, 0])], [TUPLE_EXTRA_CLAUSE, GENERAL],
                f"{name} with {len(wire) + 1} elements",
            )

    if encoding in ("map", "dataclass"):

        @check(f"{base}/unknown-keys", clauses=[UNKNOWN_KEYS_CLAUSE], surface="codec",
               description=f"{name} with a key it does not know decodes (the key is ignored)")
        def _unknown_keys(codec: CodecSurface, ctx: CheckContext) -> None:
            require_struct(ctx, name)
            value, wire = _minimal_wire(ctx.spec, name)
            wire = {**wire, "field_from_a_newer_version": [1, "x"]}
            frames = [msgspec.msgpack.encode(wire)]
            decoded = decode(codec, name, frames)
            expect_value(decoded, value, name, ctx.spec, what=f"{name} with an unknown key",
                         sent=frames, fields=list(value))

    if name in PAYLOADS and encoding == "array":

        @check(f"{base}/extra-trailing", clauses=[EXTRA_CLAUSE], surface="codec",
               description=f"{name} with an unknown trailing element decodes (the element "
                           "is ignored)")
        def _extra(codec: CodecSurface, ctx: CheckContext) -> None:
            require_struct(ctx, name)
            value = Sampler(ctx.spec).required(name)
            wire = _wire_of(ctx.spec, ctx.spec.struct(name), value)
            frames = [msgspec.msgpack.encode([*wire, "field-from-a-newer-version"])]
            decoded = decode(codec, name, frames)
            expect_value(decoded, value, name, ctx.spec, what=f"{name} with an extra element",
                         sent=frames, fields=list(value))

        @check(f"{base}/map-rejected", clauses=[TYPE_CLAUSE], surface="codec",
               description=f"{name} sent as a map instead of an array is rejected")
        def _as_map(codec: CodecSurface, ctx: CheckContext) -> None:
            require_struct(ctx, name)
            spec_item = ctx.spec.struct(name)
            value = Sampler(ctx.spec).required(name)
            wire = _wire_of(ctx.spec, spec_item, value)
            as_map = {f.name: v for f, v in zip(spec_item.fields, wire, strict=True)}
            expect_rejection(codec, name, [msgspec.msgpack.encode(as_map)],
                             [TYPE_CLAUSE, GENERAL], f"{name} as a map")

    if name in PAYLOADS:
        typed = next((f for f in required if scalar_type(parse_type(f.type)) in (int, str)),
                     None)
        if typed is not None:
            type_clause = TYPE_CLAUSE if is_array else "frames.payload-matches-type"

            @check(f"{base}/wrong-type", clauses=[type_clause], surface="codec",
                   description=f"{name} whose {typed.name} has the wrong msgpack type is "
                               "rejected")
            def _wrong_type(codec: CodecSurface, ctx: CheckContext) -> None:
                require_struct(ctx, name)
                spec_item = ctx.spec.struct(name)
                value = Sampler(ctx.spec).required(name)
                wire = _wire_of(ctx.spec, spec_item, value)
                wrong = [1.5] if scalar_type(parse_type(typed.type)) is str else "not-an-int"
                if isinstance(wire, list):
                    wire[[f.name for f in spec_item.fields].index(typed.name)] = wrong
                else:
                    wire[typed.name] = wrong
                expect_rejection(
                    codec, name, [msgspec.msgpack.encode(wire)], [type_clause, GENERAL],
                    f"{name}.{typed.name} as {type(wrong).__name__}",
                )


def _register_all() -> None:
    spec = load()
    for item in spec.structs.values():
        if isinstance(item, StructSpec) and item.name not in CONTEXTUAL:
            _register_struct(item)


_register_all()


@check("codec/struct/array-defaults-written", clauses=["structs.array.every-field-written"],
       surface="codec")
def _array_omit_defaults(codec: CodecSurface, ctx: CheckContext) -> None:
    """An array struct that omits defaults still writes every field, defaults in place."""
    item = ctx.spec.struct("EngineCoreOutputs")
    value = Sampler(ctx.spec).required("EngineCoreOutputs")
    frames = encode(codec, "EngineCoreOutputs", value)
    actual = raw_decode(frames[0])
    if not isinstance(actual, list) or len(actual) != len(item.fields):
        raise CheckFailure(
            f"EngineCoreOutputs must encode as an array of all {len(item.fields)} fields even "
            f"when they hold their defaults, got {neutral(actual)!r}",
            Reproduction(received=frames, notes={"value": value}),
        )
    expected = [value.get(f.name, default_of(f)) for f in item.fields]
    expected = [sorted(v) if isinstance(v, set) else v for v in expected]
    if [neutral(v) for v in actual] != expected:
        raise CheckFailure(
            "EngineCoreOutputs must carry every field's default in place",
            Reproduction(received=frames, notes={"expected": expected}),
        )
