"""Ring cells: one ring writer with an implementation's readers (:func:`run_ring_cell`)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from .common import (
    OUT_OF_BAND_INDEX,
    OVERFLOW_INDEX,
    RING_CHUNK,
    RING_CHUNKS,
    RING_MESSAGES,
    RING_READERS,
    STEP_TIMEOUT,
    Cell,
    ExchangeFailure,
    Implementation,
    _left_files,
    _Script,
    classify,
)

# --- ring cells ------------------------------------------------------------------------------


def ring_message(index: int) -> Any:
    """Message ``index`` of the ring stream: ``(index, payload)``. Message
    :data:`OVERFLOW_INDEX` is larger than a chunk; :data:`OUT_OF_BAND_INDEX` carries a
    1.5 MB numpy array, which pickle hands out of band (vLLM's rule: buffers of 1 MiB and more)."""
    if index == OVERFLOW_INDEX:
        return index, bytes(range(256)) * (RING_CHUNK // 256 + 4096)
    if index == OUT_OF_BAND_INDEX:
        import numpy

        return index, numpy.arange(200_000, dtype=numpy.int64) * index
    return index, index.to_bytes(4, "little") * (index % 97)


def _same(expected: Any, got: Any) -> bool:
    import numpy

    if not isinstance(got, tuple) or len(got) != 2 or got[0] != expected[0]:
        return False
    if isinstance(expected[1], numpy.ndarray):
        return (isinstance(got[1], numpy.ndarray) and got[1].dtype == expected[1].dtype
                and numpy.array_equal(got[1], expected[1]))
    return bool(got[1] == expected[1])


def _describe(message: Any) -> str:
    if isinstance(message, tuple) and len(message) == 2:
        body = message[1]
        size = getattr(body, "nbytes", None) or (len(body) if isinstance(body, bytes) else 0)
        return f"message {message[0]!r} ({type(body).__name__} of {size} bytes)"
    return repr(message)[:80]


class _ReaderThread:
    """One reader on a thread: attach, take part in the start, read the stream, check it."""

    def __init__(self, ring: Any, handle: Any, rank: int, count: int, timeout: float) -> None:
        self.error: str | None = None
        self.received = 0
        self.ready = threading.Event()
        self.reader: Any = None
        self._args = (ring, handle, rank, count, timeout)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"interop ring reader {rank}")
        self.thread.start()

    def _run(self) -> None:
        ring, handle, rank, count, timeout = self._args
        try:
            self.reader = ring.attach_reader(handle, rank)
            self.reader.wait_until_ready(timeout)
            self.ready.set()
            for index in range(count):
                got = self.reader.dequeue(timeout)
                expected = ring_message(index)
                self.received += 1
                if self.error is None and not _same(expected, got):
                    # Recorded, and the stream read on: the writer is not left blocked.
                    self.error = (f"reader {rank}: message {index} differs: expected "
                                  f"{_describe(expected)}, got {_describe(got)}")
        except Exception as exc:  # noqa: BLE001 - reported by the cell
            self.error = self.error or (f"reader {rank} after {self.received} messages: "
                                        f"{type(exc).__name__}: {exc}")[:400]
        finally:
            self.ready.set()

    def close(self, timeout: float) -> None:
        self.thread.join(timeout)
        if self.reader is not None and not self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.reader.close()


def run_ring_cell(writer_impl: Implementation, reader_impl: Implementation,
                  timeout: float = STEP_TIMEOUT) -> Cell:
    """``writer_impl``'s ring writer to :data:`RING_READERS` readers of ``reader_impl``."""
    cell = Cell("ring", writer_impl.name, reader_impl.name, "shm")
    script = _Script(cell)
    state: dict[str, Any] = {}
    readers: list[_ReaderThread] = []

    def ready() -> None:
        writer = writer_impl.ring.create_writer(n_reader=RING_READERS,
                                                max_chunk_bytes=RING_CHUNK,
                                                max_chunks=RING_CHUNKS)
        state["writer"] = writer
        for rank in range(RING_READERS):
            readers.append(_ReaderThread(reader_impl.ring, writer.handle, rank,
                                         RING_MESSAGES, timeout))
        try:
            writer.wait_until_ready(timeout)
        except TimeoutError as exc:
            problems = [r.error for r in readers if r.error]
            raise ExchangeFailure(f"the writer's start did not complete within {timeout:g} s"
                                  f" ({'; '.join(problems) or exc})",
                                  "ring.ready.collective", None) from exc
        for reader in readers:
            if not reader.ready.wait(timeout) or reader.error:
                raise ExchangeFailure(reader.error or "a reader did not start",
                                      "ring.ready.collective", "readers")

    def stream() -> None:
        for index in range(RING_MESSAGES):
            try:
                state["writer"].enqueue(ring_message(index), timeout)
            except TimeoutError as exc:
                problems = [r.error for r in readers if r.error]
                raise ExchangeFailure(
                    f"message {index} not enqueued within {timeout:g} s"
                    f" ({'; '.join(problems) or 'readers still running'})", None,
                    "readers" if problems else None) from exc

    def receive() -> None:
        for reader in readers:
            reader.thread.join(timeout)
        problems = [r.error for r in readers if r.error]
        stuck = [i for i, r in enumerate(readers) if r.thread.is_alive()]
        if problems or stuck:
            side = "readers" if any("differs" in p for p in problems) else None
            raise ExchangeFailure("; ".join(problems) or
                                  f"readers {stuck} still reading after {timeout:g} s", None,
                                  side)
        counts = [r.received for r in readers]
        if counts != [RING_MESSAGES] * RING_READERS:
            raise ExchangeFailure(f"readers received {counts} of {RING_MESSAGES}")

    def close() -> None:
        for reader in readers:
            reader.close(timeout)
        writer = state.pop("writer")
        handle = writer.handle
        writer.close()
        segment = Path("/dev/shm") / handle.shm_name.lstrip("/")
        if segment.exists():
            raise ExchangeFailure(f"the segment {handle.shm_name} is left after close",
                                  "ring.lifecycle.creator-unlinks", "writer")
        left = _left_files([handle.subscribe_address, handle.notify_address])
        if left:
            raise ExchangeFailure(f"the writer left its ipc socket files {left}",
                                  "ring.lifecycle.ipc-files", "writer")

    try:
        script.step("ready", ready)
        script.step("stream", stream)
        script.step("receive", receive)
        script.step("close", close)
    finally:
        for reader in readers:
            reader.close(timeout)
        writer = state.pop("writer", None)
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        _sweep_ring(writer_impl)
    classify(cell)
    return cell


def _sweep_ring(impl: Implementation) -> None:
    """Remove what a vLLM queue leaves behind (its ipc files), after the cell looked."""
    if impl.name == "vllm":
        from enginewire.conformance.targets.vllm.target import sweep

        sweep()
