"""The express path: the common message of a local ring end in one Python call.

:mod:`.protocol` holds the flag protocol as the spec's steps, each one a method that touches
memory only through a :class:`~.protocol.RingMemory`; the schedule explorer drives those steps.
A queue end that ran them for every message would pay for the layers around them (the codec's
call, the protocol's calls, the checks each layer makes of its own state) as much as for the
steps themselves. Over a memory that offers :attr:`~.protocol.RingMemory.direct` access
(shared memory, a plain bytearray), the functions here make one message's work in one Python
call per end, the codec's included, and its memory accesses in one more, the *flag section*:

- :func:`writer_express` returns ``enqueue(queue, obj, timeout)``: the codec's one buffer,
  then the flag section's ``publish_single``, exactly the accesses of
  :meth:`~.protocol.RingWriter.try_publish` (the chunk free? claim, head, body, read flags
  cleared, written set, the fences), then the check for readers behind and the notification
  the flags call for.
- :func:`reader_express` returns ``dequeue(queue, timeout)``: the flag section's
  ``read_single``, exactly the accesses of :meth:`~.protocol.RingReader.try_read_single` for a
  chunk holding one in-ring buffer (the check, the head, a private copy of the buffer, the
  release and its fences), then the codec's object from the copy.

The flag section is compiled (``_express_flags.c``, built by ``pip install`` where a C
compiler is found; its fences are the processor's own) or, where it was not built, the same
accesses in Python (:func:`python_flag_section`, its fences the memory's lock); each begins with
a full fence, as the steps do unless the end has fenced since its last store. Either way the
per-message Python is the two functions here and the codec.

Each also takes a wait's first turns itself (:data:`FIRST_TURNS`): where the chunk is not
free or nothing is readable, it gives the processor away (``sched_yield``) and checks the
flags again, up to that many times, before it hands over to the queue's wait (see
:mod:`.wait`, stage 0). A turn checks the flags alone, as the protocol's check does (no fence:
the end has stored nothing since its last one), so that what a waiting end costs the process
it yields to stays what a minimal ring's costs.

What they change in memory is what the steps change, byte for byte and in the same order
(tests/test_ring_express.py runs both flag sections and the steps over the same schedules and
compares every byte after every call; the order within a call is the steps' order, written
out with the clause of each access). Anything else, a message that does not fit one chunk, a
chunk that is not free or not readable, a flag-protocol object swapped after construction (a
mutant harness), goes on through the queue's general path, which runs the steps. The
functions are built only for ends whose protocol class keeps this module's steps (a mutant or
instrumented class gets its own steps called) and whose queue class keeps the general path
they stand for.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from ..errors import RingError
from .framing import (
    FIRST_DATA,
    IN_RING,
    MAX_BUFFER_BYTES,
    OVERFLOW_BASE,
    Buffer,
    cached_single_head,
    single_head,
    unpack_head,
)
from .payload import PLAIN_LEAF_TYPES, SCAN_BYTES_MAX, PayloadCodec, PickleCodec, leaf_stream
from .protocol import RingReader, RingWriter, direct_access, keeps_steps
from .wait import WaitPolicy

#: Given away once per turn of a wait's first stage (a module attribute, so that a test can
#: act as the other end during it).
_sched_yield = os.sched_yield



#: ``publish_single(view, row, n_reader, chunk, body) -> bool``: a fence, then where the chunk
#: at ``chunk`` (metadata row at ``row``) is free, the accesses of
#: :meth:`~.protocol.RingWriter.try_publish` for one buffer ``body`` (claim, head, body, read
#: flags cleared, written set, their fences) and True; False where it is not free (nothing
#: stored).
PublishSingle = Callable[[memoryview, int, int, int, bytes], bool]
#: ``read_single(view, row, own, chunk, limit) -> bytes | None | False``: a fence, then where
#: the chunk is readable by the reader whose flag is at ``own``, the accesses of
#: :meth:`~.protocol.RingReader.try_read_single`: a private copy of its one in-ring buffer of
#: at most ``limit`` bytes, released; None where it is not readable; False where it holds
#: anything else (acquired: nothing stored, the general path reads it).
ReadSingle = Callable[[memoryview, int, int, int, int], "bytes | None | Literal[False]"]


def _compiled_section() -> tuple[PublishSingle, ReadSingle] | None:
    """The compiled flag section (``_express_flags.c``), where it was built: it writes the
    one-buffer head itself, so only for the framing it knows."""
    try:
        from ._express_flags import publish_single, read_single
    except ImportError:
        return None
    if (FIRST_DATA, IN_RING) != (7, 0):
        return None
    return publish_single, read_single


#: The compiled flag section, or None where ``_express_flags`` was not built (no C compiler
#: when the package was installed): then :func:`python_flag_section` makes the same accesses.
COMPILED_FLAG_SECTION = _compiled_section()


def python_flag_section(enter: Callable[[], object], leave: Callable[[], object],
                        fence_acq_rel: Callable[[], None] | None,
                        ) -> tuple[PublishSingle, ReadSingle]:
    """The flag section in Python over a memory whose full fence is ``enter(); leave()`` and
    whose acquire-release fence is ``fence_acq_rel`` (None: no instruction): what
    ``_express_flags.c`` does, access for access."""

    def publish_single(view: memoryview, row: int, n_reader: int, chunk: int,
                       body: bytes) -> bool:
        enter()  # ring.writer.fence-before-check
        leave()
        first, end = row + 1, row + 1 + n_reader
        # ring.writer.wait-writable: written == 0, or every read flag set
        if view[row] and view[first:end] != b"\x01" * n_reader:
            return False
        view[row] = 0  # ring.writer.clear-written-before-fill
        if fence_acq_rel is not None:  # ring.writer.fence-after-claim
            fence_acq_rel()
        size = len(body)
        view[chunk:chunk + FIRST_DATA] = cached_single_head(size) or single_head(size)
        start = chunk + FIRST_DATA
        view[start:start + size] = body
        view[first:end] = bytes(n_reader)  # ring.writer.read-flags-cleared-before-written
        if fence_acq_rel is not None:  # ring.writer.fence-before-written
            fence_acq_rel()
        view[row] = 1
        enter()  # ring.writer.fence-after-written
        leave()
        return True

    def read_single(view: memoryview, row: int, own: int, chunk: int,
                    limit: int) -> bytes | None | Literal[False]:
        enter()  # ring.reader.fence-before-check
        leave()
        # ring.reader.readable-iff, ring.reader.own-flag-loaded-first
        if view[own] or not view[row]:
            return None
        if fence_acq_rel is not None:  # ring.reader.fence-before-data
            fence_acq_rel()
        marker, count, length = unpack_head(view, chunk)
        if marker != IN_RING or count != 1 or length > limit:
            return False
        start = chunk + FIRST_DATA
        # Copied before the release: the writer may reuse the slot meanwhile.
        data = view[start:start + length].tobytes()
        if fence_acq_rel is not None:  # ring.reader.fence-before-release
            fence_acq_rel()
        view[own] = 1
        enter()  # ring.reader.fence-after-release
        leave()
        return data

    return publish_single, read_single


def flag_section(end: RingWriter | RingReader) -> tuple[PublishSingle, ReadSingle]:
    """The flag section an express path of ``end`` (over a memory with direct access) uses:
    the compiled one where it was built, else the Python one over the memory's fences."""
    if COMPILED_FLAG_SECTION is not None:
        return COMPILED_FLAG_SECTION
    direct = direct_access(end.memory)
    assert direct is not None
    return python_flag_section(direct[1], direct[2], end._fence_acq_rel)


