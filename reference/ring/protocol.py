"""The flag protocol of the ring: one writer, ``n_reader`` readers, no locks.

The writer and the readers coordinate only through the one-byte flags of each chunk's metadata
row (see :mod:`.layout`). This module holds that protocol and nothing else: no waiting policy,
no sockets, no payloads. Every step touches memory only through a :class:`RingMemory`, so the
same code runs over real shared memory (:class:`.shm.ShmMemory`), over a plain
:class:`BytearrayMemory` in unit tests, and over an instrumented memory in a schedule explorer
that pauses a thread at every ``load``/``store``/``fence`` to try interleavings.

Every method is one non-blocking step; the caller loops (and waits) around them::

    writer = RingWriter(memory, layout)            reader = RingReader(memory, layout, rank)
    index = writer.try_acquire()  # None: full     index = reader.try_acquire()  # None: empty
    ... write chunk `index` ...                    try: ... read chunk `index` ...
    writer.commit()                                finally: reader.release()

The chunk states are the ``states`` table of ``spec/data/ring.toml`` (not-written ``0...``,
written ``1000``, partly-read, read-by-all ``1111`` for n_reader = 3): :class:`ChunkState` has
one member per row, named after the row (``not-written`` -> ``NOT_WRITTEN``), its value the
row's flag pattern, ``can_write`` the row's ``can_write``.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from enginewire.spec import load

from ..errors import RingError
from .framing import FIRST_DATA, IN_RING, Buffer, unpack_head
from .layout import RingLayout


class RingMemory(Protocol):
    """The memory a ring lives in, as the protocol sees it.

    Offsets are absolute byte offsets into the segment (see :class:`.layout.RingLayout`).
    Implementations must make ``fence()`` a full memory barrier between the processes or threads
    sharing the memory: every load and store before it is complete and visible before any load
    or store after it starts; ``fence_acq_rel`` (optional, see below) may leave an earlier
    store unordered with a later load, and nothing else. ``yield_()`` gives the processor away once
    (``sched_yield``); the protocol never calls it, the waiting loops around the protocol do.
    """

    def load(self, offset: int) -> int:
        """Read one byte (a flag)."""
        ...

    def store(self, offset: int, value: int) -> None:
        """Write one byte (a flag)."""
        ...

    def read(self, offset: int, length: int) -> Buffer:
        """Read ``length`` bytes; a view is fine if it stays valid until the next release."""
        ...

    def write(self, offset: int, data: Buffer) -> None:
        """Write the bytes of ``data`` starting at ``offset``."""
        ...

    def fence(self) -> None:
        """Full memory barrier."""
        ...

    #: Acquire-release fence: orders every access before it with every access after it,
    #: except an earlier store with a later load (clause ring.fence.acquire-release).
    #: Optional: where a memory lacks it the ring calls :meth:`fence` (a full barrier is always
    #: a valid implementation); None says the memory keeps that order without an instruction
    #: (x86), and the ring calls nothing.
    fence_acq_rel: Callable[[], None] | None

    #: Optional: ``(view, enter, leave)`` where ``view`` is a writable byte view of the whole
    #: memory whose item and slice accesses are exactly this memory's ``load``, ``store``,
    #: ``read`` and ``write`` (nothing recorded, nothing paused), and ``enter(); leave()`` is
    #: its ``fence``. A memory that offers it lets a queue end's express path (:mod:`.express`)
    #: make the steps' accesses without a Python call per access. An instrumented memory (the
    #: explorer's, a recording one) has none, or None, and gets the steps' own calls.
    direct: DirectAccess | None

    def yield_(self) -> None:
        """Give the processor to another thread or process once."""
        ...


#: See :attr:`RingMemory.direct`.
DirectAccess = tuple[memoryview, Callable[[], object], Callable[[], object]]


def direct_access(memory: RingMemory) -> DirectAccess | None:
    """The memory's :attr:`~RingMemory.direct` access, or None where it offers none."""
    return getattr(memory, "direct", None)


