"""The reference executor RPC (``enginewire.reference.ring.rpc`` and ``.executor``): its message
codec, its executor and workers against each other, against vLLM's own ``WorkerProc`` busy loop
and ``MultiprocExecutor.collective_rpc``, and the power of the ``ring.worker.*`` /
``ring.executor.*`` checks over it (each broken variant is caught)."""

from __future__ import annotations

import pickle
import pickletools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from ring_helpers import readers

from enginewire.reference.errors import ExecutorError, ProtocolTimeout, StateError, WorkerFailure
from enginewire.reference.ring import Executor, ResponseStatus, Worker, rpc
from enginewire.reference.ring import executor as executor_module
from enginewire.reference.ring.rpc import ReplyCodec

__all__ = ["readers"]  # a fixture used by name

CHUNK = 65536
CHUNKS = 4
READY = 10.0


class Calls:
    """The worker object: records every call; ``fail`` raises, ``wait`` blocks on an event."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.calls: list[str] = []
        self.release = threading.Event()

    def echo(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
        self.calls.append("echo")
        return (self.rank, args, kwargs)

    def fail(self, message: str) -> None:
        self.calls.append("fail")
        raise ValueError(message)

    def wait(self) -> str:
        self.calls.append("wait")
        self.release.wait(READY)
        return "late"

    def tensor(self, n: int) -> Any:
        import torch

        return torch.arange(n) + self.rank


def plus_rank(worker: Calls, offset: int) -> int:
    """Sent pickled: called with the worker first."""
    return worker.rank + offset


# --- the message codec -------------------------------------------------------------------------


def test_a_request_is_the_plain_four_tuple() -> None:
    request = rpc.make_request("echo", (1,), None, 1)
    assert type(request) is tuple and request == ("echo", (1,), {}, 1)
    assert rpc.parse_request(pickle.loads(pickle.dumps(request))) == request
    sent = rpc.make_request(plus_rank, (2,))
    assert isinstance(sent[0], bytes) and pickle.loads(sent[0]) is plus_rank
    assert rpc.resolve_method(sent[0], Calls(3))(2) == 5


@pytest.mark.parametrize("bad", [
    ["echo", (), {}, None],
    ("echo", (), {}),
    (1, (), {}, None),
    ("echo", [], {}, None),
    ("echo", (), [], None),
    ("echo", (), {}, -1),
    ("echo", (), {}, "0"),
])
def test_a_malformed_request_names_the_clause(bad: Any) -> None:
    with pytest.raises(ExecutorError) as caught:
        rpc.parse_request(bad)
    assert caught.value.clause == "ring.executor.rpc-request"


def test_make_request_refuses_a_list_of_args() -> None:
    with pytest.raises(ExecutorError, match="args is a tuple"):
        rpc.make_request("echo", [1])  # type: ignore[arg-type]


def _globals(stream: bytes) -> list[tuple[str, str]]:
    """(module, name) of every STACK_GLOBAL in a pickle stream."""
    found, strings = [], []
    for op, arg, _ in pickletools.genops(stream):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE"):
            strings.append(arg)
        if op.name == "STACK_GLOBAL":
            found.append((strings[-2], strings[-1]))
    return found


class _NoVllm(pickle._Unpickler):  # type: ignore[misc, name-defined]
    """The pure-Python unpickler (stricter about frames), refusing to import vLLM."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == (rpc.RESPONSE_MODULE, rpc.RESPONSE_QUALNAME):
            return ResponseStatus
        assert not module.startswith("vllm"), (module, name)
        return super().find_class(module, name)


@pytest.mark.parametrize("value", [
    None, "boom", (1, "two", {"k": 3}), b"x" * 100_000,
    [shared := [1, 2], shared, {"again": shared}],  # memo references inside the value
])
def test_a_reply_names_vllms_status_class_and_reads_back(value: Any) -> None:
    import io

    codec = ReplyCodec()
    for status in ResponseStatus:
        buffers = codec.encode((status, value))
        assert _globals(bytes(buffers[0]))[0] == (rpc.RESPONSE_MODULE, rpc.RESPONSE_QUALNAME)
        got = codec.decode(buffers[0], buffers[1:])
        assert got == (status, value) and got[0] is status
        again = _NoVllm(io.BytesIO(bytes(buffers[0])), buffers=buffers[1:]).load()
        assert again == (status, value)
    if isinstance(value, list):
        assert got[1][0] is got[1][1] is got[1][2]["again"]


