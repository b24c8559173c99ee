"""The reference's struct classes: the spec's struct layouts as msgspec types.

The classes are built from ``spec/data/structs/*.toml`` by :mod:`enginewire.spec.classes`
(where the encodings and type mappings are described); this module is where the reference
implementation and its users take them from. The default version's classes are attributes of
this module (``from enginewire.reference.structs import EngineCoreRequest``); :func:`build`
gives any release's, and :class:`ReleaseStructs` builds values in one release's
layout. Type checkers see them through the generated stub
``structs_generated.pyi`` (``enginewire stubs``, :mod:`.stubs`), imported here under
``TYPE_CHECKING`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from enginewire.spec import classes as _classes
from enginewire.spec.classes import (
    NdarraySlot,
    NestedTensorsSlot,
    StructSet,
    TensorSlot,
    UnionSlot,
    build,
)
from enginewire.spec.types import kind_of, parse_type

# Imported for its effect: the tensor values this implementation builds fill tensor slots.
from . import tensors as _tensors  # noqa: F401

if TYPE_CHECKING:
    from .structs_generated import *  # noqa: F403

__all__ = ["NdarraySlot", "NestedTensorsSlot", "ReleaseStructs", "StructSet", "TensorSlot",
           "UnionSlot", "build"]


def __getattr__(name: str) -> Any:
    return _classes.__getattr__(name)


class ReleaseStructs:
    """The struct and enum values the reference peers send, in one vLLM release's layout.

    ``codec`` None (the reference release): the classes of this module, as they are. A codec
    built for another release: that release's classes (``codec.structs``), given only the
    fields the release has; a FinishReason member the release lacks becomes ABORT (ERROR came
    in 0.13.0: the request ends without output either way).
    """

    def __init__(self, codec: Any = None) -> None:
        self.set = None if codec is None else codec.structs
        self.spec: Any = None if codec is None else codec.spec

    def make(self, name: str, **values: Any) -> Any:
        """``name``'s class of the release called with ``values``: a field the release lacks
        is left out, a required field of a nullable (or any) type that ``values`` lacks is nil."""
        if self.set is None:
            return getattr(_classes, name)(**values)
        cls = self.set.classes[name]
        names = set(getattr(cls, "__struct_fields__", None) or cls._fields)
        out = {k: v for k, v in values.items() if k in names}
        for fld in getattr(self.spec.structs.get(name), "fields", ()):
            expr = parse_type(fld.type)
            if fld.required and fld.name not in out and (expr.nullable or kind_of(expr) == "any"):
                out[fld.name] = None
        return cls(**out)

    def has(self, name: str) -> bool:
        return self.set is None or name in self.set.classes

    def finish_reason(self, value: int) -> Any:
        if self.set is None:
            return _classes.FinishReason(value)
        enum = self.set.enums["FinishReason"]
        known = {int(m.value) for m in enum}
        if value not in known:
            value = int(_classes.FinishReason.ABORT)
        return enum(value)
