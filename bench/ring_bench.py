"""The ring bench: a writer here, readers in worker processes, and its baselines.

Every cell creates a fresh ring through the target's ring surface
(:mod:`enginewire.conformance.targets.contract`: ``create_writer`` / ``attach_reader`` /
``enqueue`` / ``dequeue``), so ``reference``, ``vllm`` and any target the conformance suite
loads are driven by the same code. A payload's first 16 bytes carry a header (sequence
number, monotonic send time in ns). Below 1 MiB it is a ``bytearray``, pickled in band; from
1 MiB on a numpy array, pickled as one out-of-band buffer, as vLLM does with tensors
(:func:`make_payload`).

- Throughput: after a warm-up that writes every chunk at least once, the writer sends as fast
  as the ring takes messages for ``cell_seconds``; each reader stamps the arrival of the first
  and last timed message (``CLOCK_MONOTONIC``, shared by all processes), and the rate is
  ``(n - 1) / (last arrival at any reader - first arrival at any reader)``.
- Latency: one message every ``latency_interval`` seconds; each reader records arrival time
  minus send time.
- Ceiling: memcpy of the same payload into a shared-memory segment, chunk after chunk as a ring
  writes, in this process.
- Baseline: ZMQ PUSH/PULL over ipc:// of the same bytes, one PUSH socket per reader (a
  broadcast), high-water marks of ``chunks`` messages.

Readers are long-lived processes (:class:`ReaderPool`, forked by a ``forkserver`` that
imported the targets' modules once) so a cell costs no interpreter start-up; they ignore
SIGINT and are stopped by the pool. Every wait is bounded by ``config.timeout``; a reader
that does not report in time is replaced.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import signal
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import zmq

from enginewire.bench.config import BenchConfig
from enginewire.bench.stats import percentile

#: Readers fork from a server process that imported the targets' modules once (vLLM's take
#: seconds), so a fresh reader starts in milliseconds.
FORKSERVER = multiprocessing.get_context("forkserver")
#: Modules each target's readers need, imported by the fork server.
PRELOAD_MODULES = {
    "reference": ("enginewire.conformance.targets.reference", "enginewire.reference.ring"),
    "vllm": ("vllm.distributed.device_communicators.shm_broadcast", "vllm.v1.serial_utils",
             "enginewire.conformance.targets.vllm.target"),
}
#: (sequence number, send time in monotonic ns); warm-up messages have sequence -1.
HEADER = struct.Struct("<qq")
WARMUP_SEQ = -1
#: The sequence number of the last message of a minimal-ring cell (that ring has no None).
END_SEQ = -2
#: The sequence number of the message that ends a burst (:class:`ThroughputCell`): each reader
#: reports the burst on its pipe and waits there, off the processor, until the next burst.
PAUSE_SEQ = -3
#: Latency warm-up messages before the recorded ones.
LATENCY_WARMUP = 5
#: vLLM's ring (and the reference's pickle codec) send buffers of this size and more out of
#: band (vllm/distributed/device_communicators/shm_broadcast.py:918-925).
OUT_OF_BAND_FROM = 1 << 20


class BenchError(RuntimeError):
    """A cell could not be measured (a timeout, a lost message, a reader error)."""


def make_payload(size: int, seed: int = 0) -> bytearray | np.ndarray:
    """``size`` random bytes (random: no page is left untouched), writable.

    Below :data:`OUT_OF_BAND_FROM` a ``bytearray``, the cheapest object to pickle that carries
    ``size`` bytes (a numpy array costs some 6 µs (the reference) to 15 µs (vLLM) more per
    message to pickle and unpickle, which would be measured instead of the ring); from there
    on a numpy array, which pickle hands over out of band as vLLM does with tensors.
    """
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    return data if size >= OUT_OF_BAND_FROM else bytearray(data.tobytes())


# --- reader processes ----------------------------------------------------------------------


def _consume(receive: Callable[[], Any], latency: bool,
             conn: Connection | None = None) -> dict[str, Any]:
    """Receive until the sentinel (None); count, check and time the timed messages.

    With ``conn``, a :data:`PAUSE_SEQ` message ends a burst: the burst's figures go to the
    parent as ``("burst", dict)``, and the reader waits on ``conn`` for ``("resume",)``
    before it counts the next burst from zero. The final report covers what came after the
    last pause.
    """
    unpack = HEADER.unpack_from
    clock = time.monotonic_ns
    count = gaps = 0
    first_seq = last_seq = -1
    t_first = t_last = 0
    delays: list[int] = []
    while True:
        message = receive()
        now = clock()
        if message is None:
            break
        seq, sent = unpack(message)
        if seq < 0:
            if seq == PAUSE_SEQ and conn is not None:
                conn.send(("burst", {"count": count, "gaps": gaps, "first_seq": first_seq,
                                     "last_seq": last_seq, "t_first_ns": t_first,
                                     "t_last_ns": t_last, "delays_ns": [], "error": None}))
                command = conn.recv()
                if command[0] != "resume":
                    raise BenchError(f"expected resume after a burst, got {command[0]!r}")
                count = gaps = 0
                first_seq = last_seq = -1
                t_first = t_last = 0
            continue
        if count == 0:
            first_seq, t_first = seq, now
        elif seq != last_seq + 1:
            gaps += 1
        last_seq, t_last = seq, now
        count += 1
        if latency:
            delays.append(now - sent)
    return {"count": count, "gaps": gaps, "first_seq": first_seq, "last_seq": last_seq,
            "t_first_ns": t_first, "t_last_ns": t_last, "delays_ns": delays, "error": None}


def _borrowing(reader: Any, timeout: float) -> Callable[[], Any]:
    """A receive function over zero-copy reads: the header is copied out of the slot, the rest
    of the message is never touched (what a consumer that uses the data in place costs)."""
    borrow = reader.dequeue_borrowed

    def receive() -> bytes | None:
        with borrow(timeout) as message:
            if message is None:
                return None
            with memoryview(message) as view, view.cast("B") as raw:
                return raw[:HEADER.size].tobytes()

    return receive


def _raw(reader: Any, timeout: float) -> Callable[[], Any]:
    """A receive function over raw-buffer reads (``dequeue_views``): the header is copied out
    of the view, the rest stays in the slot until the next read; an empty message ends."""
    views = reader.dequeue_views

    def receive() -> bytes | None:
        main = views(timeout)[0]
        return main[:HEADER.size].tobytes() if main.nbytes else None

    return receive


def _read_ring(conn: Connection, targets: dict[str, Any], text: str, handle: Any, rank: int,
               latency: bool, timeout: float, borrowed: bool = False,
               raw: bool = False) -> dict[str, Any]:
    from enginewire.conformance.targets.resolve import load_target

    target = targets.get(text)
    if target is None:
        target = targets[text] = load_target(text)
    reader = target.ring.attach_reader(handle, rank)
    try:
        reader.wait_until_ready(timeout)
        receive = (_raw(reader, timeout) if raw else _borrowing(reader, timeout) if borrowed
                   else functools.partial(reader.dequeue, timeout))
        return _consume(receive, latency, conn)
    finally:
        reader.close()
        del reader
        gc.collect()  # unmaps the segment now, not whenever the next collection runs


def _read_zmq(conn: Connection, address: str, hwm: int, latency: bool,
              timeout: float) -> dict[str, Any]:
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    try:
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        conn.send(("connected", None))

        def receive() -> Any:
            frames = sock.recv_multipart(copy=False)
            return None if len(frames) == 1 else frames[0].buffer

        return _consume(receive, latency, conn)
    finally:
        sock.close(linger=0)
        context.term()


def _read_minimal(conn: Connection, name: str, n_reader: int, chunks: int, size: int,
                  rank: int, latency: bool, timeout: float) -> dict[str, Any]:
    from enginewire.bench.minimal_ring import MinimalReader
    from enginewire.reference.ring.shm import attach_untracked

    shm = attach_untracked(name)
    try:
        reader = MinimalReader(shm.buf, n_reader, chunks, size, rank)  # type: ignore[arg-type]
        conn.send(("connected", None))
        read = functools.partial(reader.read, timeout)
        unpack = HEADER.unpack_from

        def receive() -> bytes | None:
            data = read()
            return None if unpack(data)[0] == END_SEQ else data

        return _consume(receive, latency, conn)
    finally:
        del reader
        shm.close()


def reader_main(conn: Connection, preload: Sequence[str]) -> None:
    """A reader worker: load the targets, then run commands from ``conn`` until ``exit``.

    Commands: ``("ring", target_text, handle, rank, latency, timeout, borrowed, raw)``,
    ``("zmq", address, hwm, latency, timeout)`` and ``("minimal", segment_name, n_reader,
    chunks, size, rank, latency, timeout)``; each is answered by one ``("report", dict)``
    (``dict["error"]`` set when it failed), the zmq and minimal ones preceded by
    ``("connected", None)``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    from enginewire.conformance.targets.resolve import load_target

    targets: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for text in preload:
        try:
            targets[text] = load_target(text)
        except Exception as exc:  # reported to the parent, which skips the target
            problems[text] = f"{type(exc).__name__}: {exc}"
    # Everything alive now lives until the end: later collections need not scan it (a full
    # collection over vLLM's and torch's objects takes a quarter of a second).
    gc.freeze()
    conn.send(("ready", problems))
    while True:
        try:
            command = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        kind, args = command[0], command[1:]
        if kind == "exit":
            return
        try:
            if kind == "ring":
                report = _read_ring(conn, targets, *args)
            elif kind == "zmq":
                report = _read_zmq(conn, *args)
            elif kind == "minimal":
                report = _read_minimal(conn, *args)
            else:
                report = {"error": f"unknown command {kind!r}"}
        except Exception as exc:  # the parent records the failed cell
            report = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            conn.send(("report", report))
        except (BrokenPipeError, OSError):
            return


