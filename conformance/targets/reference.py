"""The built-in target ``reference``: :mod:`enginewire.reference` behind the target contract.

Each surface is picked up only when its reference module imports; a part of the reference
that does not exist (yet) is reported NOT IMPLEMENTED by the checks, never passed.

- ``codec``: ``enginewire.reference.codec.Codec`` (``threshold``, ``allow_insecure``); neutral
  values become the classes of ``enginewire.reference.structs`` through the spec's payload
  types.
- ``ring``: ``enginewire.reference.ring`` (``MessageQueue``; ``Executor`` and ``Worker`` for
  the executor RPC, capabilities ``ring.executor`` and ``ring.worker``).
- ``engine`` / ``frontend``: ``enginewire.reference.engine`` / ``enginewire.reference.frontend``.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from enginewire.conformance.framework.evidence import for_release
from enginewire.conformance.framework.registry import NotInRelease
from enginewire.conformance.oracle.values import build
from enginewire.conformance.targets.contract import RingHandle, Target
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

#: Seconds one poll of the reference front end lasts while a check's call waits on it: how
#: soon ``ReferenceFrontendClient.stop`` can close its sockets.
WAIT_SLICE_S = 0.05


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise


class ReferenceCodec:
    """``enginewire.reference.codec.Codec`` with neutral values in and its classes out.

    Extension point: override :meth:`make_codec` to test a changed ``Codec`` (a subclass);
    ``with_threshold`` and ``with_insecure_serialization`` build ``type(self)``, so the
    change carries over to every configured codec.
    """

    def __init__(self, threshold: int | None = None, insecure: bool = False,
                 version: str | None = None) -> None:
        self.version = version
        self.codec = self.make_codec(threshold, insecure)
        self.threshold = threshold
        self.insecure = insecure
        self.spec = self.codec.spec

    def make_codec(self, threshold: int | None, insecure: bool) -> Any:
        """The inner codec (factory): ``enginewire.reference.codec.Codec`` for this codec's
        vLLM release."""
        from enginewire.reference.codec import Codec

        return Codec(threshold=threshold, allow_insecure=insecure, version=self.version)

    def with_threshold(self, threshold: int) -> ReferenceCodec:
        return type(self)(threshold, self.insecure, self.version)

    def with_insecure_serialization(self) -> ReferenceCodec:
        return type(self)(self.threshold, insecure=True, version=self.version)

    def _payload_type(self, kind: str) -> str | None:
        for message in self.spec.surface("frames").messages:
            if message.kind == kind:
                return next((f.payload for f in message.frames if f.content == "msgpack"), None)
        return kind if kind in self.spec.structs else None

    def _class(self, name: str) -> Any:
        structs = self.codec.structs
        return structs.classes.get(name) or structs.enums.get(name)

    def encode(self, kind: str, value: Any) -> Sequence[Any]:
        payload_type = self._payload_type(kind)
        if payload_type is not None and value is not None:
            value = build(value, payload_type, self.spec, self._class)
        return self.codec.encode(kind, value)

    def decode(self, kind: str, frames: Sequence[Any]) -> Any:
        return self.codec.decode(kind, frames)


class _ReferenceRingEnd:
    def __init__(self, queue: Any) -> None:
        self.queue = queue
        # The queue's own methods (same signatures): no wrapper call per message, which the
        # ring bench would otherwise measure.
        self.enqueue: Callable[[Any, float | None], None] = queue.enqueue
        self.dequeue: Callable[[float | None], Any] = queue.dequeue
        self.dequeue_borrowed = queue.dequeue_borrowed
        self.enqueue_buffers = queue.enqueue_buffers
        self.dequeue_views = queue.dequeue_views

    def wait_until_ready(self, timeout: float) -> None:
        self.queue.wait_until_ready(timeout=timeout)

    def close(self) -> None:
        self.queue.shutdown()
        self.queue.close()


class ReferenceRingWriter(_ReferenceRingEnd):
    def __init__(self, n_reader: int, max_chunk_bytes: int, max_chunks: int,
                 n_local_reader: int | None = None, connect_ip: str | None = None,
                 queue_class: Any = None) -> None:
        if queue_class is None:
            from enginewire.reference.ring import MessageQueue as queue_class

        local = n_reader if n_local_reader is None else n_local_reader
        super().__init__(queue_class(n_reader, local, max_chunk_bytes=max_chunk_bytes,
                                     max_chunks=max_chunks, connect_ip=connect_ip))
        self.handle = ring_handle(self.queue.export_handle(), n_reader)


def ring_handle(native: Any, n_reader: int) -> RingHandle:
    """A vLLM-style ``Handle`` (reference or vLLM) as the suite's neutral RingHandle."""
    if native.buffer_handle is not None:
        n, chunk, chunks, name = native.buffer_handle
    else:
        n, chunk, chunks, name = 0, 0, 0, ""
    return RingHandle(n, chunk, chunks, name, native.local_subscribe_addr or "",
                      native.local_notify_addr or "", tuple(native.local_reader_ranks),
                      remote_subscribe_address=native.remote_subscribe_addr,
                      remote_ipv6=bool(native.remote_addr_ipv6))


