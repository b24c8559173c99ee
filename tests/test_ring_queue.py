"""The reference MessageQueue over real shared memory: processes, overflow, timeouts, cleanup."""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
from ring_helpers import (
    SHM_DIR,
    STEP_TIMEOUT,
    Readers,
    RingEnv,
    check_stream,
    message,
    pair,
    readers,
    reference_reader,
    ring_env,
    tensor_round_trip,
)

from enginewire.reference.errors import ProtocolTimeout, RingError
from enginewire.reference.ring import (
    ChunkState,
    Handle,
    MessageQueue,
    MsgspecCodec,
    PickleCodec,
    QueueClosed,
    WaitPolicy,
)
from enginewire.reference.ring.framing import encode_chunk, framed_size, needs_overflow
from enginewire.reference.ring.protocol import chunk_state

__all__ = ["readers", "ring_env"]  # fixtures used by name

CHUNK = 4096


# --- across processes ---------------------------------------------------------------------


@pytest.mark.parametrize(("n_local", "count", "max_chunks"), [(1, 1500, 3), (2, 3000, 4)])
def test_readers_in_other_processes_get_every_message_in_order(
        ring_env: RingEnv, readers: Readers, n_local: int, count: int, max_chunks: int) -> None:
    """FIFO, nothing lost or duplicated, hundreds of laps, overflow messages mixed in."""
    with MessageQueue(n_local, n_local, max_chunk_bytes=CHUNK, max_chunks=max_chunks,
                      ipc_dir=ring_env.ipc_dir) as writer:
        for rank in range(n_local):
            readers.start(reference_reader, writer.export_handle(), rank, count, CHUNK)
        writer.wait_until_ready(STEP_TIMEOUT)
        overflowed = 0
        for index in range(count):
            obj = message(index, CHUNK)
            overflowed += needs_overflow(PickleCodec().encode(obj), CHUNK)
            writer.enqueue(obj, timeout=STEP_TIMEOUT)
        reports = readers.reports()
    assert overflowed > count // 10
    assert reports == [{"received": count, "error": None}] * n_local


def test_remote_reader_over_tcp_gets_the_same_stream(ring_env: RingEnv, readers: Readers) -> None:
    count = 600
    with MessageQueue(2, 1, local_reader_ranks=[5], max_chunk_bytes=CHUNK, max_chunks=3,
                      connect_ip="127.0.0.1", ipc_dir=ring_env.ipc_dir) as writer:
        handle = writer.export_handle()
        assert handle.remote_subscribe_addr.startswith("tcp://127.0.0.1:")
        readers.start(reference_reader, handle, 5, count, CHUNK)  # local: rank 5
        readers.start(reference_reader, handle, 1, count, CHUNK)  # remote: any other rank
        writer.wait_until_ready(STEP_TIMEOUT)
        for index in range(count):
            writer.enqueue(message(index, CHUNK), timeout=STEP_TIMEOUT)
        assert readers.reports() == [{"received": count, "error": None}] * 2


def test_msgspec_codec_between_reference_peers(ring_env: RingEnv, readers: Readers) -> None:
    count = 500
    with MessageQueue(1, 1, max_chunk_bytes=CHUNK, max_chunks=2, codec="msgspec",
                      ipc_dir=ring_env.ipc_dir) as writer:
        readers.start(reference_reader, writer.export_handle(), 0, count, CHUNK, "msgspec")
        writer.wait_until_ready(STEP_TIMEOUT)
        for index in range(count):
            writer.enqueue(message(index, CHUNK), timeout=STEP_TIMEOUT)
        assert readers.reports() == [{"received": count, "error": None}]


def test_tensors_round_trip_without_importing_vllm(readers: Readers) -> None:
    """Clause ring.payload.tensor-reducer, in a fresh process that never imports vLLM."""
    pytest.importorskip("torch")
    conn = readers.start(tensor_round_trip)
    assert conn.poll(60)
    assert conn.recv() == {"equal": True, "vllm_imported": False}


