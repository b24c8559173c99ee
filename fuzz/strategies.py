"""Hypothesis strategies for every enginewire message kind and struct, generated from the spec.

Nothing here is written per struct: :func:`values` walks the type expressions of
``spec/data/structs/*.toml`` (grammar in :mod:`enginewire.spec.types`) and :func:`messages` the
frame layouts of ``spec/data/frames.toml``. The few rules a type expression cannot say (exactly
one of ``sampling_params`` and ``pooling_params``, the shape of a utility reply, ...) are listed
in :data:`RULES`, each with the clause it comes from.

Valid values
------------
``messages(kind)`` draws values that ``codec.encode(kind, value)`` accepts: instances of the
classes of :mod:`enginewire.reference.structs` for struct payloads, tuples and lists for the
untyped payloads, dicts for HELLO and READY, ``None`` for literal-only kinds. The draws reach the
edges the spec cares about: empty containers, ``None`` wherever a type is nullable, the 64-bit
integer bounds (``-2**63`` and ``2**64 - 1``), non-ASCII text, ``nan``, ``inf`` and ``-0.0`` (a
msgpack float64 carries them and every decoder in the spec's scope accepts them), and tensors
and arrays of every dtype in the vocabulary: 0-d, empty (a zero in the shape), non-contiguous,
and sized one element below, at, and one element above the inline threshold (exactly
``threshold - 1``, ``threshold`` and ``threshold + 1`` bytes for one-byte dtypes). ``ndarray``
positions get numpy arrays; ``tensor`` positions get torch tensors when the codec decodes to
torch, :class:`~enginewire.reference.tensors.WireTensor` otherwise; ``nested_tensors``
positions get such tensors, numbers, and lists of them nested a few levels deep.

Malformed input
---------------
:func:`enginewire.fuzz.mutations.malformed` draws :class:`Malformed` cases: the frames of a
valid message with exactly one rule broken, labelled with the clause a decoder must cite when
it rejects them (:mod:`enginewire.fuzz.mutations` holds the catalogue; it builds on this
module, which never imports it). Where one defect breaks two clauses at once
(a missing out-of-band frame leaves an index out of range), :attr:`Malformed.also` lists the
other one and :attr:`Malformed.accepted` holds both.

Usage in your own tests::

    from hypothesis import given
    from enginewire.fuzz.mutations import malformed
    from enginewire.fuzz.strategies import messages, same_value
    from enginewire.reference import codec

    @given(messages("add"))
    def test_round_trip(request):
        frames = codec.encode("add", request)
        assert same_value(codec.decode("add", frames), request)

    @given(malformed("outputs"))
    def test_my_decoder_rejects(case):
        with pytest.raises(MyProtocolError) as info:
            my_decode("outputs", case.frames)
        assert info.value.clause in case.accepted, case.describe()

``values("list[EngineCoreEvent] | none")`` draws any type expression; ``kinds()`` lists every
kind ``messages`` and ``malformed`` accept. Pass ``codec=Codec(threshold=..., tensors="wire")``
to match another codec configuration.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from enginewire.conformance.oracle.values import differences
from enginewire.reference.codec import Codec, Layout, default_codec
from enginewire.reference.tensors import WireTensor, vocabulary
from enginewire.spec import load
from enginewire.spec.schema import EnumSpec, StructConstraint, StructSpec
from enginewire.spec.types import TypeExpr, TypeVisitor, kind_of, members, parse_type

__all__ = [
    "INT_MAX",
    "SpecStrategies",
    "INT_MIN",
    "RULES",
    "Malformed",
    "kinds",
    "generator",
    "messages",
    "same_value",
    "values",
]

#: The integer range msgpack (and so every int field) carries: int64 minimum to uint64 maximum.
INT_MIN = -(2**63)
INT_MAX = 2**64 - 1

#: What a type expression cannot say but a valid value must respect: (where, rule, clause).
#: The multi-field rules come from the structs' ``[[constraints]]`` and ``[[tagged_unions]]``.
RULES: tuple[tuple[str, str, str], ...] = (
    *((name, f"exactly one of {' and '.join(rule.fields)} is set", rule.clause)
      for name, item in load().structs.items() if isinstance(item, StructSpec)
      for rule in item.constraints if rule.kind == "exactly-one-of"),
    *((name, f"{union.field} is [tag, struct of that tag]: "
             + ", ".join(f"{tag!r} ({struct})" for tag, struct in union.tags.items()),
       union.clause)
      for name, item in load().structs.items() if isinstance(item, StructSpec)
      for union in item.tagged_unions),
    ("UtilityResult", "type_info is nil (the codec does not allow insecure serialization)",
     "structs.utility-result.type-info-insecure-only"),
    ("outputs", "utility_output is nil", "frames.utility-reply"),
    ("utility_reply", "no request outputs; utility_output carries either failure_message or "
     "result", "frames.utility-reply"),
    ("coordinator_outputs", "no request outputs and no utility output",
     "frames.coordinator-outputs-single-frame"),
    ("abort", "at least one request id", "frames.abort-not-empty"),
    ("utility", "call_id is a non-negative integer below 2**64", "frames.utility-call-id"),
    ("stats_update", "counts holds [waiting, running, kv_cache_usage] per engine",
     "frames.stats-update-payload"),
    ("hello, ready", "the keys of the handshake surface's message table, status literal",
     "handshake.message-keys"),
)


_EDGE_INTS = (0, 1, -1, INT_MIN, INT_MAX, 2**63 - 1, 2**63, 2**32, -(2**31) - 1, 127, 128, -33)
_EDGE_FLOATS = (
    0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 1e-310, 0.1,
)
_EDGE_TEXT = ("", "é", "日本語", "\x00", "🙂 ok", "Ωmega\u200b", "a" * 40)


@dataclass(frozen=True)
class Malformed:
    """A near-valid message that breaks one rule of the spec.

    ``frames`` are the frames as the sender would hand them to its socket (with the identity
    frame first when ``routed``); ``clause`` is the clause a decoder must name when it rejects
    them; ``also`` lists other clauses the same defect breaks (a decoder may name any of
    :attr:`accepted`); ``description`` says what was changed, ``mutation`` names the catalogue
    entry (see :mod:`enginewire.fuzz.mutations`).
    """

    kind: str
    frames: tuple[bytes, ...]
    clause: str
    description: str
    mutation: str
    also: tuple[str, ...] = ()
    routed: bool = False

    @property
    def accepted(self) -> frozenset[str]:
        """Every clause a correct rejection may name."""
        return frozenset((self.clause, *self.also))

    def hex_frames(self) -> list[str]:
        """The frames as lowercase hex strings (for reports and replays)."""
        return [frame.hex() for frame in self.frames]

    def describe(self) -> str:
        """One line per fact: kind, mutation, clause, the frames in hex."""
        lines = [f"{self.kind}: {self.description} [{self.mutation}]",
                 f"  clause: {self.clause}" + (f" (or {', '.join(self.also)})" if self.also
                                               else "")]
        lines += [f"  frame {i}: {h or '(empty)'}" for i, h in enumerate(self.hex_frames())]
        return "\n".join(lines)


def same_value(actual: Any, expected: Any) -> bool:
    """Whether a decoded value equals the value it was encoded from.

    Structs compare field by field, tensors and arrays by dtype, shape and C-order bytes (so a
    NaN element compares equal to itself), floats with ``nan == nan``, sets regardless of order,
    tuples equal to lists of the same items.
    :func:`enginewire.conformance.oracle.values.differences` gives the list of mismatches.
    """
    return not differences(expected, actual)


# --- the generator -------------------------------------------------------------------------


class _StrategyOf(TypeVisitor["st.SearchStrategy[Any]"]):
    """The strategy for one type expression, built by :class:`SpecStrategies` (its nested
    types go back through the generator's cache)."""

    def __init__(self, gen: SpecStrategies) -> None:
        super().__init__(gen.spec.structs)
        self.gen = gen

    def visit_union(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return self.gen._union(expr, depth)

    def visit_int(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.one_of(st.sampled_from(_EDGE_INTS), st.integers(INT_MIN, INT_MAX))

    def visit_float(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.one_of(st.sampled_from(_EDGE_FLOATS), st.floats())

    def visit_str(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return _text()

    def visit_bool(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.booleans()

    def visit_bytes(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.binary(max_size=64)

    def visit_none(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.none()

    def visit_slice(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        bound = st.none() | st.one_of(st.sampled_from(_EDGE_INTS),
                                      st.integers(INT_MIN, 2**63 - 1))
        return st.builds(slice, bound, bound, bound)

    def visit_any(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return _any_value()

    def visit_tensor(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return self.gen.tensor(expr.name)

    visit_ndarray = visit_tensor

    def visit_nested_tensors(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return self.gen.nested_tensors()

    def visit_list(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.lists(self.gen.value(expr.args[0], depth + 1), max_size=self.gen._size(depth))

    def visit_set(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.sets(self.gen.value(expr.args[0], depth + 1), max_size=self.gen._size(depth))

    def visit_tuple(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        if expr.variadic:
            return self.visit_list(expr, depth).map(tuple)
        return st.tuples(*(self.gen.value(a, depth + 1) for a in expr.args))

    def visit_dict(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return st.dictionaries(self.gen.key(expr.args[0]),
                               self.gen.value(expr.args[1], depth + 1),
                               max_size=self.gen._size(depth))

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, depth: int) -> st.SearchStrategy[Any]:
        return self.gen.enum(item)

    def visit_struct(self, expr: TypeExpr, item: StructSpec,
                     depth: int) -> st.SearchStrategy[Any]:
        return self.gen.struct(item.name, depth)


class SpecStrategies:
    """The strategies for one codec's configuration (structs, dtype vocabulary, threshold),
    built from the spec the codec follows; :func:`generator` hands out a cached instance."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.spec = codec.spec
        self.structs = codec.structs
        self.vocab = vocabulary(codec.spec.version)
        #: Handshake kinds with a key table (hello, ready) -> their keys.
        self.handshake_keys = {
            m.name.lower(): m.keys for m in self.spec.surface("handshake").messages if m.keys
        }
        self.threshold = codec.threshold
        self.torch = None
        if codec.tensor_mode == "torch":
            import torch

            self.torch = torch
        self._cache: dict[tuple[str, int], st.SearchStrategy[Any]] = {}

    # --- type expressions --------------------------------------------------------------

    def value(self, expr: TypeExpr, depth: int = 0) -> st.SearchStrategy[Any]:
        """A strategy for values of ``expr``; ``depth`` counts enclosing containers."""
        key = (str(expr), min(depth, 4))
        found = self._cache.get(key)
        if found is None:
            found = st.deferred(lambda: self._build(expr, depth))
            self._cache[key] = found
        return found

    def _size(self, depth: int) -> int:
        return (4, 3, 2, 1, 1)[min(depth, 4)]

    def _build(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        return _StrategyOf(self).visit(expr, depth)

    def key(self, expr: TypeExpr) -> st.SearchStrategy[Any]:
        """Map keys: hashable values of ``expr`` (``any`` keys are strings or integers)."""
        if kind_of(expr) == "any":
            return _text() | st.integers(INT_MIN, INT_MAX)
        return self.value(expr, 4)

    def _union(self, expr: TypeExpr, depth: int) -> st.SearchStrategy[Any]:
        options = [self.value(a, depth) for a in members(expr)]
        if expr.nullable:
            options.insert(0, st.none())
        return st.one_of(*options)

    def enum(self, item: EnumSpec) -> st.SearchStrategy[Any]:
        if item.wire == "bytes":
            return st.sampled_from([
                bytes([m.value]) if isinstance(m.value, int) else m.value.encode()
                for m in item.members
            ])
        return st.sampled_from(list(self.structs.enums[item.name]))

    # --- structs -----------------------------------------------------------------------

    def struct(self, name: str, depth: int = 0,
               overrides: Mapping[str, st.SearchStrategy[Any]] | None = None
               ) -> st.SearchStrategy[Any]:
        """Instances of the reference class of struct ``name``; ``overrides`` replace the
        strategies of some fields (those fields are then always set)."""
        item = self.spec.struct(name)
        cls = self.structs.classes[name]
        overrides = dict(overrides or {})
        overrides.update(self._struct_rules(item, depth))
        exclusive = [c for c in item.constraints if c.kind == "exactly-one-of"]
        joint = self._exactly_one_of(item, exclusive, depth) if exclusive else None
        in_joint = {name for constraint in exclusive for name in constraint.fields}
        required: dict[str, st.SearchStrategy[Any]] = {}
        optional: dict[str, st.SearchStrategy[Any]] = {}
        for fld in item.fields:
            if fld.name in in_joint:
                continue
            expr = parse_type(fld.type)
            if fld.name in overrides:
                required[fld.name] = overrides[fld.name]
            elif fld.required:
                required[fld.name] = self.value(expr, depth + 1)
            else:
                optional[fld.name] = self.value(expr, depth + 1)
        fields = st.fixed_dictionaries(required, optional=optional)
        if joint is not None:
            return st.tuples(fields, joint).map(lambda pair: cls(**pair[0], **pair[1]))
        return fields.map(lambda kwargs: cls(**kwargs))

    def _struct_rules(self, item: StructSpec, depth: int) -> dict[str, st.SearchStrategy[Any]]:
        if item.name == "UtilityResult" and not self.codec.pickle_allowed:
            return {"type_info": st.none()}
        # A tagged union travels as [tag, value of the tagged struct] (spec data).
        return {union.field: st.one_of(*(
            st.tuples(st.just(tag), self.struct(struct, depth + 1))
            for tag, struct in union.tags.items()
        )) for union in item.tagged_unions}

    def _exactly_one_of(self, item: StructSpec, constraints: list[StructConstraint],
                        depth: int) -> st.SearchStrategy[dict[str, Any]]:
        """The fields of ``item``'s exactly-one-of constraints: in each, one field drawn
        from its type without None, the others None."""
        types = {f.name: parse_type(f.type).without_none() for f in item.fields}

        def one(constraint: StructConstraint) -> st.SearchStrategy[dict[str, Any]]:
            return st.one_of(*(
                st.fixed_dictionaries({
                    name: self.value(types[name], depth + 1) if name == chosen else st.none()
                    for name in constraint.fields
                })
                for chosen in constraint.fields
            ))

        return st.tuples(*(one(c) for c in constraints)).map(
            lambda parts: {key: value for part in parts for key, value in part.items()})

    # --- tensors -----------------------------------------------------------------------

    def nested_tensors(self) -> st.SearchStrategy[Any]:
        """Nested tensors (tensors.nested-tensors): tensors, ints and floats, and lists of
        them nested a few levels deep, empty lists included."""
        leaf = st.one_of(self.tensor("tensor"), self.value(TypeExpr("int")),
                         self.value(TypeExpr("float")))
        return st.recursive(leaf, lambda inner: st.lists(inner, max_size=3), max_leaves=4)

    def tensor(self, family: str) -> st.SearchStrategy[Any]:
        """Tensors (``family="tensor"``) or numpy arrays (``"ndarray"``) of every dtype in the
        vocabulary, with the shapes described in the module docstring."""
        table = self.vocab.torch if family == "tensor" else self.vocab.numpy
        return st.sampled_from(sorted(table)).flatmap(
            lambda dtype: self._shaped(family, dtype, table[dtype])
        )

    def _shapes(self, itemsize: int) -> st.SearchStrategy[tuple[int, ...]]:
        threshold = self.threshold
        edge_counts = sorted({max((threshold - 1) // itemsize, 0), -(-threshold // itemsize),
                              threshold // itemsize + 1})
        return st.one_of(
            st.just(()),
            st.sampled_from([(0,), (0, 3), (2, 0, 1)]),
            st.sampled_from([(count,) for count in edge_counts]),
            st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple),
        )

    def _shaped(self, family: str, dtype: str, itemsize: int) -> st.SearchStrategy[Any]:
        is_bool = dtype in ("bool", "|b1")

        @st.composite
        def build(draw: st.DrawFn) -> Any:
            shape = draw(self._shapes(itemsize))
            nbytes = math.prod(shape) * itemsize
            if is_bool:
                data = bytes(draw(st.lists(st.integers(0, 1), min_size=nbytes,
                                           max_size=nbytes)))
            else:
                data = draw(st.binary(min_size=nbytes, max_size=nbytes))
            transposed = len(shape) == 2 and draw(st.booleans())
            return self._make(family, dtype, shape, data, transposed)

        return build()

    def _make(self, family: str, dtype: str, shape: tuple[int, ...], data: bytes,
              transposed: bool) -> Any:
        stored = tuple(reversed(shape)) if transposed else shape
        if family == "ndarray":
            array = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(stored)
            return array.T if transposed else array
        if self.torch is None:
            return WireTensor(dtype, shape, data)
        torch = self.torch
        torch_dtype = getattr(torch, dtype)
        if not data:
            return torch.empty(shape, dtype=torch_dtype)
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(torch_dtype)
        tensor = tensor.reshape(stored)
        return tensor.t() if transposed else tensor

    # --- message kinds -------------------------------------------------------------------

    def layout(self, kind: str) -> Layout | None:
        return self.codec.layout(kind) if kind in self.codec.message_kinds else None

    def message(self, kind: str) -> st.SearchStrategy[Any]:
        layout = self.layout(kind)
        if layout is None:
            if kind not in self.structs.classes:
                raise KeyError(f"unknown message kind or struct {kind!r}; see kinds()")
            return self.struct(kind)
        if layout.payload is None:
            return st.none()
        if kind in self.handshake_keys:
            return self._handshake_map(kind)
        special = self._message_rules(kind)
        if special is not None:
            return special
        strategy = self.value(parse_type(layout.payload))
        if kind == "ready_response":
            # An empty payload frame stands for "ready, nothing to apply"
            # (handshake.ready-response-empty-accepted).
            return st.none() | strategy
        return strategy

    def _message_rules(self, kind: str) -> st.SearchStrategy[Any] | None:
        if kind == "outputs":
            return self.struct("EngineCoreOutputs", overrides={"utility_output": st.none()})
        if kind == "utility_reply":
            return self.struct("EngineCoreOutputs", overrides={
                "outputs": st.builds(list), "utility_output": self._utility_answer(),
            })
        if kind == "coordinator_outputs":
            return self.struct("EngineCoreOutputs", overrides={
                "outputs": st.builds(list), "utility_output": st.none(),
            })
        if kind == "abort":
            return st.lists(_text(), min_size=1, max_size=4)
        if kind == "utility":
            any_args = st.lists(_any_value(), max_size=3).map(tuple)
            return st.tuples(self.value(TypeExpr("int")), st.integers(0, INT_MAX), _text(),
                             any_args)
        if kind == "stats_update":
            number = st.one_of(st.integers(0, INT_MAX), st.floats(allow_nan=False))
            counts = st.lists(st.lists(number, min_size=3, max_size=3), max_size=4)
            return st.tuples(st.none() | counts, self.value(TypeExpr("int")), st.booleans())
        return None

    def _utility_answer(self) -> st.SearchStrategy[Any]:
        cls = self.structs.classes["UtilityOutput"]
        call_id = st.integers(0, INT_MAX)
        failed = st.builds(lambda c, m: cls(call_id=c, failure_message=m), call_id, _text())
        result = st.builds(lambda c, r: cls(call_id=c, result=r), call_id,
                           self.struct("UtilityResult"))
        return failed | result

    def _handshake_map(self, kind: str) -> st.SearchStrategy[dict[str, Any]]:
        required: dict[str, st.SearchStrategy[Any]] = {}
        optional: dict[str, st.SearchStrategy[Any]] = {}
        for key in self.handshake_keys[kind]:
            strategy = (st.just(key.value) if key.value is not None
                        else self.value(parse_type(key.type)))
            (required if key.required else optional)[key.name] = strategy
        return st.fixed_dictionaries(required, optional=optional)


def _text() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(_EDGE_TEXT), st.text(max_size=24))


def _any_scalar() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.integers(INT_MIN, INT_MAX), st.sampled_from(_EDGE_INTS),
        st.floats(), st.sampled_from(_EDGE_FLOATS), _text(), st.binary(max_size=16),
    )


def _any_value() -> st.SearchStrategy[Any]:
    """Untyped msgpack data as it decodes: lists (never tuples), maps with string keys."""
    return st.recursive(
        _any_scalar(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text(), inner, max_size=3),
        max_leaves=6,
    )


_GENERATORS: weakref.WeakKeyDictionary[Codec, SpecStrategies] = weakref.WeakKeyDictionary()


def generator(codec: Codec | None = None) -> SpecStrategies:
    """The (cached) strategy generator for ``codec`` (default: the reference default codec)."""
    codec = codec or default_codec()
    found = _GENERATORS.get(codec)
    if found is None:
        found = _GENERATORS[codec] = SpecStrategies(codec)
    return found


# --- public API ----------------------------------------------------------------------------


def kinds(codec: Codec | None = None) -> tuple[str, ...]:
    """Every kind :func:`messages` and :func:`malformed` accept: the message kinds of
    frames.toml, then the struct names of the spec."""
    codec = codec or default_codec()
    return (*codec.message_kinds, *sorted(codec.structs.classes))


def messages(kind: str, *, codec: Codec | None = None) -> st.SearchStrategy[Any]:
    """Valid values of a message ``kind`` (frames.toml) or struct name, as ``codec.encode``
    takes them (see the module docstring for what the draws cover)."""
    return generator(codec).message(kind)


def values(type_text: str | TypeExpr, *, codec: Codec | None = None) -> st.SearchStrategy[Any]:
    """Values of any type expression of the spec's grammar (``"dict[str, int] | none"``)."""
    expr = parse_type(type_text) if isinstance(type_text, str) else type_text
    return generator(codec).value(expr)
