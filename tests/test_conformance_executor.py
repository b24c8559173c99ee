"""The executor-RPC ring checks (``ring/worker/*``, ``ring/executor/*``, the request carried by
any ring): a small executor and worker over the reference ring pass them, and each broken
variant is caught by the check for the clause it breaks."""

from __future__ import annotations

import pickle
import threading
import time
from functools import partial
from typing import Any

import pytest

from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.peers.executor_peer import ResponseStatus, dumps_reply, loads_reply
from enginewire.conformance.targets.contract import RingHandle, Target
from enginewire.conformance.targets.reference import ReferenceRing, ReferenceRingWriter
from enginewire.spec import load

WORKER_CHECKS = ["ring/worker/named-method", "ring/worker/pickled-callable",
                 "ring/worker/failure-reply", "ring/worker/reply-rank"]
EXECUTOR_CHECKS = ["ring/executor/request-tuple", "ring/executor/unique-reply-rank",
                   "ring/executor/failure-raises", "ring/executor/timeout"]


@pytest.fixture(scope="module")
def spec() -> Any:
    return load()


class MiniWorker:
    """A worker after vLLM's ``WorkerProc``, over the reference ring. ``flaw`` breaks it:
    ``replies-always`` ignores output_rank, ``int-status`` replies (1, value)."""

    def __init__(self, broadcast: RingHandle, rank: int, worker: Any, flaw: str = "") -> None:
        self.rank, self.worker, self.flaw = rank, worker, flaw
        self.requests = ReferenceRing().attach_reader(broadcast, rank)
        self.responses = ReferenceRingWriter(1, 65536, 4)
        self.response_handle = self.responses.handle
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.requests.wait_until_ready(10.0)
        self.responses.wait_until_ready(10.0)
        while not self.stopping.is_set():
            try:
                method, args, kwargs, output_rank = self.requests.dequeue(timeout=0.1)
            except TimeoutError:
                continue
            func = (getattr(self.worker, method) if isinstance(method, str)
                    else partial(pickle.loads(method), self.worker))
            try:
                reply = (ResponseStatus.SUCCESS, func(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - the reply carries it
                reply = (ResponseStatus.FAILURE, str(exc))
            if output_rank in (None, self.rank) or self.flaw == "replies-always":
                if self.flaw == "int-status":
                    self.responses.enqueue((reply[0].value, reply[1]), timeout=5.0)
                else:
                    self.responses.queue.enqueue_buffers(dumps_reply(*reply), timeout=5.0)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)
        self.requests.close()
        self.responses.close()


class MiniExecutor:
    """An executor after vLLM's ``MultiprocExecutor.collective_rpc``, over the reference ring.
    ``flaw``: ``list-request`` sends a list, ``reads-every-rank`` ignores unique_reply_rank
    when reading, ``bare-timeout`` raises the queue's TimeoutError unchanged."""

    def __init__(self, world_size: int, max_chunk_bytes: int, max_chunks: int,
                 flaw: str = "") -> None:
        self.flaw = flaw
        self.broadcast = ReferenceRingWriter(world_size, max_chunk_bytes, max_chunks)
        self.broadcast_handle = self.broadcast.handle
        self.responses: list[Any] = []

    def connect(self, response_handles: list[RingHandle], timeout: float) -> None:
        self.responses = [ReferenceRing().attach_reader(h, 0) for h in response_handles]
        waits = [threading.Thread(target=end.wait_until_ready, args=(timeout,), daemon=True)
                 for end in (self.broadcast, *self.responses)]
        for wait in waits:
            wait.start()
        for wait in waits:
            wait.join(timeout)

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None,
                       unique_reply_rank: int | None = None,
                       timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        sent = method if isinstance(method, str) else pickle.dumps(method)
        request = (sent, args, kwargs or {}, unique_reply_rank)
        self.broadcast.enqueue(list(request) if self.flaw == "list-request" else request)
        queues = self.responses
        if unique_reply_rank is not None and self.flaw != "reads-every-rank":
            queues = [self.responses[unique_reply_rank]]
        values = []
        for queue in queues:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                buffers = queue.queue.dequeue_buffers(timeout=left)
            except TimeoutError as exc:
                if self.flaw == "bare-timeout":
                    raise
                raise TimeoutError(f"RPC call to {method} timed out.") from exc
            status, value = loads_reply(buffers)
            if status == ResponseStatus.FAILURE_WITH_KV_OUTPUT:
                raise RuntimeError("Worker failed with KV connector output")
            if status != ResponseStatus.SUCCESS:
                raise RuntimeError(f"Worker failed with error '{value}', please check the "
                                   "stack trace above for the root cause")
            values.append(value)
        return values[0] if unique_reply_rank is not None else values

    def close(self) -> None:
        self.broadcast.close()
        for queue in self.responses:
            queue.close()


class MiniRing(ReferenceRing):
    def __init__(self, worker_flaw: str = "", executor_flaw: str = "") -> None:
        self.worker_flaw, self.executor_flaw = worker_flaw, executor_flaw

    def start_worker(self, broadcast: RingHandle, rank: int, worker: Any) -> MiniWorker:
        return MiniWorker(broadcast, rank, worker, self.worker_flaw)

    def create_executor(self, *, world_size: int, max_chunk_bytes: int,
                        max_chunks: int) -> MiniExecutor:
        return MiniExecutor(world_size, max_chunk_bytes, max_chunks, self.executor_flaw)


def _statuses(patterns: list[str], ring: Any, spec: Any,
              timeout_scale: float = 1.0) -> dict[str, Any]:
    checks = select(all_checks(), patterns=patterns)
    assert len(checks) == len(patterns)
    return {r.check.id: r for r in run(checks, Target(name="mini", ring=ring), spec,
                                       timeout_scale=timeout_scale).results}


def test_a_sound_executor_and_worker_pass(spec: Any) -> None:
    results = _statuses(WORKER_CHECKS + EXECUTOR_CHECKS, MiniRing(), spec)
    assert {k: r.status for k, r in results.items()} == dict.fromkeys(results, PASSED), {
        k: r.message for k, r in results.items() if r.status != PASSED}


@pytest.mark.parametrize(("flaw", "caught_by", "message"), [
    ("replies-always", "ring/worker/reply-rank", "replied to a request for rank 1"),
    ("int-status", "ring/worker/named-method", "expected a member of vLLM's"),
])
def test_a_broken_worker_is_caught(spec: Any, flaw: str, caught_by: str, message: str) -> None:
    result = _statuses([caught_by], MiniRing(worker_flaw=flaw), spec)[caught_by]
    assert result.status == FAILED
    assert message in result.message


@pytest.mark.parametrize(("flaw", "caught_by", "message"), [
    ("list-request", "ring/executor/request-tuple", "expected the tuple"),
    ("reads-every-rank", "ring/executor/unique-reply-rank", "does it wait for every rank?"),
    ("bare-timeout", "ring/executor/timeout", "expected TimeoutError: RPC call to slow_step"),
])
def test_a_broken_executor_is_caught(spec: Any, flaw: str, caught_by: str,
                                     message: str) -> None:
    # Shorter waits: a reply that a broken executor's request never gets, or that it waits
    # for in vain, would not come later either.
    result = _statuses([caught_by], MiniRing(executor_flaw=flaw), spec,
                       timeout_scale=0.3)[caught_by]
    assert result.status == FAILED
    assert message in result.message


def test_an_executor_with_its_own_failure_messages_is_caught(spec: Any) -> None:
    class Terse(MiniExecutor):
        def collective_rpc(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().collective_rpc(*args, **kwargs)
            except RuntimeError as exc:
                raise RuntimeError("worker failed") from exc

    class TerseRing(MiniRing):
        def create_executor(self, **options: Any) -> Terse:
            return Terse(**options)

    check = "ring/executor/failure-raises"
    result = _statuses([check], TerseRing(), spec)[check]
    assert result.status == FAILED
    assert result.first_line.startswith("a FAILURE reply raised RuntimeError: worker failed")


def test_a_ring_that_turns_tuples_into_lists_is_caught(spec: Any) -> None:
    """The msgspec payload codec (enginewire peers only) carries an executor request as a
    list: the request checks of plain rings fail on it, and pass on pickle."""
    from enginewire.conformance.targets.reference import _ReferenceRingEnd, ring_handle
    from enginewire.reference.ring import Handle, MessageQueue

    class MsgspecRing(ReferenceRing):
        def attach_reader(self, handle: RingHandle, rank: int) -> Any:
            native = Handle(local_reader_ranks=list(range(handle.n_reader)),
                            buffer_handle=(handle.n_reader, handle.max_chunk_bytes,
                                           handle.max_chunks, handle.shm_name),
                            local_subscribe_addr=handle.subscribe_address,
                            local_notify_addr=handle.notify_address)
            return _ReferenceRingEnd(MessageQueue.create_from_handle(native, rank,
                                                                     codec="msgspec"))

        def create_writer(self, *, n_reader: int, max_chunk_bytes: int,
                          max_chunks: int) -> Any:
            end = _ReferenceRingEnd(MessageQueue(n_reader, n_reader,
                                                 max_chunk_bytes=max_chunk_bytes,
                                                 max_chunks=max_chunks, codec="msgspec"))
            end.handle = ring_handle(end.queue.export_handle(), n_reader)
            return end

    patterns = ["ring/reader/executor-request-carried", "ring/writer/executor-request-carried"]
    assert {r.status for r in _statuses(patterns, ReferenceRing(), spec).values()} == {PASSED}
    assert {r.status for r in _statuses(patterns, MsgspecRing(), spec).values()} == {FAILED}
