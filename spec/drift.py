"""``enginewire spec diff --against vllm``: compare the spec with an installed vLLM.

Two halves, kept apart so tests can feed either side:

- :func:`describe_vllm` imports vLLM and describes what its code does, by introspection
  (``msgspec.structs.fields``, ``dataclasses.fields``, ``typing.get_type_hints``, enum members,
  ``inspect.signature``, and a few encodings probed through vLLM's own ``MsgpackEncoder``). It
  returns an :class:`Implementation`: plain data that says nothing about the spec.
- :func:`compare` takes a :class:`~enginewire.spec.loader.Spec` and an :class:`Implementation`
  and returns one :class:`Difference` per fact on which they disagree. It imports nothing.

What is compared:

- every struct and enum in the spec that names a ``vllm_class``: encoding (array, map,
  dataclass, tuple), ``omit_defaults``, field names and positions, field types (normalised to
  the spec's type grammar), required fields and defaults, enum wire kind, member names and values;
  where vLLM's annotations are narrower than what it sends (a nil its encoder writes for a field
  annotated without None, a None default that ``__post_init__`` replaces), what travels is
  compared and the departure printed as a ``note:`` line, not as a difference;
- every vLLM class reachable from a spec struct's field types, or from :data:`ROOT_CLASSES`,
  that the spec does not describe;
- the request type bytes (``EngineCoreRequestType``) against the ``request_types`` surface;
- the msgpack extension codes and the zero-copy threshold against the ``tensors`` surface;
- the ring constants named in :data:`RING_CONSTANTS` against ``ring.constants`` (only keys the
  spec file has);
- the width and byte order of engine identities against the ``identity`` surface.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import dis
import enum
import importlib
import inspect
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .loader import Spec
from .schema import (
    EnumSpec,
    IdentityFile,
    RequestTypesFile,
    RingFile,
    StructSpec,
    TensorsFile,
)
from .types import TypeExpr, kind_of, parse_type

# --- what drift.py knows about vLLM ------------------------------------------------------

#: The payload types of the engine channels. The closure of their field types must be in the
#: spec, even where the spec forgot the root itself.
ROOT_CLASSES: tuple[str, ...] = (
    "vllm.v1.engine:EngineCoreRequest",
    "vllm.v1.engine:EngineCoreOutputs",
    "vllm.v1.engine:UtilityOutput",
    "vllm.v1.engine:EngineCoreReadyResponse",
    "vllm.v1.engine.utils:EngineHandshakeMetadata",
)

#: Types that vLLM's ``MsgpackEncoder.enc_hook`` writes itself, so that their Python annotation
#: says nothing about the wire: the type expression they travel as, and the classes it names.
ENC_HOOK_TYPES: dict[str, tuple[str, dict[str, str]]] = {
    "vllm.multimodal.inputs:MultiModalKwargsItem": (
        "dict[str, MultiModalFieldElem]",
        {"MultiModalFieldElem": "vllm.multimodal.inputs:MultiModalFieldElem"},
    ),
    "vllm.multimodal.inputs:BaseMultiModalField": (
        "tuple[str, MultiModalBatchedField | MultiModalFlatField | MultiModalSharedField]",
        {
            "MultiModalBatchedField": "vllm.multimodal.inputs:MultiModalBatchedField",
            "MultiModalFlatField": "vllm.multimodal.inputs:MultiModalFlatField",
            "MultiModalSharedField": "vllm.multimodal.inputs:MultiModalSharedField",
        },
    ),
    "vllm.v1.serial_utils:UtilityResult": (
        "UtilityResult",
        {"UtilityResult": "vllm.v1.serial_utils:UtilityResult"},
    ),
}

#: vLLM type aliases that the spec's grammar names as one built-in type (``module:Name`` ->
#: type name): ``NestedTensors`` is recursive, and its encoder passes numbers through beside
#: the tensors (tensors.nested-tensors).
TYPE_ALIASES: dict[str, str] = {
    "vllm.multimodal.inputs:NestedTensors": "nested_tensors",
}

#: Field names of the enc_hook tuple layouts, which have no Python fields to read them from.
ENC_HOOK_TUPLE_FIELDS: dict[str, tuple[str, ...]] = {
    "vllm.v1.serial_utils:UtilityResult": ("type_info", "value"),
}

#: The msgpack extension codes in ``vllm.v1.serial_utils``; spec names are compared
#: case-insensitively without the ``CUSTOM_TYPE_`` prefix (``pickle``, ``cloudpickle``,
#: ``raw_view``).
EXT_CODE_CONSTANTS: tuple[str, ...] = (
    "CUSTOM_TYPE_PICKLE",
    "CUSTOM_TYPE_CLOUDPICKLE",
    "CUSTOM_TYPE_RAW_VIEW",
)

#: Keys of ``ring.constants`` that drift.py checks, and where vLLM keeps each value:
#:
#: - ``max_chunk_bytes_default``: ``MessageQueue.__init__`` default of ``max_chunk_bytes``;
#: - ``max_chunks_default``: ``MessageQueue.__init__`` default of ``max_chunks``;
#: - ``reader_recheck_interval_ms``: module constant ``SHM_READER_RECHECK_INTERVAL_MS``;
#: - ``notify_poll_interval_s``: module constant ``SHM_NOTIFY_POLL_INTERVAL_S``;
#: - ``oob_threshold_bytes``: the size from which ``MessageQueue.enqueue`` sends a pickle
#:   buffer out of band (the integer constant of its nested ``oob_callback``).
RING_CONSTANTS: dict[str, str] = {
    "max_chunk_bytes_default": "MessageQueue.__init__:max_chunk_bytes",
    "max_chunks_default": "MessageQueue.__init__:max_chunks",
    "reader_recheck_interval_ms": "SHM_READER_RECHECK_INTERVAL_MS",
    "notify_poll_interval_s": "SHM_NOTIFY_POLL_INTERVAL_S",
    "oob_threshold_bytes": "MessageQueue.enqueue.oob_callback",
}

SHM_MODULE = "vllm.distributed.device_communicators.shm_broadcast"


# --- the description of an implementation ------------------------------------------------


@dataclass(frozen=True)
class FieldInfo:
    """One field as the implementation defines it."""

    name: str
    #: Type expression in the spec grammar; class references use the short names of
    #: :attr:`StructInfo.refs`.
    type: str
    required: bool
    #: JSON literal of the default, or None.
    default: str | None = None
    #: ``list``, ``dict`` or ``set``, or None.
    default_factory: str | None = None


@dataclass(frozen=True)
class StructInfo:
    """A class that travels as a struct: its encoding and fields in declaration order."""

    qualname: str
    encoding: str
    omit_defaults: bool
    fields: tuple[FieldInfo, ...]
    #: Short class name used in field types -> ``module:QualName``.
    refs: Mapping[str, str] = field(default_factory=dict)
    #: Where the description departs from the Python annotations to say what travels (a
    #: default ``__post_init__`` replaces, a nil the encoder writes for a field annotated
    #: without None): informational, never a difference.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnumInfo:
    qualname: str
    wire: str
    members: tuple[tuple[str, int | str | bytes], ...]


@dataclass
class Implementation:
    """Everything :func:`compare` needs to know about an implementation, as plain data."""

    name: str
    version: str
    classes: dict[str, StructInfo | EnumInfo] = field(default_factory=dict)
    #: ``module:QualName`` -> why the class could not be described.
    unavailable: dict[str, str] = field(default_factory=dict)
    request_types: dict[str, bytes] = field(default_factory=dict)
    ext_codes: dict[str, int] = field(default_factory=dict)
    threshold_default: int | None = None
    threshold_env: str | None = None
    ring_constants: dict[str, int | float] = field(default_factory=dict)
    #: (where, width, byteorder) for each place that derives an identity from a rank.
    identities: list[tuple[str, int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Difference:
    """One fact on which the spec and the implementation disagree."""

    #: ``Struct.field``, ``Struct``, ``request_types.ADD``, ``ring.constants.KEY``, ...
    subject: str
    message: str
    #: ``structs``, ``enums``, ``request_types``, ``tensors``, ``ring``, ``identity``.
    area: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


class ImplementationUnavailable(RuntimeError):
    """The implementation to compare with cannot be imported."""


# --- comparison (pure) -------------------------------------------------------------------


def _canonical_type(expr: TypeExpr, rename: Callable[[str], str]) -> str:
    """The type as a string with unions flattened, de-duplicated and sorted, names renamed."""
    if kind_of(expr) == "union":
        members: set[str] = set()
        for arg in expr.args:
            text = _canonical_type(arg, rename)
            members.update(text.split(" | "))
        return " | ".join(sorted(members))
    if not expr.args:
        return rename(expr.name)
    inner = ", ".join(_canonical_type(a, rename) for a in expr.args)
    return f"{expr.name}[{inner}, ...]" if expr.variadic else f"{expr.name}[{inner}]"


def _canonical_json(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except json.JSONDecodeError:
        return text


def _describe_default(required: bool, default: str | None, factory: str | None) -> str:
    if required:
        return "required"
    if factory is not None:
        return f"default_factory {factory}"
    return f"default {default}"


def _moved_fields(spec_names: list[str], impl_names: list[str]) -> set[str]:
    """Fields outside a longest common subsequence of the two orders: the ones that moved."""
    common = set(spec_names) & set(impl_names)
    a = [n for n in spec_names if n in common]
    b = [n for n in impl_names if n in common]
    lengths = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            lengths[i][j] = (
                lengths[i + 1][j + 1] + 1 if a[i] == b[j]
                else max(lengths[i + 1][j], lengths[i][j + 1])
            )
    kept: set[str] = set()
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            kept.add(a[i])
            i += 1
            j += 1
        elif lengths[i + 1][j] >= lengths[i][j + 1]:
            i += 1
        else:
            j += 1
    return common - kept


def _compare_struct(
    spec_struct: StructSpec, impl: StructInfo, spec_names: Mapping[str, str]
) -> list[Difference]:
    name = spec_struct.name
    found: list[Difference] = []

    def diff(subject: str, message: str) -> None:
        found.append(Difference(subject, message, "structs"))

    if spec_struct.encoding != impl.encoding:
        diff(name, f"encoding {spec_struct.encoding!r} in spec, {impl.encoding!r} in vllm")
    if impl.encoding in ("array", "map") and spec_struct.omit_defaults != impl.omit_defaults:
        diff(name, f"omit_defaults {str(spec_struct.omit_defaults).lower()} in spec, "
                   f"{str(impl.omit_defaults).lower()} in vllm")

    def rename(short: str) -> str:
        qualname = impl.refs.get(short)
        return spec_names.get(qualname, short) if qualname else short

    spec_order = [f.name for f in spec_struct.fields]
    impl_order = [f.name for f in impl.fields]
    impl_by_name = {f.name: (index, f) for index, f in enumerate(impl.fields)}
    moved = _moved_fields(spec_order, impl_order)
    for position, spec_field in enumerate(spec_struct.fields):
        subject = f"{name}.{spec_field.name}"
        if spec_field.name not in impl_by_name:
            diff(subject, f"in spec (position {position}), not in vllm")
            continue
        impl_position, impl_field = impl_by_name[spec_field.name]
        if spec_field.name in moved:
            diff(subject, f"position {position} in spec, {impl_position} in vllm")
        spec_type = _canonical_type(parse_type(spec_field.type), lambda n: n)
        impl_type = _canonical_type(parse_type(impl_field.type), rename)
        if spec_type != impl_type:
            diff(subject, f"type '{spec_field.type}' in spec, '{impl_field.type}' in vllm")
        spec_default = (spec_field.required, _canonical_json(spec_field.default),
                        spec_field.default_factory)
        impl_default = (impl_field.required, _canonical_json(impl_field.default),
                        impl_field.default_factory)
        if spec_default != impl_default:
            diff(subject, f"{_describe_default(*spec_default)} in spec, "
                          f"{_describe_default(*impl_default)} in vllm")
    spec_set = set(spec_order)
    for impl_position, impl_field in enumerate(impl.fields):
        if impl_field.name not in spec_set:
            diff(f"{name}.{impl_field.name}",
                 f"in vllm (position {impl_position}, type '{impl_field.type}'), not in spec")
    return found


def _compare_enum(spec_enum: EnumSpec, impl: EnumInfo) -> list[Difference]:
    found: list[Difference] = []
    if spec_enum.wire != impl.wire:
        found.append(Difference(spec_enum.name, f"wire {spec_enum.wire!r} in spec, "
                                                f"{impl.wire!r} in vllm", "enums"))
    spec_members = {m.name: m.value for m in spec_enum.members}
    impl_members = dict(impl.members)
    value: int | str | bytes
    for member, value in spec_members.items():
        subject = f"{spec_enum.name}.{member}"
        if member not in impl_members:
            found.append(Difference(subject, f"value {value!r} in spec, not in vllm", "enums"))
        elif impl_members[member] != value:
            found.append(Difference(subject, f"value {value!r} in spec, "
                                             f"{impl_members[member]!r} in vllm", "enums"))
    for member, value in impl_members.items():
        if member not in spec_members:
            found.append(Difference(f"{spec_enum.name}.{member}",
                                    f"value {value!r} in vllm, not in spec", "enums"))
    return found


def _compare_unspecified(spec: Spec, impl: Implementation,
                         spec_names: Mapping[str, str]) -> list[Difference]:
    """Classes vLLM uses in a spec struct's fields (or as a root) that the spec lacks."""
    found: list[Difference] = []
    for root in ROOT_CLASSES:
        if root not in spec_names:
            found.append(Difference(root, "a payload type of the engine channels that the spec "
                                          "does not describe", "structs"))
    for spec_struct in spec.structs.values():
        info = impl.classes.get(spec_struct.vllm_class)
        if not isinstance(spec_struct, StructSpec) or not isinstance(info, StructInfo):
            continue
        for impl_field in info.fields:
            for short in sorted(parse_type(impl_field.type).names()):
                qualname = info.refs.get(short)
                if qualname and qualname not in spec_names:
                    found.append(Difference(
                        f"{spec_struct.name}.{impl_field.name}",
                        f"type names vllm class {qualname}, which the spec does not describe",
                        "structs",
                    ))
    return found


