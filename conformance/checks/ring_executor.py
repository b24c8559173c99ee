"""Ring checks of what travels on the ring in vLLM's executor, and of socket and segment set-up.

- ``ring/worker/*`` (capability ``ring.worker``): the target is a worker; the suite is its
  executor: it writes the broadcast ring, reads the worker's response ring, and checks every
  reply ``(status, value)`` and on which ranks one comes.
- ``ring/executor/*`` (capability ``ring.executor``): the target is the executor; the suite plays
  its workers (:class:`~enginewire.conformance.peers.executor_peer.SuiteWorker`): it reads every
  request ``(method, args, kwargs, output_rank)`` and answers, or fails, or stays silent.
- ``ring/reader/executor-request-carried`` / ``ring/writer/executor-request-carried``: any ring
  carries an executor request intact (a tuple stays a tuple, bytes stay bytes).
- ``ring/reader/notify-sub-conflate`` (capability ``ring.sockets``) and
  ``ring/writer/segment-owner-only``: set-up nobody can watch from the other end.
"""

from __future__ import annotations

import os
import pickle
import stat
import time
from typing import Any

from enginewire.conformance.checks._helpers import Background
from enginewire.conformance.framework.context import CheckContext
from enginewire.conformance.framework.registry import CheckFailure, CheckSkip, Reproduction, check
from enginewire.conformance.peers.executor_peer import (
    ConformanceWorker,
    ResponseStatus,
    SuiteWorker,
    add_rank,
    loads_reply,
    method_bytes,
    names_response_status,
)
from enginewire.conformance.peers.ring_peer import SuiteRingReader, SuiteRingWriter, pickle_buffers
from enginewire.conformance.targets.contract import RingSurface

RING_TIMEOUT = 25.0
CHUNK = 65536
CHUNKS = 4


# --- target workers, suite executor ------------------------------------------------------------


class _Workers:
    """``count`` target workers on a broadcast ring the suite writes, with the suite reading
    each one's response ring."""

    def __init__(self, ring: Any, ctx: Any, count: int) -> None:
        self.ctx = ctx
        self.broadcast = SuiteRingWriter(count, CHUNK, CHUNKS, str(ctx.tmpdir))
        ctx.on_cleanup(self.broadcast.close)
        self.objects = [ConformanceWorker(rank) for rank in range(count)]
        self.peers = []
        self.responses: list[SuiteRingReader] = []
        for rank, worker in enumerate(self.objects):
            peer = ring.start_worker(self.broadcast.handle, rank, worker)
            ctx.on_cleanup(lambda p=peer: p.stop(3.0))
            self.peers.append(peer)
        for rank, peer in enumerate(self.peers):
            handle = peer.response_handle
            if handle.n_reader != 1:
                raise CheckFailure(
                    f"worker {rank}'s response ring has {handle.n_reader} readers, expected 1 "
                    "(the executor)", Reproduction(notes={"handle": handle.to_builtins()}))
            reader = SuiteRingReader(handle, 0)
            ctx.on_cleanup(reader.close)
            self.responses.append(reader)
        budget = ctx.wait(8.0)
        waits = [Background(lambda: self.broadcast.wait_until_ready(budget), "broadcast ready",
                            ctx)]
        waits += [Background(lambda r=r: r.wait_until_ready(budget), f"response {i} ready", ctx)  # type: ignore[misc]
                  for i, r in enumerate(self.responses)]
        for wait in waits:
            wait.result(budget + 1.0, "the rings' wait_until_ready")

    def send(self, request: tuple[Any, ...]) -> list[bytes]:
        buffers = pickle_buffers(request)
        self.broadcast.write_buffers(buffers, self.ctx.wait(5.0))
        return buffers

    def reply(self, rank: int, sent: list[bytes], what: str) -> Any:
        try:
            buffers = self.responses[rank].read_buffers(self.ctx.wait(5.0))
        except TimeoutError as exc:
            raise CheckFailure(f"worker {rank} sent no reply to {what}",
                               Reproduction(sent=sent)) from exc
        try:
            reply = loads_reply(buffers)
        except Exception as exc:  # noqa: BLE001
            raise CheckFailure(f"worker {rank}'s reply to {what} does not unpickle: "
                               f"{type(exc).__name__}: {exc}",
                               Reproduction(sent=sent, received=buffers)) from exc
        if not (isinstance(reply, tuple) and len(reply) == 2):
            raise CheckFailure(f"worker {rank}'s reply to {what} is {reply!r}, expected the "
                               "tuple (status, value)", Reproduction(sent=sent, received=buffers))
        if not isinstance(reply[0], ResponseStatus) or not names_response_status(buffers[0]):
            raise CheckFailure(
                f"worker {rank}'s reply status is {reply[0]!r}, expected a member of vLLM's "
                "WorkerProc.ResponseStatus pickled by reference",
                Reproduction(sent=sent, received=buffers))
        return reply

    def silent(self, rank: int, what: str, wait: float = 0.5) -> None:
        try:
            buffers = self.responses[rank].read_buffers(wait)
        except TimeoutError:
            return
        raise CheckFailure(f"worker {rank} replied to {what}",
                           Reproduction(received=buffers))


