"""The suite's side of the shared-memory ring: a byte-level writer and reader.

To check a target's ring *writer* the suite attaches :class:`SuiteRingReader` instances to the
target's segment; to check a target's *reader* it creates the ring with
:class:`SuiteRingWriter` and hands the target the
:class:`~enginewire.conformance.targets.contract.RingHandle`. Both work on the raw bytes
with their own arithmetic (vLLM's layout, ``vllm/distributed/
device_communicators/shm_broadcast.py:289-330`` and ``:940-999``), so a check can look at any
flag or chunk byte, and can also misbehave on purpose (skip a notification, leave a flag set,
write a chunk the framing forbids).

Layout of a segment for ``n_reader`` readers, ``max_chunks`` chunks of ``max_chunk_bytes``::

    [chunk 0][chunk 1]...[chunk N-1][meta 0][meta 1]...[meta N-1]
    meta i = [written][read 0]...[read n_reader-1]   (one byte each, 0 or 1)

Chunk framing: byte 0 is 1 for an overflowed message (the buffers travel as one multipart
message on the writer's XPUB) and 0 otherwise; then a 2-byte big-endian buffer count and, per
buffer, a 4-byte big-endian length and the bytes. Buffer 0 is the pickle stream (protocol 5),
the others its out-of-band buffers (``PickleBuffer`` s of 1 MiB or more).
"""

from __future__ import annotations

import inspect
import io
import pickle
import pickletools
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import zmq

from enginewire.conformance.framework.memory_log import MemoryEvent, MemoryLog
from enginewire.conformance.peers.zmq_peers import recv as _recv
from enginewire.conformance.targets.contract import RingHandle
from enginewire.spec import load

_SPEC = load()
OOB_MIN_BYTES: int = _SPEC.ring_constant("oob_threshold_bytes", int)
#: 1 byte overflow flag + 2 bytes count, then 4 bytes per buffer.
FRAME_HEADER: int = _SPEC.ring_constant("in_ring_header_bytes", int)
LENGTH_PREFIX: int = _SPEC.ring_constant("buffer_length_bytes", int)
READY: bytes = _SPEC.ring_constant("ready_message", str).encode()
NOTIFY = bytes.fromhex(_SPEC.ring_constant("notify_message_hex", str))
POLL_S = 0.0005

_HAS_TRACK = "track" in inspect.signature(shared_memory.SharedMemory.__init__).parameters
_ATTACH_LOCK = threading.Lock()


@dataclass(frozen=True)
class Geometry:
    n_reader: int
    max_chunk_bytes: int
    max_chunks: int

    @property
    def metadata_size(self) -> int:
        return 1 + self.n_reader

    @property
    def metadata_offset(self) -> int:
        return self.max_chunk_bytes * self.max_chunks

    @property
    def total(self) -> int:
        return (self.max_chunk_bytes + self.metadata_size) * self.max_chunks

    def chunk(self, index: int) -> int:
        return index * self.max_chunk_bytes

    def row(self, index: int) -> int:
        return self.metadata_offset + index * self.metadata_size

    @classmethod
    def of(cls, handle: RingHandle) -> Geometry:
        return cls(handle.n_reader, handle.max_chunk_bytes, handle.max_chunks)


# --- payload and framing -----------------------------------------------------------------


def pickle_buffers(obj: Any) -> list[bytes]:
    """``obj`` pickled like vLLM's ``MessageQueue.enqueue``: protocol 5, PickleBuffers of at
    least 1 MiB out of band. Returns ``[pickle, oob...]``."""
    extra: list[bytes] = []

    def callback(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if len(raw) < OOB_MIN_BYTES:
            return True
        extra.append(bytes(raw))
        return False

    with io.BytesIO() as out:
        pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=callback).dump(obj)
        return [out.getvalue(), *extra]


def unpickle_buffers(buffers: Sequence[bytes]) -> Any:
    return pickle.loads(buffers[0], buffers=[bytearray(b) for b in buffers[1:]])  # noqa: S301


def framed_size(buffers: Sequence[bytes]) -> int:
    """Bytes the framing of ``buffers`` takes in a chunk: 3 + sum(4 + len)."""
    return FRAME_HEADER + sum(LENGTH_PREFIX + len(b) for b in buffers)