def test_a_reply_keeps_large_buffers_out_of_band() -> None:
    import numpy as np

    array = np.arange(1 << 18, dtype=np.int64)  # 2 MiB
    buffers = ReplyCodec().encode((ResponseStatus.SUCCESS, array))
    assert len(buffers) == 2 and len(bytes(buffers[0])) < 4096
    status, got = ReplyCodec().decode(buffers[0], [bytearray(b) for b in buffers[1:]])
    assert status is ResponseStatus.SUCCESS and (got == array).all()


@pytest.mark.parametrize("bad", [(1, "x"), (ResponseStatus.SUCCESS,), [ResponseStatus.SUCCESS, 1]])
def test_only_a_status_and_value_are_a_reply(bad: Any) -> None:
    with pytest.raises(ExecutorError) as caught:
        ReplyCodec().encode(bad)
    assert caught.value.clause == "ring.executor.response"
    with pytest.raises(ExecutorError) as caught:
        rpc.parse_reply(bad, 0)
    assert caught.value.clause == "ring.executor.response"


def test_failure_replies_become_vllms_errors() -> None:
    assert rpc.reply_error(ResponseStatus.SUCCESS, "x", 0) is None
    error = rpc.reply_error(*rpc.failure(ValueError("boom")), rank=1)
    assert isinstance(error, RuntimeError) and isinstance(error, WorkerFailure)
    assert error.clause == "ring.executor.failure" and error.rank == 1
    assert error.message == ("Worker failed with error 'boom', please check the stack trace "
                             "above for the root cause")
    kv = rpc.reply_error(ResponseStatus.FAILURE_WITH_KV_OUTPUT, None, 0)
    assert kv is not None and kv.message == "Worker failed with KV connector output"
    timeout = rpc.rpc_timeout("step")
    assert isinstance(timeout, TimeoutError) and timeout.message == "RPC call to step timed out."


# --- reference executor, reference workers -------------------------------------------------------


@contextmanager
def serving(broadcast: Any, objects: list[Calls], **options: Any) -> Iterator[list[Worker]]:
    """Reference workers serving ``objects`` on threads; stopped and closed on exit."""
    workers: list[Worker] = []
    threads: list[threading.Thread] = []
    try:
        for rank, obj in enumerate(objects):
            worker = Worker(broadcast, rank, obj, max_chunk_bytes=CHUNK, max_chunks=CHUNKS,
                            **options)
            workers.append(worker)

            def run(w: Worker = worker) -> None:
                w.wait_until_ready(READY)
                w.serve()

            threads.append(threading.Thread(target=run, daemon=True))
            threads[-1].start()
        yield workers
    finally:
        for obj in objects:
            obj.release.set()
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(READY)
        for worker in workers:
            worker.close()
    assert not any(t.is_alive() for t in threads)


@contextmanager
def reference_pair(count: int) -> Iterator[tuple[Executor, list[Calls]]]:
    objects = [Calls(rank) for rank in range(count)]
    with Executor(count, max_chunk_bytes=CHUNK, max_chunks=CHUNKS) as executor, \
            serving(executor.broadcast_handle, objects) as workers:
        executor.connect([w.response_handle for w in workers], READY)
        yield executor, objects


def test_collective_rpc_returns_every_rank_in_order() -> None:
    with reference_pair(2) as (executor, objects):
        assert executor.collective_rpc("echo", (1,), {"k": 2}, timeout=READY) == [
            (0, (1,), {"k": 2}), (1, (1,), {"k": 2})]
        assert executor.collective_rpc(plus_rank, (10,), timeout=READY) == [10, 11]