def _expect_reply(got: Any, want: tuple[ResponseStatus, Any], rank: int, what: str,
                  sent: list[bytes]) -> None:
    if got != want:
        raise CheckFailure(f"worker {rank} answered {what} with {got!r}, expected {want!r}",
                           Reproduction(sent=sent))


@check("ring/worker/named-method", clauses=["ring.executor.rpc-request",
                                            "ring.executor.response",
                                            "ring.executor.topology"],
       surface="ring", requires=["ring.worker"], timeout=RING_TIMEOUT)
def _named_method(ring: RingSurface, ctx: CheckContext) -> None:
    """A worker runs a named method and replies (ResponseStatus.SUCCESS, result).

    ('echo', args, kwargs, None) runs on the worker object; the reply goes on a response ring
    of one reader."""
    workers = _Workers(ring, ctx, 1)
    sent = workers.send(("echo", (1, "two"), {"k": 3}, None))
    got = workers.reply(0, sent, "('echo', (1, 'two'), {'k': 3}, None)")
    _expect_reply(got, (ResponseStatus.SUCCESS, (0, (1, "two"), {"k": 3})), 0, "echo", sent)
    calls = workers.objects[0].recorded()
    if calls != [("echo", (1, "two"), {"k": 3})]:
        raise CheckFailure(f"the worker object saw the calls {calls!r}, expected one echo",
                           Reproduction(sent=sent))


@check("ring/worker/pickled-callable", clauses=["ring.executor.rpc-request"], surface="ring",
       requires=["ring.worker"], timeout=RING_TIMEOUT)
def _pickled_callable(ring: RingSurface, ctx: CheckContext) -> None:
    """A method sent as pickled bytes is called with the worker as first argument."""
    workers = _Workers(ring, ctx, 2)
    sent = workers.send((method_bytes(add_rank), (10,), {}, None))
    for rank in range(2):
        got = workers.reply(rank, sent, "a pickled add_rank(worker, 10)")
        _expect_reply(got, (ResponseStatus.SUCCESS, 10 + rank), rank, "add_rank", sent)


@check("ring/worker/failure-reply", clauses=["ring.executor.response"], surface="ring",
       requires=["ring.worker"], timeout=RING_TIMEOUT)
def _failure_reply(ring: RingSurface, ctx: CheckContext) -> None:
    """A method that raises is answered (ResponseStatus.FAILURE, str(exception)).

    The worker serves the next request."""
    workers = _Workers(ring, ctx, 1)
    sent = workers.send(("fail", ("boom 7",), {}, None))
    got = workers.reply(0, sent, "('fail', ('boom 7',), {}, None)")
    _expect_reply(got, (ResponseStatus.FAILURE, "boom 7"), 0, "a raising method", sent)
    sent = workers.send(("echo", (), {}, None))
    got = workers.reply(0, sent, "an echo after a failure")
    _expect_reply(got, (ResponseStatus.SUCCESS, (0, (), {})), 0, "an echo after a failure",
                  sent)