def _compare_surfaces(spec: Spec, impl: Implementation) -> list[Difference]:
    found: list[Difference] = []

    request_types = cast("RequestTypesFile | None", spec.surfaces.get("request_types"))
    if request_types is not None and impl.request_types:
        spec_bytes = {t.name: t.byte for t in request_types.types}
        for name, byte in spec_bytes.items():
            got = impl.request_types.get(name)
            subject = f"request_types.{name}"
            if got is None:
                found.append(Difference(subject, f"byte 0x{byte:02x} in spec, not in vllm",
                                        "request_types"))
            elif got != bytes([byte]):
                found.append(Difference(subject, f"byte 0x{byte:02x} in spec, {got.hex(' ')} "
                                                 "in vllm", "request_types"))
        for name, got in impl.request_types.items():
            if name not in spec_bytes:
                found.append(Difference(f"request_types.{name}",
                                        f"bytes {got.hex(' ')} in vllm, not in spec",
                                        "request_types"))

    tensors = cast("TensorsFile | None", spec.surfaces.get("tensors"))
    if tensors is not None:
        spec_codes = {_ext_key(c.name): c.code for c in tensors.ext_codes}
        if spec_codes:
            for key, code in impl.ext_codes.items():
                subject = f"tensors.ext_codes.{key.lower()}"
                if key not in spec_codes:
                    found.append(Difference(subject, f"code {code} in vllm, not in spec",
                                            "tensors"))
                elif spec_codes[key] != code:
                    found.append(Difference(subject, f"code {spec_codes[key]} in spec, {code} "
                                                     "in vllm", "tensors"))
            for key, code in spec_codes.items():
                if impl.ext_codes and key not in impl.ext_codes:
                    found.append(Difference(f"tensors.ext_codes.{key.lower()}",
                                            f"code {code} in spec, not in vllm", "tensors"))
        if impl.threshold_default is not None and tensors.threshold_default != \
                impl.threshold_default:
            found.append(Difference("tensors.threshold_default",
                                    f"{tensors.threshold_default} in spec, "
                                    f"{impl.threshold_default} in vllm", "tensors"))
        if impl.threshold_env is not None and tensors.threshold_env != impl.threshold_env:
            found.append(Difference("tensors.threshold_env",
                                    f"{tensors.threshold_env!r} in spec, {impl.threshold_env!r} "
                                    "is what vllm reads", "tensors"))

    ring = cast("RingFile | None", spec.surfaces.get("ring"))
    if ring is not None:
        for key in RING_CONSTANTS:
            if key not in ring.constants or key not in impl.ring_constants:
                continue
            want, have = ring.constants[key], impl.ring_constants[key]
            # Numbers compare by value (a spec may write 2 for vLLM's 2.0); text never matches.
            if isinstance(want, str) or isinstance(want, bool) != isinstance(have, bool) or \
                    want != have:
                found.append(Difference(f"ring.constants.{key}",
                                        f"{want!r} in spec, {have!r} in vllm", "ring"))

    identity = cast("IdentityFile | None", spec.surfaces.get("identity"))
    if identity is not None:
        for where, width, byteorder in impl.identities:
            if width != identity.width:
                found.append(Difference("identity.width", f"{identity.width} in spec, {width} "
                                                          f"in vllm ({where})", "identity"))
            if byteorder != identity.byteorder:
                found.append(Difference("identity.byteorder",
                                        f"{identity.byteorder} in spec, {byteorder} in vllm "
                                        f"({where})", "identity"))
    return found


