"""Memory models, the ring's address map, and which explorer actions commute.

Three models of how one thread's stores reach the others:

- ``sc``: sequential consistency. One memory; every load and store is a scheduling point and
  takes effect at once. Fences change nothing and are not scheduling points.
- ``tso``: every thread has a FIFO store buffer (x86-like). A store enters the buffer (a step
  of the thread alone, not a scheduling point); the oldest entry of a buffer becomes visible
  to the others ("drains") at a point the scheduler chooses; a thread's loads see its own
  newest buffered store first; a fence waits until the thread's buffer has drained.
- ``weak``: like ``tso``, except that any buffered store may drain before older ones to a
  *different* address (stores to the same address stay in order): stores become visible out
  of program order unless a fence separates them (ARM/POWER-like store reordering).

Loads are never reordered with anything in these models, so load-load and load-store
reordering (which ARM also allows) are not explored. An acquire-release fence
(``fence_acq_rel``, clause ring.fence.acquire-release) orders everything but an earlier store
with a later load: under ``sc`` and ``tso`` it therefore does nothing, as on x86; under
``weak`` it waits like a full fence, as the reference's does off x86. A multi-byte ``write``
or ``read`` is one access: the explorer interleaves between accesses, never inside one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from enginewire.reference.ring.layout import RingLayout

#: A half-open byte range ``(lo, hi)``.
Range = tuple[int, int]


class MemoryModel(enum.Enum):
    """How stores become visible to other threads (see the module docstring)."""

    SC = "sc"
    TSO = "tso"
    WEAK = "weak"

    @property
    def buffered(self) -> bool:
        """Do stores wait in a per-thread store buffer?"""
        return self is not MemoryModel.SC

    @classmethod
    def parse(cls, name: str | MemoryModel) -> MemoryModel:
        if isinstance(name, MemoryModel):
            return name
        try:
            return cls(name.lower())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown memory model {name!r}: expected one of {choices}") from None


class Region(enum.Enum):
    WRITTEN_FLAG = "written flag"
    READ_FLAG = "read flag"
    DATA = "data"


@dataclass(frozen=True, slots=True)
class Place:
    """Where one byte of the ring is: which chunk, which part, and which reader or offset."""

    region: Region
    chunk: int
    #: The reader of a read flag, or the byte offset inside the chunk's data.
    index: int


class AddressMap:
    """Names the bytes of a ring laid out as :class:`RingLayout` says."""

    def __init__(self, layout: RingLayout) -> None:
        self.layout = layout
        self.size = layout.total_size
        self.metadata_offset = layout.metadata_offset
        self.row_size = layout.metadata_size
        self.chunk_bytes = layout.max_chunk_bytes
        self._places = [self._locate(offset) for offset in range(self.size)]

    def place(self, offset: int) -> Place:
        if not 0 <= offset < self.size:
            raise ValueError(f"offset {offset} is outside the ring (0..{self.size - 1})")
        return self._places[offset]

    def _locate(self, offset: int) -> Place:
        if offset >= self.metadata_offset:
            chunk, byte = divmod(offset - self.metadata_offset, self.row_size)
            if byte == 0:
                return Place(Region.WRITTEN_FLAG, chunk, 0)
            return Place(Region.READ_FLAG, chunk, byte - 1)
        chunk, byte = divmod(offset, self.chunk_bytes)
        return Place(Region.DATA, chunk, byte)

    def row(self, chunk: int) -> Range:
        start = self.metadata_offset + chunk * self.row_size
        return (start, start + self.row_size)

    def written_flag(self, chunk: int) -> int:
        return self.metadata_offset + chunk * self.row_size

    def describe(self, lo: int, hi: int) -> str:
        """``chunk 1 written flag``, ``chunk 0 read flag r1``, ``chunk 0 read flags r0..r1``,
        ``chunk 0 data[3]``, ``chunk 0 data[7..8]``, or a list of those for a mixed range."""
        parts: list[str] = []
        offset = lo
        while offset < hi:
            first = self.place(offset)
            end = offset + 1
            while end < hi:
                nxt = self.place(end)
                if nxt.region is not first.region or nxt.chunk != first.chunk:
                    break
                if first.region is Region.WRITTEN_FLAG:
                    break
                end += 1
            last = self.place(end - 1)
            if first.region is Region.WRITTEN_FLAG:
                parts.append(f"chunk {first.chunk} written flag")
            elif first.region is Region.READ_FLAG:
                if end - offset == 1:
                    parts.append(f"chunk {first.chunk} read flag r{first.index}")
                else:
                    parts.append(f"chunk {first.chunk} read flags r{first.index}..r{last.index}")
            elif end - offset == 1:
                parts.append(f"chunk {first.chunk} data[{first.index}]")
            else:
                parts.append(f"chunk {first.chunk} data[{first.index}..{last.index}]")
            offset = end
        return " + ".join(parts)

    def misplaced(self, kind: str, lo: int, hi: int) -> tuple[str, str] | None:
        """The layout clause an access breaks, with what happened, or None.

        The ring memory's contract (``RingMemory``): ``load``/``store`` move one flag byte,
        or byte 0 of a chunk (its overflow marker, ring.framing.overflow-byte); ``read``/
        ``write`` move chunk data (a ``read`` may also take the flags of one metadata row at
        once). So under the spec's layout a one-byte access to any other data byte breaks
        ``ring.layout.metadata-region``, a data write that reaches into the metadata region
        ``ring.layout.data-region``, and an access outside the segment ``ring.layout.segment``.
        A write that runs from one chunk into the next is left to the framing check of the
        published chunk (``ring.framing.within-chunk``).
        """
        if lo < 0 or hi > self.size or hi <= lo:
            return ("ring.layout.segment",
                    f"{kind} of bytes [{lo}, {hi}) outside the ring's {self.size}-byte segment "
                    "as the spec lays it out")
        first = self._places[lo]
        if kind in ("load", "store"):
            if first.region is Region.DATA and first.index != 0:
                return ("ring.layout.metadata-region",
                        f"a flag {kind} at offset {lo}, which the spec's layout makes "
                        f"{self.describe(lo, hi)} (flags start at offset {self.metadata_offset})")
            return None
        last = self._places[hi - 1]
        if first.region is Region.DATA and last.region is Region.DATA:
            return None
        if kind == "write" or first.chunk != last.chunk:
            return ("ring.layout.data-region",
                    f"a data {kind} of bytes [{lo}, {hi}) reaches the metadata region "
                    f"({self.describe(lo, hi)}); the data region is [0, "
                    f"{self.metadata_offset})")
        return None

    def check_footprint(self, lo: int, hi: int) -> tuple[Range, ...]:
        """The bytes the flag-discipline check reads when a store to ``[lo, hi)`` becomes
        visible: the whole metadata row of a flag, the written flag of a data chunk."""
        footprint: list[Range] = []
        chunks_seen: set[tuple[bool, int]] = set()
        for offset in range(lo, hi):
            place = self.place(offset)
            key = (place.region is Region.DATA, place.chunk)
            if key in chunks_seen:
                continue
            chunks_seen.add(key)
            if place.region is Region.DATA:
                flag = self.written_flag(place.chunk)
                footprint.append((flag, flag + 1))
            else:
                footprint.append(self.row(place.chunk))
        return tuple(footprint)


def overlaps(first: tuple[Range, ...], second: tuple[Range, ...]) -> bool:
    """Does any range of ``first`` share a byte with any range of ``second``?"""
    for lo, hi in first:
        for other_lo, other_hi in second:
            if lo < other_hi and other_lo < hi:
                return True
    return False


@dataclass(frozen=True, slots=True)
class Footprint:
    """What one explorer action touches: the thread (or store buffer) it belongs to and the
    bytes of shared memory it reads and writes, the checks' reads included."""

    owner: int
    reads: tuple[Range, ...]
    writes: tuple[Range, ...]

    def independent(self, other: Footprint) -> bool:
        """Do the two actions commute (same state and same checks in either order)?

        Actions of one thread, its store buffer's drains included, never commute; actions of
        two threads commute unless one writes a byte the other reads or writes.
        """
        if self.owner == other.owner:
            return False
        return not (overlaps(self.writes, other.writes) or overlaps(self.writes, other.reads)
                    or overlaps(other.writes, self.reads))