@check("ring/worker/reply-rank", clauses=["ring.executor.reply-rank"], surface="ring",
       requires=["ring.worker"], timeout=RING_TIMEOUT)
def _reply_rank(ring: RingSurface, ctx: CheckContext) -> None:
    """With output_rank 1 both workers execute but only rank 1 replies.

    Also for a failure; with output_rank None both reply."""
    workers = _Workers(ring, ctx, 2)
    sent = workers.send(("echo", ("to-one",), {}, 1))
    sent += workers.send(("fail", ("quiet",), {}, 1))
    sent += workers.send(("echo", ("to-all",), {}, None))
    want_one: list[Any] = [(ResponseStatus.SUCCESS, (1, ("to-one",), {})),
                (ResponseStatus.FAILURE, "quiet"),
                (ResponseStatus.SUCCESS, (1, ("to-all",), {}))]
    for index, want in enumerate(want_one):
        _expect_reply(workers.reply(1, sent, f"request {index}"), want, 1, f"request {index}",
                      sent)
    got = workers.reply(0, sent, "the request for every rank")
    if got != (ResponseStatus.SUCCESS, (0, ("to-all",), {})):
        raise CheckFailure(f"worker 0 replied to a request for rank 1: its first reply is "
                           f"{got!r}, expected the answer to the request for every rank",
                           Reproduction(sent=sent))
    workers.silent(0, "a request for rank 1")
    calls = [c[0] for c in workers.objects[0].recorded()]
    if calls != ["echo", "fail", "echo"]:
        raise CheckFailure(f"worker 0 executed {calls}, expected every request (echo, fail, "
                           "echo), also those it does not answer", Reproduction(sent=sent))


# --- target executor, suite workers -------------------------------------------------------------


class _Executor:
    """A target executor for ``count`` workers, the suite playing every worker."""

    def __init__(self, ring: Any, ctx: Any, count: int) -> None:
        self.ctx = ctx
        self.executor = ring.create_executor(world_size=count, max_chunk_bytes=CHUNK,
                                             max_chunks=CHUNKS)
        ctx.on_cleanup(self.executor.close)
        handle = self.executor.broadcast_handle
        if handle.n_reader != count or tuple(handle.reader_ranks) != tuple(range(count)):
            raise CheckFailure(
                f"the broadcast ring of an executor of {count} local workers has "
                f"{handle.n_reader} readers, ranks {list(handle.reader_ranks)}",
                Reproduction(notes={"handle": handle.to_builtins()}))
        self.workers = []
        for rank in range(count):
            worker = SuiteWorker(handle, rank, str(ctx.tmpdir), max_chunk_bytes=CHUNK,
                                 max_chunks=CHUNKS)
            ctx.on_cleanup(worker.close)
            self.workers.append(worker)
        budget = ctx.wait(8.0)
        responses = [w.response_handle for w in self.workers]
        waits = [Background(lambda: self.executor.connect(responses, budget), "executor ready",
                            ctx)]
        for worker in self.workers:
            waits.append(Background(lambda w=worker: w.requests.wait_until_ready(budget),  # type: ignore[misc]
                                    "broadcast reader ready", ctx))
            waits.append(Background(lambda w=worker: w.responses.wait_until_ready(budget),  # type: ignore[misc]
                                    "response writer ready", ctx))
        for wait in waits:
            wait.result(budget + 1.0, "the rings' wait_until_ready")

    def call(self, method: Any, **options: Any) -> Background:
        return Background(lambda: self.executor.collective_rpc(method, **options),
                          "collective_rpc", self.ctx)

    def request(self, rank: int, what: str) -> tuple[list[bytes], Any]:
        try:
            return self.workers[rank].read_request(self.ctx.wait(5.0))
        except TimeoutError as exc:
            raise CheckFailure(f"worker {rank} got no request for {what}") from exc


