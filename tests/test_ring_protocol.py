"""The ring's flag protocol over plain in-process memory: step order, fences, interleavings.

The interleaving tests run the real :class:`RingWriter` and :class:`RingReader` as threads over
a memory that lets exactly one thread perform one memory operation at a time, in an order drawn
from a seeded random generator, and check the ring after every operation.
"""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable
from typing import Any

import pytest

from enginewire.reference.errors import RingError
from enginewire.reference.ring.layout import RingLayout
from enginewire.reference.ring.protocol import (
    BytearrayMemory,
    ChunkState,
    RingReader,
    RingWriter,
    chunk_state,
    classify,
)
from enginewire.reference.ring.wait import WaitPolicy, spin
from enginewire.spec import load

RING = load().surface("ring")


class RecordingMemory(BytearrayMemory):
    """Logs every operation as ``(op, offset, value_or_length)``."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.log: list[tuple[Any, ...]] = []

    def load(self, offset: int) -> int:
        self.log.append(("load", offset))
        return super().load(offset)

    def store(self, offset: int, value: int) -> None:
        self.log.append(("store", offset, value))
        super().store(offset, value)

    def read(self, offset: int, length: int) -> bytes:
        self.log.append(("read", offset, length))
        return super().read(offset, length)

    def write(self, offset: int, data: Any) -> None:
        self.log.append(("write", offset, len(bytes(data))))
        super().write(offset, data)

    def fence(self) -> None:
        self.log.append(("fence",))

    def take(self) -> list[tuple[Any, ...]]:
        log, self.log = self.log, []
        return log


# --- states -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "state"),
    [
        (b"\x00\x00\x00\x00", ChunkState.NOT_WRITTEN),
        (b"\x00\x01\x01\x01", ChunkState.NOT_WRITTEN),
        (b"\x00\x01\x00\x01", ChunkState.NOT_WRITTEN),
        (b"\x01\x00\x00\x00", ChunkState.WRITTEN),
        (b"\x01\x01\x00\x01", ChunkState.PARTLY_READ),
        (b"\x01\x00\x01\x00", ChunkState.PARTLY_READ),
        (b"\x01\x01\x01\x01", ChunkState.READ_BY_ALL),
    ],
)
def test_classify_sorts_rows_into_the_four_states(row: bytes, state: ChunkState) -> None:
    assert classify(row) is state


def test_the_four_states_are_the_specs() -> None:
    spec_states = {s.pattern: s for s in RING.states}
    assert set(spec_states) == {s.value for s in ChunkState}
    for state in ChunkState:
        assert spec_states[state.value].can_write is state.can_write


def test_classify_rejects_flags_other_than_zero_and_one() -> None:
    with pytest.raises(RingError) as info:
        classify(b"\x01\x02")
    assert info.value.clause == "ring.state.flag-values"


# --- step order and fences ----------------------------------------------------------------


def make(n_reader: int = 2, max_chunks: int = 3, chunk: int = 16) -> tuple[
        RingLayout, RecordingMemory]:
    layout = RingLayout(n_reader, chunk, max_chunks)
    return layout, RecordingMemory(layout.total_size)


def test_writer_claims_with_a_fence_before_the_check_and_written_zero() -> None:
    """Clauses ring.writer.fence-before-check, clear-written-before-fill, fence-after-claim."""
    layout, memory = make()
    writer = RingWriter(memory, layout)
    assert writer.try_acquire() == 0
    log = memory.take()
    assert log[0] == ("fence",)
    assert log[1] == ("load", layout.written_flag_offset(0))
    assert log[-2] == ("store", layout.written_flag_offset(0), 0)
    assert log[-1] == ("fence",)


def test_writer_commit_clears_read_flags_then_fences_then_sets_written() -> None:
    """Clause ring.writer.read-flags-cleared-before-written and both writer fences."""
    layout, memory = make()
    writer = RingWriter(memory, layout)
    writer.try_acquire()
    memory.take()
    writer.commit()
    row = layout.metadata_row_offset(0)
    assert memory.take() == [
        ("store", row + 1, 0),
        ("store", row + 2, 0),
        ("fence",),
        ("store", row, 1),
        ("fence",),
    ]
    assert writer.index == 1


def test_reader_fences_around_check_data_and_release() -> None:
    """Clauses ring.reader.fence-before-check, own-flag-loaded-first, fence-before-data."""
    layout, memory = make()
    writer, reader = RingWriter(memory, layout), RingReader(memory, layout, 1)
    writer.try_acquire()
    writer.commit()
    memory.take()
    assert reader.try_acquire() == 0
    row = layout.metadata_row_offset(0)
    assert memory.take() == [("fence",), ("load", row + 2), ("load", row), ("fence",)]
    reader.release()
    assert memory.take() == [("fence",), ("store", row + 2, 1), ("fence",)]
    assert reader.index == 1


class AcqRelMemory(RecordingMemory):
    """A memory with the optional acquire-release fence, logged apart from full fences."""

    def fence_acq_rel(self) -> None:
        self.log.append(("acq_rel",))


def test_acquire_release_fences_where_only_tso_order_is_needed() -> None:
    """Clause ring.fence.acquire-release: after the claim, before written = 1, before the data
    and before the release; the fences ordering a store before a later load stay full."""
    layout = RingLayout(2, 16, 2)
    memory = AcqRelMemory(layout.total_size)
    writer, reader = RingWriter(memory, layout), RingReader(memory, layout, 0)
    row = layout.metadata_row_offset(0)
    assert writer.try_acquire() == 0
    writer.commit()
    assert memory.take() == [
        ("fence",), ("load", row),                      # fence-before-check
        ("store", row, 0), ("acq_rel",),                # fence-after-claim
        ("store", row + 1, 0), ("store", row + 2, 0),
        ("acq_rel",), ("store", row, 1), ("fence",),    # fence-before-written, -after-written
    ]
    assert reader.try_acquire() == 0
    reader.release()
    assert memory.take() == [
        ("fence",), ("load", row + 1), ("load", row), ("acq_rel",),  # before check, data
        ("acq_rel",), ("store", row + 1, 1), ("fence",),             # before, after release
    ]


def test_a_memory_without_acquire_release_fences_gets_full_ones() -> None:
    layout, memory = make()
    writer = RingWriter(memory, layout)
    writer.try_acquire()
    writer.commit()
    assert sum(entry == ("fence",) for entry in memory.take()) == 4


class TsoMemory(RecordingMemory):
    """A memory that keeps acquire-release order without an instruction, as x86 does."""

    fence_acq_rel = None


def test_no_acquire_release_call_where_the_memory_needs_no_instruction() -> None:
    """A memory whose ``fence_acq_rel`` is None (ShmMemory on x86) gets no call in its place,
    and keeps the full fences after written = 1 and after the release."""
    layout = RingLayout(1, 16, 2)
    memory = TsoMemory(layout.total_size)
    writer, reader = RingWriter(memory, layout), RingReader(memory, layout, 0)
    row = layout.metadata_row_offset(0)
    assert writer.try_acquire() == 0
    writer.commit()
    assert memory.take() == [("fence",), ("load", row), ("store", row, 0),
                             ("store", row + 1, 0), ("store", row, 1), ("fence",)]
    assert reader.try_acquire() == 0
    reader.release()
    assert memory.take() == [("fence",), ("load", row + 1), ("load", row),
                             ("store", row + 1, 1), ("fence",)]


def test_a_check_right_after_a_fence_skips_its_own() -> None:
    """Clauses ring.writer.fence-before-check and ring.reader.fence-before-check allow it: the
    fence that ends a commit or a release already orders everything before the next check."""
    layout, memory = make(n_reader=1, max_chunks=2)
    writer, reader = RingWriter(memory, layout), RingReader(memory, layout, 0)
    writer.try_acquire()
    writer.commit()
    memory.take()
    assert writer.try_acquire() == 1  # no fence: nothing stored since commit's last fence
    assert memory.take()[0] == ("load", layout.metadata_row_offset(1))
    writer.abandon()  # the caller may have written data: the next check fences again
    memory.take()
    assert writer.try_acquire() == 1
    assert memory.take()[0] == ("fence",)
    reader.try_acquire()
    reader.release()
    memory.take()
    assert reader.try_acquire() is None  # chunk 1 not published: no fence, loads only
    assert all(entry[0] == "load" for entry in memory.take())


def test_spin_repeats_the_check_back_to_back_but_never_with_timeout_zero() -> None:
    answers = iter([None, 7])
    assert spin(lambda: next(answers), WaitPolicy(spin_checks=2), 1.0) == 7
    calls: list[int] = []
    assert spin(lambda: calls.append(1), WaitPolicy(spin_checks=3), None) is None
    assert len(calls) == 3
    assert spin(lambda: calls.append(1), WaitPolicy(spin_checks=3), 0) is None
    assert len(calls) == 3  # timeout 0 allows the one check already made


def test_spin_yield_checks_between_yields_until_its_time_is_up() -> None:
    import time

    from enginewire.reference.ring.wait import Backoff, spin_yield

    answers = iter([None, None, 5])
    assert spin_yield(lambda: next(answers), WaitPolicy(yield_for_s=5.0), None,
                      time.monotonic()) == 5
    calls: list[int] = []
    started = time.monotonic()
    assert spin_yield(lambda: calls.append(1), WaitPolicy(yield_for_s=0.02), None,
                      started) is None
    assert calls and time.monotonic() - started >= 0.02
    # The timeout bounds the stage too, and a Backoff built after it counts from its start.
    started = time.monotonic()
    assert spin_yield(lambda: None, WaitPolicy(yield_for_s=5.0), 0.02, started) is None
    assert time.monotonic() - started < 1.0
    backoff = Backoff(WaitPolicy(yield_for_s=5.0), 0.02, clause="ring.reader.timeout",
                      what="a chunk", checks=2, started=started)
    with pytest.raises(TimeoutError):
        backoff.pause()


def test_reader_waits_for_written_and_for_its_own_flag() -> None:
    layout, memory = make(n_reader=2, max_chunks=1)
    writer = RingWriter(memory, layout)
    first, second = RingReader(memory, layout, 0), RingReader(memory, layout, 1)
    assert first.try_acquire() is None  # not written yet
    writer.try_acquire()
    writer.commit()
    assert first.try_acquire() == 0
    first.release()
    assert chunk_state(memory, layout, 0) is ChunkState.PARTLY_READ
    assert first.try_acquire() is None  # own flag already 1 (index wrapped to 0)
    assert writer.try_acquire() is None  # reader 1 has not released it
    assert second.try_acquire() == 0
    second.release()
    assert chunk_state(memory, layout, 0) is ChunkState.READ_BY_ALL
    assert writer.try_acquire() == 0


def test_writer_never_claims_a_chunk_a_reader_has_not_released() -> None:
    layout, memory = make(n_reader=2, max_chunks=2)
    writer, slow = RingWriter(memory, layout), RingReader(memory, layout, 1)
    fast = RingReader(memory, layout, 0)
    for _ in range(2):
        writer.try_acquire()
        writer.commit()
        fast.try_acquire()
        fast.release()
    assert writer.try_acquire() is None
    slow.try_acquire()
    slow.release()
    assert writer.try_acquire() == 0


def test_abandoned_chunk_stays_unpublished_and_is_claimed_again() -> None:
    layout, memory = make(n_reader=1)
    writer, reader = RingWriter(memory, layout), RingReader(memory, layout, 0)
    writer.try_acquire()
    writer.abandon()
    assert reader.try_acquire() is None
    assert writer.try_acquire() == 0


def test_protocol_misuse_raises_ring_errors() -> None:
    layout, memory = make(n_reader=1)
    writer, reader = RingWriter(memory, layout), RingReader(memory, layout, 0)
    with pytest.raises(RingError):
        writer.commit()
    with pytest.raises(RingError):
        reader.release()
    writer.try_acquire()
    with pytest.raises(RingError):
        writer.try_acquire()
    with pytest.raises(RingError):
        RingReader(memory, layout, 1)


def test_readers_behind_only_when_no_reader_released_the_previous_chunk() -> None:
    layout, memory = make(n_reader=2, max_chunks=4)
    writer = RingWriter(memory, layout)
    readers = [RingReader(memory, layout, r) for r in range(2)]

    def publish() -> bool:
        writer.try_acquire()
        writer.commit()
        return writer.readers_behind()

    def read(rank: int) -> None:
        readers[rank].try_acquire()
        readers[rank].release()

    assert not publish()  # chunk 0, the first write: a reader may be waiting for it
    assert publish()  # chunk 1: chunk 0 unread by both, each will find chunk 1 after it
    read(0)
    read(0)
    # Reader 0 released chunk 1, the chunk before this write: it may be waiting for this one.
    assert not publish()
    read(1)
    assert publish()  # chunk 3: both readers still have chunk 2 to release
    read(0)
    read(0)
    assert not publish()  # chunk 0 again: reader 0 released chunk 3 and may be waiting


def test_readers_behind_is_false_with_one_chunk() -> None:
    layout = RingLayout(1, 8, 1)
    writer = RingWriter(BytearrayMemory(layout.total_size), layout)
    reader = RingReader(writer.memory, layout, 0)
    for _ in range(3):
        writer.try_acquire()
        writer.commit()
        assert not writer.readers_behind()
        reader.try_acquire()
        reader.release()


# --- interleavings ------------------------------------------------------------------------


class Aborted(Exception):
    pass


class SteppedMemory(BytearrayMemory):
    """Lets one actor thread perform one memory operation at a time, when the scheduler says.

    ``watch(actor, op, args)`` runs after every operation, with every actor stopped.
    """

    def __init__(self, size: int, watch: Callable[[str, str, tuple[Any, ...]], None]) -> None:
        super().__init__(size)
        self._cv = threading.Condition()
        self._waiting: set[str] = set()
        self._finished: set[str] = set()
        self._granted: str | None = None
        self._abort = False
        self._local = threading.local()
        self._watch = watch

    def _step(self, op: str, *args: Any) -> Any:
        name = self._local.name
        with self._cv:
            self._waiting.add(name)
            self._cv.notify_all()
            while self._granted != name:
                if self._abort:
                    raise Aborted
                self._cv.wait(5)
            self._granted = None
        result = getattr(BytearrayMemory, op)(self, *args)
        self._watch(name, op, args)
        return result

    def load(self, offset: int) -> int:
        return self._step("load", offset)

    def store(self, offset: int, value: int) -> None:
        self._step("store", offset, value)

    def read(self, offset: int, length: int) -> bytes:
        return self._step("read", offset, length)

    def write(self, offset: int, data: Any) -> None:
        self._step("write", offset, bytes(data))

    def fence(self) -> None:
        self._step("fence")

    def yield_(self) -> None:
        self._step("fence")  # a scheduling point, nothing else

    def run(self, actors: dict[str, Callable[[], None]], rng: random.Random,
            max_steps: int) -> tuple[int, dict[str, BaseException]]:
        """Run the actors to completion under ``rng``'s schedule; return steps and errors."""
        errors: dict[str, BaseException] = {}

        def body(name: str, fn: Callable[[], None]) -> None:
            self._local.name = name
            try:
                fn()
            except Aborted:
                pass
            except BaseException as exc:  # reported to the test
                errors[name] = exc
            finally:
                with self._cv:
                    self._finished.add(name)
                    self._cv.notify_all()

        threads = [threading.Thread(target=body, args=item, daemon=True)
                   for item in actors.items()]
        for thread in threads:
            thread.start()
        steps = 0
        with self._cv:
            while True:
                while self._waiting | self._finished != set(actors):
                    if not self._cv.wait(10):
                        raise AssertionError("an actor neither finished nor reached memory")
                if self._finished == set(actors):
                    break
                if steps >= max_steps:
                    self._abort = True
                    self._cv.notify_all()
                    break
                name = rng.choice(sorted(self._waiting))
                self._waiting.discard(name)
                self._granted = name
                steps += 1
                self._cv.notify_all()
        for thread in threads:
            thread.join(10)
        return steps, errors


