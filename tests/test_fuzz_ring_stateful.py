"""Stateful testing of the ring's flag protocol and chunk framing (single process, no sockets).

A Hypothesis :class:`~hypothesis.stateful.RuleBasedStateMachine` drives one
:class:`~enginewire.reference.ring.RingWriter` and ``n_reader``
:class:`~enginewire.reference.ring.RingReader` over a
:class:`~enginewire.reference.ring.BytearrayMemory`, the way ``MessageQueue`` does (framing a
message in the chunk, or leaving the overflow marker and handing the buffers to every reader's
subscriber queue), and checks it against a model of what each reader must see.

Rules: enqueue messages whose framed size sits around the chunk size (the overflow boundary),
with and without a writer timeout; a fill that fails (the chunk is abandoned); dequeue by any
reader; a reader that raises while reading (the slot is still released); stalling and resuming a
reader (a slow reader makes the writer find the ring full).

Invariants: every metadata row is in one of the spec's four states and agrees with the model;
no reader ever has more than ``max_chunks`` messages waiting (the writer never overwrites a chunk
some reader has not read); each reader gets every message once, in order, byte for byte (checked
at every dequeue and by draining every reader at the end).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from enginewire.fuzz.profiles import profile
from enginewire.reference.errors import ProtocolTimeout, RingError
from enginewire.reference.ring import (
    BytearrayMemory,
    ChunkState,
    RingLayout,
    RingReader,
    RingWriter,
    decode_chunk,
    framed_size,
    needs_overflow,
)
from enginewire.reference.ring.framing import write_chunk
from enginewire.reference.ring.protocol import chunk_state
from enginewire.reference.ring.wait import Backoff, WaitPolicy
from enginewire.spec import load

RING_STATES = {state.pattern for state in load().surface("ring").states}
#: A wait that allows exactly one check (timeout 0), as MessageQueue's claim loop runs it.
NO_WAIT = WaitPolicy(spin_checks=0)


class MidRead(Exception):
    """Raised by the test while a reader holds a chunk."""


@dataclass(frozen=True)
class Sent:
    """A published message: its sequence number, buffers and where it went."""

    seq: int
    buffers: tuple[bytes, ...]
    chunk: int
    overflow: bool


def _payload(seq: int, index: int, length: int) -> bytes:
    return bytes((seq * 31 + index * 7 + i) % 251 for i in range(length))


class RingMachine(RuleBasedStateMachine):
    """One writer, ``n_reader`` readers, one model of what every reader must receive."""

    def __init__(self) -> None:
        super().__init__()
        self.layout: RingLayout | None = None

    @initialize(n_reader=st.integers(1, 3), max_chunks=st.integers(1, 4),
                max_chunk_bytes=st.integers(8, 48))
    def create(self, n_reader: int, max_chunks: int, max_chunk_bytes: int) -> None:
        self.layout = RingLayout(n_reader, max_chunk_bytes, max_chunks)
        self.memory = BytearrayMemory(self.layout.total_size)
        self.writer = RingWriter(self.memory, self.layout)
        self.readers = [RingReader(self.memory, self.layout, r) for r in range(n_reader)]
        self.sent: list[Sent] = []
        #: The message each chunk holds (None: never published).
        self.in_chunk: list[Sent | None] = [None] * max_chunks
        #: Per reader: sequence number of the next message it must get.
        self.next_seq = [0] * n_reader
        #: Per reader: overflow messages its subscriber socket has received, in order.
        self.subscribed: list[deque[tuple[bytes, ...]]] = [deque() for _ in range(n_reader)]
        self.stalled = [False] * n_reader

    # --- model queries ---------------------------------------------------------------------

    def _unread_by_someone(self, chunk: int) -> bool:
        held = self.in_chunk[chunk]
        return held is not None and any(seq <= held.seq for seq in self.next_seq)

    # --- writer ----------------------------------------------------------------------------

    @rule(main_delta=st.integers(-3, 3) | st.integers(-40, 0), oob=st.lists(
        st.integers(0, 6), max_size=2), with_timeout=st.booleans())
    def enqueue(self, main_delta: int, oob: list[int], with_timeout: bool) -> None:
        assert self.layout is not None
        seq = len(self.sent)
        oob_buffers = [_payload(seq, i + 1, n) for i, n in enumerate(oob)]
        # Framed size = max_chunk_bytes + main_delta: around the overflow boundary.
        main_len = max(0, self.layout.max_chunk_bytes + main_delta
                       - framed_size([b"", *oob_buffers]))
        buffers = (_payload(seq, 0, main_len), *oob_buffers)
        chunk = self.writer.index
        full = self._unread_by_someone(chunk)
        if with_timeout:
            claimed = self._claim_with_timeout()
        else:
            claimed = self.writer.try_acquire() is not None
        assert claimed == (not full), (
            f"writer {'claimed' if claimed else 'refused'} chunk {chunk} although the model "
            f"says it is {'full' if full else 'free'}")
        if not claimed:
            event("writer found the ring full" + (" and timed out" if with_timeout else ""))
            return
        # ring.writer.wait-writable: never overwrite a chunk a reader has not read.
        assert not self._unread_by_someone(chunk)
        offset = self.writer.chunk_offset()
        overflow = needs_overflow(list(buffers), self.layout.max_chunk_bytes)
        assert overflow == (framed_size(list(buffers)) > self.layout.max_chunk_bytes)
        event("overflow" if overflow else "framed in the chunk")
        if overflow:
            self.memory.store(offset, 1)
        else:
            write_chunk(self.memory.write, list(buffers), base=offset)
        self.writer.commit()
        message = Sent(seq, buffers, chunk, overflow)
        self.sent.append(message)
        self.in_chunk[chunk] = message
        if overflow:
            for queue in self.subscribed:
                queue.append(buffers)

    def _claim_with_timeout(self) -> bool:
        """MessageQueue's claim loop with a timeout of 0: one check, then ring.writer.timeout."""
        if self.writer.try_acquire() is not None:
            return True
        backoff = Backoff(NO_WAIT, 0.0, clause="ring.writer.timeout", what="a free chunk")
        with pytest.raises(ProtocolTimeout) as info:
            while self.writer.try_acquire() is None:
                backoff.pause()
        assert info.value.clause == "ring.writer.timeout"
        return False

    @rule(garbage=st.binary(min_size=1, max_size=8))
    def fill_fails(self, garbage: bytes) -> None:
        """The writer claims a chunk, writes part of it, fails, and abandons it."""
        chunk = self.writer.index
        if self.writer.try_acquire() is None:
            assert self._unread_by_someone(chunk)
            return
        self.memory.write(self.writer.chunk_offset(), garbage)
        self.writer.abandon()
        assert self.writer.index == chunk  # ring.writer.failed-fill: no advance
        assert chunk_state(self.memory, self.layout, chunk) is ChunkState.NOT_WRITTEN
        self.in_chunk[chunk] = None  # nothing readable there any more
        for reader in self.readers:
            if reader.index == chunk:
                assert reader.try_acquire() is None

    # --- readers ---------------------------------------------------------------------------

    def _expected(self, rank: int) -> Sent | None:
        seq = self.next_seq[rank]
        return self.sent[seq] if seq < len(self.sent) else None

    def _take(self, rank: int, raise_mid_read: bool) -> tuple[bytes, ...] | None:
        """Reader ``rank`` reads its next chunk (None: nothing readable); the buffers it got,
        None when it raised mid-read."""
        assert self.layout is not None
        reader = self.readers[rank]
        expected = self._expected(rank)
        index = reader.try_acquire()
        if index is None:
            assert expected is None, f"reader {rank} found no chunk but {expected} is waiting"
            return None
        assert expected is not None, f"reader {rank} read chunk {index} with nothing sent"
        assert index == expected.chunk
        got: tuple[bytes, ...] | None = None
        try:
            chunk = self.memory.read(reader.chunk_offset(), self.layout.max_chunk_bytes)
            if raise_mid_read:
                event("reader raised mid-read" + (" on an overflow chunk" if expected.overflow
                                                  else ""))
                raise MidRead(chunk[:1])
            decoded = decode_chunk(chunk)
            if not decoded.overflow:
                got = tuple(bytes(b) for b in decoded.buffers)
        except MidRead:
            pass
        finally:
            reader.release()
        # Released and advanced whatever happened (ring.reader.release-on-error).
        row = self.layout.metadata_row_offset(index)
        assert self.memory.load(row + 1 + rank) == 1
        assert reader.index == self.layout.next_index(index)
        self.next_seq[rank] += 1
        if expected.overflow:
            # The buffers come from the subscriber socket, in ring order; a reader that failed
            # on the chunk still takes them off its socket to stay in order.
            delivered = self.subscribed[rank].popleft()
            if not raise_mid_read:
                got = delivered
        return got

    @rule(data=st.data())
    def dequeue(self, data: st.DataObject) -> None:
        ready = [r for r, stalled in enumerate(self.stalled) if not stalled]
        if not ready:
            return
        rank = data.draw(st.sampled_from(ready), label="reader")
        expected = self._expected(rank)
        got = self._take(rank, raise_mid_read=False)
        if expected is None:
            assert got is None
        else:
            assert got == expected.buffers, (
                f"reader {rank} got another message than #{expected.seq}")

    @rule(data=st.data())
    def reader_raises_mid_read(self, data: st.DataObject) -> None:
        rank = data.draw(st.sampled_from(range(len(self.readers))), label="reader")
        self._take(rank, raise_mid_read=True)

    @rule(data=st.data())
    def stall_or_resume(self, data: st.DataObject) -> None:
        rank = data.draw(st.sampled_from(range(len(self.readers))), label="reader")
        self.stalled[rank] = not self.stalled[rank]

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def rows_in_spec_states(self) -> None:
        if self.layout is None:
            return
        for index in range(self.layout.max_chunks):
            row = self.memory.read(self.layout.metadata_row_offset(index),
                                   self.layout.metadata_size)
            try:
                state = chunk_state(self.memory, self.layout, index)
            except RingError as exc:  # a flag that is neither 0 nor 1
                raise AssertionError(f"chunk {index} row {bytes(row).hex()}: {exc}") from exc
            assert state.value in RING_STATES, f"chunk {index}: {state} is not a spec state"
            held = self.in_chunk[index]
            if held is None:
                assert bytes(row)[0] == 0, f"chunk {index} published with nothing in it"
                continue
            for rank, flag in enumerate(bytes(row)[1:]):
                read = self.next_seq[rank] > held.seq
                assert flag == int(read), (
                    f"chunk {index} read flag {rank} is {flag}, model says read={read}")
            assert bytes(row)[0] == 1

    @invariant()
    def writer_never_laps_a_reader(self) -> None:
        if self.layout is None:
            return
        for rank, seq in enumerate(self.next_seq):
            assert len(self.sent) - seq <= self.layout.max_chunks, (
                f"reader {rank} has {len(self.sent) - seq} messages waiting in "
                f"{self.layout.max_chunks} chunks")

    def teardown(self) -> None:
        if self.layout is None:
            return
        # Nothing lost: every reader still gets every message it has not read, in order.
        for rank in range(len(self.readers)):
            while (expected := self._expected(rank)) is not None:
                assert self._take(rank, raise_mid_read=False) == expected.buffers
            assert self.readers[rank].try_acquire() is None
            assert not self.subscribed[rank]


TestRing = RingMachine.TestCase
TestRing.settings = settings(parent=profile(), max_examples=max(150, profile().max_examples),
                             stateful_step_count=50)