def _expect_request(buffers: list[bytes], got: Any, want: tuple[Any, ...], what: str) -> None:
    shape_ok = (type(got) is tuple and len(got) == 4 and type(got[1]) is tuple
                and type(got[2]) is dict and (got[3] is None or type(got[3]) is int))
    if not shape_ok or got != want:
        raise CheckFailure(f"{what} arrived as {got!r}, expected the tuple {want!r} "
                           "(method, args tuple, kwargs dict, output_rank)",
                           Reproduction(received=buffers))


@check("ring/executor/request-tuple", clauses=["ring.executor.rpc-request",
                                               "ring.executor.response",
                                               "ring.executor.topology"],
       surface="ring", requires=["ring.executor"], timeout=RING_TIMEOUT)
def _request_tuple(ring: RingSurface, ctx: CheckContext) -> None:
    """collective_rpc broadcasts (method, args, kwargs, None) and returns the values in rank
    order.

    A callable method travels as its pickled bytes."""
    executor = _Executor(ring, ctx, 2)
    call = executor.call("echo", args=(1,), kwargs={"k": 2}, timeout=ctx.wait(8.0))
    for rank in range(2):
        buffers, got = executor.request(rank, "collective_rpc('echo')")
        _expect_request(buffers, got, ("echo", (1,), {"k": 2}, None), "collective_rpc('echo')")
        executor.workers[rank].reply(ResponseStatus.SUCCESS, f"r{rank}")
    result = call.result(ctx.wait(8.0), "collective_rpc('echo')")
    if result != ["r0", "r1"]:
        raise CheckFailure(f"collective_rpc returned {result!r}, expected ['r0', 'r1']")
    call = executor.call(add_rank, args=(5,), timeout=ctx.wait(8.0))
    for rank in range(2):
        buffers, got = executor.request(rank, "collective_rpc(add_rank)")
        if not (type(got) is tuple and len(got) == 4 and isinstance(got[0], bytes)):
            raise CheckFailure(f"a callable method arrived as {got!r}, expected its pickled "
                               "bytes first", Reproduction(received=buffers))
        if pickle.loads(got[0]) is not add_rank or got[1:] != ((5,), {}, None):
            raise CheckFailure(f"collective_rpc(add_rank, args=(5,)) arrived as {got!r}",
                               Reproduction(received=buffers))
        executor.workers[rank].reply(ResponseStatus.SUCCESS, 5 + rank)
    result = call.result(ctx.wait(8.0), "collective_rpc(add_rank)")
    if result != [5, 6]:
        raise CheckFailure(f"collective_rpc(add_rank) returned {result!r}, expected [5, 6]")


@check("ring/executor/unique-reply-rank", clauses=["ring.executor.reply-rank"], surface="ring",
       requires=["ring.executor"], timeout=RING_TIMEOUT)
def _unique_reply_rank(ring: RingSurface, ctx: CheckContext) -> None:
    """With unique_reply_rank=1 the executor waits for rank 1's reply only.

    Every worker gets output_rank 1; the call returns rank 1's value alone."""
    executor = _Executor(ring, ctx, 2)
    call = executor.call("echo", unique_reply_rank=1, timeout=ctx.wait(2.0))
    for rank in range(2):
        buffers, got = executor.request(rank, "collective_rpc('echo', unique_reply_rank=1)")
        _expect_request(buffers, got, ("echo", (), {}, 1),
                        "collective_rpc('echo', unique_reply_rank=1)")
    executor.workers[1].reply(ResponseStatus.SUCCESS, "one")
    try:
        result = call.result(ctx.wait(8.0), "collective_rpc('echo', unique_reply_rank=1)")
    except CheckFailure as exc:
        raise CheckFailure(f"with only rank 1 replying, {exc.message} (does it wait for "
                           "every rank?)") from exc
    if result != "one":
        raise CheckFailure(f"collective_rpc(..., unique_reply_rank=1) returned {result!r}, "
                           "expected rank 1's value 'one' alone")


@check("ring/executor/failure-raises", clauses=["ring.executor.failure",
                                                "ring.executor.response"],
       surface="ring", requires=["ring.executor"], timeout=RING_TIMEOUT)