@dataclass
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    problems: dict[str, str] = field(default_factory=dict)


class ReaderPool:
    """Reader worker processes, started on demand and kept for the whole run."""

    def __init__(self, preload: Sequence[str], timeout: float) -> None:
        self.preload = tuple(preload)
        self.timeout = timeout
        self.workers: list[_Worker] = []
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    def _spawn(self) -> _Worker:
        if not self.workers:
            modules = ["enginewire.bench.ring_bench"]
            for text in self.preload:
                modules += PRELOAD_MODULES.get(text, ())
            FORKSERVER.set_forkserver_preload(modules)
        parent, child = FORKSERVER.Pipe(duplex=True)
        process = FORKSERVER.Process(target=reader_main, args=(child, self.preload), daemon=True,
                                name="enginewire-bench-reader")
        process.start()
        child.close()
        return _Worker(process, parent)

    def start(self, count: int) -> None:
        """Start workers until there are ``count`` (see :meth:`wait_ready`).

        The first start waits for the fork server to import the targets' modules."""
        self._join_background()
        self._start_now(count)

    def _start_now(self, count: int) -> None:
        while len(self.workers) < count:
            self.workers.append(self._spawn())

    def start_in_background(self, count: int) -> None:
        """:meth:`start` in a thread, so this process can import its own modules meanwhile."""

        def body() -> None:
            try:
                self._start_now(count)
            except BaseException as exc:  # re-raised by wait_ready
                self._start_error = exc

        self._starting = threading.Thread(target=body, name="enginewire-bench-readers",
                                          daemon=True)
        self._starting.start()

    def _join_background(self) -> None:
        thread, self._starting = self._starting, None
        if thread is not None:
            thread.join(self.timeout * 6)
            if thread.is_alive():
                raise BenchError("the reader processes did not start in time")
        if self._start_error is not None:
            error, self._start_error = self._start_error, None
            raise BenchError(f"the reader processes did not start: {error}") from error

    def wait_ready(self, timeout: float | None = None) -> dict[str, str]:
        """Wait until every worker loaded its targets; returns target -> load problem."""
        self._join_background()
        limit = self.timeout * 3 if timeout is None else timeout
        deadline = time.monotonic() + limit
        problems: dict[str, str] = {}
        for worker in self.workers:
            if not worker.ready:
                message = self._receive(worker, deadline, "ready")
                worker.ready = True
                worker.problems = message[1]
            problems.update(worker.problems)
        return problems

    def _receive(self, worker: _Worker, deadline: float, what: str) -> tuple[str, Any]:
        left = deadline - time.monotonic()
        try:
            if worker.conn.poll(max(0.0, left)):
                return worker.conn.recv()
        except (EOFError, OSError) as exc:
            raise BenchError(f"reader process {worker.process.pid} died ({exc})") from None
        raise BenchError(f"reader process {worker.process.pid} sent no {what} in time "
                         f"(alive: {worker.process.is_alive()})")

    def submit(self, commands: Sequence[tuple[Any, ...]], first: int = 0) -> list[_Worker]:
        """Send command ``i`` to worker ``first + i`` (starting workers as needed): cells open
        at the same time use disjoint workers."""
        self.start(first + len(commands))
        self.wait_ready()
        chosen = self.workers[first:first + len(commands)]
        for worker, command in zip(chosen, commands, strict=True):
            worker.conn.send(command)
        return chosen

    def wait_status(self, workers: Sequence[_Worker], status: str) -> None:
        """Wait for an intermediate ``status`` message from each of ``workers``."""
        deadline = time.monotonic() + self.timeout
        for worker in workers:
            message = self._receive(worker, deadline, status)
            if message[0] != status:
                raise BenchError(f"reader sent {message[0]!r} before {status!r}: {message[1]}")

    def reports(self, workers: Sequence[_Worker], timeout: float | None = None,
                kind_wanted: str = "report") -> list[dict]:
        """Each worker's report (or, with ``kind_wanted="burst"``, its report of a burst); a
        worker that sends none in time is replaced, and raises. A final report also ends the
        wait for a burst (the reader failed)."""
        deadline = time.monotonic() + (self.timeout * 2 if timeout is None else timeout)
        found: list[dict] = []
        failure: BenchError | None = None
        for worker in workers:
            try:
                while True:
                    kind, body = self._receive(worker, deadline, kind_wanted)
                    if kind == kind_wanted or kind == "report":
                        found.append(body)
                        break
            except BenchError as exc:
                failure = failure or exc
                self.replace(worker)
        if failure is not None:
            raise failure
        return found

    def replace(self, worker: _Worker) -> None:
        """Stop ``worker`` and put a fresh one in its place."""
        self._stop(worker, grace=0.0)
        index = self.workers.index(worker)
        self.workers[index] = self._spawn()

    def abandon(self, workers: Sequence[_Worker]) -> None:
        """After a failed cell: collect what the workers still send (briefly), replace the
        ones that stay silent, so no stale report is read by the next cell."""
        for worker in workers:
            try:
                self.reports([worker], timeout=self.timeout + 2)
            except BenchError:
                pass

    def _stop(self, worker: _Worker, grace: float) -> None:
        self._stop_all([worker], grace)

    @staticmethod
    def _stop_all(workers: Sequence[_Worker], grace: float) -> None:
        """Ask every worker to exit, give them ``grace`` seconds together, then terminate
        (a worker busy in a cell does not read its pipe), then kill."""
        for worker in workers:
            try:
                worker.conn.send(("exit",))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + grace
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in workers:
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5)
            worker.conn.close()

    def close(self) -> None:
        """Stop every worker (exit command, then terminate, then kill); idempotent."""
        try:
            self._join_background()
        except BenchError:
            pass
        workers, self.workers = self.workers, []
        self._stop_all(workers, grace=2.0)


