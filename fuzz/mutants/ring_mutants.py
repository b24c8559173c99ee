"""Ring mutants: the reference shared-memory ring with one thing broken.

Flag-protocol mutants are subclasses of :class:`RingWriter` / :class:`RingReader` (the
explorer runs them through :class:`~enginewire.fuzz.explore.ring_targets.ReferenceTarget`, and the
conformance suite through ``MessageQueue`` and ``ring.memory``). Framing and waiting mutants
are subclasses of :class:`MessageQueue`. :class:`MutantRing` puts either kind behind the
conformance ``ring`` surface.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

from enginewire.conformance.targets.contract import RingHandle
from enginewire.conformance.targets.reference import (
    ReferenceRing,
    _ReferenceRingEnd,
    ring_handle,
)
from enginewire.reference.errors import RingError
from enginewire.reference.ring import queue as queue_module
from enginewire.reference.ring.framing import (
    HEADER_BYTES,
    IN_RING,
    LENGTH_BYTES,
    Buffer,
    decode_chunk,
    nbytes,
    overflow_total,
    write_chunk,
)
from enginewire.reference.ring.layout import RingLayout
from enginewire.reference.ring.protocol import RingReader, RingWriter
from enginewire.reference.ring.queue import Handle, MessageQueue

# --- flag protocol -------------------------------------------------------------------------


class WrittenBeforeReadFlagsCleared(RingWriter):
    """Sets the written flag, then clears the read flags.

    vLLM issues 27858 and 29389: between the two stores a reader sees the chunk published with
    its own read flag still 1 from the previous round and skips a message (or the writer sees
    it fully read and overwrites it). The reference clears the flags first
    (clause ring.writer.read-flags-cleared-before-written).
    """

    def commit(self) -> None:
        index = self._claimed
        if index is None:
            raise RingError("ring.writer.wait-writable", "commit without a claimed chunk")
        memory, row = self.memory, self._rows[index]
        memory.fence()
        memory.store(row, 1)
        for reader in range(self.layout.n_reader):
            memory.store(row + 1 + reader, 0)
        memory.fence()
        self._claimed = None
        self.index = (index + 1) % self.layout.max_chunks


class NoFenceBeforeWritten(RingWriter):
    """Publishes the chunk without a fence between its data and the written flag.

    vLLM PR 30407 added the fences around the flag stores: on a weakly ordered machine the
    written flag can become visible before the data, and a reader copies a half-written chunk
    (clause ring.writer.fence-before-written). On x86 (TSO) stores stay in order, so no test on
    a developer machine shows it.
    """

    def commit(self) -> None:
        index = self._claimed
        if index is None:
            raise RingError("ring.writer.wait-writable", "commit without a claimed chunk")
        memory, row = self.memory, self._rows[index]
        for reader in range(self.layout.n_reader):
            memory.store(row + 1 + reader, 0)
        memory.store(row, 1)
        memory.fence()
        self._claimed = None
        self.index = (index + 1) % self.layout.max_chunks


class ReusesPartlyReadChunk(RingWriter):
    """Takes a chunk as free once ANY reader has read it, not every reader.

    vLLM's ``acquire_write`` waits until ``read_count == n_reader``
    (``vllm/distributed/device_communicators/shm_broadcast.py``); with ``any`` a slow reader's
    message is overwritten under it (clause ring.writer.wait-writable), the lost-message
    symptom of issue 27858.
    """

    def try_acquire(self) -> int | None:
        memory = self.memory
        memory.fence()
        row = self._rows[self.index]
        if memory.load(row) and any(memory.read(row + 1, self.layout.n_reader)):
            # Claim it: a claim starts by storing written = 0, after which the real check
            # finds the chunk free.
            memory.store(row, 0)
        return super().try_acquire()


class MarksReadBeforeCopy(RingReader):
    """Sets its read flag as soon as it finds the chunk readable, before copying the data.

    The writer may then refill the chunk while the reader still copies it: the reader gets a
    torn or newer message. vLLM issue 53217 is the same aliasing one level up (out-of-band
    buffers still pointing into a slot that was released); 45224 moved vLLM's release into a
    ``finally`` after the read (clause ring.reader.release-after-read).
    """

    def try_acquire(self) -> int | None:
        index = super().try_acquire()
        if index is not None:
            self.memory.store(self._rows[index] + 1 + self.rank, 1)
            self.memory.fence()
        return index


# --- framing -------------------------------------------------------------------------------

_LE_HEADER = struct.Struct("<BHI")
_LE_LENGTH = struct.Struct("<I")
_ONE_BYTE_COUNT = struct.Struct(">BBI")


def write_chunk_little_endian(write: Any, buffers: Sequence[Buffer], base: int = 0) -> int:
    """:func:`write_chunk` with every count and length little-endian."""
    write(base, _LE_HEADER.pack(IN_RING, len(buffers), nbytes(buffers[0])))
    offset = HEADER_BYTES + LENGTH_BYTES
    write(base + offset, buffers[0])
    offset += nbytes(buffers[0])
    for buffer in buffers[1:]:
        write(base + offset, _LE_LENGTH.pack(nbytes(buffer)))
        offset += LENGTH_BYTES
        write(base + offset, buffer)
        offset += nbytes(buffer)
    return offset


def write_chunk_one_byte_count(write: Any, buffers: Sequence[Buffer], base: int = 0) -> int:
    """:func:`write_chunk` with a one-byte buffer count, so everything after it sits one byte
    early."""
    write(base, _ONE_BYTE_COUNT.pack(IN_RING, len(buffers) & 0xFF, nbytes(buffers[0])))
    offset = HEADER_BYTES - 1 + LENGTH_BYTES
    write(base + offset, buffers[0])
    offset += nbytes(buffers[0])
    for buffer in buffers[1:]:
        write(base + offset, struct.pack(">I", nbytes(buffer)))
        offset += LENGTH_BYTES
        write(base + offset, buffer)
        offset += nbytes(buffer)
    return offset


def write_chunk_length_off_by_one(write: Any, buffers: Sequence[Buffer], base: int = 0) -> int:
    """:func:`write_chunk` with every length prefix one more than its buffer's length; the
    buffers themselves sit where the spec puts them."""
    write(base, struct.pack(">BHI", IN_RING, len(buffers), nbytes(buffers[0]) + 1))
    offset = HEADER_BYTES + LENGTH_BYTES
    write(base + offset, buffers[0])
    offset += nbytes(buffers[0])
    for buffer in buffers[1:]:
        write(base + offset, struct.pack(">I", nbytes(buffer) + 1))
        offset += LENGTH_BYTES
        write(base + offset, buffer)
        offset += nbytes(buffer)
    return offset


class _FramingQueue(MessageQueue):
    """A queue whose writer frames chunks with :meth:`frame` and decides overflow with
    :meth:`overflows` (the reference's own functions unless a subclass replaces one)."""

    def overflows(self, buffers: Sequence[Buffer], max_chunk_bytes: int) -> bool:
        return overflow_total(buffers) >= max_chunk_bytes

    #: How the writer frames a chunk: ``chunk_writer(write, buffers, base)`` (the reference's
    #: ``write_chunk`` unless a subclass replaces it; the ``ring.memory`` writer uses it too).
    chunk_writer = staticmethod(write_chunk)

    def frame(self, write: Any, buffers: Sequence[Buffer], base: int) -> int:
        return self.chunk_writer(write, buffers, base)

    def enqueue_buffers(self, buffers: Sequence[Buffer], timeout: float | None = None) -> None:
        if self.n_remote_reader > 0 or self.n_local_reader == 0:
            return super().enqueue_buffers(buffers, timeout)
        local_socket = self._local_socket
        assert local_socket is not None and self.layout is not None
        overflow = self.overflows(buffers, self.layout.max_chunk_bytes)
        writer, notify = self._claim_chunk(timeout)
        offset = writer.chunk_offset()
        if overflow:
            writer.memory.store(offset, 1)
        else:
            self.frame(writer.memory.write, buffers, offset)
        writer.commit()
        if overflow:
            self._send_multipart(local_socket, buffers)
        if not writer.readers_behind():
            notify()
        return None


class OverflowOffByOne(_FramingQueue):
    """Overflows only when vLLM's total is strictly greater than the chunk: ``>`` for ``>=``.

    The message whose total equals ``max_chunk_bytes`` is then written in-ring one byte past
    the end of its chunk, over the next chunk's first byte (clause
    ring.framing.overflow-condition; ``shm_broadcast.py``'s ``total_bytes + len(...) >=
    self.buffer.max_chunk_bytes``).
    """

    def overflows(self, buffers: Sequence[Buffer], max_chunk_bytes: int) -> bool:
        return overflow_total(buffers) > max_chunk_bytes


class LittleEndianLengths(_FramingQueue):
    """Writes the buffer count and every length prefix little-endian (the spec and vLLM's
    ``to_bytes(4, "big")`` say big-endian; clause ring.framing.length-prefix). A
    little-endian host that copies a native ``uint32`` into the chunk does exactly this."""

    chunk_writer = staticmethod(write_chunk_little_endian)


class OneByteBufferCount(_FramingQueue):
    """Writes the buffer count in one byte instead of two (clause ring.framing.buffer-count):
    every length and buffer after it is shifted by one byte."""

    chunk_writer = staticmethod(write_chunk_one_byte_count)


class LengthPrefixOffByOne(_FramingQueue):
    """Writes every length prefix one byte too long (a length taken with the terminator
    counted, or ``<=`` for ``<`` in a copy loop; clause ring.framing.length-prefix). A reader
    that slices the chunk by the prefix takes one byte of whatever follows: pickle ignores a
    trailing byte after its STOP opcode, so a one-buffer message still unpickles, and only a
    check that compares the prefix with the real buffer sees it; the buffer after a wrong
    prefix starts one byte late."""

    chunk_writer = staticmethod(write_chunk_length_off_by_one)


# --- waiting and release ---------------------------------------------------------------------


class NotifiesBeforeWritten(MessageQueue):
    """Sends the notification after filling the chunk but before setting its written flag.

    A reader blocked on the notify socket wakes, finds written == 0, drains the (conflated)
    notification and blocks again: the message waits for the reader's recheck, seconds
    instead of milliseconds after an idle period (clause ring.notify.after-written-flag;
    vLLM notifies at shm_broadcast.py:975, after acquire_write's written flag and fence).
    Between the notification and the flag it does 50 ms of other work (as a writer that
    notifies before an overflow send would), so a woken reader always checks the flag inside
    that window; with a window of microseconds the reader would win the race only sometimes,
    and the cross-process check would catch it only then (the ``ring.memory`` order check
    and the explorer catch it always).
    """

    notify_before_written = True
    #: Seconds between the notification and the written flag.
    window_s = 0.05

    def enqueue_buffers(self, buffers: Sequence[Buffer], timeout: float | None = None) -> None:
        if self.n_remote_reader > 0 or self.n_local_reader == 0:
            return super().enqueue_buffers(buffers, timeout)
        assert self.layout is not None
        if overflow_total(buffers) >= self.layout.max_chunk_bytes:
            return super().enqueue_buffers(buffers, timeout)
        writer, notify = self._claim_chunk(timeout)
        write_chunk(writer.memory.write, buffers, base=writer.chunk_offset())
        notify()
        time.sleep(self.window_s)
        writer.commit()
        return None


class NoRecheckAfterNotification(MessageQueue):
    """A reader that, finding the ring empty, blocks on the notify socket until a ping comes,
    never rechecking the flags on a timer.

    vLLM issue 45224: the writer skips the ping when readers are behind (the SUB socket is
    conflated and pings get lost), so a reader that trusts pings alone sleeps through a
    published chunk (clauses ring.notify.after-write and ring.notify.hint-only).
    """

    #: Its ``ring.memory`` reader waits with ``memory.wait_notify()`` (no recheck) too.
    trusts_notifications = True

    def _block_on_notify(self, seconds: float) -> bool:
        return super()._block_on_notify(3600.0)


class NoReleaseOnError(MessageQueue):
    """A reader whose read flag is set only when decoding succeeds.

    vLLM issue 45224 moved the release into a ``finally``: a message that fails to unpickle
    otherwise leaves the slot held forever, the writer blocks on it, and every rank hangs
    (clause ring.reader.release-on-error).
    """

    #: Its ``ring.memory`` reader leaves the chunk held when the body raises, too.
    release_on_error = False

    def dequeue(self, timeout: float | None = None) -> Any:
        if not self.is_local_reader or self._pending_overflow:
            return super().dequeue(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        reader, chunk = self._acquire_chunk(timeout)
        decoded = decode_chunk(chunk)
        if decoded.overflow:
            self._pending_overflow += 1
            self._release_chunk(reader)
            return self._decode_frames(self._recv_overflow(deadline))
        views = decoded.buffers
        value = self.codec.decode(views[0], [bytearray(v) for v in views[1:]])
        queue_module._release_views(views)
        self._release_chunk(reader)
        return value


# --- the conformance surface ---------------------------------------------------------------


def _with_classes(queue: MessageQueue, writer_cls: type[RingWriter],
                  reader_cls: type[RingReader]) -> MessageQueue:
    """Swap the queue's fresh (never used) flag-protocol objects for the mutant classes."""
    if queue._writer is not None and writer_cls is not RingWriter:
        queue._writer = writer_cls(queue._writer.memory, queue._writer.layout)
    if queue._reader is not None and reader_cls is not RingReader:
        old = queue._reader
        queue._reader = reader_cls(old.memory, old.layout, old.rank)
    return queue


class _MutantWriterEnd(_ReferenceRingEnd):
    def __init__(self, queue: MessageQueue, n_reader: int) -> None:
        super().__init__(queue)
        self.handle = ring_handle(queue.export_handle(), n_reader)


class MutantRing(ReferenceRing):
    """The reference ring surface with a mutant queue class and/or flag-protocol classes."""

    def __init__(self, *, queue_cls: type[MessageQueue] = MessageQueue,
                 writer_cls: type[RingWriter] = RingWriter,
                 reader_cls: type[RingReader] = RingReader) -> None:
        self.queue_cls = queue_cls
        self.writer_cls = writer_cls
        self.reader_cls = reader_cls

    def _writer(self, n_reader: int, n_local: int, max_chunk_bytes: int, max_chunks: int,
                connect_ip: str | None = None) -> _MutantWriterEnd:
        queue = self.queue_cls(n_reader, n_local, max_chunk_bytes=max_chunk_bytes,
                               max_chunks=max_chunks, connect_ip=connect_ip)
        return _MutantWriterEnd(_with_classes(queue, self.writer_cls, self.reader_cls),
                                n_reader)

    def create_writer(self, *, n_reader: int, max_chunk_bytes: int, max_chunks: int) -> Any:
        return self._writer(n_reader, n_reader, max_chunk_bytes, max_chunks)

    def create_remote_writer(self, *, n_reader: int, n_local_reader: int, max_chunk_bytes: int,
                             max_chunks: int, connect_ip: str | None = None) -> Any:
        return self._writer(n_reader, n_local_reader, max_chunk_bytes, max_chunks, connect_ip)

    def attach_reader(self, handle: RingHandle, rank: int) -> Any:
        ranks = list(handle.reader_ranks or range(handle.n_reader))
        native = Handle(
            local_reader_ranks=ranks,
            buffer_handle=(handle.n_reader, handle.max_chunk_bytes, handle.max_chunks,
                           handle.shm_name),
            local_subscribe_addr=handle.subscribe_address,
            local_notify_addr=handle.notify_address,
            tensor_arena_handle=handle.tensor_arena_handle,
        )
        queue = self.queue_cls.create_from_handle(native, ranks[rank])
        return _ReferenceRingEnd(_with_classes(queue, self.writer_cls, self.reader_cls))

    def memory_writer(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int) -> Any:
        writer = self.writer_cls(memory, RingLayout(n_reader, max_chunk_bytes, max_chunks))
        frame = getattr(self.queue_cls, "chunk_writer", write_chunk)
        notify_first = getattr(self.queue_cls, "notify_before_written", False)
        queue_overflows = getattr(self.queue_cls, "overflows", None)

        def overflows(buffers: Sequence[Buffer], limit: int) -> bool:
            if queue_overflows is not None:
                return bool(queue_overflows(None, buffers, limit))
            return overflow_total(buffers) >= limit

        class _Writer:
            def write(self, buffers: list[bytes]) -> bool:
                if writer.try_acquire() is None:
                    return False
                if overflows(buffers, max_chunk_bytes):
                    memory.store(writer.chunk_offset(), 1)  # the rest goes over the XPUB
                else:
                    frame(memory.write, buffers, writer.chunk_offset())
                if notify_first:
                    memory.notify()
                writer.commit()
                if not notify_first:
                    memory.notify()
                return True

        return _Writer()

    def memory_reader(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int, rank: int) -> Any:
        reader = self.reader_cls(memory, RingLayout(n_reader, max_chunk_bytes, max_chunks),
                                 rank)

        release_on_error = getattr(self.queue_cls, "release_on_error", True)
        trusts_notifications = getattr(self.queue_cls, "trusts_notifications", False)

        class _Reader:
            def wait(self) -> None:
                """After a read that found nothing: recheck the flags when one changes, or
                (a reader that trusts notifications) sleep until a notification."""
                if trusts_notifications:
                    memory.wait_notify()
                else:
                    memory.yield_()

            def read(self, consume: Any = None) -> list[bytes] | None:
                if reader.try_acquire() is None:
                    return None
                decoded = decode_chunk(memory.read(reader.chunk_offset(), max_chunk_bytes))
                got = [bytes(b) for b in decoded.buffers] if not decoded.overflow else []
                if consume is not None:
                    try:
                        consume(got)
                    except BaseException:
                        if release_on_error:
                            reader.release()
                        raise
                reader.release()
                return got

        return _Reader()
