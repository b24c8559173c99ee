"""Schedule exploration of the shared-memory ring (``enginewire explore``).

Runs a ring target's own writer and reader code over instrumented shared memory, interleaving
them only at memory accesses, and enumerates the interleavings (exhaustively, within a
preemption bound, or sampled with PCT) under a sequentially consistent, a TSO-like or a weaker
store-reordering memory model. See ``docs/explorer.md``.

- :mod:`.model`: memory models, the ring's address map, which actions commute;
- :mod:`.engine`: the threads' operation trees and one execution over them (scheduling points,
  store buffers);
- :mod:`.checks`: flag discipline and the messages each reader receives;
- :mod:`.strategies`: depth-first search, PCT, replay;
- :mod:`.shrink`, :mod:`.trace`, :mod:`.schedule`: shrinking, printing, replay strings;
- :mod:`.targets`, :mod:`.vllm_target`: the reference ring and vLLM's ``MessageQueue``;
- :mod:`.explorer`: :func:`explore` and :func:`replay`.
"""

from .engine import ExplorerError, ThreadContext, ThreadMemory, Violation
from .explorer import ExploreResult, Finding, explore, replay
from .model import MemoryModel
from .schedule import RingConfig, Schedule
from .strategies import ScheduleError
from .targets import ReferenceTarget, RingTarget, builtin_targets, resolve_target
from .vllm_target import VllmTarget

__all__ = [
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