def test_only_the_output_rank_replies_but_every_rank_executes() -> None:
    with reference_pair(3) as (executor, objects):
        assert executor.collective_rpc("echo", ("one",), unique_reply_rank=1,
                                       timeout=READY) == (1, ("one",), {})
        # The other ranks sent nothing: the next call reads this call's replies, not stale ones.
        assert executor.collective_rpc("echo", timeout=READY) == [(r, (), {}) for r in range(3)]
        assert [o.calls for o in objects] == [["echo", "echo"]] * 3
        for queue in executor.responses:
            with pytest.raises(TimeoutError):
                queue.dequeue(timeout=0.05)


def test_a_failure_raises_after_every_reply_is_read() -> None:
    with reference_pair(2) as (executor, objects):
        with pytest.raises(WorkerFailure) as caught:
            executor.collective_rpc("fail", ("boom 1",), timeout=READY)
        assert caught.value.rank == 0 and caught.value.status is ResponseStatus.FAILURE
        assert str(caught.value) == ("[ring.executor.failure] Worker failed with error "
                                     "'boom 1', please check the stack trace above for the "
                                     "root cause")
        assert executor.collective_rpc("echo", ("next",), timeout=READY) == [
            (0, ("next",), {}), (1, ("next",), {})]
        with pytest.raises(RuntimeError, match="has no attribute 'missing'"):
            executor.collective_rpc("missing", timeout=READY)


def test_a_timed_out_call_raises_and_stops_the_executor() -> None:
    with reference_pair(1) as (executor, objects):
        with pytest.raises(ProtocolTimeout) as caught:
            executor.collective_rpc("wait", timeout=0.3)
        assert caught.value.clause == "ring.executor.timeout"
        assert caught.value.message == "RPC call to wait timed out."
        assert isinstance(caught.value.__cause__, TimeoutError)
        objects[0].release.set()
        with pytest.raises(StateError) as refused:
            executor.collective_rpc("echo", timeout=READY)
        assert refused.value.clause == "ring.executor.timeout"


def test_a_malformed_reply_raises_and_stops_the_executor() -> None:
    objects = [Calls(0)]
    with Executor(1, max_chunk_bytes=CHUNK, max_chunks=CHUNKS) as executor, \
            serving(executor.broadcast_handle, objects) as workers:
        executor.connect([w.response_handle for w in workers], READY)
        # An int where the status belongs, written past the reply codec.
        workers[0].responses.enqueue_buffers([pickle.dumps((1, "x"), protocol=5)], READY)
        with pytest.raises(ExecutorError) as caught:
            executor.collective_rpc("echo", timeout=READY)
        assert caught.value.clause == "ring.executor.response"
        with pytest.raises(StateError, match="out of step"):
            executor.collective_rpc("echo", timeout=READY)


def test_a_worker_answers_a_malformed_request_with_a_failure() -> None:
    with reference_pair(1) as (executor, objects):
        executor.broadcast.enqueue(["echo", (), {}, None], timeout=READY)
        status, value = executor.responses[0].dequeue(timeout=READY)
        assert status is ResponseStatus.FAILURE and "ring.executor.rpc-request" in value
        assert objects[0].calls == []
        assert executor.collective_rpc("echo", timeout=READY) == [(0, (), {})]


def test_calls_need_a_connected_executor_and_a_known_rank() -> None:
    with Executor(2, max_chunk_bytes=CHUNK, max_chunks=CHUNKS) as executor:
        with pytest.raises(StateError, match="connect"):
            executor.collective_rpc("echo", timeout=1.0)
        with pytest.raises(ValueError, match="unique_reply_rank"):
            executor.collective_rpc("echo", unique_reply_rank=2, timeout=1.0)
        with pytest.raises(ExecutorError, match="one response ring per worker"):
            executor.connect([], 1.0)


def test_closing_removes_every_segment() -> None:
    import os

    with reference_pair(2) as (executor, objects):
        names = [executor.broadcast_handle.buffer_handle[3]]  # type: ignore[index]
        names += [q.handle.buffer_handle[3] for q in executor.responses]  # type: ignore[index]
        assert all(os.path.exists(f"/dev/shm/{n}") for n in names)
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)


