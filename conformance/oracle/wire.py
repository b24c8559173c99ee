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
from enginewire.spec.schema import EnumSpec, StructSpec
from enginewire.spec.types import TypeExpr, parse_type

RAW_VIEW_EXT = 3


class OmittableMap(dict):
    """An expected map-encoded struct whose ``omitted`` entries (defaults left out because the
    struct omits defaults) may also be present, holding exactly the default, when compared
    leniently."""

    omitted: dict[Any, Any]

    def __init__(self, *args: Any, omitted: dict[Any, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.omitted = dict(omitted or {})


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
                  threshold: int = 256) -> WireForm:
    """What ``value`` (neutral, of spec type ``type_text``) must look like on the wire."""
    form = WireForm(None)
    form.value = _wire(value, parse_type(type_text) if isinstance(type_text, str) else type_text,
                       spec, threshold, form.oob)
    return form


def _wire(value: Any, expr: TypeExpr, spec: Any, threshold: int, oob: list[bytes]) -> Any:
    if value is None:
        return None
    if expr.name == "union":
        member = _union_member(value, expr, spec)
        if member is None:
            tensor_members = [a for a in expr.args if a.name in ("tensor", "ndarray")]
            if tensor_members and _is_array(value):
                member = tensor_members[0]
            else:
                enums = [a for a in expr.args if isinstance(spec.structs.get(a.name), EnumSpec)]
                member = enums[0] if enums else TypeExpr("any")
        return _wire(value, member, spec, threshold, oob)
    item = spec.structs.get(expr.name)
    if isinstance(item, StructSpec):
        return _struct(value, item, spec, threshold, oob)
    if isinstance(item, EnumSpec):
        return neutral(value)
    if expr.name in ("tensor", "ndarray"):
        return _tensor(value, expr.name, threshold, oob)
    if expr.name in ("list", "set") or (expr.name == "tuple" and expr.variadic):
        return [_wire(v, expr.args[0], spec, threshold, oob) for v in value]
    if expr.name == "tuple":
        return [_wire(v, a, spec, threshold, oob) for v, a in zip(value, expr.args, strict=True)]
    if expr.name == "dict":
        return {_wire(k, expr.args[0], spec, threshold, oob):
                _wire(v, expr.args[1], spec, threshold, oob) for k, v in value.items()}
    if expr.name == "slice":
        return [value.start, value.stop, value.step]
    if expr.name == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expr.name == "any":
        if _is_array(value):
            return _tensor(value, "tensor", threshold, oob)
        if isinstance(value, Mapping):
            return {k: _wire(v, TypeExpr("any"), spec, threshold, oob) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [_wire(v, TypeExpr("any"), spec, threshold, oob) for v in value]
    return neutral(value)


def _is_array(value: Any) -> bool:
    return isinstance(value, TensorValue) or type(value).__name__ in ("Tensor", "ndarray")


def _struct(value: Any, item: StructSpec, spec: Any, threshold: int, oob: list[bytes]) -> Any:
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
        return [_wire(v, parse_type(f.type), spec, threshold, oob) for f, v, _ in entries]
    out = OmittableMap()
    for fld, present, is_default in entries:
        if item.encoding == "map" and item.omit_defaults and is_default:
            out.omitted[fld.name] = _wire(present, parse_type(fld.type), spec, threshold, [])
            continue
        out[fld.name] = _wire(present, parse_type(fld.type), spec, threshold, oob)
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
    return _back(raw, expr, spec, list(oob), "$")


def _back(raw: Any, expr: TypeExpr, spec: Any, oob: list[bytes], path: str) -> Any:
    if raw is None:
        return None
    if expr.name == "union":
        return _back(raw, _wire_member(raw, expr, spec), spec, oob, path)
    item = spec.structs.get(expr.name)
    if isinstance(item, StructSpec):
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
                out[fld.name] = _back(pairs[fld.name], parse_type(fld.type), spec, oob,
                                      f"{path}.{fld.name}")
            elif not fld.required:
                out[fld.name] = default_of(fld)
            else:
                raise WireShapeError(f"{path}: {item.name}.{fld.name} is missing")
        return out
    if isinstance(item, EnumSpec):
        return raw
    if expr.name in ("tensor", "ndarray"):
        return _tensor_back(raw, expr.name, oob, path)
    if expr.name in ("list", "set") or (expr.name == "tuple" and expr.variadic):
        if not isinstance(raw, list):
            raise WireShapeError(f"{path}: expected an array, got {type(raw).__name__}")
        items = [_back(v, expr.args[0], spec, oob, f"{path}[{i}]") for i, v in enumerate(raw)]
        return set(items) if expr.name == "set" else items
    if expr.name == "tuple":
        if not isinstance(raw, list) or len(raw) != len(expr.args):
            raise WireShapeError(f"{path}: expected an array of {len(expr.args)}")
        return [_back(v, a, spec, oob, f"{path}[{i}]")
                for i, (v, a) in enumerate(zip(raw, expr.args, strict=True))]
    if expr.name == "dict":
        if not isinstance(raw, dict):
            raise WireShapeError(f"{path}: expected a map, got {type(raw).__name__}")
        return {k: _back(v, expr.args[1], spec, oob, f"{path}.{k}") for k, v in raw.items()}
    if isinstance(raw, msgspec.msgpack.Ext):
        return raw
    return raw


def _wire_member(raw: Any, expr: TypeExpr, spec: Any) -> TypeExpr:
    members = [a for a in expr.args if a.name != "none"]
    def encoding(a: TypeExpr) -> str | None:
        found = spec.structs.get(a.name)
        return found.encoding if isinstance(found, StructSpec) else None
    if isinstance(raw, dict):
        for a in members:
            if encoding(a) in ("map", "dataclass") or a.name == "dict":
                return a
    if isinstance(raw, list):
        for a in members:
            if a.name in ("tensor", "ndarray") and len(raw) == 3 and isinstance(raw[0], str):
                return a
        for a in members:
            if encoding(a) in ("array", "tuple") or a.name in ("list", "tuple", "set"):
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
