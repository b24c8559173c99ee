"""The textbook contenders: what a reader of any IPC chapter would pick instead of the ring and
the codec, measured in the same run and harness.

Bulk bytes (GB/s), one writer process (this one) and one reader process (forked), messages of
``size`` bytes for about ``seconds``; the reader copies every message into a buffer of its own
(as the ring's copying reads do):

- ``pipe``: an anonymous pipe at its default capacity (64 KiB on Linux);
- ``pipe_1mib``: the same pipe enlarged with ``fcntl(F_SETPIPE_SZ)`` to ``/proc/sys/fs/
  pipe-max-size`` (1 MiB by default);
- ``unix_socket``: a connected ``AF_UNIX`` stream socket pair, default buffer sizes;
- ``shm_handshake``: a shared-memory slot and a one-byte handshake over two pipes: the writer
  copies a message in and sends one byte, the reader copies it out and answers one byte.

One scheduling step of 256 requests (µs per step, encode plus decode, one process):

- ``pickle``: the step as 256 slotted dataclasses, ``pickle.dumps``/``loads`` (protocol 5);
- ``msgspec_structs``: the same step as ``msgspec.Struct`` values, msgpack encode/decode;
- ``int_arrays``: the step already flattened into integer arrays (numpy: one row of scalars per
  request and the block ids concatenated with offsets), joined into one buffer and read back
  as arrays over it. Flattening the objects is not timed: the textbook figure assumes a
  scheduler that keeps its state in arrays.

The textbook figures these stand beside (one machine): about 1.6, 7.9 and 11 GB/s for a pipe,
a Unix socket and shared memory; about 376 µs, a couple hundred µs and 3 µs for the step.
They are expectations to compare with, never the measured figures.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import msgspec
import numpy as np

#: Bulk transports, in the order they run.
TRANSPORTS = ("pipe", "pipe_1mib", "unix_socket", "shm_handshake")
#: Step encodings, in the order they run.
ENCODINGS = ("pickle", "msgspec_structs", "int_arrays")
#: The textbook expectations (GB/s, µs per step), for the docs and the report.
EXPECTED_GB_PER_S = {"pipe": 1.6, "pipe_1mib": 1.6, "unix_socket": 7.9, "shm_handshake": 11.0}
EXPECTED_STEP_US = {"pickle": 376.0, "msgspec_structs": 200.0, "int_arrays": 3.0}
#: Requests in one scheduling step (vLLM's default max_num_seqs) and block ids per request.
STEP_REQUESTS = 256
BLOCKS_PER_REQUEST = 16
_SIZE = struct.Struct("<q")


class TextbookError(RuntimeError):
    """A bulk transfer did not complete."""


# --- bulk bytes -----------------------------------------------------------------------------


def _read_exactly(read_into: Callable[[memoryview], int], view: memoryview) -> None:
    got = 0
    total = view.nbytes
    while got < total:
        count = read_into(view[got:])
        if count <= 0:
            raise TextbookError("the writer closed mid-message")
        got += count


def _child(body: Callable[[], None]) -> int:
    """Fork a reader running ``body``; it leaves with os._exit (0: done, 1: failed)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            body()
            status = 0
        finally:
            os._exit(status)
    return pid


def _reap(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                raise TextbookError("the reader process failed")
            return
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise TextbookError("the reader process did not finish in time")
        time.sleep(0.005)


def _stream_fds(kind: str) -> tuple[Any, Any]:
    """(writer end, reader end) of a pipe or socket pair as objects with ``close``."""
    if kind == "unix_socket":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_fd, write_fd = os.pipe()
    if kind == "pipe_1mib":
        with open("/proc/sys/fs/pipe-max-size", encoding="ascii") as handle:
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, int(handle.read()))
    return os.fdopen(write_fd, "wb", buffering=0), os.fdopen(read_fd, "rb", buffering=0)


def bulk(kind: str, size: int, seconds: float, timeout: float) -> dict[str, float]:
    """GB/s of ``size``-byte messages through ``kind`` for about ``seconds`` (writer here,
    a forked reader copying each message into its own buffer)."""
    payload = memoryview(
        np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes())
    count = _calibrate(size, seconds)
    if kind == "shm_handshake":
        elapsed = _shm_handshake(payload, count, timeout)
    else:
        elapsed = _stream(kind, payload, count, timeout)
    return {"gb_per_s": count * size / elapsed / 1e9}


def _calibrate(size: int, seconds: float) -> int:
    """Messages to send: about ``seconds`` at 10 GB/s, at least 8."""
    return max(8, int(seconds * 10e9 / size))