# --- the writer side ------------------------------------------------------------------------


class RingBench:
    """Measures ring cells; owns the reader pool, the memcpy segment and a ZMQ context."""

    def __init__(self, config: BenchConfig, preload: Sequence[str]) -> None:
        self.config = config
        self.pool = ReaderPool(preload, config.timeout)
        self._payloads: dict[int, bytearray | np.ndarray] = {}
        self._segment: shared_memory.SharedMemory | None = None
        self._context: zmq.Context | None = None

    def start(self) -> None:
        """Start the reader processes in the background (see :meth:`ReaderPool.wait_ready`)."""
        self.pool.start_in_background(self.config.max_readers())

    def payload(self, size: int) -> bytearray | np.ndarray:
        found = self._payloads.get(size)
        if found is None:
            found = self._payloads[size] = make_payload(size, seed=size)
        return found

    # --- throughput cells, open for several bursts ---

    def throughput(self, text: str, target: Any, payload_bytes: int, readers: int,
                   chunks: int, borrowed: bool = False, raw: bool = False) -> dict[str, float]:
        """``messages_per_s`` and ``gb_per_s`` of one cell of ``target``'s ring in one burst
        of ``cell_seconds`` (see :meth:`open_ring`)."""
        return self._one_burst(self.open_ring(text, target, payload_bytes, readers, chunks,
                                              borrowed=borrowed, raw=raw))

    def minimal_throughput(self, payload_bytes: int, readers: int,
                           chunks: int) -> dict[str, float]:
        """:meth:`open_minimal` in one burst of ``cell_seconds``."""
        return self._one_burst(self.open_minimal(payload_bytes, readers, chunks))

    def zmq_throughput(self, payload_bytes: int, readers: int, chunks: int) -> dict[str, float]:
        """:meth:`open_zmq` in one burst of ``cell_seconds``."""
        return self._one_burst(self.open_zmq(payload_bytes, readers, chunks))

    def memcpy(self, payload_bytes: int, chunks: int) -> dict[str, float]:
        """:meth:`open_memcpy` in one burst of ``cell_seconds``."""
        return self._one_burst(self.open_memcpy(payload_bytes, chunks))

    def _one_burst(self, cell: ThroughputCell) -> dict[str, float]:
        try:
            messages, span = cell.burst(self.config.cell_seconds, self.config.max_messages)
        finally:
            cell.close()
        return cell.figures(messages, span)

    def open_ring(self, text: str, target: Any, payload_bytes: int, readers: int, chunks: int,
                  *, borrowed: bool = False, raw: bool = False,
                  first_worker: int = 0) -> ThroughputCell:
        """A fresh ring of ``target`` with ``readers`` reader processes (workers from
        ``first_worker`` on), ready for bursts; ``borrowed``: the readers use zero-copy reads
        (``dequeue_borrowed``); ``raw``: the writer sends the payload as a raw buffer
        (``enqueue_buffers``, no pickle) and the readers take views (``dequeue_views``)."""
        send, workers, release = self._open_ring(text, target, readers, chunks, latency=False,
                                                 borrowed=borrowed, raw=raw,
                                                 first_worker=first_worker)
        return ThroughputCell(self, self.payload(payload_bytes), chunks, send,
                              lambda: send(None), workers, release)

    def latency(self, text: str, target: Any, readers: int) -> tuple[dict[str, float], list]:
        """p50 and p99 delay (µs) of messages sent at a low rate through ``target``'s ring,
        and every delay (µs)."""
        return self._measure_latency(*self._open_ring(text, target, readers,
                                                      self.config.base_chunks, latency=True))

    def _measure_latency(self, send: Callable[[Any], None], workers: list[_Worker],
                         release: Callable[[bool], None]) -> tuple[dict[str, float], list]:
        """Trickle the latency payload through an open contender (its ``send``, None ending
        it; its readers' ``workers``; its ``release(failed)``, called in any case): p50 and
        p99 delay (µs) and every delay (µs)."""
        payload = self.payload(self.config.latency_payload)
        failed = True
        try:
            sent = self._trickle(send, payload)
            send(None)
            reports = self.pool.reports(workers)
            failed = False
        finally:
            release(failed)
        return _delays(reports, sent)

    def _open_ring(self, text: str, target: Any, readers: int, chunks: int, *, latency: bool,
                   borrowed: bool = False, raw: bool = False, first_worker: int = 0,
                   ) -> tuple[Callable[[Any], None], list[_Worker], Callable[[bool], None]]:
        """A fresh ring, its readers attached and ready: its bounded send (None: the end of
        the cell), the readers' workers and ``release(failed)``."""
        timeout = self.config.timeout
        writer = target.ring.create_writer(n_reader=readers,
                                           max_chunk_bytes=self.config.chunk_bytes,
                                           max_chunks=chunks)
        workers: list[_Worker] = []

        def release(failed: bool) -> None:
            writer.close()
            # After a failure the readers still wait (until their timeout): drain them so no
            # stale report reaches the next cell. Not on Ctrl-C: close() stops them.
            if failed and workers:
                self.pool.abandon(workers)

        try:
            workers = self.pool.submit([("ring", text, writer.handle, rank, latency, timeout,
                                         borrowed, raw) for rank in range(readers)],
                                       first_worker)
            writer.wait_until_ready(timeout)
        except BaseException:
            release(True)
            raise
        if raw:
            enqueue_buffers = writer.enqueue_buffers

            def bounded(payload: Any) -> None:
                enqueue_buffers([b""] if payload is None else [payload], timeout)
        else:
            bounded = functools.partial(writer.enqueue, timeout=timeout)  # no frame
        return bounded, workers, release

    def _stream(self, enqueue: Callable[[Any], None], payload: Any, chunks: int,
                seconds: float, warmup_seconds: float, limit: int) -> int:
        """Warm up, then send as fast as ``enqueue`` returns for ``seconds`` (at most
        ``limit`` messages); the number of timed messages."""
        pack = HEADER.pack_into
        clock = time.monotonic_ns
        warm_until = clock() + int(warmup_seconds * 1e9)
        warm = 0
        while warm < chunks + 2 or clock() < warm_until:
            pack(payload, 0, WARMUP_SEQ, 0)
            enqueue(payload)
            warm += 1
        deadline = clock() + int(seconds * 1e9)
        seq = 0
        while True:
            now = clock()
            pack(payload, 0, seq, now)
            enqueue(payload)
            seq += 1
            if now >= deadline or seq >= limit:
                return seq

    def _trickle(self, enqueue: Callable[[Any], None], payload: Any) -> int:
        """One message every ``latency_interval`` s; the number of recorded messages."""
        pack = HEADER.pack_into
        interval = self.config.latency_interval
        for _ in range(LATENCY_WARMUP):
            pack(payload, 0, WARMUP_SEQ, 0)
            enqueue(payload)
            time.sleep(interval)
        start = time.monotonic()
        count = self.config.latency_messages
        for seq in range(count):
            pack(payload, 0, seq, time.monotonic_ns())
            enqueue(payload)
            pause = start + (seq + 1) * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        return count

    # --- memcpy ceiling ---

    def open_memcpy(self, payload_bytes: int, chunks: int) -> ThroughputCell:
        """Copies of the payload into shared memory, chunk by chunk as a ring writer makes
        them, in this process: a cell without readers."""
        stride = self.config.chunk_bytes
        target = self._memcpy_segment().buf
        source = memoryview(self.payload(payload_bytes)).cast("B")  # type: ignore[arg-type]
        size = payload_bytes
        clock = time.monotonic_ns
        state = {"index": 0}

        def copies(seconds: float, warmup_seconds: float, limit: int) -> tuple[int, float]:
            warm_until = clock() + int(warmup_seconds * 1e9)
            index = state["index"]
            warm = 0
            while warm < chunks or clock() < warm_until:
                offset = (index % chunks) * stride
                target[offset:offset + size] = source  # type: ignore[index]
                index += 1
                warm += 1
            count = 0
            start = clock()
            deadline = start + int(seconds * 1e9)
            limit *= 10
            while True:
                offset = (index % chunks) * stride
                target[offset:offset + size] = source  # type: ignore[index]
                index += 1
                count += 1
                now = clock()
                if now >= deadline or count >= limit:
                    break
            state["index"] = index
            return count, (now - start) / 1e9

        return ThroughputCell(self, self.payload(payload_bytes), chunks, None, None, [],
                              lambda failed: source.release(), copies=copies)

    def _memcpy_segment(self) -> shared_memory.SharedMemory:
        if self._segment is None:
            size = max(self.config.chunks) * self.config.chunk_bytes
            self._segment = shared_memory.SharedMemory(create=True, size=size)
        return self._segment

    # --- minimal broadcast ring (ceiling of the message rate) ---

    def open_minimal(self, payload_bytes: int, readers: int, chunks: int,
                     first_worker: int = 0) -> ThroughputCell:
        """:mod:`.minimal_ring` with ``readers`` reader processes: flags and memcpy, nothing
        else, timed exactly as a ring target's cell."""
        from enginewire.bench.minimal_ring import MinimalWriter, create

        timeout = self.config.timeout
        payload = self.payload(payload_bytes)
        segment = create(readers, chunks, payload_bytes)
        workers: list[_Worker] = []
        holder: list[Any] = []

        def release(failed: bool) -> None:
            holder.clear()
            segment.close()
            segment.unlink()
            if failed and workers:
                self.pool.abandon(workers)

        try:
            holder.append(MinimalWriter(segment.buf, readers, chunks,  # type: ignore[arg-type]
                                        payload_bytes))
            workers = self.pool.submit([("minimal", segment.name, readers, chunks,
                                         payload_bytes, rank, False, timeout)
                                        for rank in range(readers)], first_worker)
            self.pool.wait_status(workers, "connected")
        except BaseException:
            release(True)
            raise
        write = holder[0].write
        end = bytearray(memoryview(payload).cast("B"))  # type: ignore[arg-type]
        HEADER.pack_into(end, 0, END_SEQ, 0)
        return ThroughputCell(self, payload, chunks, lambda data: write(data, timeout),
                              lambda: write(end, timeout), workers, release)

    # --- ZMQ PUSH/PULL baseline ---

    def open_zmq(self, payload_bytes: int, readers: int, chunks: int,
                 first_worker: int = 0) -> ThroughputCell:
        """The same bytes over ZMQ PUSH/PULL, one socket per reader, high-water marks of
        ``chunks`` messages."""
        push, workers, release = self._open_zmq(readers, chunks, latency=False,
                                                first_worker=first_worker)
        return ThroughputCell(self, self.payload(payload_bytes), chunks, push,
                              lambda: push(None), workers, release)

    def zmq_latency(self, readers: int) -> tuple[dict[str, float], list]:
        """:meth:`latency` of the ZMQ PUSH/PULL baseline."""
        return self._measure_latency(*self._open_zmq(readers, self.config.base_chunks,
                                                     latency=True))

    def _open_zmq(self, readers: int, hwm: int, *, latency: bool, first_worker: int = 0,
                  ) -> tuple[Callable[[Any], None], list[_Worker], Callable[[bool], None]]:
        from enginewire.reference.addresses import ipc_address, remove_ipc_file

        timeout = self.config.timeout
        if self._context is None:
            self._context = zmq.Context()
        addresses = [ipc_address() for _ in range(readers)]
        sockets: list[zmq.Socket] = []
        workers: list[_Worker] = []

        def release(failed: bool) -> None:
            for sock in sockets:
                sock.close(linger=0)
            for address in addresses:
                remove_ipc_file(address)
            if failed and workers:
                self.pool.abandon(workers)

        try:
            for address in addresses:
                sock = self._context.socket(zmq.PUSH)
                sockets.append(sock)
                sock.setsockopt(zmq.SNDHWM, hwm)
                sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
                sock.setsockopt(zmq.LINGER, 0)
                sock.bind(address)
            workers = self.pool.submit([("zmq", address, hwm, latency, timeout)
                                        for address in addresses], first_worker)
            self.pool.wait_status(workers, "connected")
        except BaseException:
            release(True)
            raise

        def push(payload: Any) -> None:
            if payload is None:
                for sock in sockets:
                    sock.send(b"")
                return
            view = memoryview(payload)
            # The header travels in its own frame (a copy): the body is sent without a
            # copy and must not change while zmq still holds it.
            frames = [bytes(view[:HEADER.size]), view[HEADER.size:]]
            for sock in sockets:
                sock.send_multipart(frames, copy=False)  # type: ignore[arg-type]

        return push, workers, release

    def close(self) -> None:
        """Stop the readers, free the memcpy segment, close the ZMQ context; idempotent."""
        try:
            self.pool.close()
        finally:
            if self._segment is not None:
                segment, self._segment = self._segment, None
                segment.close()
                segment.unlink()
            if self._context is not None:
                context, self._context = self._context, None
                context.term()