def _failure_raises(ring: RingSurface, ctx: CheckContext) -> None:
    """FAILURE and FAILURE_WITH_KV_OUTPUT replies raise vLLM's RuntimeErrors.

    FAILURE: RuntimeError("Worker failed with error '<value>', please check the stack trace
    above for the root cause"); FAILURE_WITH_KV_OUTPUT: RuntimeError("Worker failed with KV
    connector output")."""
    executor = _Executor(ring, ctx, 1)
    cases = [
        (ResponseStatus.FAILURE, "boom",
         "Worker failed with error 'boom', please check the stack trace above for the root "
         "cause"),
        (ResponseStatus.FAILURE_WITH_KV_OUTPUT, None, "Worker failed with KV connector output"),
    ]
    for status, value, message in cases:
        call = executor.call("step", timeout=ctx.wait(8.0))
        executor.request(0, "collective_rpc('step')")
        sent = executor.workers[0].reply(status, value)
        error = call.exception(ctx.wait(8.0), f"collective_rpc after a {status.name} reply")
        if error is None:
            raise CheckFailure(f"a {status.name} reply did not make collective_rpc raise",
                               Reproduction(sent=sent))
        if type(error) is not RuntimeError or str(error) != message:
            raise CheckFailure(f"a {status.name} reply raised {type(error).__name__}: "
                               f"{error}, expected RuntimeError: {message}",
                               Reproduction(sent=sent))


@check("ring/executor/timeout", clauses=["ring.executor.timeout"], surface="ring",
       requires=["ring.executor"], timeout=RING_TIMEOUT)
def _timeout(ring: RingSurface, ctx: CheckContext) -> None:
    """A timed call without reply raises TimeoutError('RPC call to <method> timed out.').

    The error is chained to the queue's TimeoutError."""
    executor = _Executor(ring, ctx, 1)
    started = time.monotonic()
    call = executor.call("slow_step", timeout=0.5)
    executor.request(0, "collective_rpc('slow_step', timeout=0.5)")
    error = call.exception(ctx.wait(8.0), "collective_rpc('slow_step', timeout=0.5) without "
                           "a reply")
    if error is None:
        raise CheckFailure("collective_rpc('slow_step', timeout=0.5) without a reply returned "
                           f"after {time.monotonic() - started:.1f} s")
    if type(error) is not TimeoutError or str(error) != "RPC call to slow_step timed out.":
        raise CheckFailure(f"collective_rpc without a reply raised {type(error).__name__}: "
                           f"{error}, expected TimeoutError: RPC call to slow_step timed out.")
    if not isinstance(error.__cause__, TimeoutError):
        raise CheckFailure("the TimeoutError is not chained to the queue's TimeoutError "
                           f"(__cause__ is {error.__cause__!r})")


# --- any ring: an executor request travels intact ------------------------------------------------

_REQUESTS: list[tuple[Any, ...]] = [
    ("echo", (1, "two"), {"k": 3}, None),
    (method_bytes(add_rank), (5,), {}, 1),
]


def _carried(got: Any, want: tuple[Any, ...], buffers: list[bytes] | None) -> None:
    if type(got) is not tuple or got != want or type(got[1]) is not tuple \
            or type(got[2]) is not dict or type(got[0]) is not type(want[0]):
        raise CheckFailure(f"the executor request {want!r} came out as {got!r}",
                           Reproduction(sent=buffers))


@check("ring/reader/executor-request-carried", clauses=["ring.executor.rpc-request",
                                                        "ring.payload.pickle-protocol-5"],
       surface="ring", requires=["ring.reader"], timeout=RING_TIMEOUT)
def _reader_carries(ring: RingSurface, ctx: CheckContext) -> None:
    """A reader dequeues an executor request (method, args, kwargs, output_rank) unchanged.

    A str or bytes method, an args tuple, a kwargs dict: a tuple must not become a list."""
    writer = SuiteRingWriter(1, CHUNK, CHUNKS, str(ctx.tmpdir))
    ctx.on_cleanup(writer.close)
    reader = ring.attach_reader(writer.handle, 0)
    ctx.on_cleanup(reader.close)
    budget = ctx.wait(8.0)
    waits = [Background(lambda: writer.wait_until_ready(budget), "writer ready", ctx),
             Background(lambda: reader.wait_until_ready(budget), "reader ready", ctx)]
    for wait in waits:
        wait.result(budget + 1.0, "wait_until_ready")
    for request in _REQUESTS:
        buffers = pickle_buffers(request)
        writer.write_buffers(buffers, ctx.wait(5.0))
        _carried(reader.dequeue(timeout=ctx.wait(5.0)), request, buffers)


