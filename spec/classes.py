"""msgspec classes built from the spec's struct layouts, never written out by hand.

:func:`build` reads ``spec/data/structs/*.toml`` through :func:`enginewire.spec.load` and
returns a :class:`StructSet`: one msgspec type per struct and one enum class per enum, for one
vLLM version. How each encoding becomes a Python type:

==============  ===========================================================================
``array``       ``msgspec.Struct(array_like=True)``, ``omit_defaults`` as the spec says
``map``         ``msgspec.Struct`` (a map), ``omit_defaults`` as the spec says
``dataclass``   ``msgspec.Struct`` (a map) that writes every field
``tuple``       a ``typing.NamedTuple`` (an array that rejects extra elements)
enum ``int``    ``enum.IntEnum``; ``str``: ``enum.Enum`` of strings; ``bytes``: ``enum.Enum``
==============  ===========================================================================

Type expressions map to Python annotations: ``tensor``, ``ndarray``, ``nested_tensors`` and
``slice`` become the marker classes :class:`TensorSlot`, :class:`NdarraySlot`,
:class:`NestedTensorsSlot` and ``slice``, which the codec's ``dec_hook`` turns into values.
A union msgspec cannot express (a custom type beside other types, two structs, two array
types) becomes a :class:`UnionSlot` subclass whose members the codec tries in order, structs
with more required fields first.

They live in the spec package because they are the spec's data turned into types, as
generated message classes are in Kafka: the reference implementation
(:mod:`enginewire.reference.structs`) and the history tools (compatibility across releases)
both use them, and neither may depend on the other.
"""

from __future__ import annotations

import enum
import json
import threading
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from .loader import Spec, load
from .schema import EnumSpec, FieldSpec, StructSpec
from .types import TypeExpr, TypeVisitor, parse_type
from .types import members as union_members


class _SlotMeta(type):
    """msgspec checks that a dec_hook result is an instance of the annotated type: a slot
    accepts the values the codec builds for it."""

    def __instancecheck__(cls, value: object) -> bool:
        return cls._accepts(value)  # type: ignore[attr-defined,no-any-return]


class _AdmittingMeta(_SlotMeta):
    """The metaclass of slots whose values the codec registers (:meth:`_AdmittingSlot.admit`):
    the check runs here, in one call, because msgspec makes it on every decoded value."""

    def __instancecheck__(cls, value: object) -> bool:
        return isinstance(value, cls._types) or any(  # type: ignore[attr-defined]
            accepts(value) for accepts in cls._predicates)  # type: ignore[attr-defined]


class _AdmittingSlot(metaclass=_AdmittingMeta):
    """A slot that accepts what the codec building its values registers with :meth:`admit`,
    so the spec's classes need no codec (the reference registers its tensor values in
    :mod:`enginewire.reference.tensors`)."""

    _types: ClassVar[tuple[type, ...]] = ()
    _predicates: ClassVar[tuple[Callable[[object], bool], ...]] = ()

    @classmethod
    def admit(cls, *types: type, predicate: Callable[[object], bool] | None = None) -> None:
        """Accept instances of ``types`` (and values ``predicate`` accepts) in this slot."""
        cls._types = (*cls._types, *(t for t in types if t not in cls._types))
        if predicate is not None and predicate not in cls._predicates:
            cls._predicates = (*cls._predicates, predicate)

    @classmethod
    def _accepts(cls, value: object) -> bool:
        return isinstance(value, cls)


class TensorSlot(_AdmittingSlot):
    """Annotation marker: a torch tensor position (the tensors surface's tuple)."""


class NdarraySlot(_AdmittingSlot):
    """Annotation marker: a numpy array position (the tensors surface's tuple)."""


class NestedTensorsSlot(metaclass=_SlotMeta):
    """Annotation marker: a ``nested_tensors`` position (tensors.nested-tensors): a tensor, an
    int or float, or a list of nested tensors."""

    @staticmethod
    def _accepts(value: object) -> bool:
        if isinstance(value, list):
            return all(NestedTensorsSlot._accepts(item) for item in value)
        if isinstance(value, (int, float)):
            return not isinstance(value, bool)
        return TensorSlot._accepts(value)


class UnionSlot(metaclass=_SlotMeta):
    """Base of the markers for unions msgspec cannot decode by itself.

    Subclasses carry ``members`` (Python types, most specific first) and ``expr`` (the type
    expression, for error messages); the codec returns a value of one of the members.
    """

    members: ClassVar[tuple[Any, ...]] = ()
    expr: ClassVar[str] = ""

    @staticmethod
    def _accepts(value: object) -> bool:
        return True


