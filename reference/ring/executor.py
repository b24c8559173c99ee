"""The executor RPC over the ring: vLLM's multiprocessing executor and its workers, the
queues only (no processes, no model).

- :class:`Executor` writes the broadcast ring (``world_size`` local readers) and reads one
  response ring per worker; :meth:`Executor.collective_rpc` broadcasts one request and
  collects the replies of the ranks that answer.
- :class:`Worker` reads the broadcast ring as reader ``rank``, executes every request on a
  worker object and answers on a response ring of its own (one reader: the executor) when
  the request's ``output_rank`` is None or its rank.

Start-up follows vLLM's order on both sides (``ring.ready.collective``): the worker waits on
the broadcast ring, then on its response ring; the executor on the broadcast ring, then on
every response ring. The messages are :mod:`.rpc`'s; the spec is ``ring.executor.*`` in
``spec/data/ring.toml``.

Executor (the engine core's side)::

    with Executor(world_size=2) as executor:
        handle = executor.broadcast_handle          # give it to the workers
        executor.connect(response_handles, timeout=30)
        values = executor.collective_rpc("echo", args=(1,), timeout=10)

Worker (one per rank, usually in a process of its own)::

    with Worker(handle, rank=0, worker=obj) as worker:
        response_handle = worker.response_handle    # give it to the executor
        worker.wait_until_ready(timeout=30)
        worker.serve(stop_event)

Where this differs from vLLM (nothing another process can see on the rings):

- every wait is bounded: a call given no ``timeout`` gets :data:`DEFAULT_RPC_TIMEOUT_S`
  (vLLM waits for ever), and the worker's waits are bounded or end when it is stopped;
- after a FAILURE reply the executor still reads the other ranks' replies to the same call
  before it raises (vLLM raises at once and the next call reads the stale replies);
- a call that ends before every reply was read (a timeout, a malformed reply) leaves the
  replies out of step with the requests: the executor refuses every later call;
- errors name their clause (:class:`.errors.WorkerFailure`, a ``RuntimeError``;
  :class:`.errors.ProtocolTimeout`, a ``TimeoutError``), with vLLM's text as ``message``.

Not implemented: fault tolerance (collecting failures into "One or more workers failed"),
``non_block`` futures, KV connector output aggregation, workers on other nodes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ExecutorError, ProtocolError, StateError, WorkerFailure
from .queue import MAX_CHUNK_BYTES_DEFAULT, MAX_CHUNKS_DEFAULT, Handle, MessageQueue, QueueClosed
from .rpc import (
    ReplyCodec,
    Request,
    failure,
    make_request,
    parse_reply,
    parse_request,
    replies,
    reply_error,
    resolve_method,
    rpc_timeout,
    success,
)

log = logging.getLogger("enginewire.executor")

#: The broadcast ring's chunk size in vLLM's executor (``VLLM_MQ_MAX_CHUNK_BYTES_MB``, 16).
BROADCAST_CHUNK_BYTES_DEFAULT = 16 * 1024 * 1024
#: The bound of a call given no timeout (vLLM's ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``).
DEFAULT_RPC_TIMEOUT_S = 300.0
#: How long a worker waits for the executor to take a reply off a full response ring.
REPLY_TIMEOUT_S = 300.0
#: How often a serving worker looks at its stop event while no request comes.
POLL_INTERVAL_S = 0.5


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


class Executor:
    """The executor's ends: the broadcast ring's writer and every response ring's reader.

    One call at a time: concurrent callers of :meth:`collective_rpc` take turns.
    """

    def __init__(self, world_size: int, *, max_chunk_bytes: int = BROADCAST_CHUNK_BYTES_DEFAULT,
                 max_chunks: int = MAX_CHUNKS_DEFAULT, ipc_dir: str | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size is at least 1, got {world_size}")
        self.world_size = world_size
        self.broadcast = MessageQueue(world_size, world_size, max_chunk_bytes=max_chunk_bytes,
                                      max_chunks=max_chunks, ipc_dir=ipc_dir)
        self.responses: list[MessageQueue] = []
        self._lock = threading.Lock()
        self._out_of_step: str | None = None

    @property
    def broadcast_handle(self) -> Handle:
        return self.broadcast.export_handle()

    def connect(self, response_handles: Sequence[Any], timeout: float) -> None:
        """Attach to worker ``i``'s response ring (``response_handles[i]``, a reference or a
        vLLM handle) and take part in every ring's start-up: the broadcast ring's, then each
        response ring's. Raises :class:`.errors.ProtocolTimeout` when ``timeout`` runs out."""
        if len(response_handles) != self.world_size:
            raise ExecutorError("ring.executor.topology", "one response ring per worker",
                                expected=self.world_size, got=len(response_handles))
        if self.responses:
            raise StateError("ring.ready.collective", "the executor is already connected")
        for handle in response_handles:
            self.responses.append(MessageQueue.create_from_handle(handle, 0,
                                                                  codec=ReplyCodec()))
        deadline = time.monotonic() + timeout
        self.broadcast.wait_until_ready(timeout=_remaining(deadline))
        for queue in self.responses:
            queue.wait_until_ready(timeout=_remaining(deadline))

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None,
                       unique_reply_rank: int | None = None,
                       timeout: float | None = None) -> Any:
        """Run ``method`` on every worker and return the replies' values in rank order, or
        only ``unique_reply_rank``'s value (the one rank that then replies).

        Raises :class:`.errors.WorkerFailure` (a ``RuntimeError``, vLLM's text) for the first
        rank, in rank order, that answered FAILURE or FAILURE_WITH_KV_OUTPUT, and
        :class:`.errors.ProtocolTimeout` (a ``TimeoutError``: "RPC call to <method> timed
        out.", chained to the queue's) when a reply or a free broadcast chunk did not come
        within ``timeout`` seconds (None: :data:`DEFAULT_RPC_TIMEOUT_S`).
        """
        if unique_reply_rank is not None and not 0 <= unique_reply_rank < self.world_size:
            raise ValueError(f"unique_reply_rank is None or a rank below {self.world_size}, "
                             f"got {unique_reply_rank}")
        request = make_request(method, args, kwargs, unique_reply_rank)
        deadline = time.monotonic() + (DEFAULT_RPC_TIMEOUT_S if timeout is None else timeout)
        with self._lock:
            if not self.responses:
                raise StateError("ring.ready.collective",
                                 "connect() the executor to its workers before calling them")
            if self._out_of_step is not None:
                raise StateError("ring.executor.timeout", "the executor takes no more calls: "
                                 f"{self._out_of_step}, so replies may be out of step with "
                                 "requests")
            try:
                self.broadcast.enqueue(request, timeout=_remaining(deadline))
            except TimeoutError as exc:
                raise rpc_timeout(method) from exc
            ranks = range(self.world_size) if unique_reply_rank is None else [unique_reply_rank]
            values: list[Any] = []
            first_failure: WorkerFailure | None = None
            try:
                for rank in ranks:
                    try:
                        reply = self.responses[rank].dequeue(timeout=_remaining(deadline))
                    except TimeoutError as exc:
                        if first_failure is not None:
                            raise first_failure from None
                        raise rpc_timeout(method) from exc
                    status, value = parse_reply(reply, rank)
                    error = reply_error(status, value, rank)
                    if error is not None and first_failure is None:
                        first_failure = error
                    values.append(value)
            finally:
                if len(values) < len(ranks):
                    self._out_of_step = f"the call to {method} ended before every reply came"
            if first_failure is not None:
                raise first_failure
        return values[0] if unique_reply_rank is not None else values

    def close(self) -> None:
        """Close every ring end (the broadcast ring's segment and ipc files go); idempotent."""
        for queue in (self.broadcast, *self.responses):
            queue.shutdown()
            queue.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Worker:
    """One worker's ends: reader ``rank`` of the broadcast ring and the writer of its own
    response ring (one reader), executing requests on ``worker``.

    The response ring has vLLM's ``MessageQueue(1, 1)`` geometry unless told otherwise.
    """

    def __init__(self, broadcast: Any, rank: int, worker: Any, *,
                 max_chunk_bytes: int = MAX_CHUNK_BYTES_DEFAULT,
                 max_chunks: int = MAX_CHUNKS_DEFAULT, ipc_dir: str | None = None,
                 reply_timeout: float = REPLY_TIMEOUT_S) -> None:
        self.rank = rank
        self.worker = worker
        self.reply_timeout = reply_timeout
        self.requests = MessageQueue.create_from_handle(broadcast, rank)
        try:
            self.responses = MessageQueue(1, 1, max_chunk_bytes=max_chunk_bytes,
                                          max_chunks=max_chunks, codec=ReplyCodec(),
                                          ipc_dir=ipc_dir)
        except BaseException:
            self.requests.close()
            raise
        self._stop = threading.Event()

    @property
    def response_handle(self) -> Handle:
        return self.responses.export_handle()

    def wait_until_ready(self, timeout: float) -> None:
        """The broadcast ring's start-up, then the response ring's (vLLM's order)."""
        deadline = time.monotonic() + timeout
        self.requests.wait_until_ready(timeout=_remaining(deadline))
        self.responses.wait_until_ready(timeout=_remaining(deadline))

    def execute(self, request: Request) -> tuple[Any, Any]:
        """Run one request on the worker object: the reply ``(status, value)``, whether or
        not this rank sends it."""
        try:
            return success(resolve_method(request.method, self.worker)(*request.args,
                                                                        **request.kwargs))
        except Exception as exc:  # noqa: BLE001 - answered as FAILURE, as vLLM's worker does
            log.warning("worker %d: %s raised %s: %s", self.rank, _name(request.method),
                        type(exc).__name__, exc)
            return failure(exc)

    def serve_one(self, timeout: float) -> bool:
        """Take one request, execute it, reply if this rank replies; False when none came
        within ``timeout``. A request that is not ``(method, args, kwargs, output_rank)`` is
        answered FAILURE with the error's text."""
        try:
            message = self.requests.dequeue(timeout=timeout)
        except TimeoutError:
            return False
        try:
            request = parse_request(message)
        except ProtocolError as exc:
            log.warning("worker %d: %s", self.rank, exc)
            self.responses.enqueue(failure(exc), timeout=self.reply_timeout)
            return True
        reply = self.execute(request)
        if replies(request.output_rank, self.rank):
            self.responses.enqueue(reply, timeout=self.reply_timeout)
        return True

    def serve(self, stop: threading.Event | None = None) -> None:
        """Serve requests until ``stop`` (or :meth:`stop`) is set or the rings close.

        A reply the executor does not take within ``reply_timeout`` raises
        :class:`.errors.ProtocolTimeout` out of the loop."""
        while not self._stop.is_set() and (stop is None or not stop.is_set()):
            try:
                self.serve_one(POLL_INTERVAL_S)
            except QueueClosed:
                return

    def stop(self) -> None:
        """Make :meth:`serve` return (at once, also from inside a wait)."""
        self._stop.set()
        self.requests.shutdown()
        self.responses.shutdown()

    def close(self) -> None:
        """Stop and close both ends (the response ring's segment and ipc files go)."""
        self.stop()
        self.requests.close()
        self.responses.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _name(method: str | bytes) -> str:
    return method if isinstance(method, str) else f"a pickled callable ({len(method)} bytes)"