def overflows(buffers: Sequence[bytes], max_chunk_bytes: int) -> bool:
    """vLLM's rule (shm_broadcast.py:963): overflow iff ``6 + sum(4 + len(oob)) + len(main)
    >= max_chunk_bytes``, which is ``framed_size - 1 >= max_chunk_bytes``: a message overflows
    exactly when its framing does not fit in the chunk."""
    return framed_size(buffers) > max_chunk_bytes


def frame_chunk(buffers: Sequence[bytes]) -> bytes:
    parts = [b"\x00", len(buffers).to_bytes(2, "big")]
    for buffer in buffers:
        parts += [len(buffer).to_bytes(4, "big"), bytes(buffer)]
    return b"".join(parts)


class FramingProblem(ValueError):
    """A chunk's bytes break the framing."""


def parse_chunk(chunk: bytes | memoryview, max_chunk_bytes: int) -> list[bytes] | None:
    """The buffers framed in ``chunk``, or None for an overflow marker."""
    data = bytes(chunk[: max_chunk_bytes])
    if data[0] == 1:
        return None
    if data[0] != 0:
        raise FramingProblem(f"byte 0 is {data[0]}, expected 0 (inline) or 1 (overflow)")
    count = int.from_bytes(data[1:3], "big")
    if count < 1:
        raise FramingProblem("buffer count 0: the main buffer is always counted")
    offset = FRAME_HEADER
    out = []
    for index in range(count):
        if offset + LENGTH_PREFIX > len(data):
            raise FramingProblem(f"buffer {index}'s length prefix runs past the chunk")
        length = int.from_bytes(data[offset:offset + LENGTH_PREFIX], "big")
        offset += LENGTH_PREFIX
        if offset + length > len(data):
            raise FramingProblem(f"buffer {index} ({length} bytes) runs past the chunk")
        out.append(data[offset:offset + length])
        offset += length
    return out


def pickle_stream_length(data: bytes) -> int | None:
    """Bytes of the pickle stream that starts ``data``, through its STOP opcode; None when
    ``data`` does not start with a complete pickle stream."""
    try:
        for opcode, _arg, position in pickletools.genops(data):
            if opcode.name == "STOP" and position is not None:
                return position + 1
    except Exception:  # noqa: BLE001 - any parse error: no complete stream
        return None
    return None


def framing_differences(chunk: bytes | memoryview,
                        buffers: Sequence[bytes | None]) -> list[tuple[str, str]]:
    """Every way the in-ring framing in ``chunk`` differs from the real ``buffers`` of one
    message, as ``(clause, what)``. ``buffers[0]`` None stands for a pickle stream, whose
    real length is its own (through its STOP opcode); a buffer given is compared byte for
    byte.

    Byte 0 must be 0; the buffer count (2 bytes, big-endian) must be ``len(buffers)``; each
    length prefix (4 bytes, big-endian) must be its buffer's real length. Every prefix is
    bounds-checked: a prefix or a buffer that runs past the end of the chunk is a difference,
    never truncated. The walk goes on at the offsets the spec gives the real buffers, so
    every prefix is compared. A value that is right when read little-endian is named so.
    """
    data = bytes(chunk)
    size = len(data)
    found: list[tuple[str, str]] = []

    def little(raw: bytes, want: int) -> str:
        return " (that is the right value written little-endian)" if (
            int.from_bytes(raw, "little") == want and raw != raw[::-1]) else ""

    if size < FRAME_HEADER:
        return [("ring.framing.within-chunk",
                 f"the chunk is {size} bytes, shorter than the {FRAME_HEADER}-byte header")]
    if data[0] != 0:
        found.append(("ring.framing.overflow-byte",
                      f"byte 0 is {data[0]}, expected 0 (an in-ring message)"))
    count_raw = data[1:FRAME_HEADER]
    count = int.from_bytes(count_raw, "big")
    if count != len(buffers):
        found.append(("ring.framing.buffer-count",
                      f"the buffer count (bytes 1-2, {count_raw.hex()}) is {count}; the message "
                      f"has {len(buffers)} buffer(s){little(count_raw, len(buffers))}"))
    offset = FRAME_HEADER
    for index, buffer in enumerate(buffers):
        where = f"buffer {index}'s length prefix (bytes {offset}-{offset + LENGTH_PREFIX - 1})"
        if offset + LENGTH_PREFIX > size:
            found.append(("ring.framing.within-chunk",
                          f"{where} runs past the end of the {size}-byte chunk"))
            break
        raw = data[offset:offset + LENGTH_PREFIX]
        stated = int.from_bytes(raw, "big")
        start = offset + LENGTH_PREFIX
        if buffer is None:
            real = pickle_stream_length(data[start:])
            if real is None:
                found.append(("ring.payload.pickle-protocol-5",
                              f"buffer {index} at byte {start} is not a complete pickle stream"))
                break
        else:
            real = len(buffer)
        if start + stated > size:
            found.append(("ring.framing.within-chunk",
                          f"{where} says {stated} bytes, which runs past the end of the "
                          f"{size}-byte chunk (to byte {start + stated}); the buffer is {real} "
                          f"bytes{little(raw, real)}"))
        elif stated != real:
            found.append(("ring.framing.length-prefix",
                          f"{where} says {stated} bytes; the buffer is {real} bytes"
                          f"{little(raw, real)}"))
        if buffer is not None:
            if start + real > size:
                found.append(("ring.framing.within-chunk",
                              f"buffer {index} ({real} bytes at byte {start}) does not fit in "
                              f"the {size}-byte chunk"))
                break
            if data[start:start + real] != bytes(buffer):
                found.append(("ring.framing.length-prefix",
                              f"buffer {index}'s {real} bytes at byte {start} are not the "
                              "message's buffer"))
        offset = start + real
    return found