_SCALARS: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "bytes": bytes,
    "none": None,
    "any": Any,
    "slice": slice,
    "tensor": TensorSlot,
    "ndarray": NdarraySlot,
    "nested_tensors": NestedTensorsSlot,
}


class _Annotation(TypeVisitor[Any]):
    """The Python annotation msgspec decodes a type expression with."""

    def __init__(self, owner: StructSet) -> None:
        super().__init__(owner.spec.structs)
        self.owner = owner

    def _scalar(self, expr: TypeExpr) -> Any:
        return _SCALARS[expr.name]

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _scalar
    visit_any = visit_slice = visit_tensor = visit_ndarray = visit_nested_tensors = _scalar

    def visit_union(self, expr: TypeExpr) -> Any:
        return self.owner._union(expr)

    def visit_list(self, expr: TypeExpr) -> Any:
        return list[self.visit(expr.args[0])]  # type: ignore[misc]

    def visit_set(self, expr: TypeExpr) -> Any:
        return set[self.visit(expr.args[0])]  # type: ignore[misc]

    def visit_dict(self, expr: TypeExpr) -> Any:
        return dict[self.visit(expr.args[0]), self.visit(expr.args[1])]  # type: ignore[misc]

    def visit_tuple(self, expr: TypeExpr) -> Any:
        inner = tuple(self.visit(a) for a in expr.args)
        return tuple[inner[0], ...] if expr.variadic else tuple[inner]  # type: ignore[valid-type]

    def visit_enum(self, expr: TypeExpr, item: EnumSpec) -> Any:
        return bytes if item.wire == "bytes" else self.owner.enums[expr.name]

    def visit_struct(self, expr: TypeExpr, item: StructSpec) -> Any:
        return self.owner._class(expr.name)