class QueueEnd(Protocol):
    """What the express functions use of their queue end (a :class:`.queue.MessageQueue`):
    the protocol object it holds now, its state, and the general path it hands over to."""

    _writer: RingWriter | None
    _reader: RingReader | None
    _held_views: list[memoryview] | None
    _pending_overflow: int
    _last_notify_drain: float
    _notify: Callable[[], None] | None
    _readers_running: Callable[[], bool]

    def enqueue_buffers(self, buffers: Any, timeout: float | None = ...) -> None: ...

    def _publish_after_miss(self, writer: RingWriter, head: Buffer, body: Buffer,
                            timeout: float | None, started: float | None = ...) -> None: ...

    def _dequeue_rest(self, got: bytes | int | None, tried: bool,
                      timeout: float | None, started: float | None = ...) -> Any: ...

    def _drain_notify(self, now: float) -> None: ...


#: ``enqueue(queue, obj, timeout)`` of :func:`writer_express`.
ExpressEnqueue = Callable[[QueueEnd, Any, "float | None"], None]
#: ``dequeue(queue, timeout)`` of :func:`reader_express`.
ExpressDequeue = Callable[[QueueEnd, "float | None"], Any]

#: The writer steps the express enqueue makes (a class replacing one gets no express path).
WRITER_STEPS = ("try_acquire", "chunk_offset", "commit", "readers_behind", "abandon",
                "try_publish")