# --- shared memory -----------------------------------------------------------------------


def _attach(name: str) -> shared_memory.SharedMemory:
    if _HAS_TRACK:
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    with _ATTACH_LOCK:
        original = resource_tracker.register
        resource_tracker.register = lambda *a, **k: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = original


def segment_exists(name: str) -> bool:
    try:
        shm = _attach(name)
    except FileNotFoundError:
        return False
    shm.close()
    return True


class Segment:
    """A mapping of a ring segment; the creator unlinks it on :meth:`close`."""

    def __init__(self, geometry: Geometry, name: str | None = None) -> None:
        self.geometry = geometry
        self.creator = name is None
        if name is None:
            self.shm = shared_memory.SharedMemory(create=True, size=geometry.total)
            self.shm.buf[geometry.metadata_offset:geometry.total] = bytes(  # type: ignore[index]
                geometry.total - geometry.metadata_offset)
        else:
            self.shm = _attach(name)
        self.name = self.shm.name
        self.size = self.shm.size
        self._lock = threading.Lock()

    @property
    def buf(self) -> memoryview:
        return self.shm.buf  # type: ignore[return-value]

    def metadata(self, index: int) -> bytes:
        row = self.geometry.row(index)
        return bytes(self.buf[row:row + self.geometry.metadata_size])

    def all_metadata(self) -> bytes:
        g = self.geometry
        return bytes(self.buf[g.metadata_offset:g.total])

    def chunk(self, index: int) -> bytes:
        start = self.geometry.chunk(index)
        return bytes(self.buf[start:start + self.geometry.max_chunk_bytes])

    def set(self, offset: int, value: int) -> None:
        self.buf[offset] = value

    def close(self) -> None:
        with self._lock:
            if self.shm is None:
                return
            shm, self.shm = self.shm, None  # type: ignore[assignment]
        if self.creator:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        try:
            shm.close()
        except BufferError:
            pass


# --- sockets -----------------------------------------------------------------------------


class _Sockets:
    def __init__(self) -> None:
        self.context = zmq.Context()
        self.sockets: list[zmq.Socket] = []
        self.files: list[str] = []

    def socket(self, kind: int) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.sockets.append(sock)
        return sock

    def bind_ipc(self, sock: zmq.Socket, directory: str) -> str:
        address = f"ipc://{directory}/ewring-{uuid.uuid4().hex[:12]}"
        sock.bind(address)
        self.files.append(address[len("ipc://"):])
        return address

    def close(self) -> None:
        import os

        for sock in self.sockets:
            sock.close(linger=0)
        self.context.term()
        for path in self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass



# --- writer ------------------------------------------------------------------------------


