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
- the reader's ``SpinCondition`` becomes an object whose ``wait`` is the explorer's yield
  (``record_read`` and the writer's ``notify`` do nothing: notifications travel over ZMQ,
  outside the ring), and the overflow socket raises (messages are sized to fit a chunk).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from typing import Any
from unittest import mock

from enginewire.fuzz.explore.execution import ThreadContext, ThreadMemory, current_memory
from enginewire.fuzz.explore.ring_targets import RingTarget
from enginewire.fuzz.explore.schedule import RingConfig
from enginewire.reference.ring.layout import RingLayout

SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"
#: vLLM's chunk header: overflow byte, 2-byte buffer count, 4-byte length of buffer 0.
VLLM_HEADER_BYTES = 7


class RingView:
    """``size`` bytes of explorer memory from ``base``, indexed like the memoryview slice vLLM
    gets from ``ShmRingBuffer.get_data``/``get_metadata``: ``view[i]`` loads one byte,
    ``view[a:b]`` reads bytes, and assignments store."""

    __slots__ = ("_memory", "_base", "_size")

    def __init__(self, memory: ThreadMemory, base: int, size: int) -> None:
        self._memory = memory
        self._base = base
        self._size = size

    def __len__(self) -> int:
        return self._size

    def _span(self, key: slice) -> tuple[int, int]:
        start, stop, step = key.indices(self._size)
        if step != 1:
            raise ValueError("ring views support contiguous slices only")
        return start, max(start, stop)

    def _index(self, key: int) -> int:
        index = key + self._size if key < 0 else key
        if not 0 <= index < self._size:
            raise IndexError(f"index {key} out of range for a view of {self._size} bytes")
        return index

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop = self._span(key)
            if start == stop:
                return b""
            return self._memory.read(self._base + start, stop - start)
        return self._memory.load(self._base + self._index(key))

    def __setitem__(self, key: int | slice, value: Any) -> None:
        if isinstance(key, slice):
            start, stop = self._span(key)
            data = bytes(memoryview(value).cast("B"))
            if len(data) != stop - start:
                raise ValueError(f"slice of {stop - start} bytes assigned {len(data)} bytes")
            self._memory.write(self._base + start, data)
        else:
            self._memory.store(self._base + self._index(key), value)


class _FencedClaimView(RingView):
    """A metadata row whose written-flag store of 0 (the writer's claim) is followed by a
    fence: the what-if of :class:`VllmTarget` ``fence_after_claim``."""

    __slots__ = ()

    def __setitem__(self, key: int | slice, value: Any) -> None:
        super().__setitem__(key, value)
        if key == 0 and value == 0:
            self._memory.fence()


class ExplorerRingBuffer:
    """Stands in for vLLM's ``ShmRingBuffer``: same geometry attributes, same context
    managers, views over explorer memory instead of ``shared_memory.buf`` slices."""

    def __init__(self, memory: ThreadMemory, layout: RingLayout, *,
                 fence_after_claim: bool = False) -> None:
        self._memory = memory
        self._layout = layout
        self._row_view = _FencedClaimView if fence_after_claim else RingView
        self.n_reader = layout.n_reader
        self.metadata_size = layout.metadata_size
        self.max_chunk_bytes = layout.max_chunk_bytes
        self.max_chunks = layout.max_chunks
        self.data_offset = layout.data_offset
        self.metadata_offset = layout.metadata_offset

    @contextlib.contextmanager
    def get_data(self, current_idx: int) -> Iterator[RingView]:
        yield RingView(self._memory, self._layout.chunk_offset(current_idx),
                       self.max_chunk_bytes)

    @contextlib.contextmanager
    def get_metadata(self, current_idx: int) -> Iterator[RingView]:
        yield self._row_view(self._memory, self._layout.metadata_row_offset(current_idx),
                             self.metadata_size)


class _SpinCondition:
    """vLLM's ``SpinCondition`` as the ring code uses it; waiting is the explorer's yield."""

    def __init__(self, memory: ThreadMemory) -> None:
        self._memory = memory

    def wait(self, timeout_ms: int | None = None) -> None:
        self._memory.yield_()

    def record_read(self) -> None:
        return None

    def notify(self) -> None:
        self._memory.notify()  # its notify socket send, an ordered event

    def cancel(self) -> None:
        return None


class _NoOverflowSocket:
    def send_multipart(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the explorer sizes chunks so that no message overflows the ring")


def _message_queue(context: ThreadContext, *, writer: bool,
                   fence_after_claim: bool = False) -> Any:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    queue = MessageQueue.__new__(MessageQueue)
    layout = context.layout
    queue.buffer = ExplorerRingBuffer(context.memory, layout,
                                      fence_after_claim=fence_after_claim and writer)
    queue.n_local_reader = layout.n_reader
    queue.n_remote_reader = 0
    queue.current_idx = 0
    queue.shutting_down = False
    queue.tensor_arena = None
    queue.remote_socket = None
    queue.local_socket = _NoOverflowSocket()
    queue._spin_condition = _SpinCondition(context.memory)
    queue._is_writer = writer
    queue._is_local_reader = not writer
    queue._is_remote_reader = False
    queue.local_reader_rank = -1 if writer else context.rank
    return queue


def _fence() -> None:
    memory = current_memory()
    if memory is None:
        raise RuntimeError("memory_fence called outside an explorer thread while the "
                           "explorer's stand-in is installed")
    memory.fence()


def _yield() -> None:
    memory = current_memory()
    if memory is None:
        raise RuntimeError("sched_yield called outside an explorer thread while the "
                           "explorer's stand-in is installed")
    memory.yield_()


class VllmTarget(RingTarget):
    """vLLM's ``MessageQueue`` ring code (see the module docstring).

    ``api="acquire"``: ``acquire_write``/``acquire_read`` with raw message bytes (chunks are
    exactly one message long). ``api="enqueue"``: ``enqueue``/``dequeue`` of ``bytes`` objects,
    pickled by vLLM (chunks are exactly one framed message long).

    ``fence_after_claim`` is a what-if, not vLLM's code: the writer's store of written flag 0
    (its claim of a chunk) is followed by a fence, as if ``acquire_write`` fenced there.
    """

    def __init__(self, api: str = "acquire", *, fence_after_claim: bool = False) -> None:
        if api not in ("acquire", "enqueue"):
            raise ValueError(f"api must be 'acquire' or 'enqueue', got {api!r}")
        self.api = api
        self.fence_after_claim = fence_after_claim
        #: ``enqueue`` frames its (pickled) message as the spec says; ``acquire`` moves raw bytes.
        self.framing = None if api == "acquire" else "valid"
        self.name = "vllm" if api == "acquire" else "vllm-enqueue"
        if fence_after_claim:
            self.name += "+fence-after-claim"

    def layout(self, config: RingConfig) -> RingLayout:
        if self.api == "acquire":
            chunk_bytes = config.payload_bytes
        else:
            main = max(len(pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL))
                       for p in config.payloads())
            # vLLM overflows when 6 + len(main) >= max_chunk_bytes.
            chunk_bytes = VLLM_HEADER_BYTES + main
        return RingLayout(config.readers, chunk_bytes, config.chunks)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import importlib

        module = importlib.import_module(SHM_BROADCAST)
        with mock.patch.object(module, "memory_fence", _fence), \
                mock.patch.object(module, "sched_yield", _yield), \
                mock.patch.object(module, "SPINLOOP_EXT_ENABLED", False):
            yield

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
