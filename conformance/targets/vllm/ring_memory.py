"""vLLM's unmodified ring steps over a memory the caller provides (capability ``ring.memory``).

vLLM's ``MessageQueue`` reaches its ring through ``self.buffer.get_data(i)`` and
``get_metadata(i)`` (memoryview slices of the shared memory), the module's ``memory_fence``
and ``sched_yield``, and its ``SpinCondition``. Replace those and its own ``enqueue``,
``dequeue``, ``acquire_write`` and ``acquire_read`` run over any memory with ``load``,
``store``, ``read``, ``write``, ``fence``, ``yield_`` (and optionally ``notify``): the suite's
recording memory (so the ``ring/memory/*`` checks decide vLLM) and the schedule explorer's
instrumented memory (:mod:`enginewire.fuzz.explore.vllm_ring` builds on this module).

- :class:`RingView`: a slice of that memory indexed as vLLM indexes its memoryviews
  (``view[i]`` a load, ``view[a:b]`` a read, assignments a store or a write);
- :class:`MemoryRingBuffer`: stands in for ``ShmRingBuffer``;
- :func:`message_queue`: a ``MessageQueue`` made with ``__new__`` and given the attributes
  those methods read;
- :class:`VllmMemoryRing`: the ``memory_writer``/``memory_reader`` pair of the ``vllm``
  target's ring surface. vLLM's ``enqueue``/``dequeue`` run as they are; only the pickler
  is replaced by one that passes the caller's buffers through (buffer 0 as the pickle
  stream, the others out of band, as vLLM's ``oob_callback`` decides from 1 MiB), because
  the suite hands a ring bytes, not objects.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from enginewire.reference.ring.layout import RingLayout

SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"


class RingView:
    """``size`` bytes of ``memory`` from ``base``, indexed like the memoryview slice vLLM
    gets from ``ShmRingBuffer.get_data``/``get_metadata``: ``view[i]`` loads one byte,
    ``view[a:b]`` reads bytes, and assignments store."""

    __slots__ = ("_memory", "_base", "_size")

    def __init__(self, memory: Any, base: int, size: int) -> None:
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


class MemoryRingBuffer:
    """Stands in for vLLM's ``ShmRingBuffer``: same geometry attributes, same context
    managers, views over ``memory`` instead of ``shared_memory.buf`` slices.
    ``row_view`` makes the metadata views (a :class:`RingView` subclass for a what-if)."""

    def __init__(self, memory: Any, layout: RingLayout, *,
                 row_view: type[RingView] = RingView) -> None:
        self._memory = memory
        self._layout = layout
        self._row_view = row_view
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


class SpinCondition:
    """vLLM's ``SpinCondition`` as the ring code uses it: ``wait`` is ``on_wait()``, the
    writer's ``notify`` (its notify socket send) is ``memory.notify()`` where the memory has
    one, so the notification is an ordered event of the memory's log."""

    def __init__(self, memory: Any, on_wait: Callable[[], None]) -> None:
        self._memory = memory
        self._on_wait = on_wait

    def wait(self, timeout_ms: int | None = None) -> None:
        self._on_wait()

    def record_read(self) -> None:
        return None

    def notify(self) -> None:
        notify = getattr(self._memory, "notify", None)
        if notify is not None:
            notify()

    def cancel(self) -> None:
        return None


class NoOverflowSocket:
    def send_multipart(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the ring's memory adapter sizes chunks so that no message "
                           "overflows the ring")


def message_queue(memory: Any, layout: RingLayout, *, writer: bool, rank: int | None,
                  on_wait: Callable[[], None],
                  row_view: type[RingView] = RingView) -> Any:
    """A vLLM ``MessageQueue`` whose ring is ``memory`` laid out as ``layout``."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    # The attributes below are duck-typed stand-ins (and None for the remote side it lacks)
    # for the types vLLM's constructor would set: mypy cannot see that they fit.
    queue = MessageQueue.__new__(MessageQueue)
    queue.buffer = MemoryRingBuffer(memory, layout, row_view=row_view)  # type: ignore[assignment]
    queue.n_local_reader = layout.n_reader
    queue.n_remote_reader = 0
    queue.current_idx = 0
    queue.shutting_down = False
    queue.tensor_arena = None
    queue.remote_socket = None  # type: ignore[assignment]
    queue.local_socket = NoOverflowSocket()  # type: ignore[assignment]
    queue._spin_condition = SpinCondition(memory, on_wait)  # type: ignore[assignment]
    queue._is_writer = writer
    queue._is_local_reader = not writer
    queue._is_remote_reader = False
    if not writer and rank is None:
        raise ValueError("message_queue: a reader needs its rank (0..n_reader-1), got None")
    queue.local_reader_rank = -1 if writer or rank is None else rank
    return queue


@contextlib.contextmanager
def patched(fence: Callable[[], None], yield_: Callable[[], None],
            pickle_module: Any = None) -> Iterator[None]:
    """vLLM's module-level ``memory_fence`` and ``sched_yield`` replaced (and its spin-loop
    extension off; ``pickle_module`` replaces the module's ``pickle`` when given)."""
    module = importlib.import_module(SHM_BROADCAST)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(module, "memory_fence", fence))
        stack.enter_context(mock.patch.object(module, "sched_yield", yield_))
        stack.enter_context(mock.patch.object(module, "SPINLOOP_EXT_ENABLED", False))
        if pickle_module is not None:
            stack.enter_context(mock.patch.object(module, "pickle", pickle_module))
        yield


