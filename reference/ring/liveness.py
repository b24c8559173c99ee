"""The liveness record: who uses a ring, kept after the ring's spec'd bytes (ring.liveness.*).

A reference writer makes its segment :data:`record_size` bytes longer than the layout needs and
writes there, at :func:`record_offset` (the layout's ``total_size`` rounded up to 8)::

    | magic (8) | writer pid (8) | writer start (8) | reader 0 pid (8) | reader 0 start (8) | ...
    | reader 0 state (1) | ... | reader n-1 state (1) |

all little-endian unsigned. A local reader that finds the magic writes its own pid and start
time into its entry when it attaches and clears the entry when it closes. vLLM reads only the
layout's bytes and accepts a larger segment (ring.layout.segment), so the record changes nothing
it sees; a vLLM writer's segment has no record, and then nothing is checked.

A reader's state byte says whether it may be blocked on the notify socket
(clause ring.notify.waiting-state): :data:`ABSENT` (0: no reader that keeps the byte, e.g. a
vLLM reader, or none attached), :data:`RUNNING` (1: it checks the flags without blocking) or
:data:`BLOCKING` (2: it blocks, or is about to). A reader stores BLOCKING and fences before its
last check of the flags ahead of a block, and RUNNING when its wait ends; the writer, after the
fence that follows a written flag, may skip the notification only while every state byte reads
RUNNING (:meth:`LivenessRecord.readers_running`).

A waiting end calls :meth:`LivenessRecord.check_writer` (readers) or
:meth:`LivenessRecord.check_readers` (the writer) now and then; each raises
:class:`~enginewire.reference.errors.RingPeerDead` naming the dead process.
"""

from __future__ import annotations

import struct

from ..errors import RingPeerDead
from ..processes import Creator, this_process
from .layout import RingLayout

MAGIC = b"EWLIVE\x00\x01"
_U64X2 = struct.Struct("<QQ")
#: A reader's state byte (ring.notify.waiting-state).
ABSENT, RUNNING, BLOCKING = 0, 1, 2


def record_offset(layout: RingLayout) -> int:
    """Where the record starts: right after the layout's bytes, 8-byte aligned."""
    return (layout.total_size + 7) // 8 * 8


def record_size(layout: RingLayout) -> int:
    """Bytes of the record: magic, the writer's entry, one entry and one state byte per local
    reader."""
    return 8 + 16 * (1 + layout.n_reader) + layout.n_reader


def segment_size(layout: RingLayout) -> int:
    """Bytes a reference writer allocates: the layout, padding, the record."""
    return record_offset(layout) + record_size(layout)


class LivenessRecord:
    """The record of one segment, seen from one end (``rank`` None: the writer)."""

    def __init__(self, buf: memoryview, layout: RingLayout, rank: int | None) -> None:
        self._buf = buf
        self._base = record_offset(layout)
        self._n_reader = layout.n_reader
        self.rank = rank
        #: The readers' state bytes: ``buf[states[0]:states[1]]``.
        self.states = (self._base + 8 + 16 * (1 + layout.n_reader),
                       self._base + 8 + 16 * (1 + layout.n_reader) + layout.n_reader)
        self._all_running = bytes([RUNNING] * layout.n_reader)

    @classmethod
    def create(cls, buf: memoryview, layout: RingLayout) -> LivenessRecord:
        """Write a fresh record naming the calling process as the writer."""
        record = cls(buf, layout, None)
        base = record._base
        buf[base + 8:base + record_size(layout)] = bytes(record_size(layout) - 8)
        record._put(0, this_process())
        buf[base:base + 8] = MAGIC
        return record

    @classmethod
    def attach(cls, buf: memoryview, layout: RingLayout, rank: int) -> LivenessRecord | None:
        """The record of a segment for local reader ``rank``, entered as this process; None
        when the segment has none (a vLLM writer's)."""
        base = record_offset(layout)
        if len(buf) < base + record_size(layout) or bytes(buf[base:base + 8]) != MAGIC:
            return None
        record = cls(buf, layout, rank)
        record._put(1 + rank, this_process())
        record.set_state(RUNNING)
        return record

    def set_state(self, state: int) -> None:
        """Store this reader's state byte (the caller fences where the order matters); nothing
        once the mapping is gone (a queue closed under a waiting thread)."""
        if self.rank is not None:
            try:
                self._buf[self.states[0] + self.rank] = state
            except (IndexError, ValueError, TypeError):
                pass

    def readers_running(self) -> bool:
        """Does every local reader's state byte read RUNNING (none blocking, none that keeps
        no state)? The writer's test after the fence that follows a written flag."""
        start, end = self.states
        return self._buf[start:end] == self._all_running

    def _entry(self, slot: int) -> int:
        return self._base + 8 + 16 * slot

    def _put(self, slot: int, creator: Creator) -> None:
        _U64X2.pack_into(self._buf, self._entry(slot), creator.pid, creator.start)

    def _get(self, slot: int) -> Creator | None:
        pid, start = _U64X2.unpack_from(self._buf, self._entry(slot))
        return Creator(pid, start) if pid else None

    @property
    def writer(self) -> Creator | None:
        return self._get(0)

    def reader(self, rank: int) -> Creator | None:
        """The process that attached as local reader ``rank`` and has not closed, if any."""
        return self._get(1 + rank)

    def leave(self) -> None:
        """Clear this reader's entry (a clean close is not a death)."""
        if self.rank is not None:
            try:
                self.set_state(ABSENT)
                _U64X2.pack_into(self._buf, self._entry(1 + self.rank), 0, 0)
            except (IndexError, ValueError, TypeError):
                pass  # the mapping is already gone

    def check_writer(self) -> None:
        """Raise RingPeerDead if the writer's process no longer runs."""
        writer = self.writer
        if writer is not None and not writer.alive():
            raise RingPeerDead(
                "ring.liveness.peer-dead",
                f"the ring's writer (pid {writer.pid}) is dead",
                expected="a running writer",
                got=f"pid {writer.pid} gone",
                peer="writer",
                pid=writer.pid,
            )

    def check_readers(self, ranks: list[int] | None = None) -> None:
        """Raise RingPeerDead if a recorded local reader (of ``ranks``, default all) no longer
        runs."""
        for rank in range(self._n_reader) if ranks is None else ranks:
            reader = self.reader(rank)
            if reader is not None and not reader.alive():
                raise RingPeerDead(
                    "ring.liveness.peer-dead",
                    f"local reader {rank} (pid {reader.pid}) is dead",
                    expected="a running reader",
                    got=f"pid {reader.pid} gone",
                    peer=f"reader {rank}",
                    pid=reader.pid,
                )