class ReferenceRing:
    """``enginewire.reference.ring``: ``MessageQueue`` for the socket-level ends and the
    sans-IO ``RingWriter``/``RingReader`` over a caller's memory for ``ring.memory``."""

    #: Readers offer ``dequeue_borrowed`` (the queue's zero-copy reads).
    borrowed_reads = True
    #: Writers offer ``enqueue_buffers`` and readers ``dequeue_views`` (raw buffers, no codec,
    #: views valid until the next read).
    raw_buffers = True

    def queue_class(self) -> Any:
        """The ring end class (factory for writers and readers): a subclass of
        ``enginewire.reference.ring.MessageQueue`` changes one step of both ends."""
        from enginewire.reference.ring import MessageQueue

        return MessageQueue

    def create_writer(self, *, n_reader: int, max_chunk_bytes: int, max_chunks: int) -> Any:
        return ReferenceRingWriter(n_reader, max_chunk_bytes, max_chunks,
                                   queue_class=self.queue_class())

    def create_remote_writer(self, *, n_reader: int, n_local_reader: int, max_chunk_bytes: int,
                             max_chunks: int, connect_ip: str | None = None) -> Any:
        return ReferenceRingWriter(n_reader, max_chunk_bytes, max_chunks, n_local_reader,
                                   connect_ip, queue_class=self.queue_class())

    def zmq_sockets(self, end: _ReferenceRingEnd) -> list[tuple[str, Any]]:
        queue = end.queue
        found = [("subscribe", queue._local_socket), ("notify", queue._notify_socket),
                 ("remote", queue._remote_socket)]
        return [(channel, sock) for channel, sock in found if sock is not None]

    def attach_reader(self, handle: RingHandle, rank: int) -> Any:
        native = _native_handle(handle)
        return _ReferenceRingEnd(self.queue_class().create_from_handle(
            native, native.local_reader_ranks[rank]))

    def start_worker(self, broadcast: RingHandle, rank: int, worker: Any) -> Any:
        """A reference worker, reader ``rank`` of the suite's broadcast ring."""
        return ReferenceWorkerPeer(broadcast, rank, worker)

    def create_executor(self, *, world_size: int, max_chunk_bytes: int,
                        max_chunks: int) -> Any:
        return ReferenceExecutorEnd(world_size, max_chunk_bytes, max_chunks)

    def memory_writer_class(self) -> Any:
        """The sans-IO flag-protocol writer over a memory (factory, ``ring.memory``)."""
        from enginewire.reference.ring import RingWriter

        return RingWriter

    def memory_reader_class(self) -> Any:
        """The sans-IO flag-protocol reader over a memory (factory, ``ring.memory``)."""
        from enginewire.reference.ring import RingReader

        return RingReader

    def memory_writer(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int) -> Any:
        from enginewire.reference.ring import RingLayout
        from enginewire.reference.ring.framing import overflow_total, write_chunk

        writer = self.memory_writer_class()(memory, RingLayout(n_reader, max_chunk_bytes,
                                                               max_chunks))

        class _Writer:
            def write(self, buffers: list[bytes]) -> bool:
                if writer.try_acquire() is None:
                    return False
                if overflow_total(buffers) >= max_chunk_bytes:
                    memory.store(writer.chunk_offset(), 1)  # the rest goes over the XPUB
                else:
                    write_chunk(memory.write, buffers, base=writer.chunk_offset())
                writer.commit()
                # After the written flag and its fence (ring.notify.after-written-flag).
                memory.notify()
                return True

        return _Writer()

    def memory_reader(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int, rank: int) -> Any:
        from enginewire.reference.ring import RingLayout, decode_chunk

        layout = RingLayout(n_reader, max_chunk_bytes, max_chunks)
        reader = self.memory_reader_class()(memory, layout, rank)

        class _Reader:
            def read(self, consume: Any = None) -> list[bytes] | None:
                if reader.try_acquire() is None:
                    return None
                try:
                    chunk = memory.read(reader.chunk_offset(), max_chunk_bytes)
                    decoded = decode_chunk(chunk)
                    got = [bytes(b) for b in decoded.buffers] if not decoded.overflow else []
                    if consume is not None:
                        consume(got)  # may raise: the chunk is released all the same
                    return got
                finally:
                    reader.release()

        return _Reader()