class BytearrayMemory:
    """A :class:`RingMemory` over a private ``bytearray``: for one process (threads, tests).

    ``fence()`` takes and releases a lock, which is a full barrier between threads.
    """

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self._fence_lock = threading.Lock()
        # A subclass may instrument the accesses (a recording memory): only this class's own
        # accesses are plain item accesses.
        self.direct: DirectAccess | None = (
            (memoryview(self.data), self._fence_lock.acquire, self._fence_lock.release)
            if type(self) is BytearrayMemory else None)

    def load(self, offset: int) -> int:
        return self.data[offset]

    def store(self, offset: int, value: int) -> None:
        self.data[offset] = value

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.data[offset:offset + length])

    def write(self, offset: int, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        self.data[offset:offset + view.nbytes] = view

    def fence(self) -> None:
        with self._fence_lock:
            pass

    def yield_(self) -> None:
        os.sched_yield()


_STATES = load().chunk_states()
_CAN_WRITE = {state.pattern: state.can_write for state in _STATES}


class _ChunkStateBase(enum.Enum):
    @property
    def can_write(self) -> bool:
        """The writer may claim a chunk in this state (the state's ``can_write``)."""
        return _CAN_WRITE[self.value]


#: The states of a chunk's metadata row, one member per row of the spec's ``states`` table:
#: NOT_WRITTEN, WRITTEN, PARTLY_READ, READ_BY_ALL.
if TYPE_CHECKING:
    # What a type checker sees of the class built below from the spec's table.
    class ChunkState(_ChunkStateBase):
        NOT_WRITTEN = enum.auto()
        WRITTEN = enum.auto()
        PARTLY_READ = enum.auto()
        READ_BY_ALL = enum.auto()
else:
    ChunkState = _ChunkStateBase(
        "ChunkState",
        [(state.name.upper().replace("-", "_"), state.pattern) for state in _STATES],
        module=__name__,
    )


def classify(row: Buffer) -> ChunkState:
    """The state of one metadata row ``| written | read[0] | ... |``.

    Raises :class:`RingError` if a flag is neither 0 nor 1 (clause ring.state.flag-values).
    """
    flags = bytes(row)
    if len(flags) < 2:
        raise RingError("ring.layout.metadata-region", "a metadata row is 1 + n_reader bytes",
                        expected=">= 2 bytes", got=len(flags))
    for position, flag in enumerate(flags):
        if flag not in (0, 1):
            raise RingError("ring.state.flag-values", f"flag byte {position} is not 0 or 1",
                            expected="0 or 1", got=flag)
    if flags[0] == 0:
        return ChunkState.NOT_WRITTEN
    read = sum(flags[1:])
    if read == 0:
        return ChunkState.WRITTEN
    if read == len(flags) - 1:
        return ChunkState.READ_BY_ALL
    return ChunkState.PARTLY_READ


def chunk_state(memory: RingMemory, layout: RingLayout, index: int) -> ChunkState:
    """Classify chunk ``index`` as it is in ``memory`` now (no fence: for inspection)."""
    return classify(memory.read(layout.metadata_row_offset(index), layout.metadata_size))


class _RingEnd:
    """What the writer and a reader share: the memory, the layout, the next chunk ``index``
    (from 0, advancing modulo ``max_chunks``), and state derived once from the layout and the
    memory so that a step does no arithmetic or attribute lookup it can avoid."""

    def __init__(self, memory: RingMemory, layout: RingLayout) -> None:
        self.memory = memory
        self.layout = layout
        self.index = 0
        # None where the memory needs no instruction for it; see RingMemory.fence_acq_rel.
        self._fence_acq_rel = getattr(memory, "fence_acq_rel", memory.fence)
        # True while this end has stored nothing since its last fence: a fence then would
        # order nothing more, so the check before an acquire skips it.
        self._fenced = False
        self._max_chunks = layout.max_chunks
        self._rows = [layout.metadata_row_offset(i) for i in range(layout.max_chunks)]
        self._chunks = [layout.chunk_offset(i) for i in range(layout.max_chunks)]


def keeps_steps(end: object, steps: tuple[str, ...], base: type) -> bool:
    """Does ``end``'s class keep ``base``'s own ``steps`` (none replaced by a subclass: a
    mutant, an instrumented end)? Only then may a path make those steps' accesses itself."""
    return all(getattr(type(end), name) is getattr(base, name) for name in steps)


#: The steps :meth:`RingWriter.try_publish` inlines.
_PUBLISH_STEPS = ("try_acquire", "chunk_offset", "commit", "readers_behind", "abandon")


class RingWriter(_RingEnd):
    """The writer's side of the flag protocol. Exactly one writer exists per ring.

    ``index`` is the next chunk to write; it starts at 0 and advances modulo ``max_chunks``.
    """

    def __init__(self, memory: RingMemory, layout: RingLayout) -> None:
        super().__init__(memory, layout)
        self._claimed: int | None = None
        self._n_reader = layout.n_reader
        self._read_flags = [tuple(range(row + 1, row + 1 + layout.n_reader))
                            for row in self._rows]
        # try_publish inlines this class's steps; a subclass that replaces one of them (a
        # mutant, an instrumented writer) gets its own steps called instead.
        self._inlined = keeps_steps(self, _PUBLISH_STEPS, RingWriter)

    def try_acquire(self) -> int | None:
        """Claim chunk ``index`` if it is free and return it, else None (nothing changed).

        Fence, then: is the chunk free, i.e. written == 0 or every read flag set (clauses
        ring.writer.fence-before-check and ring.writer.wait-writable)? The fence is skipped
        while the writer has stored nothing since its last one. Claiming sets the written flag
        to 0 before the caller fills the chunk (clause ring.writer.clear-written-before-fill).
        """
        if self._claimed is not None:
            raise RingError("ring.writer.single-writer", "a chunk is already claimed",
                            expected="commit() before the next acquire", got=self._claimed)
        memory = self.memory
        if not self._fenced:
            memory.fence()
            self._fenced = True
        index = self.index
        row = self._rows[index]
        load = memory.load
        if load(row) and sum(map(load, self._read_flags[index])) != self._n_reader:
            return None
        self._fenced = False  # the chunk's data is written by the caller, out of sight
        memory.store(row, 0)
        # The claim must be visible before any data byte or read flag of the chunk changes
        # (clause ring.writer.fence-after-claim): store-store order, an acquire-release fence.
        if self._fence_acq_rel is not None:
            self._fence_acq_rel()
        self._claimed = index
        return index

    def chunk_offset(self) -> int:
        """Offset of the claimed chunk's data."""
        if self._claimed is None:
            raise RingError("ring.writer.wait-writable", "no chunk claimed",
                            expected="try_acquire() first", got=None)
        return self._chunks[self._claimed]

    def commit(self) -> None:
        """Publish the claimed chunk: clear every read flag, fence, written = 1, fence, advance.

        The read flags are cleared BEFORE the written flag is set
        (clause ring.writer.read-flags-cleared-before-written).
        """
        index = self._claimed
        if index is None:
            raise RingError("ring.writer.wait-writable", "commit without a claimed chunk",
                            expected="try_acquire() first", got=None)
        memory = self.memory
        store = memory.store
        for flag in self._read_flags[index]:
            store(flag, 0)
        if self._fence_acq_rel is not None:  # ring.writer.fence-before-written: store-store
            self._fence_acq_rel()
        store(self._rows[index], 1)
        memory.fence()  # ring.writer.fence-after-written
        self._fenced = True
        self._claimed = None
        index += 1
        self.index = 0 if index == self._max_chunks else index

    def readers_behind(self) -> bool:
        """After :meth:`commit`: has no reader released the chunk committed before it yet?

        Then every reader still has that chunk to release, and each one checks the new chunk
        only after that release, so it will find the new chunk written without a notification
        (clause ring.notify.after-write). Both sides fence between their flag store and their
        load of the other's flag, so at least one of them sees the other's store. False with a
        single chunk and before the second write.
        """
        if self._max_chunks < 2:
            return False
        index = (self.index - 2) % self._max_chunks
        memory = self.memory
        if not memory.load(self._rows[index]):
            return False
        return not any(map(memory.load, self._read_flags[index]))

    def try_publish(self, head: Buffer, body: Buffer) -> bool | None:
        """One whole message in one call, for the per-message path of a queue: exactly the
        memory events of :meth:`try_acquire`, then ``write(chunk, head)``,
        ``write(chunk + len(head), body)``, then :meth:`commit`, then :meth:`readers_behind`,
        in that order (tests/test_ring_protocol.py runs both over a recording memory and
        compares the event sequences). The steps are those methods' steps, inlined: the
        memory sees no difference, a message costs one Python call instead of five.

        None when the chunk is not free (nothing changed: the caller waits and calls again);
        otherwise whether the readers need a notification (``not readers_behind()``).

        A queue end over shared memory makes the same accesses without a call per access
        (:mod:`.express`); this method is what it and the explorer are held to.
        """
        if self._claimed is not None:
            raise RingError("ring.writer.single-writer", "a chunk is already claimed",
                            expected="commit() before the next acquire", got=self._claimed)
        if not self._inlined:
            return self._publish_by_steps(head, body)
        memory = self.memory
        load = memory.load
        store = memory.store
        # try_acquire: ring.writer.fence-before-check, ring.writer.wait-writable
        if not self._fenced:
            memory.fence()
            self._fenced = True
        index = self.index
        row = self._rows[index]
        flags = self._read_flags[index]
        if load(row) and sum(map(load, flags)) != self._n_reader:
            return None
        self._fenced = False
        store(row, 0)  # ring.writer.clear-written-before-fill
        fence_acq_rel = self._fence_acq_rel
        if fence_acq_rel is not None:  # ring.writer.fence-after-claim
            fence_acq_rel()
        # the caller's fill
        offset = self._chunks[index]
        write = memory.write
        write(offset, head)
        write(offset + len(head), body)
        # commit: ring.writer.read-flags-cleared-before-written
        for flag in flags:
            store(flag, 0)
        if fence_acq_rel is not None:  # ring.writer.fence-before-written
            fence_acq_rel()
        store(row, 1)
        memory.fence()  # ring.writer.fence-after-written
        self._fenced = True
        index += 1
        max_chunks = self._max_chunks
        self.index = 0 if index == max_chunks else index
        # readers_behind: ring.notify.after-write
        if max_chunks < 2:
            return True
        before = index - 2  # the chunk committed before this one (index is one past this)
        if before < 0:
            before += max_chunks
        if not load(self._rows[before]):
            return True
        return any(map(load, self._read_flags[before]))

    def _publish_by_steps(self, head: Buffer, body: Buffer) -> bool | None:
        """:meth:`try_publish` through the step methods (those of a subclass included)."""
        if self.try_acquire() is None:
            return None
        offset = self.chunk_offset()
        try:
            self.memory.write(offset, head)
            self.memory.write(offset + len(head), body)
        except BaseException:
            self.abandon()
            raise
        self.commit()
        return not self.readers_behind()

    def abandon(self) -> None:
        """Give a claimed chunk up without publishing it (the caller failed while filling it).

        The chunk keeps written == 0, so no reader reads it, and ``index`` does not advance:
        the next acquire claims the same chunk again.
        """
        self._fenced = False
        self._claimed = None


class RingReader(_RingEnd):
    """Local reader ``rank``'s side of the flag protocol.

    ``rank`` is the reader's position in the handle's ``local_reader_ranks`` (0-based), which
    selects its read flag. ``index`` is the next chunk to read; it starts at 0.
    """

    def __init__(self, memory: RingMemory, layout: RingLayout, rank: int) -> None:
        layout.read_flag_offset(0, rank)  # validates rank
        super().__init__(memory, layout)
        self.rank = rank
        self._held: int | None = None
        self._own_flags = [row + 1 + rank for row in self._rows]
        self._chunk_bytes = layout.max_chunk_bytes

    def try_acquire(self) -> int | None:
        """Return chunk ``index`` if it is readable, else None. The caller must then
        :meth:`release` it, also when reading it fails (clause ring.reader.release-on-error).

        Fence, then: written == 1 and own read flag == 0 (clauses
        ring.reader.fence-before-check, ring.reader.readable-iff and
        ring.reader.own-flag-loaded-first: the own read flag is loaded before the written flag,
        so a claim that clears the read flags between the two loads cannot look readable). The
        fence is skipped while the reader has stored nothing since its last one (the one that
        ends :meth:`release`).
        """
        if self._held is not None:
            raise RingError("ring.reader.release-after-read", "a chunk is already held",
                            expected="release() before the next acquire", got=self._held)
        memory = self.memory
        if not self._fenced:
            memory.fence()
            self._fenced = True
        index = self.index
        load = memory.load
        if load(self._own_flags[index]) or not load(self._rows[index]):
            return None
        # Orders the data loads after the flag loads (clause ring.reader.fence-before-data):
        # load-load order, an acquire-release fence.
        if self._fence_acq_rel is not None:
            self._fence_acq_rel()
        self._held = index
        return index

    def chunk_offset(self) -> int:
        """Offset of the held chunk's data."""
        if self._held is None:
            raise RingError("ring.reader.readable-iff", "no chunk held",
                            expected="try_acquire() first", got=None)
        return self._chunks[self._held]

    def release(self) -> None:
        """Mark the held chunk read: fence, own flag = 1, fence, advance.

        Only the reader's own flag is written (clause ring.reader.only-own-flag).
        """
        index = self._held
        if index is None:
            raise RingError("ring.reader.release-after-read", "release without a held chunk",
                            expected="try_acquire() first", got=None)
        memory = self.memory
        # ring.reader.fence-before-release: the data loads before the flag store, an
        # acquire-release fence.
        if self._fence_acq_rel is not None:
            self._fence_acq_rel()
        memory.store(self._own_flags[index], 1)
        memory.fence()  # ring.reader.fence-after-release
        self._fenced = True
        self._held = None
        index += 1
        self.index = 0 if index == self._max_chunks else index

    def try_read_single(self, limit: int) -> bytes | int | None:
        """One small message in one call, for the per-message path of a queue.

        None when the next chunk is not readable (nothing held). Otherwise the chunk is
        acquired (:meth:`try_acquire`) and its first ``FIRST_DATA`` bytes read
        (``read(chunk, FIRST_DATA)``): when they frame exactly one in-ring buffer of at most
        ``limit`` bytes that lies within the chunk, that buffer is copied out
        (``read(chunk + FIRST_DATA, length)``), the chunk released (:meth:`release`) and the
        copy returned; any other chunk stays held and its index is returned, for the caller to
        read and release as after :meth:`try_acquire`. The steps are the methods' own (those
        of a subclass included); a chunk shorter than a one-buffer head is returned held.

        A queue end over shared memory makes the same accesses without a call per access
        (:mod:`.express`).
        """
        index = self.try_acquire()
        if index is None:
            return None
        if self._chunk_bytes < FIRST_DATA:
            return index
        offset = self.chunk_offset()
        memory = self.memory
        marker, count, length = unpack_head(bytes(memory.read(offset, FIRST_DATA)))
        if (marker != IN_RING or count != 1 or length > limit
                or FIRST_DATA + length > self._chunk_bytes):
            return index
        try:
            data = bytes(memory.read(offset + FIRST_DATA, length))
        finally:
            self.release()
        return data