def _stream(kind: str, payload: memoryview, count: int, timeout: float) -> float:
    """Seconds from the first byte sent to the reader's one-byte confirmation (on a pipe of
    its own) that it has copied the last message."""
    writer, reader = _stream_fds(kind)
    size = payload.nbytes
    back_read, back_write = os.pipe()
    read_into = reader.recv_into if kind == "unix_socket" else reader.readinto
    send = writer.send if kind == "unix_socket" else writer.write

    def body() -> None:
        writer.close()
        os.close(back_read)
        into = memoryview(bytearray(size))
        for _ in range(count):
            _read_exactly(read_into, into)
        os.write(back_write, b"\x00")

    try:
        pid = _child(body)
        os.close(back_write)
        reader.close()
        started = time.perf_counter()
        for _ in range(count):
            sent = 0
            while sent < size:
                sent += send(payload[sent:])
        if os.read(back_read, 1) != b"\x00":
            raise TextbookError("the reader did not confirm")
        elapsed = time.perf_counter() - started
        _reap(pid, timeout)
        return elapsed
    finally:
        os.close(back_read)
        writer.close()
        reader.close()


def _shm_handshake(payload: memoryview, count: int, timeout: float) -> float:
    size = payload.nbytes
    segment = shared_memory.SharedMemory(create=True, size=size)
    try:
        ready_read, ready_write = os.pipe()
        done_read, done_write = os.pipe()
        slot = segment.buf
        assert slot is not None

        def body() -> None:
            os.close(ready_write)
            os.close(done_read)
            into = bytearray(size)
            for _ in range(count):
                if os.read(ready_read, 1) != b"\x01":
                    raise TextbookError("handshake lost")
                into[:] = slot
                os.write(done_write, b"\x01")

        pid = _child(body)
        os.close(ready_read)
        os.close(done_write)
        try:
            started = time.perf_counter()
            for _ in range(count):
                slot[:size] = payload
                os.write(ready_write, b"\x01")
                if os.read(done_read, 1) != b"\x01":
                    raise TextbookError("the reader did not answer")
            elapsed = time.perf_counter() - started
        finally:
            os.close(ready_write)
            os.close(done_read)
        _reap(pid, timeout)
        return elapsed
    finally:
        segment.close()
        segment.unlink()


# --- one scheduling step --------------------------------------------------------------------


@dataclass(slots=True)
class PickledRequest:
    """One scheduled request of a step, as plain Python objects."""

    req_id: str
    num_tokens: int
    num_computed_tokens: int
    new_token_id: int
    block_ids: list[int]


class StructRequest(msgspec.Struct):
    """The same request as a msgspec struct."""

    req_id: str
    num_tokens: int
    num_computed_tokens: int
    new_token_id: int
    block_ids: list[int]


def _rows() -> list[tuple[str, int, int, int, list[int]]]:
    return [(f"req-{i:05d}", 512 + i, 500 + i, 1000 + i,
             list(range(i * BLOCKS_PER_REQUEST, (i + 1) * BLOCKS_PER_REQUEST)))
            for i in range(STEP_REQUESTS)]


def step_operations() -> dict[str, Callable[[], Any]]:
    """Encoding -> one round trip (encode then decode) of a 256-request step."""
    rows = _rows()
    pickled = [PickledRequest(*row) for row in rows]
    structs = [StructRequest(*row) for row in rows]
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(list[StructRequest])
    scalars = np.array([[i, r[1], r[2], r[3]] for i, r in enumerate(rows)], dtype=np.int64)
    blocks = np.concatenate([np.array(r[4], dtype=np.int64) for r in rows])
    offsets = np.arange(0, (STEP_REQUESTS + 1) * BLOCKS_PER_REQUEST, BLOCKS_PER_REQUEST,
                        dtype=np.int64)
    header = struct.Struct("<qq")

    def arrays() -> Any:
        frame = b"".join((header.pack(scalars.size, blocks.size), scalars.tobytes(),
                          offsets.tobytes(), blocks.tobytes()))
        n_scalars, n_blocks = header.unpack_from(frame)
        start = header.size
        got_scalars = np.frombuffer(frame, np.int64, n_scalars, start).reshape(-1, 4)
        start += n_scalars * 8
        got_offsets = np.frombuffer(frame, np.int64, STEP_REQUESTS + 1, start)
        start += (STEP_REQUESTS + 1) * 8
        return got_scalars, got_offsets, np.frombuffer(frame, np.int64, n_blocks, start)

    return {
        "pickle": lambda: pickle.loads(pickle.dumps(pickled, protocol=5)),
        "msgspec_structs": lambda: decoder.decode(encoder.encode(structs)),
        "int_arrays": arrays,
    }
