"""Ring targets by name: what ``enginewire explore --target NAME`` runs.

``reference`` (:class:`~enginewire.fuzz.explore.ring_targets.ReferenceTarget`), ``vllm`` and
``vllm-enqueue`` (:class:`~enginewire.fuzz.explore.vllm_ring.VllmTarget`), or
``package.module:attr`` naming a :class:`~enginewire.fuzz.explore.ring_targets.RingTarget`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from enginewire.fuzz.explore.ring_targets import ReferenceTarget, RingTarget
from enginewire.fuzz.explore.vllm_ring import VllmTarget


def builtin_targets() -> dict[str, Callable[[], RingTarget]]:
    """The targets ``--target`` names: ``reference``, ``vllm`` (vLLM's ``acquire_write`` and
    ``acquire_read`` with raw bytes) and ``vllm-enqueue`` (``enqueue``/``dequeue``, pickled)."""

    def vllm_acquire() -> RingTarget:
        return VllmTarget(api="acquire")

    def vllm_enqueue() -> RingTarget:
        return VllmTarget(api="enqueue")

    return {"reference": ReferenceTarget, "vllm": vllm_acquire, "vllm-enqueue": vllm_enqueue}


def resolve_target(name: str) -> RingTarget:
    """A built-in target by name, or ``package.module:attr`` naming a :class:`RingTarget`
    instance, a subclass of it, or a function returning one."""
    builtins = builtin_targets()
    if name in builtins:
        return builtins[name]()
    if ":" not in name:
        raise ValueError(f"unknown target {name!r}: expected one of "
                         f"{', '.join(builtins)} or package.module:attr")
    module_name, attr = name.split(":", 1)
    found: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        found = getattr(found, part)
    if isinstance(found, type) and issubclass(found, RingTarget):
        found = found()
    elif not isinstance(found, RingTarget) and callable(found):
        found = found()
    if not isinstance(found, RingTarget):
        raise ValueError(f"{name} is not a RingTarget (got {type(found).__name__})")
    found.name = name
    return found