ATTACH_AND_EXIT = """
import sys
from multiprocessing import shared_memory
from enginewire.reference.ring import RingLayout, ShmSegment
name, mode = sys.argv[1], sys.argv[2]
if mode == "plain":  # what the clause forbids: the tracker of this process adopts the segment
    shared_memory.SharedMemory(name=name).close()
else:
    ShmSegment.attach(name, RingLayout(1, 64, 10)).close()
"""


def test_attaching_process_does_not_unlink_the_segment_at_exit(ring_env: RingEnv) -> None:
    """Clause ring.lifecycle.attach-untracked, with a fresh interpreter (its own resource
    tracker); a plain attach in the same place does lose the segment, so the check bites."""
    with MessageQueue(1, 1, max_chunk_bytes=64, ipc_dir=ring_env.ipc_dir) as writer, \
            MessageQueue(1, 1, max_chunk_bytes=64, ipc_dir=ring_env.ipc_dir) as victim:
        for queue, mode in ((writer, "reference"), (victim, "plain")):
            name = queue.export_handle().buffer_handle[3]
            subprocess.run([sys.executable, "-c", ATTACH_AND_EXIT, name, mode], check=True,
                           timeout=60, capture_output=True)
        assert (SHM_DIR / writer.export_handle().buffer_handle[3]).exists()
        assert not (SHM_DIR / victim.export_handle().buffer_handle[3]).exists()
        writer.enqueue("still here", timeout=1)


# --- in one process: overflow, framing, release on error ---------------------------------


def test_exact_chunk_size_stays_in_the_ring_and_one_more_byte_overflows(
        ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64, max_chunks=4)
    with writer, reader:
        memory = writer.memory  # type: ignore[union-attr]
        for extra, overflow in [(-1, False), (0, False), (1, True)]:
            main = b"m" * (64 - framed_size([b""]) + extra)
            index = writer.ring_writer.index  # type: ignore[union-attr]
            writer.enqueue_buffers([main], timeout=1)
            assert memory.load(writer.layout.chunk_offset(index)) == int(overflow)
            assert reader.dequeue_buffers(timeout=1) == [main]


def test_out_of_band_buffers_in_the_ring_and_over_the_socket(ring_env: RingEnv) -> None:
    numpy = pytest.importorskip("numpy")
    codec = PickleCodec(oob_threshold=256)
    writer, reader = pair(ring_env, max_chunk_bytes=2048, max_chunks=2, codec=codec)
    reader.codec = codec
    with writer, reader:
        small = numpy.arange(100, dtype=numpy.int32)  # 400 bytes: out of band, in the ring
        large = numpy.arange(1000, dtype=numpy.int64)  # 8000 bytes: overflows
        for obj in [{"a": small}, {"b": large}, {"a": small, "n": 3}]:
            buffers = codec.encode(obj)
            assert len(buffers) == 2
            writer.enqueue(obj, timeout=1)
            got = reader.dequeue(timeout=1)
            assert got.keys() == obj.keys()
            for key, value in obj.items():
                assert (got[key] == value).all() if hasattr(value, "all") else got[key] == value
        writer.enqueue({"a": small}, timeout=1)
        got = reader.dequeue(timeout=1)
        writer.enqueue({"a": small * 0}, timeout=1)  # the slot is reused...
        reader.dequeue(timeout=1)
        assert (got["a"] == small).all()  # ...but the first array owns a copy
        got["a"][0] = 7  # and is writable


def test_reader_releases_the_slot_when_its_caller_raises(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=1)
    with writer, reader:
        layout = writer.layout
        writer.enqueue("first", timeout=1)
        with pytest.raises(ZeroDivisionError), reader.acquire_read(timeout=1):
            1 / 0  # noqa: B018
        assert chunk_state(writer.memory, layout, 0) is ChunkState.READ_BY_ALL
        writer.enqueue("second", timeout=1)  # would time out with the slot still held
        assert reader.dequeue(timeout=1) == "second"


def test_undecodable_payload_raises_and_the_stream_goes_on(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=1)
    with writer, reader:
        writer.enqueue_buffers([b"not a pickle"], timeout=1)
        with pytest.raises(pickle.UnpicklingError):
            reader.dequeue(timeout=1)
        writer.enqueue("next", timeout=1)
        assert reader.dequeue(timeout=1) == "next"