def test_workers_in_processes_of_their_own(readers: Any) -> None:
    """Two reference worker processes (spawned) serve the reference executor of this one."""
    import os

    from ring_helpers import STEP_TIMEOUT, reference_worker

    with Executor(2, max_chunk_bytes=CHUNK, max_chunks=CHUNKS) as executor:
        conns = [readers.start(reference_worker, executor.broadcast_handle, rank, CHUNK)
                 for rank in range(2)]
        handles = []
        for conn in conns:
            assert conn.poll(STEP_TIMEOUT * 3), "a worker process sent no response handle"
            handles.append(conn.recv())
        executor.connect(handles, STEP_TIMEOUT)
        replies = executor.collective_rpc("echo", ("x",), timeout=STEP_TIMEOUT)
        assert [(r[0], r[2]) for r in replies] == [(0, ("x",)), (1, ("x",))]
        assert len({os.getpid(), *(r[1] for r in replies)}) == 3
        with pytest.raises(WorkerFailure, match="'far away'"):
            executor.collective_rpc("fail", ("far away",), unique_reply_rank=1,
                                    timeout=STEP_TIMEOUT)
        assert executor.collective_rpc("stop_serving", timeout=STEP_TIMEOUT) == ["stopping"] * 2
        assert readers.reports() == [{"error": None}] * 2


# --- against vLLM's own executor and worker code -------------------------------------------------


@contextmanager
def vllm_workers(broadcast: Any, objects: list[Calls]) -> Iterator[list[Any]]:
    """vLLM's ``WorkerProc`` busy loops (model-less, on threads) on a reference broadcast ring."""
    from enginewire.conformance.targets.reference import ring_handle
    from enginewire.conformance.targets.vllm.target import VllmRing, sweep

    neutral = ring_handle(broadcast, len(objects))
    peers: list[Any] = []
    try:
        for rank, obj in enumerate(objects):
            peers.append(VllmRing().start_worker(neutral, rank, obj))
        yield peers
    finally:
        for obj in objects:
            obj.release.set()
        for peer in peers:
            peer.stop(READY)
        sweep()


@pytest.mark.vllm
def test_reference_executor_drives_vllms_workers() -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("torch")
    objects = [Calls(0), Calls(1)]
    with Executor(2, max_chunk_bytes=CHUNK, max_chunks=CHUNKS) as executor, \
            vllm_workers(executor.broadcast_handle, objects) as peers:
        executor.connect([p.proc.worker_response_mq.export_handle() for p in peers], READY)
        assert executor.collective_rpc("echo", (1,), {"k": 2}, timeout=READY) == [
            (0, (1,), {"k": 2}), (1, (1,), {"k": 2})]
        assert executor.collective_rpc(plus_rank, (5,), timeout=READY) == [5, 6]
        assert executor.collective_rpc("echo", unique_reply_rank=1, timeout=READY) == (1, (), {})
        tensors = executor.collective_rpc("tensor", (4,), timeout=READY)
        assert [t.tolist() for t in tensors] == [[0, 1, 2, 3], [1, 2, 3, 4]]
        with pytest.raises(WorkerFailure) as caught:
            executor.collective_rpc("fail", ("vllm boom",), unique_reply_rank=0, timeout=READY)
        assert caught.value.value == "vllm boom"
        # A call every rank answers comes after every rank executed the ones before it.
        executor.collective_rpc("echo", timeout=READY)
        assert [o.calls for o in objects] == [["echo", "echo", "fail", "echo"]] * 2