#: The reader steps the express dequeue makes.
READER_STEPS = ("try_acquire", "chunk_offset", "release", "try_read_single")
#: The most turns (a yield, then a check of the flags) an express call takes before it hands
#: a wait over to the queue; fewer where the wait's yield stage or its timeout ends first.
FIRST_TURNS = 64


def writer_express(writer: RingWriter, codec: PayloadCodec,
                   policy: WaitPolicy) -> ExpressEnqueue | None:
    """The express ``enqueue`` of ``writer``'s queue end, or None where the writer's memory
    offers no direct access or its class replaces a step.

    ``policy`` bounds the first turns of a wait by its yield stage. The function reads and
    advances the writer's own state (``index``, whether it has fenced since its last store),
    so the steps and the express path can take turns on one writer; the notification and the
    test that every local reader keeps checking the flags (ring.notify.waiting-state) are the
    queue's, looked up when they are needed.
    """
    direct = direct_access(writer.memory)
    if direct is None or not keeps_steps(writer, WRITER_STEPS, RingWriter):
        return None
    buf = direct[0]
    layout = writer.layout
    # the writer's own offsets; the read flags of a row as one span
    rows, chunks, max_chunks = writer._rows, writer._chunks, writer._max_chunks
    spans = [(flags[0], flags[-1] + 1) for flags in writer._read_flags]
    chunk_bytes = layout.max_chunk_bytes
    all_read = bytes([1] * layout.n_reader)
    none_read = bytes(layout.n_reader)
    publish_single, _ = flag_section(writer)
    n_reader = layout.n_reader
    encode = codec.encode
    # PickleCodec.encode's stream of a plain leaf, without its call and its list
    dumps_leaf = type(codec) is PickleCodec
    dumps = pickle.dumps
    protocol = pickle.HIGHEST_PROTOCOL
    yield_for = policy.yield_for_s
    monotonic = time.monotonic

    def chunk_free(row: int, first: int, end: int) -> bool:  # ring.writer.wait-writable
        return not buf[row] or buf[first:end] == all_read

    def enqueue(queue: QueueEnd, obj: Any, timeout: float | None) -> None:
        if dumps_leaf and type(obj) in PLAIN_LEAF_TYPES:
            body = dumps(obj, protocol)
        else:
            buffers = encode(obj)
            body = buffers[0]
            if len(buffers) != 1 or type(body) is not bytes:
                queue.enqueue_buffers(buffers, timeout)
                return
        size = len(body)
        if (queue._writer is not writer
                or not (OVERFLOW_BASE + size < chunk_bytes and 0 < size <= MAX_BUFFER_BYTES)):
            queue.enqueue_buffers([body], timeout)
            return
        if writer._claimed is not None:
            raise RingError("ring.writer.single-writer", "a chunk is already claimed",
                            expected="commit() before the next acquire", got=writer._claimed)
        index = writer.index
        row = rows[index]
        if not publish_single(buf, row, n_reader, chunks[index], body):
            head = cached_single_head(size) or single_head(size)
            if timeout is not None and timeout <= 0:
                queue._publish_after_miss(writer, head, body, timeout)
                return
            started = monotonic()
            first, end = spans[index]
            if not (_turns(chunk_free, (row, first, end),
                           started + (yield_for if timeout is None else min(yield_for, timeout)))
                    and publish_single(buf, row, n_reader, chunks[index], body)):
                queue._publish_after_miss(writer, head, body, timeout, started)
                return
        writer._fenced = True  # the flag section ends with a full fence
        index += 1
        writer.index = 0 if index == max_chunks else index
        # A notification is sent only where both tests call for it; the state bytes first,
        # since they hold still while the readers run (the flags' line is the busy one).
        if queue._readers_running():  # ring.notify.waiting-state
            return
        # ring.notify.after-write: no notification while every reader still has the chunk
        # committed before this one to release
        if max_chunks > 1:
            before = index - 2
            if before < 0:
                before += max_chunks
            if buf[rows[before]]:
                first, end = spans[before]
                if buf[first:end] == none_read:
                    return
        notify = queue._notify
        if notify is not None:
            notify()

    return enqueue


