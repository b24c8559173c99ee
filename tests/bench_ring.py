"""Benchmarks: the reference ring against vLLM's MessageQueue and a raw memcpy, side by side.

Run with ``pytest tests/bench_ring.py --benchmark-only`` (add ``-s`` for the summary table).

- ``messages``: 1 KiB messages (pickled bytes) from a writer to 2 reader processes; one round
  sends a batch and ends when both readers have received all of it. ``reference`` readers
  unpickle through the allow-list, ``reference-trusted`` ones without it.
- ``bandwidth``: 1, 4 and 16 MiB numpy arrays (out of band in both implementations) to 1 reader
  process, against copying the same bytes into a shared-memory segment in this process. Both
  ``dequeue``s copy every array out of the slot into fresh memory (vLLM's semantics);
  ``reference-borrowed`` reads with ``dequeue_borrowed`` instead (arrays view the slot).

Besides wall-clock rates the summary reports the CPU time all processes of a pipeline spent
per message (writer and readers, zmq I/O threads included): on a shared machine wall-clock
rates swing with the load of other processes, CPU time per message much less.

Targets (reported, not asserted): the reference ring moves at least 3x the messages per second
of vLLM's at 1 KiB with 2 readers, and at least 80% of the memcpy bandwidth at 1 MiB and up.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import pytest
from ring_helpers import SPAWN

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
SMALL = 1024
BANDWIDTH_SIZES = [1 * MIB, 4 * MIB, 16 * MIB]
BIG_CHUNK = 16 * MIB + 64 * 1024
ROUNDS = 5
IMPLEMENTATIONS = ["reference", "reference-trusted", "reference-msgspec", "vllm"]
#: The payload codec of each reference variant: "reference" reads pickle through the spec's
#: allow-list (ring.payload.pickle-allow-list), "reference-trusted" unpickles anything, so the
#: two side by side give the allow-list's cost.
CODECS = {"reference-msgspec": "msgspec", "reference-trusted": "pickle-trusted"}


#: Ends a round: a reader acknowledges it with the number of messages it received.
END_OF_ROUND = "end of round"


def _batch(size: int) -> int:
    """Messages per round: about 64 MiB or 3000 messages, whichever is fewer."""
    return max(4, min(3000, 64 * MIB // size))


def bench_reader(conn: Connection, impl: str, handle: Any, rank: int) -> None:
    """Receive messages until ``None``; answer every END_OF_ROUND with the count and the CPU
    seconds of this process since the last one."""
    if impl == "vllm":
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

        queue = MessageQueue.create_from_handle(handle, rank)
        queue.wait_until_ready()
    else:
        from enginewire.reference.ring import MessageQueue as Reference

        codec = CODECS.get(impl, "pickle")
        queue = Reference.create_from_handle(handle, rank, codec=codec)
        queue.wait_until_ready(timeout=120)
    received = 0
    cpu = time.process_time()
    while True:
        if impl == "reference-borrowed":
            with queue.dequeue_borrowed(timeout=120) as obj:
                if obj is not None and not isinstance(obj, str):
                    obj[-1]  # touch the data the way a consumer would start to  # noqa: B018
        else:
            obj = queue.dequeue(timeout=120)
        if obj is None:
            break
        if isinstance(obj, str) and obj == END_OF_ROUND:
            now = time.process_time()
            conn.send((received, now - cpu))
            received, cpu = 0, now
        else:
            received += 1
    conn.close()


class Pipeline:
    """A writer here, ``n_readers`` reader processes, batches acknowledged by every reader."""

    def __init__(self, impl: str, n_readers: int, max_chunk_bytes: int,
                 max_chunks: int) -> None:
        self.impl = impl
        self.cpu_seconds = 0.0
        self.messages = 0
        if impl == "vllm":
            from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

            self.writer = MessageQueue(n_readers, n_readers, max_chunk_bytes=max_chunk_bytes,
                                       max_chunks=max_chunks)
        else:
            from enginewire.reference.ring import MessageQueue as Reference

            codec = CODECS.get(impl, "pickle")
            self.writer = Reference(n_readers, n_readers, max_chunk_bytes=max_chunk_bytes,
                                    max_chunks=max_chunks, codec=codec)
        self.conns: list[Connection] = []
        self.processes = []
        for rank in range(n_readers):
            parent, child = SPAWN.Pipe(duplex=False)
            process = SPAWN.Process(target=bench_reader, daemon=True,
                                    args=(child, impl, self.writer.export_handle(), rank))
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)
        if impl == "vllm":
            self.writer.wait_until_ready()
        else:
            self.writer.wait_until_ready(timeout=120)

    def round(self, obj: Any, batch: int) -> None:
        """Send ``batch`` copies of ``obj`` and wait until every reader has all of them."""
        enqueue = self.writer.enqueue
        cpu = time.process_time()
        for _ in range(batch):
            enqueue(obj, timeout=60)
        enqueue(END_OF_ROUND, timeout=60)
        self.cpu_seconds += time.process_time() - cpu
        for conn in self.conns:
            if not conn.poll(60):
                raise TimeoutError(f"{self.impl}: a reader did not finish its round in 60 s")
            received, reader_cpu = conn.recv()
            if received != batch:
                raise AssertionError(f"{self.impl}: a reader got {received} of {batch}")
            self.cpu_seconds += reader_cpu
        self.messages += batch

    def reset_cpu(self) -> None:
        self.cpu_seconds, self.messages = 0.0, 0

    def cpu_per_message_us(self) -> float:
        return self.cpu_seconds / max(1, self.messages) * 1e6

    def close(self) -> None:
        try:
            self.writer.enqueue(None, timeout=10)
        finally:
            for process in self.processes:
                process.join(30)
                if process.is_alive():
                    process.terminate()
                    process.join(10)
            for conn in self.conns:
                conn.close()
            if self.impl != "vllm":
                self.writer.close()
            del self.writer
            gc.collect()  # vLLM unlinks its segment when its queue is collected


class Results:
    """Messages per second, MB/s and CPU per message by (scenario, implementation)."""

    def __init__(self) -> None:
        self.rates: dict[tuple[str, str], tuple[float, float]] = {}
        self.cpu_us: dict[tuple[str, str], float] = {}

    def record(self, benchmark: Any, scenario: str, impl: str, batch: int, size: int,
               pipeline: Pipeline | None = None) -> None:
        seconds = benchmark.stats.stats.mean
        rate = batch / seconds
        self.rates[(scenario, impl)] = (rate, rate * size / 1e6)
        benchmark.extra_info.update(messages_per_round=batch, payload_bytes=size,
                                    messages_per_s=round(rate), megabytes_per_s=round(
                                        rate * size / 1e6))
        if pipeline is not None:
            self.cpu_us[(scenario, impl)] = pipeline.cpu_per_message_us()
            benchmark.extra_info["cpu_us_per_message"] = round(pipeline.cpu_per_message_us(), 1)

    def summary(self) -> list[str]:
        lines = ["", "ring benchmarks (mean of rounds):"]
        for (scenario, impl), (rate, mbps) in sorted(self.rates.items()):
            cpu = self.cpu_us.get((scenario, impl))
            lines.append(f"  {scenario:<18} {impl:<18} {rate:>12,.0f} msg/s {mbps:>10,.0f} MB/s"
                         + (f" {cpu:>10,.1f} CPU us/msg" if cpu is not None else ""))
        small = {impl: rate for (s, impl), (rate, _) in self.rates.items() if s == "1KiB-2readers"}
        cpus = {impl: cpu for (s, impl), cpu in self.cpu_us.items() if s == "1KiB-2readers"}
        if "vllm" in small:
            for impl in ("reference", "reference-msgspec"):
                if impl in small:
                    lines.append(f"  {impl} / vllm at 1 KiB, 2 readers: "
                                 f"{small[impl] / small['vllm']:.2f}x msg/s (target >= 3x), "
                                 f"{cpus['vllm'] / cpus[impl]:.2f}x less CPU per message")
        if "reference" in small and "reference-trusted" in small:
            ratio = small["reference"] / small["reference-trusted"]
            extra = cpus["reference"] - cpus["reference-trusted"]
            lines.append(f"  allow-list cost at 1 KiB, 2 readers: reference (allow-list) / "
                         f"reference-trusted = {ratio:.3f}x msg/s, {extra:+.1f} CPU us/msg")
        for size in BANDWIDTH_SIZES:
            scenario = f"{size // MIB}MiB-1reader"
            base = self.rates.get((scenario, "memcpy"))
            for impl in ("reference", "reference-borrowed", "vllm"):
                if base and (scenario, impl) in self.rates:
                    share = self.rates[(scenario, impl)][1] / base[1]
                    lines.append(f"  {impl} / memcpy at {size // MIB} MiB: {share:.0%}"
                                 + ("" if impl == "vllm" else " (target >= 80%)"))
        return lines


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest) -> Iterator[Results]:
    found = Results()
    yield found
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n".join(found.summary()))


@pytest.fixture(scope="module")
def pipelines() -> Iterator[dict[tuple[str, str], Pipeline]]:
    """Pipelines by (implementation, scenario), started on first use, closed at the end."""
    made: dict[tuple[str, str], Pipeline] = {}
    yield made
    for pipeline in made.values():
        pipeline.close()


def get_pipeline(pipelines: dict[tuple[str, str], Pipeline], impl: str,
                 scenario: str) -> Pipeline:
    key = (impl, scenario)
    if key not in pipelines:
        if impl == "vllm":
            pytest.importorskip("vllm")
        if scenario == "small":
            pipelines[key] = Pipeline(impl, 2, 64 * 1024, 10)
        else:
            pipelines[key] = Pipeline(impl, 1, BIG_CHUNK, 4)
    return pipelines[key]


@pytest.mark.benchmark(group="1KiB-2readers")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_messages_1kib_two_readers(benchmark: Any, pipelines: dict[tuple[str, str], Pipeline],
                                   results: Results, impl: str) -> None:
    batch = _batch(SMALL)
    pipeline = get_pipeline(pipelines, impl, "small")
    payload = b"x" * SMALL
    pipeline.round(payload, batch)  # warm up
    pipeline.reset_cpu()
    benchmark.pedantic(pipeline.round, args=(payload, batch), rounds=ROUNDS, iterations=1)
    results.record(benchmark, "1KiB-2readers", impl, batch, SMALL, pipeline)


@pytest.mark.parametrize("size", BANDWIDTH_SIZES, ids=lambda size: f"{size // MIB}MiB")
@pytest.mark.parametrize("impl", ["reference", "reference-borrowed", "vllm"])
def test_bandwidth_one_reader(benchmark: Any, pipelines: dict[tuple[str, str], Pipeline],
                              results: Results, impl: str, size: int) -> None:
    numpy = pytest.importorskip("numpy")
    benchmark.group = f"{size // MIB}MiB-1reader"
    batch = _batch(size)
    pipeline = get_pipeline(pipelines, impl, "bandwidth")
    array = numpy.frombuffer(bytes(range(256)) * (size // 256), dtype=numpy.uint8)
    pipeline.round(array, batch)  # warm up
    pipeline.reset_cpu()
    benchmark.pedantic(pipeline.round, args=(array, batch), rounds=ROUNDS, iterations=1)
    results.record(benchmark, f"{size // MIB}MiB-1reader", impl, batch, size, pipeline)


@pytest.mark.parametrize("size", BANDWIDTH_SIZES, ids=lambda size: f"{size // MIB}MiB")
def test_bandwidth_memcpy_into_shared_memory(benchmark: Any, results: Results,
                                             size: int) -> None:
    benchmark.group = f"{size // MIB}MiB-1reader"
    batch = _batch(size)
    source = bytes(range(256)) * (size // 256)
    segment = shared_memory.SharedMemory(create=True, size=size)
    try:
        target = segment.buf

        def copy_batch() -> None:
            for _ in range(batch):
                target[:size] = source

        copy_batch()
        benchmark.pedantic(copy_batch, rounds=ROUNDS, iterations=1)
        results.record(benchmark, f"{size // MIB}MiB-1reader", "memcpy", batch, size)
    finally:
        segment.close()
        segment.unlink()