@dataclass
class StructSet:
    """The msgspec types of one vLLM version's structs and enums."""

    version: str
    spec: Spec
    classes: dict[str, Any] = field(default_factory=dict)
    enums: dict[str, type[enum.Enum]] = field(default_factory=dict)
    _types: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getitem__(self, name: str) -> Any:
        found = self.classes.get(name) or self.enums.get(name)
        if found is None:
            raise KeyError(f"no struct or enum {name!r} in the spec for vLLM {self.version}")
        return found

    def type_of(self, expression: str | TypeExpr) -> Any:
        """The Python annotation for a type expression (cached)."""
        key = str(expression)
        found = self._types.get(key)
        if found is None and key not in self._types:
            expr = parse_type(expression) if isinstance(expression, str) else expression
            found = self._annotation(expr)
            self._types[key] = found
        return found

    # --- building -------------------------------------------------------------------------

    def _annotation(self, expr: TypeExpr) -> Any:
        return _Annotation(self).visit(expr)

    def _union(self, expr: TypeExpr) -> Any:
        members = [self._annotation(a) for a in union_members(expr)]
        nullable = expr.nullable
        candidate = typing.Union[tuple(members + ([None] if nullable else []))]  # type: ignore[valid-type]  # noqa: UP007
        try:
            msgspec.msgpack.Decoder(candidate, dec_hook=_identity_hook)
            return candidate
        except TypeError:
            pass
        ordered = sorted(members, key=self._specificity)
        slot = types.new_class(
            f"UnionOf{len(ordered)}",
            (UnionSlot,),
            exec_body=lambda ns: ns.update(
                members=tuple(ordered), expr=str(expr), __module__=__name__
            ),
        )
        return typing.Optional[slot] if nullable else slot  # noqa: UP007, UP045

    def _specificity(self, member: Any) -> int:
        """Sort key: struct types with more required fields first, everything else after."""
        if isinstance(member, type) and issubclass(member, msgspec.Struct):
            info = msgspec.structs.fields(member)
            required = sum(
                1
                for f in info
                if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
            )
            return -required
        return 1

    def _class(self, name: str) -> Any:
        found = self.classes.get(name)
        if found is not None:
            return found
        spec = self.spec.struct(name)
        if spec.encoding == "tuple":
            built = self._named_tuple(spec)
        else:
            built = self._struct(spec)
        self.classes[name] = built
        return built

    def _struct(self, spec: StructSpec) -> Any:
        fields: list[tuple[Any, ...]] = []
        seen_default = False
        kw_only = False
        for fld in spec.fields:
            annotation = self.type_of(fld.type)
            if fld.required:
                kw_only = kw_only or seen_default
                fields.append((fld.name, annotation))
            else:
                seen_default = True
                fields.append((fld.name, annotation, self._default(fld, annotation)))
        return msgspec.defstruct(
            spec.name,
            fields,
            array_like=spec.encoding == "array",
            omit_defaults=spec.omit_defaults and spec.encoding != "dataclass",
            kw_only=kw_only,
            module=__name__,
        )

    def _named_tuple(self, spec: StructSpec) -> Any:
        annotations = {fld.name: self.type_of(fld.type) for fld in spec.fields}
        defaults = {
            fld.name: self._plain_default(fld, annotations[fld.name])
            for fld in spec.fields
            if not fld.required
        }

        def body(namespace: dict[str, Any]) -> None:
            namespace["__annotations__"] = annotations
            namespace["__module__"] = __name__
            namespace.update(defaults)

        return types.new_class(spec.name, (typing.NamedTuple,), exec_body=body)

    def _plain_default(self, fld: FieldSpec, annotation: Any) -> Any:
        if fld.default_factory is not None:
            raise ValueError(f"tuple field {fld.name} cannot have a default_factory")
        return _coerce(json.loads(fld.default or "null"), annotation)

    def _default(self, fld: FieldSpec, annotation: Any) -> Any:
        if fld.default_factory is not None:
            factory = {"list": list, "dict": dict, "set": set}[fld.default_factory]
            return msgspec.field(default_factory=factory)
        raw = json.loads(fld.default or "null")
        if isinstance(raw, (list, dict)):
            struct_typed = isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)
            if not raw and not struct_typed:
                return msgspec.field(default_factory=type(raw))
            # {} for a struct-typed field: the struct with its own defaults (the wheels'
            # ``field(default_factory=PrefixCacheStats)``, derived as {}).
            # A fresh value per instance: a shared mutable default would leak between structs.
            return msgspec.field(default_factory=lambda: msgspec.convert(raw, annotation))
        return _coerce(raw, annotation)

    def _enum(self, spec: EnumSpec) -> type[enum.Enum]:
        members: dict[str, int | str | bytes] = {m.name: m.value for m in spec.members}
        if spec.wire == "int":
            return enum.IntEnum(spec.name, members, module=__name__)  # type: ignore[return-value]
        if spec.wire == "bytes":
            members = {m.name: _bytes_value(m.value) for m in spec.members}
        return enum.Enum(spec.name, members, module=__name__)  # type: ignore[return-value]


def _bytes_value(value: int | str) -> bytes:
    return bytes([value]) if isinstance(value, int) else value.encode()


def _identity_hook(_type: Any, value: Any) -> Any:
    return value


def _coerce(value: Any, annotation: Any) -> Any:
    """A JSON default as the Python value the annotation expects (an enum member, a float)."""
    if value is None:
        return None
    for candidate in typing.get_args(annotation) or (annotation,):
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return candidate(value)
        if candidate is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
    return value


_BUILT: dict[str, StructSet] = {}
#: The reference version's set, once built.
_DEFAULT: list[StructSet] = []
#: Held while a set is built: two threads asking for one release at once (an engine thread and
#: a front end touching the module attributes first) get the same classes, never two sets of
#: look-alike classes that fail each other's isinstance checks.
_BUILD_LOCK = threading.RLock()


def build(version: str | None = None) -> StructSet:
    """Every struct and enum of the spec for ``version`` (default: the reference version)."""
    if version is None and _DEFAULT:
        # The module attributes (``structs.EngineCoreOutputs``) come here on every access.
        return _DEFAULT[0]
    spec = load(version)
    with _BUILD_LOCK:
        found = _BUILT.get(spec.version)
        if found is None:
            found = StructSet(version=spec.version, spec=spec)
            for name, item in spec.structs.items():
                if isinstance(item, EnumSpec):
                    found.enums[name] = found._enum(item)
            for name, item in spec.structs.items():
                if isinstance(item, StructSpec):
                    found._class(name)
            _BUILT[spec.version] = found
        if version is None and not _DEFAULT:
            _DEFAULT.append(found)
    return found


def __getattr__(name: str) -> Any:
    if name[:1].isupper():
        try:
            return build()[name]
        except KeyError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
