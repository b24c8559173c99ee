"""The explorer's built-in ring targets by name.

``reference`` (:class:`~enginewire.fuzz.explore.ring_targets.ReferenceTarget`), ``vllm`` and
``vllm-enqueue`` (:class:`~enginewire.fuzz.explore.vllm_ring.VllmTarget`), ``vllm-memory`` (the
``vllm`` conformance target's ``ring.memory`` ends: vLLM's ``enqueue``/``dequeue`` with the
suite's buffers passed through its pickler, chunks framed as the spec says). Every other
``--target`` text is resolved by :func:`enginewire.fuzz.explore.pairing.resolve_target`.
"""

from __future__ import annotations

from collections.abc import Callable

from enginewire.fuzz.explore.ring_targets import MemoryRingTarget, ReferenceTarget, RingTarget
from enginewire.fuzz.explore.vllm_ring import VllmTarget


def builtin_targets() -> dict[str, Callable[[], RingTarget]]:
    """The targets ``--target`` names: ``reference``, ``vllm`` (vLLM's ``acquire_write`` and
    ``acquire_read`` with raw bytes), ``vllm-enqueue`` (``enqueue``/``dequeue``, pickled) and
    ``vllm-memory`` (``enqueue``/``dequeue`` through the ``ring.memory`` adapter)."""

    def vllm_acquire() -> RingTarget:
        return VllmTarget(api="acquire")

    def vllm_enqueue() -> RingTarget:
        return VllmTarget(api="enqueue")

    def vllm_memory() -> RingTarget:
        from enginewire.conformance.targets.vllm.ring_memory import VllmMemoryRing

        return MemoryRingTarget(VllmMemoryRing(), "vllm-memory")

    return {"reference": ReferenceTarget, "vllm": vllm_acquire, "vllm-enqueue": vllm_enqueue,
            "vllm-memory": vllm_memory}