class BrokenWriterIgnoresReadFlags(RingWriter):
    """Mutant: takes any published chunk that at least one reader released."""

    def try_acquire(self) -> int | None:
        self.memory.fence()
        row = self._rows[self.index]
        if self.memory.load(row) and sum(self.memory.read(row + 1, self.layout.n_reader)) > 0:
            self.memory.store(row, 0)  # the claim's first store: the real check then passes
        return super().try_acquire()


class BrokenReaderReleasesFirst(RingReader):
    """Mutant: marks the chunk read as soon as it has it, before reading the data."""

    def try_acquire(self) -> int | None:
        index = super().try_acquire()
        if index is not None:
            self.memory.store(self._rows[index] + 1 + self.rank, 1)
        return index


class BrokenWriterSkipsIfAnyReaderBehind(RingWriter):
    """Mutant: skips the notification when *some* reader has not released the last chunk."""

    def readers_behind(self) -> bool:
        row = self._rows[(self.index - 2) % self.layout.max_chunks]
        return bool(self.memory.load(row)) and not all(
            self.memory.read(row + 1, self.layout.n_reader))


def run_schedule(seed: int, *, writer_cls: type[RingWriter] = RingWriter,
                 reader_cls: type[RingReader] = RingReader, n_reader: int = 2,
                 max_chunks: int = 2, messages: int = 5, sleepers: bool = False) -> list[str]:
    """One seeded interleaving; returns the problems found (empty: all good).

    With ``sleepers`` the readers never poll: after a failed check they sleep until the writer
    notifies them (a token byte per reader after the ring), as a reader blocked on the notify
    socket does; the writer notifies unless :meth:`RingWriter.readers_behind`.
    """
    layout = RingLayout(n_reader, 8, max_chunks)
    token = layout.total_size  # token byte of reader r: token + r
    problems: list[str] = []
    # Model: the readers that have yet to release each chunk's current content.
    unread: dict[int, set[int]] = {c: set() for c in range(max_chunks)}
    chunk_of = {layout.chunk_offset(c): c for c in range(max_chunks)}
    row_of = {layout.metadata_row_offset(c): c for c in range(max_chunks)}
    memory: SteppedMemory

    def watch(actor: str, op: str, args: tuple[Any, ...]) -> None:
        for chunk in range(max_chunks):
            row = layout.metadata_row_offset(chunk)
            try:
                classify(memory.data[row:row + layout.metadata_size])
            except RingError as exc:
                problems.append(f"chunk {chunk} after {actor} {op}: {exc}")
        if op == "write" and actor == "writer":
            chunk = chunk_of.get(args[0], chunk_of.get(args[0] - 4))
            if chunk is not None and unread[chunk]:
                problems.append(f"writer overwrote chunk {chunk} unread by {unread[chunk]}")
        if op == "store" and args[0] < token:
            offset, value = args
            base = max(o for o in row_of if o <= offset)
            chunk, flag = row_of[base], offset - base
            if actor == "writer" and flag == 0 and value == 1:
                unread[chunk] = set(range(n_reader))
            if actor.startswith("reader") and value == 1:
                unread[chunk].discard(flag - 1)
                if flag - 1 != int(actor[-1]):
                    problems.append(f"{actor} stored another reader's flag")
            if actor.startswith("reader") and (flag == 0 or value != 1):
                problems.append(f"{actor} stored {value} at flag {flag} of chunk {chunk}")

    memory = SteppedMemory(layout.total_size + n_reader, watch)
    received: dict[int, list[tuple[int, int]]] = {r: [] for r in range(n_reader)}

    def writer_actor() -> None:
        writer = writer_cls(memory, layout)
        for seq in range(messages):
            while writer.try_acquire() is None:
                memory.yield_()
            offset = writer.chunk_offset()
            memory.write(offset, seq.to_bytes(4, "big"))  # two halves: torn reads show
            memory.write(offset + 4, seq.to_bytes(4, "big"))
            writer.commit()
            if sleepers and not writer.readers_behind():
                for rank in range(n_reader):
                    memory.store(token + rank, 1)

    def reader_actor(rank: int) -> Callable[[], None]:
        def run() -> None:
            reader = reader_cls(memory, layout, rank)
            for _ in range(messages):
                while reader.try_acquire() is None:
                    if sleepers:
                        while not memory.load(token + rank):
                            memory.yield_()
                        memory.store(token + rank, 0)
                    else:
                        memory.yield_()
                offset = reader.chunk_offset()
                high = int.from_bytes(memory.read(offset, 4), "big")
                low = int.from_bytes(memory.read(offset + 4, 4), "big")
                received[rank].append((high, low))
                reader.release()
        return run

    actors = {"writer": writer_actor, **{f"reader{r}": reader_actor(r) for r in range(n_reader)}}
    steps, errors = memory.run(actors, random.Random(seed), max_steps=5_000)
    problems += [f"{name} raised {exc!r}" for name, exc in errors.items()]
    if steps >= 5_000:
        problems.append("no progress in 5000 steps")
    for rank, got in received.items():
        if got != [(i, i) for i in range(len(got))] or len(got) != messages:
            problems.append(f"reader{rank} received {got}")
    return problems