def _ext_key(name: str) -> str:
    return name.upper().removeprefix("CUSTOM_TYPE_")


def compare(spec: Spec, impl: Implementation) -> list[Difference]:
    """Every fact on which ``spec`` and ``impl`` disagree, structs first, in spec order."""
    spec_names = {s.vllm_class: name for name, s in spec.structs.items()}
    found: list[Difference] = []
    for name in sorted(spec.structs):
        spec_struct = spec.structs[name]
        info = impl.classes.get(spec_struct.vllm_class)
        if info is None:
            why = impl.unavailable.get(spec_struct.vllm_class, "not found")
            found.append(Difference(name, f"vllm class {spec_struct.vllm_class}: {why}",
                                    "structs"))
        elif isinstance(spec_struct, EnumSpec) != isinstance(info, EnumInfo):
            kind = "an enum" if isinstance(info, EnumInfo) else "a struct"
            found.append(Difference(name, f"{spec_struct.kind} in spec, {kind} in vllm",
                                    "structs"))
        elif isinstance(spec_struct, EnumSpec):
            found.extend(_compare_enum(spec_struct, info))  # type: ignore[arg-type]
        else:
            found.extend(_compare_struct(spec_struct, info, spec_names))  # type: ignore[arg-type]
    found.extend(_compare_unspecified(spec, impl, spec_names))
    found.extend(_compare_surfaces(spec, impl))
    return found