@pytest.mark.parametrize(
    ("chunk", "clause"),
    [
        (b"\x00\x00\x05" + b"\x00\x00\x00\x01x", "ring.framing.within-chunk"),
        (b"\x00\x00\x00", "ring.framing.buffer-count"),
        (b"\x07", "ring.framing.overflow-byte"),
    ],
)
def test_malformed_chunk_raises_ring_error_and_releases(ring_env: RingEnv, chunk: bytes,
                                                        clause: str) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64, max_chunks=1)
    with writer, reader:
        memory = writer.memory  # type: ignore[union-attr]
        for _ in range(2):  # the second round needs the slot released by the first
            with writer.acquire_write(timeout=1) as offset:
                memory.write(offset, chunk.ljust(64, b"\xee"))
            with pytest.raises(RingError) as info:
                reader.dequeue(timeout=1)
            assert info.value.clause == clause


def test_writer_abandons_a_chunk_whose_filling_failed(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64, max_chunks=2)
    with writer, reader:
        with pytest.raises(RuntimeError), writer.acquire_write(timeout=1):
            raise RuntimeError("caller failed")
        with pytest.raises(TimeoutError):
            reader.dequeue(timeout=0.05)
        writer.enqueue(1, timeout=1)
        assert reader.dequeue(timeout=1) == 1


def test_in_ring_bytes_are_the_documented_framing(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=128, max_chunks=1)
    with writer, reader:
        writer.enqueue_buffers([b"abc", b"de"], timeout=1)
        chunk = writer.memory.read(0, 128)  # type: ignore[union-attr]
        assert bytes(chunk[:framed_size([b"abc", b"de"])]) == encode_chunk([b"abc", b"de"])
        chunk.release()
        assert reader.dequeue_buffers(timeout=1) == [b"abc", bytearray(b"de")]


# --- timeouts -----------------------------------------------------------------------------


def test_writer_times_out_when_no_chunk_frees_up(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64, max_chunks=2)
    with writer, reader:
        writer.enqueue(1, timeout=1)
        writer.enqueue(2, timeout=1)
        started = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            writer.enqueue(3, timeout=0.2)
        assert 0.2 <= time.monotonic() - started < 2
        assert isinstance(info.value, ProtocolTimeout)
        assert info.value.clause == "ring.writer.timeout"
        assert [reader.dequeue(timeout=1), reader.dequeue(timeout=1)] == [1, 2]
        writer.enqueue(3, timeout=1)  # nothing was half-written by the failed attempt
        assert reader.dequeue(timeout=1) == 3


def test_reader_times_out_on_an_empty_ring(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64)
    with writer, reader:
        started = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            reader.dequeue(timeout=0.2)
        assert 0.2 <= time.monotonic() - started < 2
        assert info.value.clause == "ring.reader.timeout"  # type: ignore[attr-defined]
        with pytest.raises(TimeoutError):
            reader.dequeue(timeout=0)


def test_late_overflow_message_times_out_then_comes_first(ring_env: RingEnv) -> None:
    """An overflow receive that times out keeps its place: the late message comes next."""
    writer, reader = pair(ring_env, max_chunk_bytes=64, max_chunks=4)
    with writer, reader:
        with writer.acquire_write(timeout=1) as offset:
            writer.memory.store(offset, 1)  # type: ignore[union-attr]
        with pytest.raises(TimeoutError):
            reader.dequeue(timeout=0.1)  # the chunk says overflow, the socket has nothing yet
        writer.enqueue("in the ring", timeout=1)
        writer._local_socket.send_multipart(PickleCodec().encode("late"))  # type: ignore[union-attr]
        assert reader.dequeue(timeout=1) == "late"
        assert reader.dequeue(timeout=1) == "in the ring"


