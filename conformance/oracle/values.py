"""The neutral value model the suite and its targets exchange, derived from the spec.

The suite never hands a target its own classes: it speaks in *neutral values*, the shape the
spec's type expressions describe (:mod:`enginewire.spec.types`):

==================  =====================================================================
spec type           neutral value
==================  =====================================================================
struct ``Name``     ``dict`` field name -> neutral value; a missing key means the field's
                    default (given to a target) or is filled from the spec (for comparison)
enum ``Name``       its wire value (``int`` or ``str``); an ``IntEnum`` member compares equal
``tensor``          a ``torch.Tensor`` (given), :class:`TensorValue` (normalized)
``ndarray``         a ``numpy.ndarray`` (given), :class:`TensorValue` (normalized)
``bytes``           ``bytes``
``tuple``/``list``  ``list`` (normalized), ``set`` stays a ``set``
``slice``           ``slice``
==================  =====================================================================

:func:`neutral` turns whatever a target's decoder returns (msgspec Structs, dataclasses,
dicts, enum members, tensors) into that model; :func:`complete` fills a partial struct value
with the spec's defaults; :func:`differences` compares two neutral values field by field and
names the path of every mismatch. :func:`build` does the opposite of :func:`neutral` for a
Python implementation whose codec takes its own classes (the built-in adapters use it).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from enginewire.spec.schema import EnumSpec, StructSpec
from enginewire.spec.types import TypeExpr, TypeVisitor, kind_of, members, parse_type


@dataclass(frozen=True)
class TensorValue:
    """A tensor or array reduced to what travels: dtype string, shape, raw bytes (C order)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes
    #: ``"tensor"`` for torch, ``"ndarray"`` for numpy.
    family: str = "tensor"

    def __repr__(self) -> str:
        shown = self.data[:32].hex() + ("..." if len(self.data) > 32 else "")
        size = len(self.data)
        return f"TensorValue({self.family} {self.dtype} {list(self.shape)} {size}B {shown})"