class SuiteRingWriter:
    """The suite as the ring's writer (it creates the segment and binds both sockets)."""

    def __init__(self, n_reader: int, max_chunk_bytes: int, max_chunks: int,
                 directory: str) -> None:
        self.geometry = Geometry(n_reader, max_chunk_bytes, max_chunks)
        self.segment = Segment(self.geometry)
        self.net = _Sockets()
        try:
            self.xpub = self.net.socket(zmq.XPUB)
            self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
            subscribe = self.net.bind_ipc(self.xpub, directory)
            self.notify = self.net.socket(zmq.PUB)
            self.notify.setsockopt(zmq.SNDHWM, 1)
            notify = self.net.bind_ipc(self.notify, directory)
        except BaseException:
            self.close()
            raise
        self.handle = RingHandle(n_reader, max_chunk_bytes, max_chunks, self.segment.name,
                                 subscribe, notify, tuple(range(n_reader)))
        self.index = 0

    def wait_until_ready(self, timeout: float, subscribers: int | None = None) -> None:
        """Wait for one subscription per reader on the XPUB, then publish READY."""
        deadline = time.monotonic() + timeout
        for _ in range(self.geometry.n_reader if subscribers is None else subscribers):
            message = _recv(self.xpub, deadline - time.monotonic(), "reader subscription")
            if not message or not message[0] or message[0][0] != 1:
                raise ValueError(f"expected a subscription message, got {message!r}")
        self.xpub.send(READY)

    def writable(self, index: int) -> bool:
        meta = self.segment.metadata(index)
        return meta[0] == 0 or sum(meta[1:]) == self.geometry.n_reader

    def write_buffers(self, buffers: Sequence[bytes], timeout: float, *,
                      notify: bool = True, overflow: bool | None = None) -> int:
        """Write one message (the vLLM way); returns the chunk index it used."""
        g, seg = self.geometry, self.segment
        deadline = time.monotonic() + timeout
        index = self.index
        while not self.writable(index):
            if time.monotonic() > deadline:
                raise TimeoutError(f"chunk {index} not released by every reader within "
                                   f"{timeout:g} s")
            time.sleep(POLL_S)
        row = g.row(index)
        seg.set(row, 0)
        spill = overflows(buffers, g.max_chunk_bytes) if overflow is None else overflow
        start = g.chunk(index)
        if spill:
            seg.buf[start] = 1
        else:
            framed = frame_chunk(buffers)
            seg.buf[start:start + len(framed)] = framed
        for reader in range(g.n_reader):
            seg.set(row + 1 + reader, 0)
        seg.set(row, 1)
        self.index = (index + 1) % g.max_chunks
        if spill:
            self.xpub.send_multipart([bytes(b) for b in buffers])
        if notify:
            self.notify.send(NOTIFY)
        return index

    def enqueue(self, obj: Any, timeout: float = 5.0, **kwargs: Any) -> int:
        return self.write_buffers(pickle_buffers(obj), timeout, **kwargs)

    def close(self) -> None:
        self.net.close()
        self.segment.close()


# --- reader ------------------------------------------------------------------------------


class SuiteRingReader:
    """The suite as local reader ``rank`` (0-based) of a ring someone else created."""

    def __init__(self, handle: RingHandle, rank: int) -> None:
        self.handle = handle
        self.geometry = Geometry.of(handle)
        self.rank = rank
        self.segment = Segment(self.geometry, handle.shm_name)
        self.net = _Sockets()
        try:
            self.sub = self.net.socket(zmq.SUB)
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            self.sub.connect(handle.subscribe_address)
            self.notify = self.net.socket(zmq.SUB)
            self.notify.setsockopt(zmq.CONFLATE, 1)
            self.notify.setsockopt(zmq.SUBSCRIBE, b"")
            self.notify.connect(handle.notify_address)
        except BaseException:
            self.close()
            raise
        self.index = 0

    def wait_until_ready(self, timeout: float) -> None:
        message = _recv(self.sub, timeout, "READY from the writer")
        if message != [READY]:
            raise ValueError(f"expected READY, got {message!r}")

    def readable(self, index: int) -> bool:
        meta = self.segment.metadata(index)
        return meta[0] == 1 and meta[1 + self.rank] == 0

    def read_buffers(self, timeout: float) -> list[bytes]:
        """Read the next message's buffers the vLLM way (overflow from the XPUB)."""
        g, seg = self.geometry, self.segment
        deadline = time.monotonic() + timeout
        index = self.index
        while not self.readable(index):
            if time.monotonic() > deadline:
                raise TimeoutError(f"chunk {index} not written within {timeout:g} s "
                                   f"(metadata {seg.metadata(index).hex()})")
            time.sleep(POLL_S)
        try:
            buffers = parse_chunk(seg.chunk(index), g.max_chunk_bytes)
        finally:
            seg.set(g.row(index) + 1 + self.rank, 1)
            self.index = (index + 1) % g.max_chunks
        if buffers is None:
            buffers = _recv(self.sub, max(deadline - time.monotonic(), 0.05),
                            "overflowed message on the XPUB")
        return buffers

    def dequeue(self, timeout: float = 5.0) -> Any:
        return unpickle_buffers(self.read_buffers(timeout))

    def close(self) -> None:
        self.net.close()
        self.segment.close()