def reader_express(reader: RingReader, codec: PayloadCodec, policy: WaitPolicy,
                   drain_interval: float) -> ExpressDequeue | None:
    """The express ``dequeue`` of ``reader``'s queue end, or None where the reader's memory
    offers no direct access, its class replaces a step, or a chunk cannot hold a one-buffer
    head.

    A reader that never waits drains its notify socket every ``drain_interval`` seconds
    (ring.notify.busy-poll); ``policy`` bounds the first turns of a wait by its yield stage.
    The function reads and advances the reader's own state, as :func:`writer_express` does
    the writer's.
    """
    direct = direct_access(reader.memory)
    layout = reader.layout
    if (direct is None or not keeps_steps(reader, READER_STEPS, RingReader)
            or layout.max_chunk_bytes < FIRST_DATA):
        return None
    buf = direct[0]
    rows, chunks, max_chunks = reader._rows, reader._chunks, reader._max_chunks
    own_flags = reader._own_flags
    # the longest buffer a chunk holds, and at most what the allow-list's scan takes
    limit = min(SCAN_BYTES_MAX, layout.max_chunk_bytes - FIRST_DATA)
    _, read_single = flag_section(reader)
    decode = codec.decode
    # PickleCodec.decode's first screen and its unpickling, without its call and its checks
    # of the buffer's type (the copy below is bytes)
    loads_leaf = type(codec) is PickleCodec
    loads = pickle.loads
    yield_for = policy.yield_for_s
    monotonic = time.monotonic

    def readable(own: int, row: int) -> bool:  # ring.reader.readable-iff
        return not buf[own] and bool(buf[row])

    def dequeue(queue: QueueEnd, timeout: float | None) -> Any:
        if (queue._reader is not reader or queue._held_views is not None
                or queue._pending_overflow):
            return queue._dequeue_rest(None, False, timeout)
        if reader._held is not None:
            raise RingError("ring.reader.release-after-read", "a chunk is already held",
                            expected="release() before the next acquire", got=reader._held)
        index = reader.index
        own = own_flags[index]
        row = rows[index]
        data = read_single(buf, row, own, chunks[index], limit)
        if data is None:
            if timeout is not None and timeout <= 0:
                return queue._dequeue_rest(None, True, timeout)
            started = monotonic()
            if _turns(readable, (own, row),
                      started + (yield_for if timeout is None else min(yield_for, timeout))):
                data = read_single(buf, row, own, chunks[index], limit)
            if data is None:
                return queue._dequeue_rest(None, False, timeout, started)
        if data is False:
            reader._held = index  # acquired: the general path reads and releases it
            return queue._dequeue_rest(index, True, timeout)
        reader._fenced = True  # the flag section ends with a full fence
        index += 1
        reader.index = 0 if index == max_chunks else index
        now = monotonic()
        if now - queue._last_notify_drain >= drain_interval:
            queue._drain_notify(now)
        if loads_leaf and leaf_stream(data):
            return loads(data)
        return decode(data, ())

    return dequeue


def _turns(ready: Callable[..., bool], args: tuple[int, ...], until: float) -> bool:
    """A wait's first turns: give the processor away and call ``ready(*args)`` (a check of the
    flags alone), at most :data:`FIRST_TURNS` times and not past ``until``; whether it said
    yes. Only a miss comes here: the per-message function stays free of closures over its
    own variables."""
    for _ in range(FIRST_TURNS):
        _sched_yield()
        if ready(*args):
            return True
        if time.monotonic() >= until:
            return False
    return False
