"""vLLM objects with exactly the field values of a reference value, for byte-level comparisons.

:func:`to_vllm` turns a value of a spec type, built from the classes of
:mod:`enginewire.reference.structs` (as :func:`enginewire.fuzz.strategies.messages` draws
them), into the same value built from vLLM's own classes (the spec's ``vllm_class`` names), so
that vLLM's ``MsgpackEncoder`` can encode it and the bytes can be compared with the reference
codec's.

vLLM validates and normalizes values when they are constructed (``SamplingParams`` turns
``stop=None`` into ``[]``, ``LoRARequest`` rejects an id below 1, ``EngineCoreOutputs`` stamps
``timestamp=0.0`` with the clock); none of that is wire format, and a fuzzer's values break it
on purpose. So the objects are made without running ``__init__``/``__post_init__``: a msgspec
Struct is a copy of a prototype (built once from the conformance suite's valid sample) whose
fields are then set with ``msgspec.structs.force_setattr``; a dataclass is allocated with
``__new__`` and its fields set with ``object.__setattr__``. Fields of the vLLM class that the
spec does not list keep the class's default.

Two places where vLLM's Python types differ from the wire layout are bridged: a multimodal item
(``dict[str, MultiModalFieldElem]``) becomes a ``MultiModalKwargsItem``, and a
``MultiModalFieldElem.field`` ``[factory, struct]`` becomes the field object itself (vLLM's
encoder writes the factory name from the object's class, structs.mm-item.map).

Requires the ``vllm`` package.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
from typing import Any

import msgspec

from enginewire.conformance.oracle.samples import Sampler
from enginewire.conformance.oracle.values import build, import_class
from enginewire.reference.tensors import WireTensor
from enginewire.spec import load
from enginewire.spec.schema import EnumSpec, StructSpec
from enginewire.spec.types import (
    TypeExpr,
    TypeVisitor,
    container_type,
    kind_of,
    members,
    parse_type,
)

#: Spec types vLLM holds in a container class of its own (module:QualName).
CONTAINER_CLASSES = {
    "dict[str, MultiModalFieldElem]": "vllm.multimodal.inputs:MultiModalKwargsItem",
}


class VllmObjects:
    """Converter from reference values to vLLM objects for one spec version."""

    def __init__(self, version: str | None = None) -> None:
        self.spec = load(version)

    @functools.cache  # noqa: B019 - one converter per run, a few dozen names
    def vllm_class(self, name: str) -> Any:
        item = self.spec.structs[name]
        return import_class(item.vllm_class)

    @functools.cache  # noqa: B019
    def _prototype(self, name: str) -> Any:
        """A valid instance of a msgspec Struct class, built the normal way (validation
        included) from the conformance suite's minimal sample; only ever copied."""
        return build(Sampler(self.spec).required(name), name, self.spec, self._resolve)

    def _resolve(self, name: str) -> Any:
        item = self.spec.structs.get(name)
        return import_class(item.vllm_class) if item is not None else None

    # --- conversion ----------------------------------------------------------------------

    def convert(self, value: Any, type_text: str | TypeExpr) -> Any:
        """``value`` (reference classes) as vLLM objects of spec type ``type_text``."""
        expr = parse_type(type_text) if isinstance(type_text, str) else type_text
        if value is None:
            return None
        return _Convert(self).visit(expr, value)

    def _member(self, value: Any, expr: TypeExpr) -> TypeExpr:
        """The union member a reference value belongs to."""
        candidates = members(expr)
        if [kind_of(m) for m in candidates] == ["nested_tensors"]:
            return candidates[0]
        for member in candidates:
            item = self.spec.structs.get(member.name)
            if isinstance(item, StructSpec) and type(value).__name__ == item.name:
                return member
            if isinstance(item, EnumSpec) and isinstance(value, enum.Enum):
                return member
        if isinstance(value, dict):
            return next((m for m in candidates if kind_of(m) == "mapping"), TypeExpr("any"))
        if isinstance(value, list | tuple | set):
            return next((m for m in candidates if kind_of(m) == "sequence"),
                        TypeExpr("any"))
        if type(value).__name__ in ("Tensor", "WireTensor"):
            return TypeExpr("tensor")
        return TypeExpr("any")

    def _struct(self, value: Any, item: StructSpec) -> Any:
        if item.name == "UtilityResult":
            from vllm.v1.serial_utils import UtilityResult

            return UtilityResult(value.value)
        fields = {f.name: self.convert(getattr(value, f.name), f.type) for f in item.fields}
        if item.name == "MultiModalFieldElem":
            # vLLM holds the field object; its encoder writes the factory name from the class.
            fields["field"] = fields["field"][1]
        cls = self.vllm_class(item.name)
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
            # msgspec omits a default only when the value *is* the default object (an identity
            # check), so a field holding the reference class's default object gets vLLM's.
            at_default = _fields_at_default(value)
            obj = copy.copy(self._prototype(item.name))
            for info in msgspec.structs.fields(cls):
                if info.name in fields and info.name not in at_default:
                    msgspec.structs.force_setattr(obj, info.name, fields[info.name])
                else:
                    msgspec.structs.force_setattr(obj, info.name, _default(info))
            return obj
        if dataclasses.is_dataclass(cls):
            obj = cls.__new__(cls)  # type: ignore[arg-type]
            for info in dataclasses.fields(cls):  # type: ignore[assignment]
                if info.name in fields:
                    object.__setattr__(obj, info.name, fields[info.name])
                elif info.default is not dataclasses.MISSING:
                    object.__setattr__(obj, info.name, info.default)
                elif info.default_factory is not dataclasses.MISSING:
                    object.__setattr__(obj, info.name, info.default_factory())
            return obj
        # NamedTuple
        return cls(*(fields[f.name] for f in item.fields))