@check("ring/writer/executor-request-carried", clauses=["ring.executor.rpc-request",
                                                        "ring.payload.pickle-protocol-5"],
       surface="ring", requires=["ring.writer"], timeout=RING_TIMEOUT)
def _writer_carries(ring: RingSurface, ctx: CheckContext) -> None:
    """An executor request enqueued by a writer reads back as the same tuple."""
    writer = ring.create_writer(n_reader=1, max_chunk_bytes=CHUNK, max_chunks=CHUNKS)
    ctx.on_cleanup(writer.close)
    reader = SuiteRingReader(writer.handle, 0)
    ctx.on_cleanup(reader.close)
    budget = ctx.wait(8.0)
    waits = [Background(lambda: writer.wait_until_ready(budget), "writer ready", ctx),
             Background(lambda: reader.wait_until_ready(budget), "reader ready", ctx)]
    for wait in waits:
        wait.result(budget + 1.0, "wait_until_ready")
    for request in _REQUESTS:
        writer.enqueue(request, timeout=ctx.wait(5.0))
        buffers = reader.read_buffers(ctx.wait(5.0))
        _carried(pickle.loads(buffers[0], buffers=[bytearray(b) for b in buffers[1:]]),
                 request, buffers)


# --- set-up nobody sees from the other end --------------------------------------------------------


@check("ring/reader/notify-sub-conflate", clauses=["ring.notify.sub-conflate"], surface="ring",
       requires=["ring.reader", "ring.sockets"], timeout=RING_TIMEOUT)
def _sub_conflate(ring: RingSurface, ctx: CheckContext) -> None:
    """A local reader's notify socket is a SUB with CONFLATE set (read with getsockopt)."""
    import zmq

    writer = SuiteRingWriter(1, CHUNK, CHUNKS, str(ctx.tmpdir))
    ctx.on_cleanup(writer.close)
    reader = ring.attach_reader(writer.handle, 0)
    ctx.on_cleanup(reader.close)
    sockets = dict(ring.zmq_sockets(reader))  # type: ignore[attr-defined]
    notify = sockets.get("notify")
    if notify is None:
        raise CheckFailure(f"the reader exposed no notify socket (channels {sorted(sockets)})")
    kind = notify.getsockopt(zmq.TYPE)
    conflate = notify.getsockopt(zmq.CONFLATE)
    if kind != zmq.SUB or conflate != 1:
        raise CheckFailure(f"the reader's notify socket is of type {kind} with CONFLATE "
                           f"{conflate}, expected a SUB ({zmq.SUB}) with CONFLATE 1")


@check("ring/writer/segment-owner-only", clauses=["ring.payload.trusted-only"], surface="ring",
       requires=["ring.writer"], timeout=RING_TIMEOUT)
def _segment_owner_only(ring: RingSurface, ctx: CheckContext) -> None:
    """The segment the writer creates is readable and writable by its owner only (0600).

    Another user's process cannot read the pickles in it or write code into them."""
    if not os.path.isdir("/dev/shm"):
        raise CheckSkip("no /dev/shm here: POSIX shared memory is not a file to stat")
    writer = ring.create_writer(n_reader=1, max_chunk_bytes=CHUNK, max_chunks=CHUNKS)
    ctx.on_cleanup(writer.close)
    info = os.stat(f"/dev/shm/{writer.handle.shm_name.lstrip('/')}")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077 or info.st_uid != os.getuid():
        raise CheckFailure(f"the ring segment has mode {mode:04o} and owner {info.st_uid}, "
                           f"expected mode 0600 (group and others nothing) and owner "
                           f"{os.getuid()}", Reproduction(notes={"segment":
                                                                 writer.handle.shm_name}))
