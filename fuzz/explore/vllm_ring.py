"""vLLM's own ``MessageQueue`` code as a ring target (``--target vllm`` / ``vllm-enqueue``).

The installed vLLM's writer and reader methods run unmodified
(``vllm/distributed/device_communicators/shm_broadcast.py``): ``acquire_write`` and
``acquire_read`` (target ``vllm``: the writer puts the raw message bytes into the chunk it is
given, each reader copies them out), or ``enqueue`` and ``dequeue`` (target
``vllm-enqueue``: pickled messages with vLLM's chunk framing). What is replaced is only what
they reach outside the ring's bytes:

- each ``MessageQueue`` is made with ``MessageQueue.__new__`` and given the attributes those
  methods read; its ``buffer`` is an object with vLLM's ``get_data``/``get_metadata`` context
  managers whose views turn every index and slice into a load or store of explorer memory;
- the module's ``memory_fence`` and ``sched_yield`` become the explorer's fence and yield
  (``unittest.mock.patch`` while the target is installed), and ``SPINLOOP_EXT_ENABLED`` is
  held False;
- the reader's ``SpinCondition`` becomes an object whose ``wait`` is the explorer's yield and
  whose ``notify`` (the writer's notify socket send) is an ordered ``notify`` event of the
  explorer (clause ring.notify.after-written-flag), and the overflow socket raises (messages
  are sized to fit a chunk).

The stand-ins are :mod:`enginewire.conformance.targets.vllm.ring_memory`'s, the ones the
``vllm`` conformance target's ``ring.memory`` capability runs over the suite's logged memory.
"""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

from enginewire.conformance.targets.vllm.ring_memory import RingView, message_queue, patched
from enginewire.fuzz.explore.execution import ThreadContext, current_memory
from enginewire.fuzz.explore.ring_targets import RingTarget
from enginewire.fuzz.explore.schedule import RingConfig
from enginewire.reference.ring.layout import RingLayout

#: vLLM's chunk header: overflow byte, 2-byte buffer count, 4-byte length of buffer 0.
VLLM_HEADER_BYTES = 7


class _FencedClaimView(RingView):
    """A metadata row whose written-flag store of 0 (the writer's claim) is followed by a
    fence: the what-if of :class:`VllmTarget` ``fence_after_claim``."""

    __slots__ = ()

    def __setitem__(self, key: int | slice, value: Any) -> None:
        super().__setitem__(key, value)
        if key == 0 and value == 0:
            self._memory.fence()


def _message_queue(context: ThreadContext, *, writer: bool,
                   fence_after_claim: bool = False) -> Any:
    """vLLM's ``MessageQueue`` over the thread's explorer memory (waiting is its yield)."""
    memory = context.memory
    return message_queue(memory, context.layout, writer=writer, rank=context.rank,
                         on_wait=memory.yield_,
                         row_view=_FencedClaimView if fence_after_claim and writer else RingView)


def _explorer_memory(stand_in: str) -> Any:
    """The explorer memory of the calling thread, for the stand-in of vLLM's ``stand_in``."""
    memory = current_memory()
    if memory is None:
        raise RuntimeError(f"{stand_in} called outside an explorer thread while the "
                           "explorer's stand-in is installed")
    return memory


def _fence() -> None:
    _explorer_memory("memory_fence").fence()


def _lock_fence() -> None:
    """``memory_fence`` where a lock taken and released is no full fence: the explorer's
    acquire-release fence, which leaves an earlier store and a later load unordered."""
    _explorer_memory("memory_fence").fence_acq_rel()


def _yield() -> None:
    _explorer_memory("sched_yield").yield_()


class VllmTarget(RingTarget):
    """vLLM's ``MessageQueue`` ring code (see the module docstring).

    ``api="acquire"``: ``acquire_write``/``acquire_read`` with raw message bytes (chunks are
    exactly one message long). ``api="enqueue"``: ``enqueue``/``dequeue`` of ``bytes`` objects,
    pickled by vLLM (chunks are exactly one framed message long).

    ``fence_after_claim`` is a what-if, not vLLM's code: the writer's store of written flag 0
    (its claim of a chunk) is followed by a fence, as if ``acquire_write`` fenced there.

    ``lock_fence`` is the what-if of a processor where vLLM's ``memory_fence`` (a
    ``threading.Lock`` taken and released) is no full fence: on Arm the lock's acquire and
    release are one-way barriers, which at the least leave an earlier store and a later load
    unordered. Each fence runs as the explorer's acquire-release fence, which under ``tso``,
    whose only reordering is that one, orders nothing (docs/explorer.md).
    """

    def __init__(self, api: str = "acquire", *, fence_after_claim: bool = False,
                 lock_fence: bool = False) -> None:
        if api not in ("acquire", "enqueue"):
            raise ValueError(f"api must be 'acquire' or 'enqueue', got {api!r}")
        self.api = api
        self.fence_after_claim = fence_after_claim
        self.lock_fence = lock_fence
        #: ``enqueue`` frames its (pickled) message as the spec says; ``acquire`` moves raw bytes.
        self.framing = None if api == "acquire" else "valid"
        self.name = "vllm" if api == "acquire" else "vllm-enqueue"
        if fence_after_claim:
            self.name += "+fence-after-claim"
        if lock_fence:
            self.name += "+lock-fence"

    def layout(self, config: RingConfig) -> RingLayout:
        if self.api == "acquire":
            chunk_bytes = config.payload_bytes
        else:
            main = max(len(pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL))
                       for p in config.payloads())
            # vLLM overflows when 6 + len(main) >= max_chunk_bytes.
            chunk_bytes = VLLM_HEADER_BYTES + main
        return RingLayout(config.readers, chunk_bytes, config.chunks)

    def installed(self) -> contextlib.AbstractContextManager[None]:
        return patched(_lock_fence if self.lock_fence else _fence, _yield)

    def run_writer(self, context: ThreadContext) -> None:
        queue = _message_queue(context, writer=True, fence_after_claim=self.fence_after_claim)
        for payload in context.payloads:
            if self.api == "acquire":
                with queue.acquire_write(timeout=None) as buf:
                    buf[0:len(payload)] = payload
            else:
                queue.enqueue(payload, timeout=None)

    def run_reader(self, context: ThreadContext) -> None:
        queue = _message_queue(context, writer=False)
        size = len(context.payloads[0])
        for _ in context.payloads:
            if self.api == "acquire":
                with queue.acquire_read(timeout=None, indefinite=True) as buf:
                    context.received(bytes(buf[0:size]))
            else:
                context.received(queue.dequeue(timeout=None, indefinite=True))