def test_wait_until_ready_times_out_without_readers(ring_env: RingEnv) -> None:
    with MessageQueue(1, 1, ipc_dir=ring_env.ipc_dir) as writer:
        with pytest.raises(TimeoutError) as info:
            writer.wait_until_ready(timeout=0.2)
        assert info.value.clause == "ring.ready.subscriptions"  # type: ignore[attr-defined]


def test_reader_blocked_on_the_notify_socket_wakes_on_a_write(ring_env: RingEnv) -> None:
    policy = WaitPolicy(yield_for_s=0.0, poll_min_s=30.0, recheck_s=30.0)
    writer = MessageQueue(1, 1, ipc_dir=ring_env.ipc_dir, max_chunk_bytes=64)
    reader = MessageQueue.create_from_handle(writer.export_handle(), 0, wait=policy)
    with writer, reader:
        ready = threading.Thread(target=reader.wait_until_ready, args=(STEP_TIMEOUT,))
        ready.start()
        writer.wait_until_ready(STEP_TIMEOUT)
        ready.join()
        got: list[object] = []
        thread = threading.Thread(target=lambda: got.append(reader.dequeue(timeout=20)))
        thread.start()
        time.sleep(0.3)  # the reader is blocked on its notify socket by now
        started = time.monotonic()
        writer.enqueue("wake up", timeout=1)
        thread.join(STEP_TIMEOUT)
        assert got == ["wake up"]
        assert time.monotonic() - started < 5  # woken, not rescued by the 30 s poll timeout


def test_shutdown_wakes_a_waiting_reader(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64)
    with writer, reader:
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                reader.dequeue(timeout=20)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.1)
        reader.shutdown()
        thread.join(5)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], QueueClosed)


# --- handles and cleanup ------------------------------------------------------------------


def test_handle_has_vllms_fields_in_order() -> None:
    from dataclasses import fields

    assert [f.name for f in fields(Handle)] == [
        "local_reader_ranks", "buffer_handle", "local_subscribe_addr", "local_notify_addr",
        "remote_subscribe_addr", "remote_addr_ipv6", "tensor_arena_handle"]


def test_reader_refuses_a_handle_with_a_tensor_arena(ring_env: RingEnv) -> None:
    with MessageQueue(1, 1, ipc_dir=ring_env.ipc_dir) as writer:
        handle = Handle(**{**writer.export_handle().__dict__,
                           "tensor_arena_handle": (1, 2, 3, "psm_arena")})
        with pytest.raises(RingError) as info:
            MessageQueue.create_from_handle(handle, 0)
        assert info.value.clause == "ring.payload.tensor-arena"


def test_close_removes_segment_and_ipc_files(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64)
    name = writer.export_handle().buffer_handle[3]
    assert (SHM_DIR / name).exists()
    assert len(list(Path(ring_env.ipc_dir).iterdir())) == 2
    writer.close()
    assert not (SHM_DIR / name).exists()  # unlinked although the reader still maps it
    assert list(Path(ring_env.ipc_dir).iterdir()) == []
    reader.close()
    writer.close()  # idempotent
    assert writer.closed and reader.closed


def test_dropped_writer_cleans_up_at_garbage_collection(ring_env: RingEnv) -> None:
    writer = MessageQueue(1, 1, ipc_dir=ring_env.ipc_dir, max_chunk_bytes=64)
    name = writer.export_handle().buffer_handle[3]
    del writer
    gc.collect()
    assert not (SHM_DIR / name).exists()


def test_failed_construction_leaves_nothing(ring_env: RingEnv) -> None:
    with pytest.raises(zmq.ZMQError):
        MessageQueue(2, 1, connect_ip="no such interface", ipc_dir=ring_env.ipc_dir)
    assert ring_env.segments  # the segment existed before the failure...
    # ...and the fixture checks that it and the ipc files are gone


def test_ipv6_writer_marks_the_handle(ring_env: RingEnv) -> None:
    try:
        writer = MessageQueue(1, 0, connect_ip="::1", ipc_dir=ring_env.ipc_dir)
    except zmq.ZMQError:
        pytest.skip("no IPv6 loopback here")
    with writer:
        handle = writer.export_handle()
        assert handle.remote_addr_ipv6 and handle.remote_subscribe_addr.startswith("tcp://[::1]:")
        assert handle.buffer_handle is None and handle.local_subscribe_addr is None


