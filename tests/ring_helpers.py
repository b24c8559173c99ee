"""Shared pieces of the ring tests: message streams, reader processes, leftover checks.

Reader processes are started with the ``spawn`` method and run the functions below, so this
module imports nothing heavy at the top: a child imports only what its function needs.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

SPAWN = multiprocessing.get_context("spawn")
SHM_DIR = Path("/dev/shm")
#: Seconds any single step of a ring test may wait before the test fails.
STEP_TIMEOUT = 20.0


# --- the message streams ------------------------------------------------------------------


def stream_sizes(max_chunk_bytes: int) -> list[int]:
    """Payload sizes cycled through by :func:`message`: small, around one chunk, several."""
    return [0, 1, 100, max_chunk_bytes // 2, max_chunk_bytes - 60, max_chunk_bytes - 20,
            max_chunk_bytes, max_chunk_bytes + 20, 3 * max_chunk_bytes, 17]


def payload(index: int, size: int) -> bytes:
    """``size`` bytes that differ from message to message."""
    seed = hashlib.blake2b(index.to_bytes(8, "little"), digest_size=16).digest()
    return (seed * (size // len(seed) + 1))[:size]


def message(index: int, max_chunk_bytes: int) -> tuple[int, bytes]:
    """Message ``index`` of a test stream: ``(index, payload)``; some overflow the chunk."""
    sizes = stream_sizes(max_chunk_bytes)
    return index, payload(index, sizes[index % len(sizes)])


def tensor_message(index: int) -> dict[str, Any]:
    """Message ``index`` of the tensor stream: torch tensors and numpy arrays of every kind the
    pickle codec treats differently (in band, out of band in the ring, overflowing, bfloat16,
    0-d, empty, non-contiguous, requiring grad, big-endian in Fortran order)."""
    import numpy
    import torch

    generator = torch.Generator().manual_seed(index)
    kind = index % 6
    if kind == 0:
        tensor = torch.randn(100, generator=generator)  # in band
    elif kind == 1:
        tensor = torch.randn(400_000, generator=generator)  # 1.6 MB: out of band, in the ring
    elif kind == 2:
        tensor = torch.randn(1_600_000, generator=generator).to(torch.bfloat16)  # 3.2 MB
    elif kind == 3:
        tensor = torch.randn(1_000, 1_500, generator=generator).t()  # 6 MB, overflows
    elif kind == 4:
        tensor = torch.tensor(float(index))  # 0-d
    else:
        tensor = torch.empty(0, 3, dtype=torch.int64)
    return {
        "i": index,
        "t": tensor,
        "g": torch.ones(3, requires_grad=True),
        "a": numpy.full(300_000 * (index % 2) + 5, index, dtype=numpy.int32),
        "b": numpy.arange(3 * (index + 1), dtype=">f8").reshape(-1, 3).T,  # Fortran order
    }


def same_value(got: Any, want: Any) -> bool:
    """Deep equality that understands tensors and arrays (dtype and shape included)."""
    if isinstance(want, dict):
        return (isinstance(got, dict) and got.keys() == want.keys()
                and all(same_value(got[k], want[k]) for k in want))
    if isinstance(want, tuple | list):  # msgpack has no tuples: a list stands for one
        return (isinstance(got, tuple | list) and len(got) == len(want)
                and all(same_value(g, w) for g, w in zip(got, want, strict=True)))
    module = type(want).__module__
    if module.startswith("torch"):
        import torch

        return (isinstance(got, torch.Tensor) and got.dtype == want.dtype
                and got.shape == want.shape and bool(torch.equal(got.detach(), want.detach())))
    if module.startswith("numpy"):
        import numpy

        return (isinstance(got, numpy.ndarray) and got.dtype == want.dtype
                and got.shape == want.shape and bool((got == want).all()))
    return bool(got == want) and type(got) is type(want)


STREAMS: dict[str, Callable[[int, int], Any]] = {
    "bytes": message,
    "tensors": lambda index, _max_chunk_bytes: tensor_message(index),
}


def check_stream(receive: Callable[[], Any], count: int, max_chunk_bytes: int,
                 stream: str = "bytes") -> dict[str, Any]:
    """Receive ``count`` messages and compare each with the stream's; report, never raise."""
    expected = STREAMS[stream]
    received = 0
    try:
        for index in range(count):
            got = receive()
            if not same_value(got, expected(index, max_chunk_bytes)):
                head = got[0] if isinstance(got, tuple) else type(got).__name__
                return {"received": received,
                        "error": f"message {index} differs (got one starting {head!r})"}
            received += 1
    except Exception as exc:  # reported to the parent, which fails the test
        return {"received": received, "error": f"{type(exc).__name__}: {exc}"}
    return {"received": received, "error": None}