def tensor_value(obj: Any) -> TensorValue:
    """Normalize a ``torch.Tensor`` or ``numpy.ndarray`` to a :class:`TensorValue`."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return TensorValue(obj.dtype.str, tuple(int(n) for n in obj.shape),
                           np.ascontiguousarray(obj).tobytes(), "ndarray")
    import torch

    if isinstance(obj, torch.Tensor):
        flat = obj.detach().contiguous().reshape(-1).view(torch.uint8)
        return TensorValue(str(obj.dtype).removeprefix("torch."), tuple(int(n) for n in obj.shape),
                           bytes(flat.numpy().tobytes()), "tensor")
    raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(obj).__name__}")


def _is_tensor(obj: Any) -> bool:
    module = type(obj).__module__
    if module.startswith("numpy") and type(obj).__name__ == "ndarray":
        return True
    if module.startswith("torch"):
        import torch

        return isinstance(obj, torch.Tensor)
    return False


def neutral(obj: Any, *, keep_tensors: bool = False) -> Any:
    """Normalize a decoded value (any Python implementation's types) to the neutral model.
    ``keep_tensors``: torch tensors and numpy arrays stay as they are (the form the target
    contract's ``encode`` takes), everything else is normalized."""
    if obj is None or isinstance(obj, bool | int | float | str):
        if isinstance(obj, enum.Enum):
            return obj.value
        return obj
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    if isinstance(obj, TensorValue):
        return obj
    if _is_tensor(obj):
        return obj if keep_tensors else tensor_value(obj)
    if isinstance(obj, Mapping):
        return {_key(k): neutral(v, keep_tensors=keep_tensors) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {name: neutral(getattr(obj, name), keep_tensors=keep_tensors)
                for name in obj._fields}
    if isinstance(obj, list | tuple):
        return [neutral(v, keep_tensors=keep_tensors) for v in obj]
    if isinstance(obj, set | frozenset):
        return {neutral(v, keep_tensors=keep_tensors) for v in obj}
    if isinstance(obj, slice):
        return obj
    fields = getattr(type(obj), "__struct_fields__", None)
    if fields is not None:
        return {name: neutral(getattr(obj, name), keep_tensors=keep_tensors) for name in fields}
    factory = vllm_mm_factory(obj)
    if factory is not None:
        # vLLM holds the field object where the wire has [factory_name, kwargs].
        return [factory, {f.name: neutral(getattr(obj, f.name), keep_tensors=keep_tensors)
                         for f in dataclasses.fields(obj)}]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: neutral(getattr(obj, f.name), keep_tensors=keep_tensors)
                for f in dataclasses.fields(obj)}
    if hasattr(obj, "result") and type(obj).__name__ == "UtilityResult":
        # vLLM's wrapper class: on the wire it is [type_info, value], type_info null unless
        # insecure serialization is on.
        return {"type_info": None, "value": neutral(obj.result, keep_tensors=keep_tensors)}
    return obj


def vllm_mm_factory(obj: Any) -> str | None:
    """The factory name vLLM's encoder writes for one of its multimodal field objects
    (``MMF_CLASS_TO_FACTORY``, structs.mm-item.map); None for anything else, and always None
    while vLLM's serial_utils is not imported."""
    serial_utils = sys.modules.get("vllm.v1.serial_utils")
    table = getattr(serial_utils, "MMF_CLASS_TO_FACTORY", None) or {}
    return table.get(type(obj))


def _key(key: Any) -> Any:
    return key.value if isinstance(key, enum.Enum) else key


def default_of(field: Any) -> Any:
    """The neutral default of a spec field (``FieldSpec``); ``KeyError`` for a required one."""
    if field.default_factory == "list":
        return []
    if field.default_factory == "dict":
        return {}
    if field.default_factory == "set":
        return set()
    if field.default is not None:
        return json.loads(field.default)
    raise KeyError(f"field {field.name!r} is required and has no default")


def complete(value: Any, type_text: str | TypeExpr, spec: Any) -> Any:
    """``value`` with every struct's missing fields set to the spec's defaults, recursively."""
    expr = parse_type(type_text) if isinstance(type_text, str) else type_text
    return _Complete(spec).walk(expr, value)


class _Complete(TypeVisitor[Any]):
    """Missing struct fields filled with their defaults; anything not of its type unchanged."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec.structs)
        self.spec = spec

    def walk(self, expr: TypeExpr, value: Any) -> Any:
        return None if value is None else self.visit(expr, value)

    def visit_union(self, expr: TypeExpr, value: Any) -> Any:
        member = _union_member(value, expr, self.spec)
        return value if member is None else self.walk(member, value)

    def visit_struct(self, expr: TypeExpr, item: StructSpec, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        out = {}
        for fld in item.fields:
            if fld.name in value:
                out[fld.name] = self.walk(parse_type(fld.type), value[fld.name])
            elif not fld.required:
                # A struct default ({} in derived history: the struct built with its own
                # defaults) is completed like a value.
                out[fld.name] = self.walk(parse_type(fld.type), default_of(fld))
        for key in value:
            if key not in out:
                out[key] = value[key]
        return out

    def visit_list(self, expr: TypeExpr, value: Any) -> Any:
        if not isinstance(value, list | tuple | set):
            return value
        if expr.fixed_tuple and len(expr.args) == len(value):
            return [self.walk(a, v) for v, a in zip(value, expr.args, strict=True)]
        done = [self.walk(expr.args[0], v) for v in value]
        return set(done) if isinstance(value, set) else done

    visit_set = visit_tuple = visit_list

    def visit_dict(self, expr: TypeExpr, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {k: self.walk(expr.args[1], v) for k, v in value.items()}

    def _as_is(self, expr: TypeExpr, value: Any) -> Any:
        return value

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _as_is
    visit_any = visit_slice = visit_tensor = visit_ndarray = visit_nested_tensors = _as_is

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, value: Any) -> Any:
        return value


def _union_member(value: Any, expr: TypeExpr, spec: Any) -> TypeExpr | None:
    """The member of a union a neutral value belongs to (a struct for a dict, else None)."""
    candidates = members(expr)
    if isinstance(value, Mapping):
        structs = [a for a in candidates if kind_of(a, spec.structs) == "struct"]
        if len(structs) > 1:
            # Several structs: the ones whose fields hold the keys, required fields included.
            structs = [a for a in structs if _fits_fields(value, spec.structs[a.name])]
        if len(structs) == 1:
            return structs[0]
        dicts = [a for a in candidates if kind_of(a) == "mapping"]
        if dicts:
            return dicts[0]
    if isinstance(value, list | tuple | set):
        for a in candidates:
            if kind_of(a) == "sequence":
                return a
    return None


def _fits_fields(value: Mapping[str, Any], item: StructSpec) -> bool:
    names = {f.name for f in item.fields}
    return set(value) <= names and all(f.name in value for f in item.fields if f.required)


def differences(expected: Any, actual: Any, path: str = "$") -> list[str]:
    """Every mismatch between two neutral values, as ``path: expected X, got Y`` lines."""
    found: list[str] = []
    _diff(neutral(expected), neutral(actual), path, found)
    return found


def _diff(expected: Any, actual: Any, path: str, found: list[str]) -> None:
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        for key in expected:
            if key not in actual:
                found.append(f"{path}.{key}: missing (expected {_short(expected[key])})")
            else:
                _diff(expected[key], actual[key], f"{path}.{key}", found)
        for key in actual:
            if key not in expected:
                found.append(f"{path}.{key}: unexpected field (got {_short(actual[key])})")
        return
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            found.append(f"{path}: expected {len(expected)} items, got {len(actual)}: "
                         f"expected {_short(expected)}, got {_short(actual)}")
            return
        for index, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _diff(e, a, f"{path}[{index}]", found)
        return
    if isinstance(expected, set) and isinstance(actual, list | set):
        if expected != set(actual):
            found.append(f"{path}: expected {_short(expected)}, got {_short(actual)}")
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if expected != actual and not (expected != expected and actual != actual):
            found.append(f"{path}: expected {expected!r}, got {actual!r}")
        return
    if type(expected) is bool or type(actual) is bool:
        if type(expected) is not type(actual) or expected != actual:
            found.append(f"{path}: expected {_short(expected)}, got {_short(actual)}")
        return
    if expected != actual:
        found.append(f"{path}: expected {_short(expected)}, got {_short(actual)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:160] + "..."


# --- building a Python implementation's own objects --------------------------------------

Resolver = Callable[[str], type | None]


def build(value: Any, type_text: str | TypeExpr, spec: Any, resolve: Resolver) -> Any:
    """Turn a neutral value into objects of an implementation's classes.

    ``resolve(name)`` returns the implementation's class for a spec struct or enum name (or
    None to keep the neutral dict/value). Struct classes are called with keyword arguments;
    enum classes with the wire value.
    """
    expr = parse_type(type_text) if isinstance(type_text, str) else type_text
    return _Build(spec, resolve).walk(expr, value)


class _Build(TypeVisitor[Any]):
    """Neutral values turned into an implementation's objects (see :func:`build`)."""

    def __init__(self, spec: Any, resolve: Resolver) -> None:
        super().__init__(spec.structs)
        self.spec = spec
        self.resolve = resolve

    def walk(self, expr: TypeExpr, value: Any) -> Any:
        return None if value is None else self.visit(expr, value)

    def visit_union(self, expr: TypeExpr, value: Any) -> Any:
        member = _union_member(value, expr, self.spec)
        if member is None:
            member = next((a for a in expr.args
                           if isinstance(self.structs.get(a.name), EnumSpec)), None)
        return value if member is None else self.walk(member, value)

    def visit_struct(self, expr: TypeExpr, item: StructSpec, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        types = {f.name: f.type for f in item.fields}
        kwargs = {key: self.walk(parse_type(types[key]), val) if key in types else val
                  for key, val in value.items()}
        cls = self.resolve(expr.name)
        return kwargs if cls is None else cls(**kwargs)

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, value: Any) -> Any:
        cls = self.resolve(expr.name)
        return value if cls is None else cls(value)

    def visit_list(self, expr: TypeExpr, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return value
        return [self.walk(expr.args[0], v) for v in value]

    def visit_set(self, expr: TypeExpr, value: Any) -> Any:
        if not isinstance(value, list | tuple | set):
            return value
        return {self.walk(expr.args[0], v) for v in value}

    def visit_tuple(self, expr: TypeExpr, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return value
        if expr.variadic:
            return tuple(self.walk(expr.args[0], v) for v in value)
        return tuple(self.walk(a, v) for v, a in zip(value, expr.args, strict=False))

    def visit_dict(self, expr: TypeExpr, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {k: self.walk(expr.args[1], v) for k, v in value.items()}

    def _as_is(self, expr: TypeExpr, value: Any) -> Any:
        return value

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _as_is
    visit_any = visit_slice = visit_tensor = visit_ndarray = visit_nested_tensors = _as_is


def import_class(path: str) -> type:
    """Import ``module:QualName`` (the spec's ``vllm_class`` form)."""
    import importlib

    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
