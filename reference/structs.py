"""The reference's struct classes: the spec's struct layouts as msgspec types.

The classes are built from ``spec/data/structs/*.toml`` by :mod:`enginewire.spec.classes`
(where the encodings and type mappings are described); this module is where the reference
implementation and its users take them from. The default version's classes are attributes of
this module (``from enginewire.reference.structs import EngineCoreRequest``); :func:`build`
gives any release's. Type checkers see them through the generated stub
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

# Imported for its effect: the tensor values this implementation builds fill tensor slots.
from . import tensors as _tensors  # noqa: F401

if TYPE_CHECKING:
    from .structs_generated import *  # noqa: F403

__all__ = ["NdarraySlot", "NestedTensorsSlot", "StructSet", "TensorSlot", "UnionSlot", "build"]


def __getattr__(name: str) -> Any:
    return _classes.__getattr__(name)
