"""The explorer's built-in ring targets by name.

``reference`` (:class:`~enginewire.fuzz.explore.ring_targets.ReferenceTarget`), ``vllm`` and
``vllm-enqueue`` (:class:`~enginewire.fuzz.explore.vllm_ring.VllmTarget`) with its what-ifs
``vllm+fence-after-claim`` and ``vllm+lock-fence``, ``vllm-memory`` (the ``vllm`` conformance
target's ``ring.memory`` ends: vLLM's ``enqueue``/``dequeue`` with the suite's buffers passed
through its pickler, chunks framed as the spec says). Every other ``--target`` text is resolved
by :func:`enginewire.fuzz.explore.pairing.resolve_target`. A target's name is the first part of
the schedules it prints, so a what-if's findings replay by name like the others'.
"""

from __future__ import annotations

from collections.abc import Callable

from enginewire.fuzz.explore.ring_targets import MemoryRingTarget, ReferenceTarget, RingTarget
from enginewire.fuzz.explore.vllm_ring import VllmTarget


def builtin_targets() -> dict[str, Callable[[], RingTarget]]:
    """The targets ``--target`` names: ``reference``, ``vllm`` (vLLM's ``acquire_write`` and
    ``acquire_read`` with raw bytes), ``vllm-enqueue`` (``enqueue``/``dequeue``, pickled),
    ``vllm+fence-after-claim`` and ``vllm+lock-fence`` (``vllm`` in the two what-ifs of
    :class:`~enginewire.fuzz.explore.vllm_ring.VllmTarget`) and ``vllm-memory``
    (``enqueue``/``dequeue`` through the ``ring.memory`` adapter)."""

    def vllm_acquire() -> RingTarget:
        return VllmTarget(api="acquire")

    def vllm_enqueue() -> RingTarget:
        return VllmTarget(api="enqueue")

    def vllm_memory() -> RingTarget:
        from enginewire.conformance.targets.vllm.ring_memory import VllmMemoryRing

        return MemoryRingTarget(VllmMemoryRing(), "vllm-memory")

    def fence_after_claim() -> RingTarget:
        return VllmTarget(api="acquire", fence_after_claim=True)

    def lock_fence() -> RingTarget:
        return VllmTarget(api="acquire", lock_fence=True)

    return {"reference": ReferenceTarget, "vllm": vllm_acquire, "vllm-enqueue": vllm_enqueue,
            "vllm+fence-after-claim": fence_after_claim, "vllm+lock-fence": lock_fence,
            "vllm-memory": vllm_memory}