def test_reader_of_a_vanished_segment_raises_ring_error(ring_env: RingEnv) -> None:
    with MessageQueue(1, 1, ipc_dir=ring_env.ipc_dir, max_chunk_bytes=64) as writer:
        handle = writer.export_handle()
    with pytest.raises(RingError) as info:
        MessageQueue.create_from_handle(handle, 0)
    assert info.value.clause == "ring.lifecycle.creator-unlinks"


def test_check_stream_reports_a_wrong_message() -> None:
    """The stream checker the process tests rely on does notice a bad message."""
    stream = iter([message(0, CHUNK), message(2, CHUNK)])
    report = check_stream(lambda: next(stream), 2, CHUNK)
    assert report["received"] == 1 and "message 1" in report["error"]


def test_msgspec_codec_rejects_out_of_band_buffers_and_garbage() -> None:
    codec = MsgspecCodec()
    with pytest.raises(Exception, match="one buffer"):
        codec.decode(codec.encode([1])[0], [b"x"])
    with pytest.raises(Exception, match="msgpack"):
        codec.decode(b"\xc1", [])


def test_zmq_sockets_are_the_specified_kinds(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=64)
    with writer, reader:
        assert writer._local_socket.type == zmq.XPUB  # type: ignore[union-attr]
        assert writer._notify_socket.type == zmq.PUB  # type: ignore[union-attr]
        assert writer._notify_socket.getsockopt(zmq.SNDHWM) == 1  # type: ignore[union-attr]
        assert reader._notify_socket.type == zmq.SUB  # type: ignore[union-attr]
        assert reader._local_socket.type == zmq.SUB  # type: ignore[union-attr]


def test_borrowed_read_views_the_slot_and_holds_it(ring_env: RingEnv) -> None:
    numpy = pytest.importorskip("numpy")
    codec = PickleCodec(oob_threshold=256)
    writer, reader = pair(ring_env, max_chunk_bytes=2048, max_chunks=1, codec=codec)
    reader.codec = codec
    with writer, reader:
        array = numpy.arange(100, dtype=numpy.int64)  # 800 bytes: out of band, in the ring
        writer.enqueue({"a": array}, timeout=1)
        with reader.dequeue_borrowed(timeout=1) as got:
            assert (got["a"] == array).all()
            assert not got["a"].flags.writeable  # a view of the slot, not a copy
            with pytest.raises(TimeoutError):
                writer.enqueue("blocked", timeout=0.05)  # the slot is still held
        writer.enqueue({"a": array * 2}, timeout=1)  # released at the end of the block
        with reader.dequeue_borrowed(timeout=1) as got:
            assert (got["a"] == array * 2).all()
        writer.enqueue({"a": numpy.arange(1000)}, timeout=1)  # overflows: socket frames
        with reader.dequeue_borrowed(timeout=1) as got:
            assert (got["a"] == numpy.arange(1000)).all()
        writer.enqueue("last", timeout=1)
        assert reader.dequeue(timeout=1) == "last"


def test_raw_buffers_come_back_as_views_valid_until_the_next_read(ring_env: RingEnv) -> None:
    writer, reader = pair(ring_env, max_chunk_bytes=2048, max_chunks=1)
    with writer, reader:
        writer.enqueue_buffers([b"main", bytearray(b"out of band")], timeout=1)
        views = reader.dequeue_views(timeout=1)
        assert [bytes(v) for v in views] == [b"main", b"out of band"]
        assert all(v.readonly for v in views)  # views of the slot, not copies
        with pytest.raises(TimeoutError):
            writer.enqueue_buffers([b"blocked"], timeout=0.05)  # the slot is still held
        # The next read, of whatever kind, releases the slot (and the views) first.
        writer_done = threading.Thread(target=writer.enqueue_buffers,
                                       args=([b"second"],), kwargs={"timeout": STEP_TIMEOUT})
        writer_done.start()
        assert reader.dequeue_buffers(timeout=STEP_TIMEOUT) == [b"second"]
        writer_done.join(STEP_TIMEOUT)
        with pytest.raises(ValueError):
            bytes(views[0])  # released: the slot may hold another message now
        writer.enqueue_buffers([b"x" * 3000], timeout=1)  # overflows: views of socket frames
        assert [bytes(v) for v in reader.dequeue_views(timeout=1)] == [b"x" * 3000]
        writer.enqueue_buffers([b"last"], timeout=1)
        held = reader.dequeue_views(timeout=1)
        assert bytes(held[0]) == b"last"
    with pytest.raises(ValueError):
        bytes(held[0])  # close released the held views