# --- a recording memory for the flag-order checks ----------------------------------------


class RecordingMemory:
    """A ring memory (load/store/read/write/fence/yield_, as ``enginewire.reference.ring``'s
    ``RingMemory``) over a bytearray that logs every operation: ``(op, offset, value)``."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self.log: list[tuple[str, int, Any]] = []

    def load(self, offset: int) -> int:
        self.log.append(("load", offset, self.data[offset]))
        return self.data[offset]

    def store(self, offset: int, value: int) -> None:
        self.log.append(("store", offset, value))
        self.data[offset] = value

    def read(self, offset: int, length: int) -> bytes:
        self.log.append(("read", offset, length))
        return bytes(self.data[offset:offset + length])

    def write(self, offset: int, data: Any) -> None:
        raw = bytes(data)
        self.log.append(("write", offset, len(raw)))
        self.data[offset:offset + len(raw)] = raw

    def fence(self) -> None:
        self.log.append(("fence", -1, None))

    def yield_(self) -> None:
        self.log.append(("yield", -1, None))

    def notify(self) -> None:
        """The writer's notification (its notify socket send), an ordered event of the log."""
        self.log.append(("notify", -1, None))

    def wait_notify(self) -> None:
        """A reader blocking on its notify socket with no recheck (a reader's ``wait()``)."""
        self.log.append(("wait_notify", -1, None))


def memory_field(geometry: Geometry, offset: int, length: int = 1) -> str:
    """Where ``offset`` lies in the ring (``chunk 0 written flag``, ``chunk 1 read flag r0``,
    ``chunk 0 data[3..10]``), in the explorer's words."""
    if offset < geometry.metadata_offset:
        chunk, index = divmod(offset, geometry.max_chunk_bytes)
        span = f"{index}..{index + length - 1}" if length > 1 else f"{index}"
        return f"chunk {chunk} data[{span}]"
    chunk, column = divmod(offset - geometry.metadata_offset, geometry.metadata_size)
    if chunk >= geometry.max_chunks:
        return "beyond the ring"
    if column == 0:
        return f"chunk {chunk} written flag"
    return f"chunk {chunk} read flag r{column - 1}"


def memory_log(log: Sequence[tuple[str, int, Any]], geometry: Geometry, process: str, *,
               setup: Sequence[tuple[str, int, Any]] = (), setup_process: str = "suite",
               title: str = "") -> MemoryLog:
    """A :class:`RecordingMemory` log as a typed reproduction: ``setup`` (the state the suite
    put in place before the target ran, as ``(op, offset, value)``) by ``setup_process``,
    then the target's ``log`` by ``process``, each access named by its field."""
    events: list[MemoryEvent] = []
    for who, entries, note in ((setup_process, setup, "setup"), (process, log, "")):
        for op, offset, value in entries:
            bulk = op in ("read", "write")
            where = "" if offset < 0 else memory_field(geometry, offset,
                                                       int(value) if bulk else 1)
            shown = "" if value is None else (f"{value} bytes" if bulk else str(value))
            events.append(MemoryEvent(who, op, where, None if offset < 0 else offset, shown,
                                      len(events), note))
    return MemoryLog(events, title)