# --- reader processes ---------------------------------------------------------------------


def reference_reader(conn: Connection, handle: Any, rank: int, count: int,
                     max_chunk_bytes: int, codec: str = "pickle", stream: str = "bytes") -> None:
    """Attach a reference reader, receive and check ``count`` messages, send the report."""
    from enginewire.reference.ring import MessageQueue

    try:
        with MessageQueue.create_from_handle(handle, rank, codec=codec) as queue:
            queue.wait_until_ready(timeout=STEP_TIMEOUT)
            report = check_stream(lambda: queue.dequeue(timeout=STEP_TIMEOUT), count,
                                  max_chunk_bytes, stream)
    except Exception as exc:
        report = {"received": 0, "error": f"{type(exc).__name__}: {exc}"}
    conn.send(report)
    conn.close()


def vllm_reader(conn: Connection, jobs: list[tuple[Any, int, int, int, str]]) -> None:
    """Attach vLLM's own reader to each job's handle ``(handle, rank, count, max_chunk_bytes,
    stream)`` in turn; send one report per job."""
    reports = []
    try:
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

        for handle, rank, count, max_chunk_bytes, stream in jobs:
            queue = MessageQueue.create_from_handle(handle, rank)
            queue.wait_until_ready()
            reports.append(check_stream(lambda q=queue: q.dequeue(timeout=STEP_TIMEOUT),
                                        count, max_chunk_bytes, stream))
    except Exception as exc:
        reports.append({"received": 0, "error": f"{type(exc).__name__}: {exc}"})
    conn.send(reports)
    conn.close()


def tensor_round_trip(conn: Connection) -> None:
    """Encode and decode the tensor stream with the reference pickle codec; report whether
    every message came back equal and whether vLLM got imported on the way."""
    import sys

    from enginewire.reference.ring.payload import PickleCodec

    codec = PickleCodec()
    equal = True
    for index in range(6):
        buffers = codec.encode(tensor_message(index))
        got = codec.decode(buffers[0], [bytearray(b) for b in buffers[1:]])
        equal = equal and same_value(got, tensor_message(index))
    conn.send({"equal": equal, "vllm_imported": "vllm" in sys.modules})
    conn.close()


class RankedWorker:
    """The object a worker process serves: ``echo`` returns ``(rank, pid, args)``, ``fail``
    raises, ``stop_serving`` ends the serving loop after its reply."""

    def __init__(self, rank: int) -> None:
        import threading

        self.rank = rank
        self.stopping = threading.Event()

    def echo(self, *args: Any) -> tuple[int, int, tuple[Any, ...]]:
        import os

        return (self.rank, os.getpid(), args)

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def stop_serving(self) -> str:
        self.stopping.set()
        return "stopping"


def reference_worker(conn: Connection, handle: Any, rank: int, max_chunk_bytes: int) -> None:
    """Serve as reference worker ``rank`` of the broadcast ring ``handle``: send the response
    ring's handle, serve until ``stop_serving``, close, then send a report."""
    from enginewire.reference.ring import Worker

    report: dict[str, Any] = {"error": None}
    try:
        obj = RankedWorker(rank)
        with Worker(handle, rank, obj, max_chunk_bytes=max_chunk_bytes, max_chunks=4) as worker:
            conn.send(worker.response_handle)
            worker.wait_until_ready(timeout=STEP_TIMEOUT)
            worker.serve(obj.stopping)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    conn.send(report)
    conn.close()