def test_a_writer_that_waits_for_a_full_ring_delivers_every_message_once(
        ring_env: RingEnv) -> None:
    """One-buffer messages of every buffer type go through try_publish; on a full ring the
    writer waits by calling it again (nothing half-written, nothing sent twice)."""
    import numpy as np

    writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=2)
    sent: list[bytes] = [bytes([n]) * (1 + n % 100) for n in range(40)]
    got: list[bytes] = []

    def read_slowly() -> None:
        for _ in sent:
            time.sleep(0.002)
            got.append(b"".join(bytes(v) for v in reader.dequeue_views(timeout=STEP_TIMEOUT)))

    with writer, reader:
        thread = threading.Thread(target=read_slowly)
        thread.start()
        for number, message in enumerate(sent):
            kind = number % 3  # bytes, bytearray, a numpy array: each one buffer
            buffer = (message if kind == 0 else bytearray(message) if kind == 1
                      else np.frombuffer(message, dtype=np.uint8))
            writer.enqueue_buffers([buffer], timeout=STEP_TIMEOUT)
        thread.join(STEP_TIMEOUT)
        assert not thread.is_alive()
    assert got == sent


def test_enqueue_writes_the_bytes_enqueue_buffers_writes(ring_env: RingEnv) -> None:
    """enqueue publishes a one-buffer pickle stream itself (not through enqueue_buffers): the
    chunk it leaves is byte for byte the one enqueue_buffers leaves for the codec's buffers,
    the frame of the spec; too large messages and a closed end take the general path as
    before."""
    writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=1)
    objects = [b"", b"x" * 200, bytearray(b"abc"), "text", 7, None, {"a": [1, 2]}, (3.5,)]
    with writer, reader:
        for obj in objects:
            buffers = writer.codec.encode(obj)
            for by_enqueue in (True, False):
                if by_enqueue:
                    writer.enqueue(obj, timeout=1)
                else:
                    writer.enqueue_buffers(buffers, timeout=1)
                size = framed_size(buffers)
                chunk = writer.memory.read(0, size)  # type: ignore[union-attr]
                assert bytes(chunk) == encode_chunk(buffers), obj
                chunk.release()
                assert reader.dequeue(timeout=1) == obj
        writer.enqueue(b"y" * 1000, timeout=1)  # overflows: the general path
        assert reader.dequeue(timeout=1) == b"y" * 1000
        # A full ring: enqueue waits by the same call until the reader frees the chunk.
        writer.enqueue(b"first", timeout=1)
        later = threading.Timer(0.05, lambda: got.append(reader.dequeue(timeout=1)))
        got: list[object] = []
        later.start()
        writer.enqueue(b"second", timeout=STEP_TIMEOUT)
        later.join(STEP_TIMEOUT)
        assert got == [b"first"]
        assert reader.dequeue(timeout=1) == b"second"
        with pytest.raises(ProtocolTimeout):
            writer.enqueue(b"third", timeout=1)
            writer.enqueue(b"fourth", timeout=0.05)
    with pytest.raises(QueueClosed):
        writer.enqueue(b"closed", timeout=0.1)
    with pytest.raises(QueueClosed):
        reader.dequeue(timeout=0.1)