class _NotReady(Exception):
    """vLLM's code reached a wait: no free chunk (writer) or nothing to read (reader)."""


def _not_ready() -> None:
    raise _NotReady


class _Frames:
    """The caller's buffers, in place of the object vLLM's ``enqueue`` pickles."""

    def __init__(self, buffers: list[Any]) -> None:
        self.buffers = buffers


class _PassThroughPickle:
    """Stands in for the ``pickle`` module inside ``shm_broadcast``: ``Pickler.dump`` of a
    :class:`_Frames` writes buffer 0 as the stream and offers every other buffer to vLLM's
    ``buffer_callback`` (out of band from 1 MiB); ``loads`` returns the buffers."""

    HIGHEST_PROTOCOL = 5

    class Pickler:
        def __init__(self, file: Any, protocol: int | None = None,
                     buffer_callback: Callable[[Any], bool] | None = None) -> None:
            self.file = file
            self.buffer_callback = buffer_callback
            self.dispatch_table: dict[Any, Any] = {}

        def dump(self, obj: _Frames) -> None:
            import pickle

            self.file.write(bytes(obj.buffers[0]))
            for buffer in obj.buffers[1:]:
                if self.buffer_callback is None or self.buffer_callback(
                        pickle.PickleBuffer(bytes(buffer))):
                    raise ValueError("the vLLM ring memory adapter carries extra buffers "
                                     "out of band only (vLLM: from 1 MiB)")

    def __init__(self, consume: Callable[[list[bytes]], None] | None = None) -> None:
        self.consume = consume

    def loads(self, data: Any, buffers: Any = ()) -> list[bytes]:
        """The buffers; ``consume(buffers)`` runs here, inside vLLM's ``acquire_read`` block
        (while the chunk is held), where vLLM unpickles."""
        got = [bytes(data), *(bytes(b) for b in buffers)]
        if self.consume is not None:
            self.consume(got)
        return got


class VllmMemoryRing:
    """``memory_writer``/``memory_reader`` of the ``vllm`` target (capability ``ring.memory``):
    vLLM's ``enqueue``/``dequeue`` over the suite's memory. ``write`` returns False (and has
    stored nothing) where vLLM's ``acquire_write`` would yield for a free chunk; ``read``
    returns None where ``acquire_read`` would wait; ``read(consume)`` calls ``consume(buffers)``
    where vLLM unpickles, inside ``acquire_read``, so a body that raises is vLLM's own case."""

    def memory_writer(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int) -> Any:
        layout = RingLayout(n_reader, max_chunk_bytes, max_chunks)
        queue = message_queue(memory, layout, writer=True, rank=None, on_wait=_not_ready)

        class _Writer:
            def write(self, buffers: list[bytes]) -> bool:
                with patched(memory.fence, _not_ready, _PassThroughPickle()):
                    try:
                        queue.enqueue(_Frames(list(buffers)), timeout=None)
                    except _NotReady:
                        return False
                return True

        return _Writer()

    def memory_reader(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int, rank: int) -> Any:
        layout = RingLayout(n_reader, max_chunk_bytes, max_chunks)
        queue = message_queue(memory, layout, writer=False, rank=rank, on_wait=_not_ready)

        class _Reader:
            def read(self, consume: Any = None) -> list[bytes] | None:
                with patched(memory.fence, _not_ready, _PassThroughPickle(consume)):
                    try:
                        return list(queue.dequeue(timeout=None, indefinite=True))
                    except _NotReady:
                        return None

        return _Reader()