class Readers:
    """Reader processes of one test; :meth:`stop` (run by the fixture) leaves none behind."""

    def __init__(self) -> None:
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []

    def start(self, target: Callable[..., None], *args: Any) -> Connection:
        """Run ``target(conn, *args)`` in a new process; return the parent's end of ``conn``."""
        parent, child = SPAWN.Pipe(duplex=False)
        process = SPAWN.Process(target=target, args=(child, *args), daemon=True)
        process.start()
        child.close()
        self.processes.append(process)
        self.conns.append(parent)
        return parent

    def reports(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Every reader's report, in start order; fails the test if one is missing."""
        found = []
        for conn, process in zip(self.conns, self.processes, strict=True):
            if not conn.poll(timeout):
                pytest.fail(f"reader process {process.pid} sent no report in {timeout} s")
            found.append(conn.recv())
        for process in self.processes:
            process.join(timeout)
        return found

    def stop(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(10)
        for conn in self.conns:
            conn.close()


@pytest.fixture
def readers() -> Iterator[Readers]:
    group = Readers()
    try:
        yield group
    finally:
        group.stop()


# --- leftovers ----------------------------------------------------------------------------


class RingEnv:
    """Where a test's queues put their ipc files, and which segments they created."""

    def __init__(self, ipc_dir: str) -> None:
        self.ipc_dir = ipc_dir
        self.segments: list[str] = []

    def leaked_segments(self) -> list[str]:
        return [name for name in self.segments if (SHM_DIR / name).exists()]

    def leaked_ipc_files(self) -> list[str]:
        """enginewire socket files still in :attr:`ipc_dir` (vLLM's own are not counted:
        vLLM never removes them, see clause ring.lifecycle.ipc-files)."""
        return sorted(p.name for p in Path(self.ipc_dir).iterdir()
                      if p.name.startswith("enginewire-"))


@pytest.fixture
def ring_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[RingEnv]:
    """A private ipc directory (also vLLM's, through VLLM_RPC_BASE_PATH) and a record of every
    segment the test's writers create; fails the test if either outlives it, then cleans up so
    one failure does not leak into the next test."""
    from enginewire.reference.ring import shm

    # Short on purpose: a unix socket path holds at most 107 bytes.
    env = RingEnv(tempfile.mkdtemp(prefix="ewring-"))
    original = shm.ShmSegment.create.__func__  # type: ignore[attr-defined]

    def recording_create(cls: type, layout: Any) -> Any:
        segment = original(cls, layout)
        env.segments.append(segment.name)
        return segment

    monkeypatch.setattr(shm.ShmSegment, "create", classmethod(recording_create))
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", env.ipc_dir)
    try:
        yield env
        leaked_shm = env.leaked_segments()
        leaked_ipc = env.leaked_ipc_files()
        assert not leaked_shm, f"shared-memory segments left behind: {leaked_shm}"
        assert not leaked_ipc, f"ipc socket files left behind: {leaked_ipc}"
    finally:
        for name in env.leaked_segments():
            (SHM_DIR / name).unlink(missing_ok=True)
        shutil.rmtree(env.ipc_dir, ignore_errors=True)


def pair(env: RingEnv, cls: Any = None, **kwargs: Any) -> tuple[Any, Any]:
    """A writer and one in-process local reader of queue class ``cls`` (default
    ``MessageQueue``), handshake done."""
    if cls is None:
        from enginewire.reference.ring import MessageQueue as cls
    writer = cls(1, 1, ipc_dir=env.ipc_dir, **kwargs)
    reader = cls.create_from_handle(writer.export_handle(), 0)
    ready = threading.Thread(target=reader.wait_until_ready, args=(STEP_TIMEOUT,))
    ready.start()
    writer.wait_until_ready(STEP_TIMEOUT)
    ready.join(STEP_TIMEOUT)
    return writer, reader
