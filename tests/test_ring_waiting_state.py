"""The readers' state bytes and the notifications they spare (clause ring.notify.waiting-state).

A reference reader keeps a state byte in the liveness record: running while it checks the
flags without blocking, blocking from just before it blocks on the notify socket until its wait
ends. The writer skips a notification only while every state byte reads running; a reader that
keeps no byte (vLLM's) leaves it 0, and then every write is notified as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from ring_helpers import RingEnv, ring_env  # noqa: F401 - the fixture

from enginewire.reference.ring import MessageQueue
from enginewire.reference.ring.liveness import ABSENT, BLOCKING, RUNNING, LivenessRecord

TIMEOUT = 10.0
#: The writer, its two readers and the count of notifications it sent.
Queues = tuple[MessageQueue, list[MessageQueue], list[int]]


@pytest.fixture
def queues(ring_env: RingEnv) -> Iterator[Queues]:  # noqa: F811
    """A writer with two local readers in this process, ready; its notifications counted."""
    writer = MessageQueue(2, 2, max_chunk_bytes=1024, max_chunks=4, ipc_dir=ring_env.ipc_dir)
    readers = [MessageQueue.create_from_handle(writer.export_handle(), rank) for rank in range(2)]
    try:
        threads = [threading.Thread(target=r.wait_until_ready, args=(TIMEOUT,)) for r in readers]
        for thread in threads:
            thread.start()
        writer.wait_until_ready(TIMEOUT)
        for thread in threads:
            thread.join(TIMEOUT)
        sent = [0]
        notify = writer._notify
        assert notify is not None

        def counted() -> None:
            sent[0] += 1
            notify()

        writer._notify = counted
        yield writer, readers, sent
    finally:
        for end in [*readers, writer]:
            end.close()


def _states(writer: MessageQueue) -> bytes:
    record = writer._resources.liveness
    assert record is not None
    start, end = record.states
    return bytes(writer._resources.segment.memory.buf[start:end])  # type: ignore[union-attr]


def _reader_record(reader: MessageQueue) -> LivenessRecord:
    record = reader._resources.liveness
    assert record is not None
    return record


def test_attached_readers_run_and_a_closed_one_is_absent(queues: Queues) -> None:
    writer, readers, _ = queues
    assert _states(writer) == bytes([RUNNING, RUNNING])
    readers[1].close()
    assert _states(writer) == bytes([RUNNING, ABSENT])


def test_no_notification_while_every_reader_runs(queues: Queues) -> None:
    writer, readers, sent = queues
    for number in range(12):
        writer.enqueue(number, timeout=TIMEOUT)
        assert [r.dequeue(timeout=TIMEOUT) for r in readers] == [number, number]
    assert sent[0] == 0


@pytest.mark.parametrize("state", [BLOCKING, ABSENT])
def test_a_blocking_or_stateless_reader_gets_every_notification(queues: Queues, state: int) -> None:
    """A reader that may block, or one that keeps no state (vLLM's), is notified of every
    write whose readers are not all behind."""
    writer, readers, sent = queues
    _reader_record(readers[0]).set_state(state)
    for number in range(6):
        writer.enqueue(number, timeout=TIMEOUT)
        assert [r.dequeue(timeout=TIMEOUT) for r in readers] == [number, number]
    assert sent[0] == 6


def test_a_reader_announces_its_block_and_is_woken_by_the_notification(queues: Queues) -> None:
    """A reader with nothing to read stores BLOCKING before it blocks; the write that follows
    is notified, and the reader's state is RUNNING again once it has the message."""
    writer, readers, sent = queues
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(readers[0].dequeue(timeout=TIMEOUT)))
    thread.start()
    try:
        for _ in range(1000):
            if _states(writer)[0] == BLOCKING:
                break
            threading.Event().wait(0.005)
        assert _states(writer) == bytes([BLOCKING, RUNNING])
        writer.enqueue("wake", timeout=TIMEOUT)
    finally:
        thread.join(TIMEOUT)
    assert got == ["wake"]
    assert sent[0] == 1
    assert _states(writer) == bytes([RUNNING, RUNNING])
    assert readers[1].dequeue(timeout=TIMEOUT) == "wake"


def test_a_wait_that_times_out_leaves_the_reader_running(queues: Queues) -> None:
    writer, readers, _ = queues
    with pytest.raises(TimeoutError):
        readers[0].dequeue(timeout=0.05)
    assert _states(writer)[0] == RUNNING


def test_announcing_a_block_does_not_lengthen_the_first_block() -> None:
    """A block that returned without blocking (False: the reader announced it) leaves the
    interval as it was; a real block doubles it."""
    from enginewire.reference.ring.wait import Backoff, WaitPolicy

    asked: list[float] = []

    def block(seconds: float) -> bool:
        asked.append(seconds)
        return len(asked) > 1  # the first call announces

    policy = WaitPolicy(spin_checks=0, yield_for_s=0.0, poll_min_s=0.001)
    backoff = Backoff(policy, 10.0, clause="ring.reader.timeout", what="x", block=block)
    for _ in range(3):
        backoff.pause()
    assert asked == [0.001, 0.001, 0.002]