# --- introspection of vLLM ---------------------------------------------------------------


def _import_class(qualname: str) -> Any:
    module_name, _, attr_path = qualname.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class _Describer:
    """Walks vLLM classes and writes their layouts in the spec's type grammar."""

    def __init__(self) -> None:
        import msgspec

        self.msgspec = msgspec
        self.impl_types = self._special_types()
        self.aliases = self._aliases()

    @staticmethod
    def _aliases() -> list[tuple[Any, str]]:
        found = []
        for qualname, name in TYPE_ALIASES.items():
            try:
                found.append((_import_class(qualname), name))
            except (ImportError, AttributeError):
                continue
        return found

    def alias(self, annotation: Any) -> str | None:
        """The spec's type name for a vLLM alias object in :data:`TYPE_ALIASES`."""
        return next((name for obj, name in self.aliases if annotation is obj), None)

    @staticmethod
    def _special_types() -> dict[Any, str]:
        import numpy as np
        import torch

        return {torch.Tensor: "tensor", np.ndarray: "ndarray", slice: "slice"}

    def kind(self, cls: Any) -> str | None:
        if not isinstance(cls, type):
            return None
        if issubclass(cls, enum.Enum):
            return "enum"
        if issubclass(cls, self.msgspec.Struct):
            return "array" if cls.__struct_config__.array_like else "map"
        if dataclasses.is_dataclass(cls):
            return "dataclass"
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return "tuple"
        return None

    def type_expr(self, annotation: Any, refs: dict[str, str]) -> str:
        """``annotation`` in the spec grammar; classes it names are added to ``refs``."""
        if annotation is None or annotation is type(None):
            return "none"
        alias = self.alias(annotation)
        if alias is not None:
            return alias
        if annotation is Any or isinstance(annotation, (typing.ForwardRef, str, typing.TypeVar)):
            return "any"
        if isinstance(annotation, type):
            special = ENC_HOOK_TYPES.get(_qualname(annotation))
            if special is not None:
                text, names = special
                refs.update(names)
                return text
        for py_type, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"),
                              (bytes, "bytes")):
            if annotation is py_type:
                return name
        if annotation in self.impl_types:
            return self.impl_types[annotation]
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            return self.type_expr(args[0], refs)
        if origin in (typing.Union, types.UnionType):
            parts: list[str] = []
            for arg in args:
                for part in self.type_expr(arg, refs).split(" | "):
                    if part not in parts:
                        parts.append(part)
            return " | ".join(parts)
        if origin is typing.Literal:
            parts = []
            for value in args:
                part = self.type_expr(type(value), refs)
                if part not in parts:
                    parts.append(part)
            return " | ".join(parts)
        if origin in (list, cabc.Sequence, cabc.MutableSequence):
            return f"list[{self.type_expr(args[0], refs)}]" if args else "list[any]"
        if origin in (set, frozenset, cabc.Set, cabc.MutableSet):
            return f"set[{self.type_expr(args[0], refs)}]" if args else "set[any]"
        if origin is tuple:
            if not args:
                return "tuple[any, ...]"
            if len(args) == 2 and args[1] is Ellipsis:
                return f"tuple[{self.type_expr(args[0], refs)}, ...]"
            return "tuple[" + ", ".join(self.type_expr(a, refs) for a in args) + "]"
        if origin in (dict, cabc.Mapping, cabc.MutableMapping):
            if not args:
                return "dict[any, any]"
            return f"dict[{self.type_expr(args[0], refs)}, {self.type_expr(args[1], refs)}]"
        if annotation in (list, cabc.Sequence):
            return "list[any]"
        if annotation in (set, frozenset):
            return "set[any]"
        if annotation is tuple:
            return "tuple[any, ...]"
        if annotation in (dict, cabc.Mapping):
            return "dict[any, any]"
        if isinstance(annotation, type) and self.kind(annotation):
            short = annotation.__name__
            qualname = _qualname(annotation)
            while refs.get(short, qualname) != qualname:
                short += "_"
            refs[short] = qualname
            return short
        raise TypeError(f"no wire type for annotation {annotation!r}")

    def default_json(self, value: Any) -> str:
        if isinstance(value, enum.Enum):
            value = value.value
        return json.dumps(self.msgspec.to_builtins(value))

    def raw_fields(self, cls: type) -> list[tuple[str, Any, Any, Any]]:
        """(name, annotation, default, factory) per field; MISSING is None in both slots."""
        kind = self.kind(cls)
        out: list[tuple[str, Any, Any, Any]] = []
        if kind in ("array", "map"):
            nodefault = self.msgspec.NODEFAULT
            for f in self.msgspec.structs.fields(cls):
                default = f.default if f.default is not nodefault else _MISSING
                factory = f.default_factory if f.default_factory is not nodefault else _MISSING
                out.append((f.name, f.type, default, factory))
        elif kind == "dataclass":
            hints = typing.get_type_hints(cls)
            for dc_field in dataclasses.fields(cls):
                default = (dc_field.default if dc_field.default is not dataclasses.MISSING
                           else _MISSING)
                factory = (dc_field.default_factory
                           if dc_field.default_factory is not dataclasses.MISSING else _MISSING)
                # typing.get_type_hints expands an alias: keep the alias object itself.
                annotation = (dc_field.type if self.alias(dc_field.type)
                              else hints.get(dc_field.name, dc_field.type))
                out.append((dc_field.name, annotation, default, factory))
        elif kind == "tuple":
            hints = typing.get_type_hints(cls)
            defaults = getattr(cls, "_field_defaults", {})
            for name in cls._fields:  # type: ignore[attr-defined]
                out.append((name, hints.get(name, Any), defaults.get(name, _MISSING), _MISSING))
        return out

    def describe(self, cls: type) -> StructInfo | EnumInfo:
        qualname = _qualname(cls)
        kind = self.kind(cls)
        if kind == "enum":
            members = tuple((m.name, m.value) for m in cls)  # type: ignore[attr-defined]
            values = [v for _, v in members]
            wire = ("int" if all(isinstance(v, int) for v in values)
                    else "str" if all(isinstance(v, str) for v in values) else "bytes")
            return EnumInfo(qualname, wire, members)
        if qualname in ENC_HOOK_TUPLE_FIELDS:
            return self._describe_enc_hook_tuple(cls)
        if kind is None:
            raise TypeError("neither a msgspec Struct, a dataclass, a NamedTuple nor an enum")
        refs: dict[str, str] = {}
        fields: list[FieldInfo] = []
        notes: list[str] = []
        raw = self.raw_fields(cls)
        nil_fields = self._probe_nil_fields(cls)
        constructed = self._constructed_defaults(cls, raw, refs)
        for name, annotation, default, factory in raw:
            type_text = self.type_expr(annotation, refs)
            if name in nil_fields and "none" not in type_text.split(" | "):
                notes.append(
                    f"{cls.__name__}.{name}: annotated '{type_text}', but vLLM's encoder writes "
                    f"nil for None; compared as '{type_text} | none'"
                )
                type_text += " | none"
            if name in constructed:
                value = constructed[name]
                notes.append(
                    f"{cls.__name__}.{name}: declared default None is outside its type "
                    f"'{type_text}'; __post_init__ makes it {value!r} in a default-constructed "
                    f"object, which is what travels; compared as default "
                    f"{self.default_json(value)}"
                )
                default = value
            if default is not _MISSING:
                fields.append(FieldInfo(name, type_text, False, default=self.default_json(default)))
            elif factory is not _MISSING:
                named = {list: "list", dict: "dict", set: "set"}.get(factory)
                if named is not None:
                    fields.append(FieldInfo(name, type_text, False, default_factory=named))
                else:
                    fields.append(FieldInfo(name, type_text, False,
                                            default=self.default_json(factory())))
            else:
                fields.append(FieldInfo(name, type_text, True))
        omit = bool(kind in ("array", "map")
                    and cls.__struct_config__.omit_defaults)  # type: ignore[attr-defined]
        encoding = self._probe_encoding(cls) or kind
        return StructInfo(qualname, encoding, omit, tuple(fields), refs, tuple(notes))

    def _constructed_defaults(self, cls: type, raw: list[tuple[str, Any, Any, Any]],
                              refs: dict[str, str]) -> dict[str, Any]:
        """Fields of a dataclass whose declared default is None although their annotation
        excludes None, with the value ``__post_init__`` gives them in ``cls()``."""
        if self.kind(cls) != "dataclass" or not hasattr(cls, "__post_init__"):
            return {}
        outside = [name for name, annotation, default, _ in raw if default is None
                   and "none" not in self.type_expr(annotation, dict(refs)).split(" | ")]
        if not outside:
            return {}
        try:
            made = cls()
        except Exception:  # a class that cannot be built without arguments keeps None
            return {}
        return {name: getattr(made, name) for name in outside
                if getattr(made, name, None) is not None}

    def _enc_hook_probe(self, cls: type) -> Any:
        """What vLLM's encoder writes for a MultiModalFieldElem (the one dataclass its enc_hook
        writes itself) whose data is None; None for every other class."""
        if _qualname(cls) != "vllm.multimodal.inputs:MultiModalFieldElem":
            return None
        from vllm.multimodal.inputs import MultiModalKwargsItem, MultiModalSharedField
        from vllm.v1.serial_utils import MsgpackEncoder

        elem = cls(data=None, field=MultiModalSharedField(batch_size=1))
        frames = MsgpackEncoder().encode(MultiModalKwargsItem({"k": elem}))
        return self.msgspec.msgpack.decode(frames[0])["k"]  # type: ignore[arg-type]

    def _probe_nil_fields(self, cls: type) -> set[str]:
        """Fields set to None in the enc_hook probe that vLLM's encoder writes as nil."""
        encoded = self._enc_hook_probe(cls)
        if not isinstance(encoded, dict):
            return set()
        return {name for name, value in encoded.items() if value is None}

    def _probe_encoding(self, cls: type) -> str | None:
        """For a class vLLM's enc_hook writes itself, the encoding it really produces."""
        if _qualname(cls) != "vllm.multimodal.inputs:MultiModalFieldElem":
            return None
        encoded = self._enc_hook_probe(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        if isinstance(encoded, dict) and list(encoded) == names:
            return "dataclass"
        return f"enc_hook writes {type(encoded).__name__}"

    def _describe_enc_hook_tuple(self, cls: type) -> StructInfo:
        from vllm.v1.serial_utils import MsgpackEncoder

        names = ENC_HOOK_TUPLE_FIELDS[_qualname(cls)]
        probe_value = {"probe": [1, 2]}
        frames = MsgpackEncoder().encode(cls(probe_value))
        encoded = self.msgspec.msgpack.decode(frames[0])  # type: ignore[arg-type]
        if isinstance(encoded, list) and len(encoded) == len(names) and \
                encoded[-1] == probe_value:
            encoding = "tuple"
        else:
            encoding = f"enc_hook writes {encoded!r}"
        fields = tuple(FieldInfo(name, "any", True) for name in names)
        return StructInfo(_qualname(cls), encoding, False, fields, {})


_MISSING = object()


def _describe_classes(impl: Implementation, qualnames: Iterable[str]) -> None:
    describer = _Describer()
    todo = list(dict.fromkeys(qualnames))
    while todo:
        qualname = todo.pop(0)
        if qualname in impl.classes or qualname in impl.unavailable:
            continue
        try:
            info = describer.describe(_import_class(qualname))
        except Exception as exc:  # an import or annotation failure is itself a finding
            impl.unavailable[qualname] = f"cannot be described ({type(exc).__name__}: {exc})"
            continue
        impl.classes[qualname] = info
        if isinstance(info, StructInfo):
            todo.extend(q for q in info.refs.values() if q not in impl.classes)


def _default_threshold(name: str) -> tuple[int | None, str | None]:
    """The value ``vllm.envs`` gives ``name`` when the variable is unset."""
    envs = importlib.import_module("vllm.envs")
    getter = getattr(envs, "environment_variables", {}).get(name)
    if getter is None:
        return None, None
    saved = os.environ.pop(name, None)
    try:
        return int(getter()), name
    finally:
        if saved is not None:
            os.environ[name] = saved


def _nested_int_constants(code: types.CodeType, function_name: str) -> list[int]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == function_name:
                return [c for c in const.co_consts if isinstance(c, int)
                        and not isinstance(c, bool)]
            found = _nested_int_constants(const, function_name)
            if found:
                return found
    return []


def _ring_constants() -> dict[str, int | float]:
    shm = importlib.import_module(SHM_MODULE)
    values: dict[str, int | float] = {}
    for key, where in RING_CONSTANTS.items():
        if where.startswith("MessageQueue.__init__:"):
            parameter = inspect.signature(shm.MessageQueue.__init__).parameters.get(
                where.split(":", 1)[1])
            if parameter is not None and parameter.default is not inspect.Parameter.empty:
                values[key] = parameter.default
        elif where == "MessageQueue.enqueue.oob_callback":
            sizes = [c for c in _nested_int_constants(shm.MessageQueue.enqueue.__code__,
                                                      "oob_callback") if c >= 1024]
            if len(sizes) == 1:
                values[key] = sizes[0]
        elif hasattr(shm, where):
            values[key] = getattr(shm, where)
    return values


def _to_bytes_calls(code: types.CodeType) -> list[tuple[int, str]]:
    """(length, byteorder) of every ``x.to_bytes(...)`` call with constant arguments."""
    found: list[tuple[int, str]] = []
    instructions = list(dis.get_instructions(code))
    for index, instruction in enumerate(instructions):
        if instruction.opname not in ("LOAD_ATTR", "LOAD_METHOD") or \
                instruction.argval != "to_bytes":
            continue
        consts: list[Any] = []
        kw_names: tuple[str, ...] = ()
        for following in instructions[index + 1:]:
            if following.opname == "LOAD_CONST":
                consts.append(following.argval)
            elif following.opname == "KW_NAMES":  # Python 3.11 and 3.12
                kw_names = code.co_consts[following.arg]  # type: ignore[index]
            elif following.opname.startswith(("CALL", "PRECALL")):
                break
            else:
                consts = []
                break
        if not kw_names and consts and isinstance(consts[-1], tuple):  # Python 3.13 CALL_KW
            kw_names = consts.pop()
        positional = consts[: len(consts) - len(kw_names)]
        arguments = dict(zip(("length", "byteorder"), positional, strict=False))
        arguments.update(zip(kw_names, consts[len(positional):], strict=False))
        if isinstance(arguments.get("length"), int) and isinstance(arguments.get("byteorder"),
                                                                  str):
            found.append((arguments["length"], arguments["byteorder"]))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(_to_bytes_calls(const))
    return found


def _identities() -> list[tuple[str, int, str]]:
    found: list[tuple[str, int, str]] = []
    utils = importlib.import_module("vllm.v1.engine.utils")
    rank = 0x0102
    identity = utils.CoreEngine(rank).identity
    byteorder = ("little" if identity == rank.to_bytes(len(identity), "little")
                 else "big" if identity == rank.to_bytes(len(identity), "big") else "unknown")
    found.append(("front end, vllm.v1.engine.utils:CoreEngine", len(identity), byteorder))
    core = importlib.import_module("vllm.v1.engine.core")
    for length, order in _to_bytes_calls(core.EngineCoreProc.__init__.__code__):
        found.append(("engine, vllm.v1.engine.core:EngineCoreProc.__init__", length, order))
    return found


def describe_vllm(extra_classes: Iterable[str] = ()) -> Implementation:
    """Describe the installed vLLM: the classes in :data:`ROOT_CLASSES` and ``extra_classes``
    (``module:QualName``) with everything their fields reach, and the surface constants.

    Raises :class:`ImplementationUnavailable` when vLLM cannot be imported.
    """
    try:
        vllm = importlib.import_module("vllm")
        importlib.import_module("vllm.v1.engine")
        importlib.import_module("vllm.v1.serial_utils")
    except Exception as exc:
        raise ImplementationUnavailable(
            f"cannot import vllm ({type(exc).__name__}: {exc}); install it to compare"
        ) from exc
    impl = Implementation(name="vllm", version=getattr(vllm, "__version__", "unknown"))
    _describe_classes(impl, [*ROOT_CLASSES, *extra_classes])

    engine = importlib.import_module("vllm.v1.engine")
    impl.request_types = {m.name: m.value for m in engine.EngineCoreRequestType}
    serial_utils = importlib.import_module("vllm.v1.serial_utils")
    impl.ext_codes = {_ext_key(name): getattr(serial_utils, name)
                      for name in EXT_CODE_CONSTANTS if hasattr(serial_utils, name)}
    impl.threshold_default, impl.threshold_env = _default_threshold(
        "VLLM_MSGPACK_ZERO_COPY_THRESHOLD")
    impl.ring_constants = _ring_constants()
    impl.identities = _identities()
    return impl


def notes(spec: Spec, impl: Implementation) -> list[str]:
    """Where the description of ``impl`` departs from its annotations to say what travels,
    for the classes ``spec`` describes (informational: :func:`compare` already used them)."""
    found: list[str] = []
    for name in sorted(spec.structs):
        info = impl.classes.get(spec.structs[name].vllm_class)
        if isinstance(info, StructInfo):
            found.extend(info.notes)
    return found


def run_diff(spec: Spec, against: str = "vllm") -> int:
    """Print every difference between ``spec`` and the installed implementation.

    Returns 0 when there is none, 1 when there are differences, 2 when the implementation
    cannot be imported (or ``against`` names one this module does not know).
    """
    if against != "vllm":
        print(f"enginewire spec diff: unknown implementation {against!r}; known: vllm",
              file=sys.stderr)
        return 2
    try:
        impl = describe_vllm(s.vllm_class for s in spec.structs.values())
    except ImplementationUnavailable as exc:
        print(f"enginewire spec diff: {exc}", file=sys.stderr)
        return 2
    if impl.version != spec.version:
        print(f"note: the spec describes vLLM {spec.version}; installed vllm is {impl.version}")
    differences = compare(spec, impl)
    for difference in differences:
        print(difference)
    for note in notes(spec, impl):
        print(f"note: {note}")
    n_structs = sum(1 for s in spec.structs.values() if isinstance(s, StructSpec))
    n_enums = len(spec.structs) - n_structs
    compared = (f"{n_structs} structs, {n_enums} enums, {len(impl.request_types)} request "
                f"types, {len(impl.ext_codes)} extension codes, "
                f"{len(impl.ring_constants)} ring constants, {len(impl.identities)} identity "
                f"sites")
    if not differences:
        print(f"no differences between the spec and vllm {impl.version} ({compared})")
        return 0
    by_area: dict[str, int] = {}
    for difference in differences:
        by_area[difference.area] = by_area.get(difference.area, 0) + 1
    areas = ", ".join(f"{n} {area}" for area, n in sorted(by_area.items()))
    print(f"{len(differences)} difference(s) between the spec and vllm {impl.version} "
          f"({areas}); compared {compared}")
    return 1