def test_a_message_of_several_buffers_is_published_in_one_call(ring_env: RingEnv) -> None:
    """A small main buffer in front of out-of-band buffers goes through try_publish as one
    head and one body (framing.split_head), also when the ring is full and the writer waits;
    the chunk is encode_chunk's, byte for byte. A message whose leading buffers exceed
    LEADING_BYTES_MAX, an overflowing one and a one-buffer one of no bytes take the steps and
    leave the same bytes."""
    import numpy as np

    from enginewire.reference.ring import RingWriter
    from enginewire.reference.ring.framing import LEADING_BYTES_MAX

    published: list[int] = []

    class CountingWriter(RingWriter):
        def try_publish(self, head: object, body: object) -> bool | None:
            published.append(len(head))  # type: ignore[arg-type]
            return super().try_publish(head, body)  # type: ignore[arg-type]

    chunk_bytes = 2 * LEADING_BYTES_MAX
    writer, reader = pair(ring_env, max_chunk_bytes=chunk_bytes, max_chunks=1)
    messages: list[list[Any]] = [
        [b"main", b"oob"],
        [b"", bytearray(b"a" * 100), np.arange(50, dtype=">i4")],
        [b"m" * 10, b"", b"last"],
        [b"x" * (LEADING_BYTES_MAX + 1), b"oob"],  # leading buffers too large: the steps
        [b""],  # one buffer of no bytes: the steps
    ]
    by_one_call = [True, True, True, False, False]
    with writer, reader:
        old = writer.ring_writer
        assert old is not None
        writer._writer = CountingWriter(old.memory, old.layout)
        for buffers, one_call in zip(messages, by_one_call, strict=True):
            published.clear()
            writer.enqueue_buffers(buffers, timeout=1)
            chunk = writer.memory.read(0, framed_size(buffers))  # type: ignore[union-attr]
            assert bytes(chunk) == encode_chunk(buffers)
            chunk.release()
            assert bool(published) == one_call, buffers
            got = reader.dequeue_buffers(timeout=1)
            assert got == [memoryview(b).cast("B").tobytes() for b in buffers]
        # A full ring: the writer waits by calling try_publish again, the message lands once.
        writer.enqueue_buffers([b"first", b"1"], timeout=1)
        later = threading.Timer(0.05, lambda: got_later.append(reader.dequeue_buffers(timeout=1)))
        got_later: list[object] = []
        later.start()
        published.clear()
        writer.enqueue_buffers([b"second", b"2"], timeout=STEP_TIMEOUT)
        later.join(STEP_TIMEOUT)
        assert len(published) >= 2  # the miss, then the call that published
        assert got_later == [[b"first", bytearray(b"1")]]
        assert reader.dequeue_buffers(timeout=1) == [b"second", bytearray(b"2")]
        overflowing = [b"m", b"z" * chunk_bytes]
        published.clear()
        writer.enqueue_buffers(overflowing, timeout=1)
        assert published == []
        assert reader.dequeue_buffers(timeout=1) == overflowing


def test_the_per_message_paths_use_the_ends_current_protocol_objects(ring_env: RingEnv) -> None:
    """enqueue's and dequeue's one-call paths look the flag-protocol objects up per message:
    objects swapped in after construction (the mutant harness does so) are the ones called."""
    from enginewire.reference.ring import RingReader, RingWriter

    calls: list[str] = []

    class CountingWriter(RingWriter):
        def try_publish(self, head: object, body: object) -> bool | None:
            calls.append("publish")
            return super().try_publish(head, body)  # type: ignore[arg-type]

    class CountingReader(RingReader):
        def try_read_single(self, limit: int) -> bytes | int | None:
            calls.append("read")
            return super().try_read_single(limit)

    writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=2)
    with writer, reader:
        old_writer, old_reader = writer.ring_writer, reader.ring_reader
        assert old_writer is not None and old_reader is not None
        writer._writer = CountingWriter(old_writer.memory, old_writer.layout)
        reader._reader = CountingReader(old_reader.memory, old_reader.layout, old_reader.rank)
        writer.enqueue(b"swapped", timeout=1)
        assert reader.dequeue(timeout=1) == b"swapped"
    assert calls == ["publish", "read"]


