"""The ceiling contender of the ring's message rate: a minimal broadcast ring.

One writer, ``n_reader`` readers, ``chunks`` fixed-size slots of ``size`` bytes, in one
shared-memory segment::

    | flags: chunks rows of (written, read[0], ..., read[n-1]) | slot 0 | slot 1 | ... |

Every message has the same size: no framing, no codec, no notification, no timeouts beyond a
deadline checked every few thousand spins. The writer waits (``sched_yield``) until its slot is
unwritten or read by every reader, copies the bytes in, clears the read flags and sets
``written``; a reader waits until ``written`` is set and its own flag is clear, copies the bytes
out and sets its flag. Stores of single bytes through a memoryview are plain stores, which x86
(TSO) keeps in program order, so no fence is needed there: this ring is correct on x86 only,
which is all a ceiling has to be. What it costs per message is the least a Python broadcast ring
over flags can cost; the reference ring does the spec's steps (fences, framing, a codec, the
notify socket) on top.
"""

from __future__ import annotations

import os
import time
from multiprocessing import shared_memory

#: Spins between two deadline checks.
_CHECK_EVERY = 4096


class MinimalRingTimeout(TimeoutError):
    """A wait of the minimal ring outlived its deadline."""


def segment_size(n_reader: int, chunks: int, size: int) -> int:
    return chunks * (1 + n_reader) + chunks * size


class MinimalWriter:
    """The writer end over ``buf`` (a whole segment of :func:`segment_size` bytes)."""

    def __init__(self, buf: memoryview, n_reader: int, chunks: int, size: int) -> None:
        self.buf = buf
        self.size = size
        row = 1 + n_reader
        self.rows = [i * row for i in range(chunks)]
        self.slots = [chunks * row + i * size for i in range(chunks)]
        self.ones = bytes([1] * n_reader)
        self.zeros = bytes(n_reader)
        self.n_reader = n_reader
        self.chunks = chunks
        self.index = 0

    def write(self, data: bytes | bytearray | memoryview, timeout: float) -> None:
        buf = self.buf
        index = self.index
        row = self.rows[index]
        first, end = row + 1, row + 1 + self.n_reader
        ones = self.ones
        spins = 0
        deadline = 0.0
        while buf[row] and buf[first:end] != ones:
            os.sched_yield()
            spins += 1
            if spins % _CHECK_EVERY == 0:
                deadline = _check(deadline, timeout)
        slot = self.slots[index]
        buf[slot:slot + self.size] = data
        buf[first:end] = self.zeros
        buf[row] = 1
        index += 1
        self.index = 0 if index == self.chunks else index


class MinimalReader:
    """Reader ``rank``'s end over ``buf``."""

    def __init__(self, buf: memoryview, n_reader: int, chunks: int, size: int,
                 rank: int) -> None:
        self.buf = buf
        self.size = size
        row = 1 + n_reader
        self.rows = [i * row for i in range(chunks)]
        self.slots = [chunks * row + i * size for i in range(chunks)]
        self.rank = rank
        self.chunks = chunks
        self.index = 0

    def read(self, timeout: float) -> bytes:
        buf = self.buf
        index = self.index
        row = self.rows[index]
        own = row + 1 + self.rank
        spins = 0
        deadline = 0.0
        while buf[own] or not buf[row]:
            os.sched_yield()
            spins += 1
            if spins % _CHECK_EVERY == 0:
                deadline = _check(deadline, timeout)
        slot = self.slots[index]
        data = buf[slot:slot + self.size].tobytes()
        buf[own] = 1
        index += 1
        self.index = 0 if index == self.chunks else index
        return data


def _check(deadline: float, timeout: float) -> float:
    """The deadline of a wait (set at its first check), or MinimalRingTimeout once past it."""
    now = time.monotonic()
    if not deadline:
        return now + timeout
    if now > deadline:
        raise MinimalRingTimeout(f"minimal ring: no progress for {timeout} s")
    return deadline


def create(n_reader: int, chunks: int, size: int) -> shared_memory.SharedMemory:
    """A zeroed segment for the ring (the caller closes and unlinks it)."""
    return shared_memory.SharedMemory(create=True, size=segment_size(n_reader, chunks, size))