def _fields_at_default(value: Any) -> set[str]:
    """Fields of a msgspec Struct instance that hold their default object (or, for a
    default_factory, an empty container)."""
    if not isinstance(value, msgspec.Struct):
        return set()
    found = set()
    for info in msgspec.structs.fields(type(value)):
        current = getattr(value, info.name)
        if info.default is not msgspec.NODEFAULT and current is info.default:
            found.add(info.name)
        elif info.default_factory is not msgspec.NODEFAULT and not current and isinstance(
            current, list | dict | set | bytearray
        ):
            found.add(info.name)
    return found


def _default(info: Any) -> Any:
    if info.default is not msgspec.NODEFAULT:
        return info.default
    if info.default_factory is not msgspec.NODEFAULT:
        return info.default_factory()
    raise ValueError(f"vLLM field {info.name!r} is required but not in the spec")


@functools.lru_cache(maxsize=4)
def converter(version: str | None = None) -> VllmObjects:
    """The shared converter for ``version`` (default: the reference version)."""
    return VllmObjects(version)


def to_vllm(value: Any, type_text: str | TypeExpr, version: str | None = None) -> Any:
    """``value`` rebuilt from vLLM's classes without their validation (see module docs)."""
    return converter(version).convert(value, type_text)


class _Convert(TypeVisitor[Any]):
    """One step of :meth:`VllmObjects.convert`: nested values go back through ``convert``."""

    def __init__(self, objects: Any) -> None:
        super().__init__(objects.spec.structs)
        self.objects = objects

    def visit_union(self, expr: TypeExpr, value: Any) -> Any:
        return self.objects.convert(value, self.objects._member(value, expr))

    def visit_struct(self, expr: TypeExpr, item: StructSpec, value: Any) -> Any:
        return self.objects._struct(value, item)

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, value: Any) -> Any:
        return self.objects.vllm_class(item.name)(
            value.value if isinstance(value, enum.Enum) else value)

    def visit_tensor(self, expr: TypeExpr, value: Any) -> Any:
        return value.to_torch() if isinstance(value, WireTensor) else value

    def visit_nested_tensors(self, expr: TypeExpr, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [self.objects.convert(v, expr) for v in value]
        return value.to_torch() if isinstance(value, WireTensor) else value

    def visit_list(self, expr: TypeExpr, value: Any) -> Any:
        if expr.fixed_tuple:
            return tuple(self.objects.convert(v, a)
                         for v, a in zip(value, expr.args, strict=True))
        items = [self.objects.convert(v, expr.args[0]) for v in value]
        if container_type(expr) is set:
            # Same elements in the same order, so the encoded arrays are byte-identical.
            return value.copy() if items == list(value) else set(items)
        return tuple(items) if container_type(expr) is tuple else items

    visit_set = visit_tuple = visit_list

    def visit_dict(self, expr: TypeExpr, value: Any) -> Any:
        converted = {self.objects.convert(k, expr.args[0]): self.objects.convert(v, expr.args[1])
                     for k, v in value.items()}
        container = CONTAINER_CLASSES.get(str(expr))
        return import_class(container)(converted) if container else converted

    def _as_is(self, expr: TypeExpr, value: Any) -> Any:
        return value

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _as_is
    visit_any = visit_slice = visit_ndarray = _as_is