@pytest.mark.parametrize("seed", range(30))
def test_every_interleaving_delivers_everything_in_order(seed: int) -> None:
    assert run_schedule(seed, n_reader=1 + seed % 3, max_chunks=1 + seed % 3) == []


def test_the_interleaving_check_catches_a_writer_that_ignores_read_flags() -> None:
    caught = any(run_schedule(seed, writer_cls=BrokenWriterIgnoresReadFlags)
                 for seed in range(40))
    assert caught, "the mutant writer survived 40 schedules"


def test_the_interleaving_check_catches_a_reader_that_releases_before_reading() -> None:
    caught = any(run_schedule(seed, reader_cls=BrokenReaderReleasesFirst)
                 for seed in range(40))
    assert caught, "the mutant reader survived 40 schedules"


@pytest.mark.parametrize("seed", range(30))
def test_readers_that_sleep_until_notified_never_miss_a_chunk(seed: int) -> None:
    """The writer's notification skip (clause ring.notify.after-write) never strands a reader
    that blocks after a failed check until the next notification."""
    assert run_schedule(seed, n_reader=1 + seed % 3, max_chunks=1 + seed % 4,
                        sleepers=True) == []


def test_the_sleeper_check_catches_a_writer_that_skips_too_often() -> None:
    caught = any(run_schedule(seed, writer_cls=BrokenWriterSkipsIfAnyReaderBehind,
                              n_reader=2, max_chunks=3, sleepers=True)
                 for seed in range(60))
    assert caught, "the mutant writer survived 60 schedules"


