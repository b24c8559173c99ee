"""The msgpack data model a spec'd value must take on the wire: an oracle built from the spec.

:func:`expected_wire` maps a neutral value of a spec type to the plain msgpack data model
(lists, dicts, ints, floats, strings, ``Ext``) the spec prescribes, plus the out-of-band buffers
its tensors go to. :func:`raw_decode` reads frame 0 of a message into the same model (any
extension type stays a ``msgspec.msgpack.Ext``). Comparing the two checks an encoder against
the spec, independent of integer-width choices; byte-exact comparisons are the golden vectors'
job.

Encodings (``StructSpec.encoding``):

- ``array``: an array of every field in spec order (msgspec ``array_like``; ``omit_defaults``
  does not shorten it);
- ``map``: a map by field name; with ``omit_defaults`` a field equal to its default is left out;
- ``dataclass``: a map of every field by name (msgspec encodes dataclasses whole);
- ``tuple``: an array of every field in order (a NamedTuple).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from enginewire.conformance.oracle.values import (
    TensorValue,
    _union_member,
    default_of,
    neutral,
    tensor_value,
)
from enginewire.spec import load
from enginewire.spec.schema import EnumSpec, StructSpec
from enginewire.spec.types import (
    TypeExpr,
    TypeVisitor,
    container_type,
    kind_of,
    members,
    parse_type,
    tensor_family,
)

#: msgpack extension type of inline tensor bytes (tensors surface, ext_codes).
RAW_VIEW_EXT: int = load().ext_code("raw_view")
#: The default inline threshold in bytes (tensors surface, threshold_default).
THRESHOLD_DEFAULT: int = load().inline_threshold()


class OmittableMap(dict):
    """An expected map-encoded struct whose ``omitted`` entries (defaults left out because the
    struct omits defaults) may also be present, holding exactly the default, when compared
    leniently."""

    omitted: dict[Any, Any]
    #: Every field name of the struct, in declaration order (the order msgspec writes them).
    order: list[Any]

    def __init__(self, *args: Any, omitted: dict[Any, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.omitted = dict(omitted or {})
        self.order = list(self)


class WireSet(list):
    """An expected set: a msgpack array whose order the spec leaves open (structs.set.array)."""


@dataclass
class WireForm:
    """The expected frame 0 (as msgpack data) and the expected out-of-band buffers."""

    value: Any
    oob: list[bytes] = field(default_factory=list)


def raw_decode(frame: bytes | bytearray | memoryview) -> Any:
    """Decode one msgpack frame to plain data; extension types stay ``Ext(code, bytes)``."""
    return msgspec.msgpack.decode(
        frame, ext_hook=lambda code, data: msgspec.msgpack.Ext(code, bytes(data))
    )


def expected_wire(value: Any, type_text: str | TypeExpr, spec: Any, *,
                  threshold: int = THRESHOLD_DEFAULT) -> WireForm:
    """What ``value`` (neutral, of spec type ``type_text``) must look like on the wire."""
    form = WireForm(None)
    form.value = _ToWire(spec, threshold, form.oob).wire(
        parse_type(type_text) if isinstance(type_text, str) else type_text, value)
    return form


class _ToWire(TypeVisitor[Any]):
    """The wire form of a neutral value of one type; out-of-band buffers go to ``oob``."""

    def __init__(self, spec: Any, threshold: int, oob: list[bytes]) -> None:
        super().__init__(spec.structs)
        self.spec = spec
        self.threshold = threshold
        self.oob = oob

    def wire(self, expr: TypeExpr, value: Any) -> Any:
        return None if value is None else self.visit(expr, value)

    def visit_union(self, expr: TypeExpr, value: Any) -> Any:
        member = _union_member(value, expr, self.spec)
        if member is None:
            tensor_members = [a for a in expr.args if kind_of(a) == "tensor"]
            if tensor_members and _is_array(value):
                member = tensor_members[0]
            else:
                enums = [a for a in expr.args if isinstance(self.structs.get(a.name), EnumSpec)]
                member = enums[0] if enums else TypeExpr("any")
        return self.wire(member, value)

    def visit_struct(self, expr: TypeExpr, item: StructSpec, value: Any) -> Any:
        return _struct(value, item, self)

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, value: Any) -> Any:
        return neutral(value)

    def visit_tensor(self, expr: TypeExpr, value: Any) -> Any:
        tensors = self.spec.surface("tensors")
        form = tensors.tensor_form if tensor_family(expr) == "tensor" else tensors.ndarray_form
        if form != "tuple":
            code = self.spec.ext_code("tensor") if form == "pickle" else RAW_VIEW_EXT
            return _earlier_tensor(value, form, code, self.threshold, self.oob)
        return _tensor(value, expr.name, self.threshold, self.oob)

    visit_ndarray = visit_tensor

    def visit_list(self, expr: TypeExpr, value: Any) -> Any:
        return [self.wire(expr.args[0], v) for v in value]

    def visit_set(self, expr: TypeExpr, value: Any) -> Any:
        return WireSet(self.wire(expr.args[0], v) for v in value)

    def visit_tuple(self, expr: TypeExpr, value: Any) -> Any:
        if expr.variadic:
            return self.visit_list(expr, value)
        return [self.wire(a, v) for v, a in zip(value, expr.args, strict=True)]

    def visit_dict(self, expr: TypeExpr, value: Any) -> Any:
        return {self.wire(expr.args[0], k): self.wire(expr.args[1], v) for k, v in value.items()}

    def visit_slice(self, expr: TypeExpr, value: Any) -> Any:
        return [value.start, value.stop, value.step]

    def visit_float(self, expr: TypeExpr, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return neutral(value)

    def visit_any(self, expr: TypeExpr, value: Any) -> Any:
        if _is_array(value):
            return _tensor(value, "tensor", self.threshold, self.oob)
        if isinstance(value, Mapping):
            return {k: self.wire(expr, v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.wire(expr, v) for v in value]
        return neutral(value)

    def _plain(self, expr: TypeExpr, value: Any) -> Any:
        return neutral(value)

    visit_str = visit_int = visit_bool = visit_bytes = visit_none = _plain
    visit_nested_tensors = _plain


def _is_array(value: Any) -> bool:
    return isinstance(value, TensorValue) or type(value).__name__ in ("Tensor", "ndarray")


def _struct(value: Any, item: StructSpec, walk: _ToWire) -> Any:
    if not isinstance(value, Mapping):
        raise TypeError(f"a {item.name} value must be a dict, got {type(value).__name__}")
    unknown = set(value) - {f.name for f in item.fields}
    if unknown:
        raise KeyError(f"{item.name} has no fields {sorted(unknown)}")
    entries = []
    for fld in item.fields:
        if fld.name in value:
            present = value[fld.name]
        elif fld.required:
            raise KeyError(f"{item.name}.{fld.name} is required")
        else:
            present = default_of(fld)
        is_default = not fld.required and fld.name not in value or (
            not fld.required and neutral(present) == default_of(fld)
        )
        entries.append((fld, present, is_default))
    if item.encoding in ("array", "tuple"):
        return [walk.wire(parse_type(f.type), v) for f, v, _ in entries]
    out = OmittableMap()
    out.order = [fld.name for fld, _, _ in entries]
    for fld, present, is_default in entries:
        if item.encoding == "map" and item.omit_defaults and is_default:
            scratch = _ToWire(walk.spec, walk.threshold, [])
            out.omitted[fld.name] = scratch.wire(parse_type(fld.type), present)
            continue
        out[fld.name] = walk.wire(parse_type(fld.type), present)
    return out


def _tensor(value: Any, family: str, threshold: int, oob: list[bytes]) -> list[Any]:
    tv = value if isinstance(value, TensorValue) else tensor_value(value)
    # ndarrays of rank 0 always travel inline; tensors only by size (vllm/v1/serial_utils.py
    # :242 and :261).
    inline = len(tv.data) < threshold or (tv.family == "ndarray" and not tv.shape)
    if inline:
        data: Any = msgspec.msgpack.Ext(RAW_VIEW_EXT, tv.data)
    else:
        oob.append(tv.data)
        data = len(oob)
    return [tv.dtype, list(tv.shape), data]


def _earlier_tensor(value: Any, form: str, code: int, threshold: int,
                   oob: list[bytes]) -> Any:
    """A tensor in an earlier release's form (the tensors surface's tensor_form): ``numpy``,
    the tuple of its numpy view (numpy's dtype.str; a 0-d value inline whatever its size);
    ``pickle``, the ``tensor`` extension type wrapping a pickle stream of the numpy view (this
    process's pickle of it: the stream's bytes are not specified, tensors.pickle-form).
    ``code``: the extension type of the pickle, or of inline bytes in the numpy form."""
    import pickle

    import numpy as np

    tv = value if isinstance(value, TensorValue) else tensor_value(value)
    array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
    if form == "pickle":
        return msgspec.msgpack.Ext(code, pickle.dumps(array))
    if len(tv.data) < threshold or not tv.shape:
        data: Any = msgspec.msgpack.Ext(code, tv.data)
    else:
        oob.append(tv.data)
        data = len(oob)
    return [array.dtype.str, list(tv.shape), data]


def compare_wire(expected: Any, actual: Any, path: str = "$", *,
                 strict_omit: bool = False) -> list[str]:
    """Differences between two values of the msgpack data model (``Ext`` compared by code and
    bytes). A default that a map struct omits may be present with its default value unless
    ``strict_omit``."""
    found: list[str] = []
    _compare(expected, actual, path, found, strict_omit)
    return found


def _compare(expected: Any, actual: Any, path: str, found: list[str],
             strict_omit: bool = False) -> None:
    if isinstance(expected, msgspec.msgpack.Ext) or isinstance(actual, msgspec.msgpack.Ext):
        both = isinstance(expected, msgspec.msgpack.Ext) and isinstance(actual, msgspec.msgpack.Ext)
        if not (both and expected.code == actual.code
                and bytes(expected.data) == bytes(actual.data)):
            found.append(f"{path}: expected {show(expected)}, got {show(actual)}")
        return
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        omitted = getattr(expected, "omitted", {})
        for key in expected:
            if key not in actual:
                found.append(f"{path}.{key}: missing (expected {show(expected[key])})")
            else:
                _compare(expected[key], actual[key], f"{path}.{key}", found, strict_omit)
        for key in actual:
            if key in expected:
                continue
            if key in omitted and not strict_omit:
                _compare(omitted[key], actual[key], f"{path}.{key}", found, strict_omit)
            elif key in omitted:
                found.append(f"{path}.{key}: holds its default {show(actual[key])}, which "
                             "should be omitted")
            else:
                found.append(f"{path}.{key}: not expected on the wire (got {show(actual[key])})")
        return
    if isinstance(expected, Sequence) and isinstance(actual, Sequence) and not isinstance(
        expected, str | bytes
    ) and not isinstance(actual, str | bytes):
        if len(expected) != len(actual):
            found.append(f"{path}: expected an array of {len(expected)}, got {len(actual)}: "
                         f"{show(actual)}")
        # Every common position, also when the lengths differ: the first one whose meaning
        # differs is what a reader needs, not the length alone.
        for index, (e, a) in enumerate(zip(expected, actual, strict=False)):
            _compare(e, a, f"{path}[{index}]", found, strict_omit)
        return
    if type(expected) is not type(actual):
        found.append(f"{path}: expected {show(expected)} ({type(expected).__name__}), got "
                     f"{show(actual)} ({type(actual).__name__})")
        return
    if expected != actual:
        found.append(f"{path}: expected {show(expected)}, got {show(actual)}")


def show(value: Any) -> str:
    """A short, deterministic rendering of a msgpack value for messages."""
    if isinstance(value, msgspec.msgpack.Ext):
        return f"Ext({value.code}, {bytes(value.data)[:24].hex()})"
    if isinstance(value, list):
        text = "[" + ", ".join(show(v) for v in value) + "]"
        return text if len(text) <= 120 else text[:120] + "..."
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


# --- the way back: wire data to neutral values ---------------------------------------------


class WireShapeError(ValueError):
    """Wire data that does not have the shape its spec type prescribes."""


def from_wire(raw: Any, type_text: str | TypeExpr, spec: Any,
              oob: Sequence[bytes] = ()) -> Any:
    """Read wire data (from :func:`raw_decode`) as a neutral value of spec type ``type_text``:
    array structs become dicts by field name (missing trailing fields take their defaults),
    tensor tuples :class:`TensorValue` (out-of-band data taken from ``oob``, index 1 first).
    Raises :class:`WireShapeError` where the data cannot be that type."""
    expr = parse_type(type_text) if isinstance(type_text, str) else type_text
    return _FromWire(spec, list(oob)).back(expr, raw, "$")


class _FromWire(TypeVisitor[Any]):
    """A neutral value of one type read from wire data; ``path`` names the position."""

    def __init__(self, spec: Any, oob: list[bytes]) -> None:
        super().__init__(spec.structs)
        self.spec = spec
        self.oob = oob

    def back(self, expr: TypeExpr, raw: Any, path: str) -> Any:
        return None if raw is None else self.visit(expr, raw, path)

    def visit_union(self, expr: TypeExpr, raw: Any, path: str) -> Any:
        return self.back(_wire_member(raw, expr, self.spec), raw, path)

    def visit_struct(self, expr: TypeExpr, item: StructSpec, raw: Any, path: str) -> Any:
        names = [f.name for f in item.fields]
        if item.encoding in ("array", "tuple"):
            if not isinstance(raw, list):
                raise WireShapeError(f"{path}: {item.name} must be an array, got "
                                     f"{type(raw).__name__}")
            pairs = dict(zip(names, raw, strict=False))
        else:
            if not isinstance(raw, dict):
                raise WireShapeError(f"{path}: {item.name} must be a map, got "
                                     f"{type(raw).__name__}")
            pairs = {k: v for k, v in raw.items() if k in names}
        out = {}
        for fld in item.fields:
            if fld.name in pairs:
                out[fld.name] = self.back(parse_type(fld.type), pairs[fld.name],
                                          f"{path}.{fld.name}")
            elif not fld.required:
                out[fld.name] = default_of(fld)
            else:
                raise WireShapeError(f"{path}: {item.name}.{fld.name} is missing")
        return out

    def visit_tensor(self, expr: TypeExpr, raw: Any, path: str) -> Any:
        return _tensor_back(raw, expr.name, self.oob, path)

    visit_ndarray = visit_tensor

    def visit_list(self, expr: TypeExpr, raw: Any, path: str) -> Any:
        if not isinstance(raw, list):
            raise WireShapeError(f"{path}: expected an array, got {type(raw).__name__}")
        items = [self.back(expr.args[0], v, f"{path}[{i}]") for i, v in enumerate(raw)]
        return set(items) if container_type(expr) is set else items

    visit_set = visit_list

    def visit_tuple(self, expr: TypeExpr, raw: Any, path: str) -> Any:
        if expr.variadic:
            return self.visit_list(expr, raw, path)
        if not isinstance(raw, list) or len(raw) != len(expr.args):
            raise WireShapeError(f"{path}: expected an array of {len(expr.args)}")
        return [self.back(a, v, f"{path}[{i}]")
                for i, (v, a) in enumerate(zip(raw, expr.args, strict=True))]

    def visit_dict(self, expr: TypeExpr, raw: Any, path: str) -> Any:
        if not isinstance(raw, dict):
            raise WireShapeError(f"{path}: expected a map, got {type(raw).__name__}")
        return {k: self.back(expr.args[1], v, f"{path}.{k}") for k, v in raw.items()}

    def _as_is(self, expr: TypeExpr, raw: Any, path: str) -> Any:
        """Scalars, enums, untyped and nested-tensor data stay the wire value."""
        return raw

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _as_is
    visit_any = visit_slice = visit_nested_tensors = _as_is

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, raw: Any, path: str) -> Any:
        return raw


def _wire_member(raw: Any, expr: TypeExpr, spec: Any) -> TypeExpr:
    candidates = members(expr)
    def encoding(a: TypeExpr) -> str | None:
        found = spec.structs.get(a.name)
        return found.encoding if isinstance(found, StructSpec) else None
    if isinstance(raw, dict):
        for a in candidates:
            if encoding(a) in ("map", "dataclass") or kind_of(a) == "mapping":
                return a
    if isinstance(raw, list):
        for a in candidates:
            if kind_of(a) == "tensor" and len(raw) == 3 and isinstance(raw[0], str):
                return a
        for a in candidates:
            if encoding(a) in ("array", "tuple") or kind_of(a) == "sequence":
                return a
    return TypeExpr("any")


def _tensor_back(raw: Any, family: str, oob: list[bytes], path: str) -> TensorValue:
    if not (isinstance(raw, list) and len(raw) == 3 and isinstance(raw[0], str)
            and isinstance(raw[1], list)):
        raise WireShapeError(f"{path}: a {family} must be [dtype, shape, data]")
    dtype, shape, data = raw
    if isinstance(data, msgspec.msgpack.Ext) and data.code == RAW_VIEW_EXT:
        body = bytes(data.data)
    elif isinstance(data, int) and not isinstance(data, bool) and 0 < data <= len(oob):
        body = bytes(oob[data - 1])
    else:
        raise WireShapeError(f"{path}: tensor data {show(data)} is neither Ext 3 nor a valid "
                             "out-of-band index")
    return TensorValue(dtype, tuple(shape), body, family)