class ReferenceWorkerPeer:
    """``enginewire.reference.ring.Worker`` serving on a thread of this process."""

    def __init__(self, broadcast: RingHandle, rank: int, worker: Any) -> None:
        import threading

        from enginewire.reference.ring import Worker

        self.worker = Worker(_native_handle(broadcast), rank, worker)
        self.response_handle = ring_handle(self.worker.response_handle, 1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"reference worker {rank}")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.wait_until_ready(timeout=30.0)
            self.worker.serve()
        except BaseException as exc:  # noqa: BLE001 - kept for the check's report
            self.error = exc

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close both rings; a thread still inside a worker method after
        ``timeout`` finds them closed (its reply raises ``QueueClosed``)."""
        self.worker.stop()
        self.thread.join(timeout)
        self.worker.close()

    def alive(self) -> bool:
        return self.thread.is_alive()


class ReferenceExecutorEnd:
    """``enginewire.reference.ring.Executor`` behind the target contract.

    The reference raises its own typed errors, subclasses of what vLLM's executor raises that
    name the clause (``WorkerFailure``, a ``RuntimeError``; ``ProtocolTimeout``, a
    ``TimeoutError``); the contract asks for vLLM's exact type, so they are re-raised as that
    type with the reference's own text (``.message``) and the same cause.
    """

    def __init__(self, world_size: int, max_chunk_bytes: int, max_chunks: int) -> None:
        from enginewire.reference.ring import Executor

        self.executor = Executor(world_size, max_chunk_bytes=max_chunk_bytes,
                                 max_chunks=max_chunks)
        self.broadcast_handle = ring_handle(self.executor.broadcast_handle, world_size)

    def connect(self, response_handles: list[RingHandle], timeout: float) -> None:
        self.executor.connect([_native_handle(h) for h in response_handles], timeout)

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None,
                       unique_reply_rank: int | None = None,
                       timeout: float | None = None) -> Any:
        from enginewire.reference.errors import ProtocolTimeout, WorkerFailure

        try:
            return self.executor.collective_rpc(method, args, kwargs, unique_reply_rank,
                                                timeout)
        except WorkerFailure as exc:
            raise RuntimeError(exc.message) from exc
        except ProtocolTimeout as exc:
            raise TimeoutError(exc.message) from exc.__cause__

    def close(self) -> None:
        self.executor.close()


def _native_handle(handle: RingHandle) -> Any:
    """The suite's neutral RingHandle as the reference ring's ``Handle``."""
    from enginewire.reference.ring import Handle

    return handle.as_handle(Handle)


class _Collect(logging.Handler):
    """Keeps the reference peers' log records (instead of the last-resort stderr print)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < 1000:
            self.lines.append(record.getMessage())


_ENGINE_LOG = _Collect()
logging.getLogger("enginewire.engine").addHandler(_ENGINE_LOG)
#: The reference worker logs every exception a worker method raises; checks raise some.
logging.getLogger("enginewire.executor").addHandler(_ENGINE_LOG)