# --- the one-call publish ---------------------------------------------------------------------


class _AcqRelRecordingMemory(RecordingMemory):
    """A recording memory whose acquire-release fence is its own event."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.fence_acq_rel = lambda: self.log.append(("acq_rel",))


@pytest.mark.parametrize("acq_rel", [False, True])
@pytest.mark.parametrize("max_chunks", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_try_publish_makes_the_memory_events_of_the_steps(acq_rel: bool, max_chunks: int,
                                                         seed: int) -> None:
    """try_publish == try_acquire; write(head); write(body); commit; readers_behind, event for
    event, over the same random schedule of writes and reads (full rings included)."""
    layout = RingLayout(n_reader=2, max_chunk_bytes=64, max_chunks=max_chunks)
    kind = _AcqRelRecordingMemory if acq_rel else RecordingMemory
    stepwise, fused = kind(layout.total_size), kind(layout.total_size)
    ends = []
    for memory in (stepwise, fused):
        ends.append((RingWriter(memory, layout),
                     [RingReader(memory, layout, rank) for rank in range(2)]))
    rng = random.Random(seed)
    results: tuple[list[Any], list[Any]] = ([], [])
    for number in range(60):
        action = rng.randrange(3)
        head, body = bytes([number % 256]) * 3, bytes([255 - number % 256]) * rng.randrange(9)
        for side, (writer, readers) in enumerate(ends):
            if action == 2:
                if side == 0:
                    index = writer.try_acquire()
                    if index is None:
                        results[0].append(None)
                        continue
                    offset = writer.chunk_offset()
                    writer.memory.write(offset, head)
                    writer.memory.write(offset + len(head), body)
                    writer.commit()
                    results[0].append(not writer.readers_behind())
                else:
                    results[1].append(writer.try_publish(head, body))
            else:
                reader = readers[action]
                index = reader.try_acquire()
                if index is not None:
                    results[side].append(bytes(reader.memory.read(reader.chunk_offset(), 12)))
                    reader.release()
        assert stepwise.log == fused.log, number
        assert results[0] == results[1]
    assert stepwise.data == fused.data
    assert any(r is None for r in results[0]) or max_chunks > 1
    assert {True, False} <= {r for r in results[0] if isinstance(r, bool)} or max_chunks < 3


def test_try_publish_refuses_while_a_chunk_is_claimed() -> None:
    layout = RingLayout(n_reader=1, max_chunk_bytes=64, max_chunks=2)
    writer = RingWriter(BytearrayMemory(layout.total_size), layout)
    assert writer.try_acquire() == 0
    with pytest.raises(RingError):
        writer.try_publish(b"h", b"b")


def test_try_publish_calls_a_subclass_steps() -> None:
    """A writer subclass that replaces a step (a mutant) is not bypassed by the inlined path."""

    class SkipsClearingReadFlags(RingWriter):
        def commit(self) -> None:
            index = self._claimed
            assert index is not None
            self.memory.store(self._rows[index], 1)
            self.memory.fence()
            self._fenced = True
            self._claimed = None
            self.index = (index + 1) % self._max_chunks

    layout = RingLayout(n_reader=1, max_chunk_bytes=64, max_chunks=1)
    memory = RecordingMemory(layout.total_size)
    writer, reader = SkipsClearingReadFlags(memory, layout), RingReader(memory, layout, 0)
    assert writer.try_publish(b"h", b"1") is not None
    assert reader.try_acquire() == 0
    reader.release()
    assert writer.try_publish(b"h", b"2") is not None
    assert reader.try_acquire() is None  # the subclass's commit left the read flag set
    assert RingWriter(BytearrayMemory(layout.total_size), layout)._inlined
    assert not writer._inlined


# --- the per-message read --------------------------------------------------------------------


def _one_buffer_head(length: int, count: int = 1, marker: int = 0) -> bytes:
    return struct.pack(">BHI", marker, count, length)


def test_try_read_single_runs_a_subclass_steps() -> None:
    """try_read_single runs a reader subclass's steps (a mutant's)."""

    class ReleasesTwice(RingReader):
        released = 0

        def release(self) -> None:
            type(self).released += 1
            super().release()

    layout = RingLayout(n_reader=1, max_chunk_bytes=64, max_chunks=2)
    memory = BytearrayMemory(layout.total_size)
    writer, reader = RingWriter(memory, layout), ReleasesTwice(memory, layout, 0)
    assert writer.try_publish(_one_buffer_head(3), b"abc") is not None
    assert reader.try_read_single(64) == b"abc"
    assert ReleasesTwice.released == 1
    assert reader.try_read_single(64) is None