class ThroughputCell:
    """One contender of one throughput cell, set up once and measured in bursts.

    The ring (or socket, or segment) and its readers stay open between bursts; after each
    burst the writer sends a :data:`PAUSE_SEQ` message and every reader reports the burst and
    waits on its pipe (blocked, taking no processor) until the next one. So the contenders of
    a cell can take turns burst by burst (:meth:`burst`), each burst timed as a whole cell
    is: ``(n - 1)`` messages over the span between the first and the last arrival at any
    reader. :meth:`close` ends the cell (the sentinel, the readers' final reports, the
    release).
    """

    def __init__(self, bench: RingBench, payload: Any, chunks: int,
                 send: Callable[[Any], None] | None, end: Callable[[], None] | None,
                 workers: list[_Worker], release: Callable[[bool], None], *,
                 copies: Callable[[float, float, int], tuple[int, float]] | None = None,
                 ) -> None:
        self.bench = bench
        self.payload = payload
        self.payload_bytes = memoryview(payload).nbytes
        self.chunks = chunks
        self.workers = workers
        self._send = send
        self._end = end
        self._release = release
        self._copies = copies
        self._bursts = 0
        self._parked = False
        self._closed = False
        self._failed = False

    def burst(self, seconds: float, limit: int) -> tuple[int, float]:
        """Send for ``seconds`` (at most ``limit`` messages; the first burst warms up for
        ``warmup_seconds``, later ones write every chunk once); the timed messages less one
        and the seconds they spanned."""
        config = self.bench.config
        warmup = config.warmup_seconds if self._bursts == 0 else 0.0
        self._bursts += 1
        if self._copies is not None:
            return self._copies(seconds, warmup, limit)
        assert self._send is not None
        try:
            if self._parked:
                for worker in self.workers:
                    worker.conn.send(("resume",))
                self._parked = False
            sent = self.bench._stream(self._send, self.payload, self.chunks, seconds, warmup,
                                      limit)
            HEADER.pack_into(self.payload, 0, PAUSE_SEQ, 0)
            self._send(self.payload)
            self._parked = True
            reports = self.bench.pool.reports(self.workers, kind_wanted="burst")
        except BaseException:
            self._failed = True
            raise
        return _span(reports, sent)

    def figures(self, messages: int, span: float) -> dict[str, float]:
        """``messages_per_s`` and ``gb_per_s`` of ``messages`` over ``span`` seconds."""
        if span <= 0:
            raise BenchError("no time passed between the first and the last message")
        rate = messages / span
        return {"messages_per_s": rate, "gb_per_s": rate * self.payload_bytes / 1e9}

    def close(self) -> None:
        """End the cell: the readers leave (their final reports), the ring is released."""
        if self._closed:
            return
        self._closed = True
        failed = self._failed
        try:
            if not failed and self._end is not None:
                if self._parked:
                    for worker in self.workers:
                        worker.conn.send(("resume",))
                self._end()
                for report in self.bench.pool.reports(self.workers):
                    if report.get("error"):
                        raise BenchError(f"reader: {report['error']}")
        except BaseException:
            failed = True
            raise
        finally:
            self._release(failed)


def _checked(reports: list[dict], sent: int) -> list[dict]:
    for rank, report in enumerate(reports):
        if report.get("error"):
            raise BenchError(f"reader {rank}: {report['error']}")
        if report["count"] != sent or report["gaps"]:
            raise BenchError(f"reader {rank} got {report['count']} of {sent} messages "
                             f"({report['gaps']} gaps)")
    return reports


def _span(reports: list[dict], sent: int) -> tuple[int, float]:
    """The timed messages less one and the seconds between the first arrival at any reader
    and the last (the rate is their quotient)."""
    _checked(reports, sent)
    if sent < 2:
        raise BenchError(f"only {sent} timed message(s): the cell is too short")
    span = max(r["t_last_ns"] for r in reports) - min(r["t_first_ns"] for r in reports)
    if span <= 0:
        raise BenchError("no time passed between the first and the last message")
    return sent - 1, span / 1e9


def _delays(reports: list[dict], sent: int) -> tuple[dict[str, float], list[float]]:
    _checked(reports, sent)
    delays = [d / 1000 for r in reports for d in r["delays_ns"]]
    if not delays:
        raise BenchError("no latency samples")
    return {"p50_us": percentile(delays, 50), "p99_us": percentile(delays, 99)}, delays