class ReferenceEnginePeer:
    """A reference engine running on a thread of this process: ``engine_class`` (a
    ``ReferenceEngine`` or a subclass) with the launch's options and ``options`` (other
    ``EngineOptions`` fields, e.g. ``step_delay``)."""

    def __init__(self, launch: Any, engine_class: type | None = None,
                 **options: Any) -> None:
        import threading

        from enginewire.reference.engine import EngineOptions, ReferenceEngine

        self.engine = (engine_class or ReferenceEngine)(EngineOptions(
            handshake_address=launch.handshake_address, rank=launch.engine_index,
            local=launch.local, headless=launch.headless, dp_size=launch.dp_size,
            handshake_timeout=launch.init_timeout,
            input_addresses=launch.input_addresses, output_addresses=launch.output_addresses,
            **options,
        ))
        self.status: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"reference engine {launch.engine_index}")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.status = self.engine.run()
        except BaseException as exc:  # noqa: BLE001 - kept for the check's report
            self.error = exc

    def stop(self, timeout: float = 5.0) -> None:
        self.engine.request_stop()
        self.thread.join(timeout)

    def alive(self) -> bool:
        return self.thread.is_alive()


class ReferenceEngines:
    """The reference engine surface: engines on threads of this process, ``engine_class`` and
    ``options`` as :class:`ReferenceEnginePeer`'s (default: ``ReferenceEngine`` with default
    options). Extension point: :meth:`engine_class` (a subclass of
    ``enginewire.reference.engine.ReferenceEngine`` changes one step of the engine)."""

    def __init__(self, engine_class: type | None = None, **options: Any) -> None:
        self._engine_class = engine_class
        self.options = options

    def engine_class(self) -> Any:
        if self._engine_class is not None:
            return self._engine_class
        from enginewire.reference.engine import ReferenceEngine

        return ReferenceEngine

    def start_engine(self, launch: Any) -> ReferenceEnginePeer:
        return ReferenceEnginePeer(launch, self.engine_class(), **self.options)

    def die(self, peer: ReferenceEnginePeer) -> None:
        peer.engine.request_death()

    def zmq_sockets(self, peer: ReferenceEnginePeer) -> list[tuple[str, Any]]:
        """The engine's open input DEALERs and output PUSHes (its handshake DEALER lives only
        inside the handshake)."""
        engine = peer.engine
        return [(s.channel, s.socket) for s in (*engine._inputs, *engine._outputs)]