@pytest.mark.vllm
def test_vllms_executor_drives_reference_workers() -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("torch")
    from enginewire.conformance.targets.reference import ring_handle
    from enginewire.conformance.targets.vllm.target import VllmRing, sweep

    objects = [Calls(0), Calls(1)]
    vllm = VllmRing().create_executor(world_size=2, max_chunk_bytes=CHUNK, max_chunks=CHUNKS)
    try:
        broadcast = vllm.executor.rpc_broadcast_mq.export_handle()  # vLLM's own Handle
        with serving(broadcast, objects) as workers:
            vllm.connect([ring_handle(w.response_handle, 1) for w in workers], READY)
            call = vllm.collective_rpc
            assert call("echo", (1,), {"k": 2}, timeout=READY) == [
                (0, (1,), {"k": 2}), (1, (1,), {"k": 2})]
            assert call(plus_rank, (5,), timeout=READY) == [5, 6]
            assert call("echo", unique_reply_rank=1, timeout=READY) == (1, (), {})
            tensors = call("tensor", (3,), timeout=READY)
            assert [t.tolist() for t in tensors] == [[0, 1, 2], [1, 2, 3]]
            with pytest.raises(RuntimeError) as caught:
                call("fail", ("ref boom",), unique_reply_rank=1, timeout=READY)
            assert str(caught.value) == ("Worker failed with error 'ref boom', please check "
                                         "the stack trace above for the root cause")
            call("echo", timeout=READY)
            assert [o.calls for o in objects] == [["echo", "echo", "fail", "echo"]] * 2
    finally:
        vllm.close()
        sweep()


# --- the checks catch a broken reference ---------------------------------------------------------

EXECUTOR_RPC_CHECKS = ["ring/worker/named-method", "ring/worker/pickled-callable",
                       "ring/worker/failure-reply", "ring/worker/reply-rank",
                       "ring/executor/request-tuple", "ring/executor/unique-reply-rank",
                       "ring/executor/failure-raises", "ring/executor/timeout"]


def _verdicts(patterns: list[str]) -> dict[str, Any]:
    from enginewire.conformance.framework.registry import all_checks, select
    from enginewire.conformance.framework.runner import run
    from enginewire.conformance.targets.reference import reference_target
    from enginewire.spec import load

    checks = select(all_checks(), patterns=patterns)
    assert len(checks) == len(patterns), [c.id for c in checks]
    target = reference_target()
    try:
        return {r.check.id: r for r in run(checks, target, load()).results}
    finally:
        target.close()


def test_the_reference_passes_every_executor_rpc_check() -> None:
    from enginewire.conformance.framework.runner import PASSED

    results = _verdicts(EXECUTOR_RPC_CHECKS)
    assert {k: r.status for k, r in results.items()} == dict.fromkeys(results, PASSED), {
        k: r.message for k, r in results.items() if r.status != PASSED}


def _every_rank_replies(output_rank: int | None, rank: int) -> bool:
    return True


def _failure_as_success(error: BaseException) -> tuple[ResponseStatus, Any]:
    return (ResponseStatus.SUCCESS, str(error))


def _no_output_rank(method: Any, args: tuple[Any, ...] = (), kwargs: Any = None,
                    output_rank: int | None = None) -> tuple[Any, ...]:
    return rpc.make_request(method, args, kwargs, None)


@pytest.mark.parametrize(("name", "broken", "caught_by", "message"), [
    ("replies", _every_rank_replies, "ring/worker/reply-rank",
     "replied to a request for rank 1"),
    ("failure", _failure_as_success, "ring/worker/failure-reply",
     "answered a raising method with (<ResponseStatus.SUCCESS: 1>, 'boom 7')"),
    ("reply_error", lambda status, value, rank: None, "ring/executor/failure-raises",
     "a FAILURE reply did not make collective_rpc raise"),
    ("make_request", _no_output_rank, "ring/executor/unique-reply-rank",
     "expected the tuple ('echo', (), {}, 1)"),
    ("rpc_timeout", lambda method: RuntimeError(f"{method} took too long"),
     "ring/executor/timeout", "expected TimeoutError: RPC call to slow_step timed out."),
])
def test_a_broken_reference_is_caught(monkeypatch: pytest.MonkeyPatch, name: str, broken: Any,
                                      caught_by: str, message: str) -> None:
    from enginewire.conformance.framework.runner import FAILED

    monkeypatch.setattr(executor_module, name, broken)
    result = _verdicts([caught_by])[caught_by]
    assert result.status == FAILED, result.message
    assert message in result.message
