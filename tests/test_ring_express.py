"""The express path (reference/ring/express.py) against the flag protocol's steps.

The express functions make one message's memory accesses in one call; they must leave exactly
what the steps (``RingWriter.try_publish``, ``RingReader.try_read_single`` and the codec)
leave, hand everything else to the queue's general path, and exist only where a memory offers
direct access and the protocol classes keep their own steps.
"""

from __future__ import annotations

import pickle
import random
import struct
import time
from typing import Any

import pytest
from ci_tools import require_built
from ring_helpers import RingEnv, pair, ring_env

from enginewire.reference.errors import ProtocolTimeout
from enginewire.reference.ring import MessageQueue, MsgspecCodec, PickleCodec, express
from enginewire.reference.ring.express import reader_express, writer_express
from enginewire.reference.ring.framing import (
    FIRST_DATA,
    MAX_BUFFER_BYTES,
    OVERFLOW_BASE,
    single_head,
)
from enginewire.reference.ring.layout import RingLayout
from enginewire.reference.ring.payload import SCAN_BYTES_MAX, PayloadCodec
from enginewire.reference.ring.protocol import BytearrayMemory, RingReader, RingWriter
from enginewire.reference.ring.wait import DEFAULT_POLICY

__all__ = ["ring_env"]  # fixture used by name


class _StepsOnlyMemory(BytearrayMemory):
    """The same memory without direct access: every access is a step's own call."""


class _Miss(Exception):
    """The stand-in queue's wait: the express call found no free chunk or nothing readable."""


class _Queue:
    """What the express functions use of their queue, recording what they hand over."""

    def __init__(self, writer: RingWriter | None = None, reader: RingReader | None = None,
                 ) -> None:
        self._writer = writer
        self._reader = reader
        self._held_views = None
        self._pending_overflow = 0
        self._last_notify_drain = time.monotonic()
        self.handed: list[Any] = []
        self._notify: Any = None
        self._readers_running: Any = None

    def enqueue_buffers(self, buffers: list[Any], timeout: float | None) -> None:
        self.handed.append(("general", [bytes(b) for b in buffers]))

    def _publish_after_miss(self, writer: RingWriter, head: bytes, body: bytes,
                            timeout: float | None, started: float | None = None) -> None:
        raise _Miss

    def _dequeue_rest(self, got: int | None, tried: bool, timeout: float | None,
                      started: float | None = None) -> Any:
        reader = self._reader
        assert reader is not None
        if got is None:
            raise _Miss
        chunk = bytes(reader.memory.read(reader.chunk_offset(), reader.layout.max_chunk_bytes))
        reader.release()
        return ("held", got, chunk)

    def _drain_notify(self, now: float) -> None:
        self._last_notify_drain = now


def _objects(rng: random.Random, number: int, codec: PayloadCodec) -> Any:
    """A message: plain leaves of every size around the chunk's, containers, a two-buffer
    object (out of band, for the pickle codec), or a hand-made chunk head of several
    buffers."""
    kind = rng.randrange(7)
    if kind == 0:
        return bytes([number % 251]) * rng.choice([0, 1, 5, 20, 30, 41, 60])
    if kind == 1:
        return bytearray(rng.randbytes(rng.choice([3, 25])))
    if kind == 2:
        return "é" * rng.randrange(12)
    if kind == 3:
        return {"n": number, "items": list(range(rng.randrange(4)))}
    if kind == 4:
        return rng.choice([number, None, 2.5, True])
    if kind == 5 and isinstance(codec, PickleCodec):
        return pickle.PickleBuffer(bytearray(rng.randbytes(8)))  # an out-of-band buffer
    if kind == 5:
        return [number] * rng.randrange(30)
    return ("several", rng.choice([2, 3]))