class ReferenceFrontendClient:
    """``enginewire.reference.frontend.ReferenceFrontend`` behind the FrontendClient contract."""

    def __init__(self, launch: Any, codec: ReferenceCodec, frontend_class: Any = None) -> None:
        if frontend_class is None:
            from enginewire.reference.frontend import ReferenceFrontend as frontend_class

        self.codec = codec
        release = {} if codec.version in (None, REFERENCE_VLLM_VERSION) else {
            "version": codec.version}
        self.frontend = frontend_class(
            launch.engine_count, handshake_address=launch.handshake_address,
            input_address=launch.input_address, output_address=launch.output_address,
            **release,
        )
        # ReferenceFrontend has no parameter for it; its session checks READY's hash.
        self.frontend.session.config_hash = launch.parallel_config_hash
        # A check may wait (wait_ready, call_utility, next_outputs) on a thread of its own
        # while its clean-up stops the front end: a zmq socket closed under a poll on another
        # thread aborts the process. So each wait polls in slices, holding ``_busy``, and
        # gives up once ``_stopping`` is set; stop() closes the sockets only after that.
        self._busy = threading.Lock()
        self._stopping = threading.Event()

    def _until(self, timeout: float, attempt: Callable[[float], Any]) -> Any:
        """``attempt(seconds)`` in slices of at most ``WAIT_SLICE_S`` until it returns,
        ``timeout`` s pass (its last ProtocolTimeout propagates) or stop() is called."""
        from enginewire.reference.errors import ProtocolTimeout

        deadline = time.monotonic() + timeout
        with self._busy:
            while True:
                if self._stopping.is_set():
                    raise ConnectionError("the front end was stopped while a call waited")
                remaining = deadline - time.monotonic()
                try:
                    return attempt(max(0.0, min(WAIT_SLICE_S, remaining)))
                except ProtocolTimeout as exc:
                    if remaining <= WAIT_SLICE_S:
                        # The whole wait timed out: say so, not the last slice's length.
                        raise ProtocolTimeout(
                            exc.clause, exc.message.replace(f"{WAIT_SLICE_S} s", f"{timeout} s"),
                            expected=exc.expected, got=exc.got) from None

    def wait_ready(self, timeout: float) -> None:
        self._until(timeout, self.frontend.wait_ready)

    def add_request(self, request: dict[str, Any], engine_index: int = 0) -> None:
        spec = self.codec.spec
        if spec.version != REFERENCE_VLLM_VERSION:
            # A request written for the newest layout, as the release lays it out.
            request, absent = for_release(request, "EngineCoreRequest", spec)
            if absent:
                raise NotInRelease(f"vLLM {spec.version} has no {', '.join(absent)}")
        value = build(request, "EngineCoreRequest", spec, self.codec._class)
        self.frontend.add_request(value, engine_index)

    def abort(self, request_ids: list[str], engine_index: int = 0) -> None:
        self.frontend.abort(request_ids, engine_index)

    def call_utility(self, method: str, args: list[Any], engine_index: int = 0,
                     timeout: float = 5.0) -> Any:
        from enginewire.reference.errors import ProtocolTimeout

        future = self.frontend.call_utility_async(method, *args, engine_index=engine_index)

        def pump(seconds: float) -> Any:
            if not future.done():
                self.frontend.pump(seconds)
            if not future.done():
                raise ProtocolTimeout("frames.utility-reply", f"no reply to utility call "
                                      f"{method!r} within {timeout} s")
            return future.result()

        return self._until(timeout, pump)

    def next_outputs(self, timeout: float) -> Any:
        return self._until(timeout, self.frontend.get_output)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the front end once no call waits on its sockets (a waiting call ends within
        ``WAIT_SLICE_S``); raises, leaving the sockets open, when one still waits after
        ``timeout``."""
        self._stopping.set()
        if not self._busy.acquire(timeout=timeout):
            raise RuntimeError(f"a call still waited on the front end {timeout:g} s after stop")
        try:
            self.frontend.close()
        finally:
            self._busy.release()

    def alive(self) -> bool:
        return self.frontend.alive()


class ReferenceFrontends:
    #: ``launch.parallel_config_hash`` becomes the hash the session requires of READY.
    supports_coordinated_dp = True

    def __init__(self, codec: ReferenceCodec) -> None:
        self.codec = codec

    def frontend_class(self) -> Any:
        """The front end it starts (factory): a subclass of
        ``enginewire.reference.frontend.ReferenceFrontend`` changes one step."""
        from enginewire.reference.frontend import ReferenceFrontend

        return ReferenceFrontend

    def start_frontend(self, launch: Any) -> ReferenceFrontendClient:
        return ReferenceFrontendClient(launch, self.codec, self.frontend_class())

    def zmq_sockets(self, client: ReferenceFrontendClient) -> list[tuple[str, Any]]:
        return [(s.channel, s.socket) for s in client.frontend._sockets]


def reference_target(version: str | None = None) -> Target:
    """enginewire's reference implementation (whatever parts of it exist); ``version``: the
    vLLM release whose struct layouts its codec follows."""
    codec = (ReferenceCodec(version=version) if _optional("enginewire.reference.codec")
             is not None else None)
    ring = ReferenceRing() if _optional("enginewire.reference.ring") is not None else None
    # The engines speak the release's layouts, handshake keys and ready response.
    release: dict[str, Any] = ({} if version in (None, REFERENCE_VLLM_VERSION)
                               else {"version": version})
    engine = ReferenceEngines(**release) if _optional("enginewire.reference.engine") else None
    frontend = None
    if codec is not None and _optional("enginewire.reference.frontend") is not None:
        frontend = ReferenceFrontends(codec)
    return Target(
        name="reference",
        codec=codec,
        ring=ring,
        engine=engine,
        frontend=frontend,
        description="enginewire.reference",
    )