def test_enqueue_calls_a_subclass_enqueue_buffers(ring_env: RingEnv) -> None:
    """A queue class that replaces enqueue_buffers (a mutant does) gets it called by enqueue
    for every message, the common small one included."""
    sent: list[object] = []

    class Recording(MessageQueue):
        def enqueue_buffers(self, buffers: object, timeout: float | None = 1.0) -> None:
            sent.append(buffers)
            super().enqueue_buffers(buffers, timeout)  # type: ignore[arg-type]

    writer, reader = pair(ring_env, Recording)
    with writer, reader:
        writer.enqueue(b"small", timeout=1)
        assert reader.dequeue(timeout=1) == b"small"
    assert sent == [[pickle.dumps(b"small", pickle.HIGHEST_PROTOCOL)]]


def test_a_miss_yields_once_and_checks_again_before_the_wait(
        ring_env: RingEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """enqueue and dequeue, finding the chunk not free or nothing readable, give the processor
    away and check again (the express path's first turns) before they build a wait
    (_wait_for): what another process did meanwhile (here, the yield itself publishes or
    reads) is found without the wait; a timeout of 0 allows one check and no yield; turns that
    find nothing go on into the wait as before."""
    from enginewire.reference.ring import express as express_module

    writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=1)
    waits: list[str] = []
    turns: list[Callable[[], object]] = []

    def counting_wait(queue: MessageQueue) -> Callable[..., object]:
        original = queue._wait_for

        def wait_for(*args: object, **kwargs: object) -> object:
            waits.append(str(kwargs["clause"]))
            return original(*args, **kwargs)  # type: ignore[arg-type]

        return wait_for

    def first_turn() -> None:  # what the other end does while this one is off the processor
        if turns:
            turns.pop()()

    monkeypatch.setattr(express_module, "_sched_yield", first_turn)
    with writer, reader:
        monkeypatch.setattr(writer, "_wait_for", counting_wait(writer))
        monkeypatch.setattr(reader, "_wait_for", counting_wait(reader))
        turns.append(lambda: writer.enqueue(b"during the yield", timeout=1))
        assert reader.dequeue(timeout=1) == b"during the yield"
        writer.enqueue(b"fills the ring", timeout=1)
        turns.append(lambda: received.append(reader.dequeue(timeout=1)))
        received: list[object] = []
        writer.enqueue(b"after the yield", timeout=1)
        assert received == [b"fills the ring"] and waits == []
        assert reader.dequeue(timeout=1) == b"after the yield"
        turns.append(lambda: writer.enqueue(b"never", timeout=1))
        with pytest.raises(ProtocolTimeout):
            reader.dequeue(timeout=0)
        assert len(turns) == 1 and waits == ["ring.reader.timeout"]  # no yield at timeout 0
        turns.clear()
        with pytest.raises(ProtocolTimeout):
            reader.dequeue(timeout=0.01)  # nothing during the yield: the wait, as before
        assert waits == ["ring.reader.timeout"] * 2


def test_a_writer_timeout_names_the_readers_that_hold_the_chunk(ring_env: RingEnv) -> None:
    """The writer's timeout says which local readers have not read the chunk it waits for, and
    which process each is: a reader that closed its end (a clean close clears its liveness
    entry, so it is not dead to the liveness check) shows as no process attached."""
    import os

    for closes in (False, True):
        writer, reader = pair(ring_env, max_chunk_bytes=256, max_chunks=2)
        with writer, reader:
            writer.enqueue(b"one", timeout=1)
            writer.enqueue(b"two", timeout=1)
            assert reader.dequeue(timeout=1) == b"one"  # chunk 0 read, chunk 1 not
            writer.enqueue(b"three", timeout=1)  # into chunk 0
            if closes:
                reader.close()
            with pytest.raises(ProtocolTimeout) as caught:
                writer.enqueue(b"four", timeout=0.2)  # chunk 1: unread
            message = str(caught.value)
            assert caught.value.clause == "ring.writer.timeout"
            assert "chunk 1 is still unread by reader 0" in message
            assert ("no process attached" in message) == closes
            assert (f"pid {os.getpid()}" in message) == (not closes)