def _steps_enqueue(writer: RingWriter, codec: PayloadCodec, obj: Any, chunk_bytes: int,
                   running: bool, notified: list[int], number: int) -> Any:
    """What the express enqueue stands for, by the steps: the codec's buffers, the one-buffer
    publish where it fits, the notification where the flags and the states call for it."""
    if isinstance(obj, tuple) and obj[0] == "several":
        raise AssertionError("hand-made chunks are written by both sides alike")
    buffers = codec.encode(obj)
    body = buffers[0]
    size = len(body)
    if (len(buffers) != 1 or type(body) is not bytes
            or not (OVERFLOW_BASE + size < chunk_bytes and 0 < size <= MAX_BUFFER_BYTES)):
        return ("general", [bytes(b) for b in buffers])
    notify = writer.try_publish(single_head(size), body)
    if notify is None:
        return "miss"
    if notify and not running:
        notified.append(number)
    return None


@pytest.fixture(params=["compiled", "python"])
def flag_section(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each flag section the express path may run: the compiled one (which must have been
    built where the tests run), and the Python one it falls back to."""
    if request.param == "python":
        monkeypatch.setattr(express, "COMPILED_FLAG_SECTION", None)
    else:
        _require_compiled()
    return request.param


def _require_compiled() -> None:
    require_built(express.COMPILED_FLAG_SECTION is not None, "reference/ring/_express_flags.c",
                  why="the compiled flag section goes untested (pip install -e . with a C "
                      "compiler and Python's headers builds it)")


def test_the_compiled_flag_section_is_the_one_used_where_it_was_built(
        ring_env: RingEnv) -> None:
    """A queue over shared memory runs the compiled flag section, not the Python one."""
    _require_compiled()
    writer, reader = pair(ring_env)
    with writer, reader:
        assert writer._writer is not None and reader._reader is not None
        assert express.flag_section(writer._writer) is express.COMPILED_FLAG_SECTION
        assert express.flag_section(reader._reader) is express.COMPILED_FLAG_SECTION
        writer.enqueue(b"x" * 100, timeout=1)
        assert reader.dequeue(timeout=1) == b"x" * 100


def test_shared_memory_fences_with_the_compiled_full_fence_where_it_was_built() -> None:
    """ShmMemory's fence (the steps' and the queue's full fence) is the processor's own, one
    C call, where the extension was built; the lock pair is not a full fence on Arm."""
    _require_compiled()
    from enginewire.reference.ring import _express_flags, shm

    assert shm.memory_fence is _express_flags.full_fence
    memory = shm.ShmMemory(memoryview(bytearray(8)))
    assert memory.fence is _express_flags.full_fence
    assert memory.fence() is None


def test_a_lock_fence_off_x86_is_reported() -> None:
    """Without the compiled fence, a machine other than x86 gets a warning naming the clauses
    its lock-pair fence may break; x86, or a built fence, gets none."""
    from enginewire.reference.ring.shm import lock_fence_warning

    warning = lock_fence_warning("aarch64", compiled=False)
    assert warning is not None and "ring.writer.fence-after-written" in warning
    assert "C compiler" in warning
    assert lock_fence_warning("aarch64", compiled=True) is None
    assert lock_fence_warning("x86_64", compiled=False) is None
    assert lock_fence_warning("AMD64", compiled=False) is None


def test_the_compiled_flag_section_refuses_what_it_cannot_do_safely() -> None:
    """Offsets past the memory, a body that is not bytes, a read-only or released view: a
    typed error, nothing written."""
    _require_compiled()
    assert express.COMPILED_FLAG_SECTION is not None
    publish_single, read_single = express.COMPILED_FLAG_SECTION
    memory = bytearray(64)
    view = memoryview(memory)
    with pytest.raises(IndexError):
        publish_single(view, 0, 2, 60, b"body")  # the body would end past the memory
    with pytest.raises(IndexError):
        publish_single(view, -1, 2, 8, b"body")
    with pytest.raises(IndexError):
        read_single(view, 0, 64, 8, 16)  # the reader's flag is past the memory
    with pytest.raises(TypeError):
        publish_single(view, 0, 2, 8, bytearray(b"body"))  # type: ignore[arg-type]
    with pytest.raises(BufferError):
        publish_single(memoryview(bytes(64)), 0, 2, 8, b"body")  # read-only
    assert memory == bytearray(64)
    assert publish_single(view, 0, 2, 8, b"body") is True
    assert read_single(view, 0, 1, 8, 16) == b"body"
    assert read_single(view, 0, 1, 8, 16) is None  # released: nothing more for this reader
    assert read_single(view, 0, 2, 8, 3) is False  # longer than the limit: left acquired
    assert memory[:3] == b"\x01\x01\x00"
    view.release()
    with pytest.raises(ValueError):
        read_single(view, 0, 2, 8, 16)


@pytest.mark.parametrize("codec", [PickleCodec(oob_threshold=8), MsgspecCodec()],
                         ids=["pickle", "msgspec"])
@pytest.mark.parametrize("n_reader", [1, 2, 3])
@pytest.mark.parametrize("max_chunks", [1, 2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_the_express_path_leaves_the_bytes_the_steps_leave(codec: PayloadCodec, n_reader: int,
                                                           max_chunks: int, seed: int,
                                                           flag_section: str) -> None:
    """The express enqueue and dequeue against the steps, over the same random schedule of
    writes and reads (full and empty rings, messages that fit and that do not, several-buffer
    chunks, the readers running or not): the same results, the same messages handed to the
    general path, the same notifications, and every byte of the memory the same after every
    call; with either flag section."""
    layout = RingLayout(n_reader=n_reader, max_chunk_bytes=48, max_chunks=max_chunks)
    fast, slow = BytearrayMemory(layout.total_size), _StepsOnlyMemory(layout.total_size)
    running = [False]
    notified: tuple[list[int], list[int]] = ([], [])
    number = [0]
    writers = RingWriter(fast, layout), RingWriter(slow, layout)
    readers = ([RingReader(fast, layout, rank) for rank in range(n_reader)],
               [RingReader(slow, layout, rank) for rank in range(n_reader)])
    enqueue = writer_express(writers[0], codec, DEFAULT_POLICY)
    assert enqueue is not None
    dequeues = [reader_express(reader, codec, DEFAULT_POLICY, 2.0) for reader in readers[0]]
    writer_queue = _Queue(writer=writers[0])
    writer_queue._notify = lambda: notified[0].append(number[0])
    writer_queue._readers_running = lambda: running[0]
    reader_queues = [_Queue(reader=reader) for reader in readers[0]]
    rng = random.Random(seed)
    seen: set[str] = set()
    for number[0] in range(300):
        running[0] = rng.random() < 0.5
        action = rng.randrange(n_reader + 1)
        results: list[Any] = []
        if action == n_reader:
            obj = _objects(rng, number[0], codec)
            if isinstance(obj, tuple):  # a hand-made chunk of several buffers, by the steps
                head = struct.pack(">BHI", 0, obj[1], 3)
                results = [writer.try_publish(head, b"abc") for writer in writers]
            else:
                try:
                    enqueue(writer_queue, obj, 0)  # type: ignore[arg-type]
                    results.append(writer_queue.handed.pop() if writer_queue.handed else None)
                except _Miss:
                    results.append("miss")
                results.append(_steps_enqueue(writers[1], codec, obj, layout.max_chunk_bytes,
                                              running[0], notified[1], number[0]))
        else:
            dequeue = dequeues[action]
            assert dequeue is not None
            try:
                results.append(dequeue(reader_queues[action], 0))  # type: ignore[arg-type]
            except _Miss:
                results.append("miss")
            reader = readers[1][action]
            got = reader.try_read_single(SCAN_BYTES_MAX)
            if got is None:
                results.append("miss")
            elif isinstance(got, int) and not isinstance(got, bool):
                chunk = bytes(reader.memory.read(reader.chunk_offset(), 48))
                reader.release()
                results.append(("held", got, chunk))
            else:
                results.append(codec.decode(got, ()))
        assert results[0] == results[1], number[0]
        assert fast.data == slow.data, number[0]
        assert notified[0] == notified[1], number[0]
        first = results[0]
        seen.add(first[0] if isinstance(first, tuple) and first and isinstance(first[0], str)
                 else "miss" if first == "miss" else "message")
    assert {"miss", "message", "general"} <= seen
    assert "held" in seen


def test_express_exists_only_over_direct_memory_and_the_own_steps() -> None:
    """No express path over a memory without direct access (an instrumented one), for a
    protocol class that replaces a step (a mutant), or for a chunk too small for a head."""

    class ChecksTwice(RingReader):
        def try_acquire(self) -> int | None:
            return super().try_acquire()

    class CommitsItsOwnWay(RingWriter):
        def commit(self) -> None:
            super().commit()

    layout = RingLayout(n_reader=1, max_chunk_bytes=64, max_chunks=2)
    codec = PickleCodec()
    plain, steps = BytearrayMemory(layout.total_size), _StepsOnlyMemory(layout.total_size)

    def writer_of(memory: BytearrayMemory, cls: type[RingWriter] = RingWriter) -> Any:
        return writer_express(cls(memory, layout), codec, DEFAULT_POLICY)

    assert writer_of(plain) is not None
    assert writer_of(steps) is None
    assert writer_of(plain, CommitsItsOwnWay) is None
    assert reader_express(RingReader(plain, layout, 0), codec, DEFAULT_POLICY, 2.0) is not None
    assert reader_express(RingReader(steps, layout, 0), codec, DEFAULT_POLICY, 2.0) is None
    assert reader_express(ChecksTwice(plain, layout, 0), codec, DEFAULT_POLICY, 2.0) is None
    tiny = RingLayout(n_reader=1, max_chunk_bytes=FIRST_DATA - 1, max_chunks=2)
    memory = BytearrayMemory(tiny.total_size)
    assert reader_express(RingReader(memory, tiny, 0), codec, DEFAULT_POLICY, 2.0) is None


def test_a_queue_uses_the_express_path_only_where_its_class_keeps_the_general_one(
        ring_env: RingEnv) -> None:
    """A plain queue's ends have an express path, and lose it when closed; a queue class that
    replaces enqueue_buffers or the general read (a mutant) has none, so its own code runs for
    every message."""

    class OwnRead(MessageQueue):
        def _dequeue_rest(self, got: Any, tried: bool, timeout: float | None,
                          started: float | None = None) -> Any:
            return super()._dequeue_rest(got, tried, timeout, started)

    class OwnWrite(MessageQueue):
        def enqueue_buffers(self, buffers: Any, timeout: float | None = 1.0) -> None:
            super().enqueue_buffers(buffers, timeout)

    for cls, writes, reads in ((MessageQueue, True, True), (OwnRead, True, False),
                               (OwnWrite, False, True)):
        writer, reader = pair(ring_env, cls)
        with writer, reader:
            assert (writer._express_enqueue is not None) == writes, cls
            assert (reader._express_dequeue is not None) == reads, cls
            writer.enqueue({"through": cls.__name__}, timeout=1)
            assert reader.dequeue(timeout=1) == {"through": cls.__name__}
        assert writer._express_enqueue is None and reader._express_dequeue is None


def test_the_turns_count_against_the_timeout(ring_env: RingEnv) -> None:
    """The queue's wait after the express path's turns counts from when the turns began: an
    enqueue on a full ring and a dequeue on an empty one each time out once the caller's
    timeout has passed since the call, and the error gives the caller's timeout."""
    writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=1)
    with writer, reader:
        assert writer._express_enqueue is not None and reader._express_dequeue is not None
        writer.enqueue(b"fills the ring", timeout=1)
        for call in (lambda: writer.enqueue(b"no room", timeout=0.2),
                     lambda: (reader.dequeue(timeout=1), reader.dequeue(timeout=0.2))):
            began = time.monotonic()
            with pytest.raises(ProtocolTimeout) as caught:
                call()
            assert time.monotonic() - began >= 0.2
            assert caught.value.expected == "within 0.200 s", caught.value
