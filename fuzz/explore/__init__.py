"""Schedule exploration of the shared-memory ring (``enginewire explore``).

Runs a ring target's own writer and reader code over instrumented shared memory, interleaving
them only at memory accesses, and enumerates the interleavings (exhaustively, within a
preemption bound, or sampled with PCT) under a sequentially consistent, a TSO-like or a weaker
store-reordering memory model. See ``docs/explorer.md``.

- :mod:`.model`: memory models, the ring's address map, which actions commute;
- :mod:`.execution`: the threads' operation trees and one execution over them (scheduling
  points, store buffers);
- :mod:`.checks`: flag discipline and the messages each reader receives;
- :mod:`.search`: depth-first search, PCT, replay;
- :mod:`.shrink`, :mod:`.trace`, :mod:`.schedule`: shrinking, printing, replay strings;
- :mod:`.ring_targets`, :mod:`.vllm_ring`: the reference ring and vLLM's ``MessageQueue``;
  :mod:`.builtin_rings`: the targets by name;
- :mod:`.pairing`: any ``ring.memory`` conformance target as an explorer target, one
  target's writer with another's readers, :func:`cross_explore` and :func:`resolve_target`;
- :mod:`.explorer`: :func:`explore` and :func:`replay`.

This package may import ``enginewire.spec``, ``enginewire.reference``, ``enginewire.conformance``
and vLLM (inside functions), never the rest of fuzz, bench or the command line.
"""

from enginewire.fuzz.explore.builtin_rings import builtin_targets
from enginewire.fuzz.explore.execution import ExplorerError, ThreadContext, ThreadMemory, Violation
from enginewire.fuzz.explore.explorer import (
    CrossResult,
    ExploreResult,
    Finding,
    cross_explore,
    explore,
    replay,
)
from enginewire.fuzz.explore.model import MemoryModel
from enginewire.fuzz.explore.pairing import MemoryRingTarget, PairedTarget, resolve_target
from enginewire.fuzz.explore.ring_targets import ReferenceTarget, RingTarget
from enginewire.fuzz.explore.schedule import RingConfig, Schedule
from enginewire.fuzz.explore.search import ScheduleError
from enginewire.fuzz.explore.vllm_ring import VllmTarget

__all__ = [
    "CrossResult",
    "MemoryRingTarget",
    "PairedTarget",
    "cross_explore",
    "ExploreResult",
    "ExplorerError",
    "Finding",
    "MemoryModel",
    "ReferenceTarget",
    "RingConfig",
    "RingTarget",
    "Schedule",
    "ScheduleError",
    "ThreadContext",
    "ThreadMemory",
    "Violation",
    "VllmTarget",
    "builtin_targets",
    "explore",
    "replay",
    "resolve_target",
]
