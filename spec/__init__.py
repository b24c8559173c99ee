"""enginewire.spec: the machine-readable wire specification and its loader.

The facts live in TOML files under ``data/`` (one per surface, one per struct under
``data/structs/``); :func:`load` validates them against :mod:`.schema` and returns a typed
:class:`Spec`. Everything else in enginewire (reference, conformance, fuzz) reads the spec
through this function rather than restating it.

Layer: the lowest. This package may import only the standard library and third-party packages
(vLLM only inside :mod:`.drift`, which compares the spec with an installed vLLM), never another
enginewire package.
"""

from .loader import REFERENCE_VLLM_VERSION, ClauseRef, Spec, SpecError, load
from .types import TypeExpr, parse_type
from .versions import VersionRange

__all__ = [
    "REFERENCE_VLLM_VERSION",
    "ClauseRef",
    "Spec",
    "SpecError",
    "TypeExpr",
    "VersionRange",
    "load",
    "parse_type",
]
