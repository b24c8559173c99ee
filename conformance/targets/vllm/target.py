"""The built-in target ``vllm``: thin adapters over vLLM 0.33.0's own code.

- ``codec``: ``vllm.v1.serial_utils.MsgpackEncoder``/``MsgpackDecoder`` for tensors and structs,
  ``msgspec.msgpack`` for the handshake maps, exactly as vLLM's engine core and client call them
  (``vllm/v1/engine/core.py:1942-2040``, ``vllm/v1/engine/core_client.py:1005-1050``,
  ``vllm/v1/engine/utils.py:1485-1548``). Neutral values become vLLM's classes through the
  spec's ``vllm_class`` names.
- ``ring``: ``vllm.distributed.device_communicators.shm_broadcast.MessageQueue``, and the
  executor RPC over it: ``MultiprocExecutor.collective_rpc`` and ``WorkerProc``'s busy loop
  (:class:`VllmExecutor`, :class:`VllmWorker`), without processes or a model.
- ``frontend``: ``AsyncMPClient`` given ``client_addresses``
  (:mod:`enginewire.conformance.targets.vllm.frontend_client`).
- ``engine``: vLLM's ``EngineCoreProc`` launched by its ``CoreEngineProcManager``, with only the
  model layer (the worker) stood in (:mod:`enginewire.conformance.targets.vllm.engine_core`).

The adapters decide nothing: where vLLM deviates from the spec, the checks fail against this
target, and the expected-failure list ``conformance/data/expected/vllm-0.33.0.txt`` records it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from enginewire.conformance.oracle.values import build, import_class
from enginewire.conformance.targets.contract import RingHandle, Target
from enginewire.conformance.targets.vllm.ring_memory import VllmMemoryRing
from enginewire.spec import load

#: Message kinds on the input channel: kind -> (type byte, payload type).
INPUT_KINDS = {
    t.message: (bytes([t.byte]), "EngineCoreRequest" if t.name == "ADD" else None)
    for t in load().surface("request_types").types if t.on_wire and t.message
}
#: Single-frame literals: kind -> bytes (frames.toml, the messages made of one literal frame:
#: engine_core_dead, coordinator_subscribe, coordinator_ready, stats_subscribe).
LITERAL_KINDS = {
    message.kind: bytes.fromhex(message.frames[0].literal_hex or "")
    for message in load().surface("frames").messages
    if len(message.frames) == 1 and message.frames[0].content == "literal"
}
ENGINE_CORE_DEAD = LITERAL_KINDS["engine_core_dead"]
#: Plain msgspec payloads of the coordinator channels (vllm/v1/engine/coordinator.py:288-456).
PLAIN_KINDS = ("stats_update", "scale_elastic_ep")
#: Kinds carried as an EngineCoreOutputs payload (vllm/v1/engine/core.py:2078-2100).
OUTPUT_KINDS = ("outputs", "utility_reply", "coordinator_outputs")


class VllmCodec:
    """vLLM's encoders and decoders behind the codec surface."""

    def __init__(self, threshold: int | None = None, insecure: bool = False) -> None:
        from vllm.v1 import serial_utils

        self._serial = serial_utils
        self.threshold = threshold
        self.insecure = insecure
        self.spec = load()
        self.encoder = serial_utils.MsgpackEncoder(size_threshold=threshold)

    def with_threshold(self, threshold: int) -> VllmCodec:
        return VllmCodec(threshold, self.insecure)

    def with_insecure_serialization(self) -> VllmCodec:
        """vLLM with VLLM_ALLOW_INSECURE_SERIALIZATION=1 (set only around each call: vLLM
        reads the variable on every use until its env cache is enabled)."""
        return VllmCodec(self.threshold, insecure=True)

    def _environment(self) -> Any:
        import contextlib
        import os

        @contextlib.contextmanager
        def scope() -> Any:
            if not self.insecure:
                yield
                return
            before = os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION")
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
            try:
                yield
            finally:
                if before is None:
                    os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)
                else:
                    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = before

        return scope()

    # -- classes --------------------------------------------------------------------------

    @functools.cache  # noqa: B019 - one codec per run, a few dozen names
    def _builder(self, name: str) -> Any:
        if name == "UtilityResult":
            # vLLM's UtilityResult(r) wraps the value; its type_info is derived on encode.
            return lambda type_info=None, value=None: self._serial.UtilityResult(value)
        return self._class(name)

    def _class(self, name: str) -> Any:
        item = self.spec.structs.get(name)
        path = getattr(item, "vllm_class", None)
        if not path:
            return None
        try:
            return import_class(path)
        except (ImportError, AttributeError):
            return None

    def _build(self, kind: str, value: Any) -> Any:
        return build(value, kind, self.spec, self._builder)

    # -- surface --------------------------------------------------------------------------

    def encode(self, kind: str, value: Any) -> list[Any]:
        with self._environment():
            return self._encode(kind, value)

    def decode(self, kind: str, frames: Sequence[Any]) -> Any:
        with self._environment():
            try:
                return self._decode(kind, frames)
            except NotImplementedError as exc:
                # vLLM's ext hook refuses an extension code it does not know with
                # NotImplementedError ("Extension type code 9 is not supported"): that is its
                # rejection of the frame, not a missing decoder (contract: rejections).
                if str(exc).startswith("Extension type code"):
                    raise ValueError(f"vLLM refused the frame: {exc}") from exc
                raise

    def _encode(self, kind: str, value: Any) -> list[Any]:
        import msgspec

        if kind in INPUT_KINDS:
            type_byte, payload_type = INPUT_KINDS[kind]
            payload = self._build(payload_type, value) if payload_type else _tuples(value)
            return [type_byte, *self.encoder.encode(payload)]
        if kind in ("hello", "ready"):
            return [msgspec.msgpack.encode(value)]
        if kind == "init":
            return [msgspec.msgpack.encode(self._build("EngineHandshakeMetadata", value))]
        if kind == "ready_response":
            return [msgspec.msgpack.encode(self._build("EngineCoreReadyResponse", value))]
        if kind in OUTPUT_KINDS:
            return list(self.encoder.encode(self._build("EngineCoreOutputs", value)))
        if kind in LITERAL_KINDS:
            return [LITERAL_KINDS[kind]]
        if kind in PLAIN_KINDS:
            return [msgspec.msgpack.encode(value)]
        if kind in ("EngineHandshakeMetadata", "EngineCoreReadyResponse"):
            return [msgspec.msgpack.encode(self._build(kind, value))]
        return list(self.encoder.encode(self._build(kind, value)))

    def _decode(self, kind: str, frames: Sequence[Any]) -> Any:
        import msgspec
        from vllm.v1.engine import EngineCoreRequestType

        frames = [bytes(f) if not isinstance(f, memoryview) else f for f in frames]
        if kind in INPUT_KINDS:
            if not frames:
                raise ValueError("no frames")
            request_type = EngineCoreRequestType(bytes(frames[0]))
            if request_type.value != INPUT_KINDS[kind][0]:
                raise ValueError(f"type byte {bytes(frames[0])!r} is not {kind}")
            payload_type = INPUT_KINDS[kind][1]
            decoder = (
                self._serial.MsgpackDecoder(self._class(payload_type))
                if payload_type
                else self._serial.MsgpackDecoder()
            )
            return decoder.decode(frames[1:])
        if kind in ("hello", "ready"):
            (frame,) = frames
            message = msgspec.msgpack.decode(frame)
            # What vllm/v1/engine/utils.py:1493 reads from every handshake message.
            message["status"], message["local"], message["headless"]  # noqa: B018
            return message
        if kind in ("init", "EngineHandshakeMetadata"):
            (frame,) = frames
            return msgspec.msgpack.decode(frame, type=self._class("EngineHandshakeMetadata"))
        if kind in ("ready_response", "EngineCoreReadyResponse"):
            (frame,) = frames
            return msgspec.msgpack.decode(frame, type=self._class("EngineCoreReadyResponse"))
        if kind in LITERAL_KINDS:
            if len(frames) != 1 or bytes(frames[0]) != LITERAL_KINDS[kind]:
                raise ValueError(f"not the {kind} literal {LITERAL_KINDS[kind]!r}")
            return None
        if kind in PLAIN_KINDS:
            (frame,) = frames
            return msgspec.msgpack.decode(frame)
        if kind in OUTPUT_KINDS:
            kind = "EngineCoreOutputs"
        cls = self._class(kind)
        decoder = self._serial.MsgpackDecoder(cls)
        return decoder.decode(list(frames))


def _tuples(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# --- ring --------------------------------------------------------------------------------


class VllmRingWriter:
    def __init__(self, n_reader: int, max_chunk_bytes: int, max_chunks: int,
                 n_local_reader: int | None = None, connect_ip: str | None = None) -> None:
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

        from enginewire.conformance.targets.reference import ring_handle

        local = n_reader if n_local_reader is None else n_local_reader
        self.queue = MessageQueue(
            n_reader, local, max_chunk_bytes=max_chunk_bytes, max_chunks=max_chunks,
            connect_ip=connect_ip,
        )
        self.handle = ring_handle(self.queue.export_handle(), n_reader)
        # vLLM's own method (same signature): no wrapper call per message, which the ring
        # bench would otherwise measure.
        self.enqueue: Callable[[Any, float | None], None] = self.queue.enqueue

    def wait_until_ready(self, timeout: float) -> None:
        _bounded(self.queue.wait_until_ready, timeout, "writer wait_until_ready")

    def close(self) -> None:
        _close_queue(self.queue)


def _vllm_handle(handle: RingHandle) -> Any:
    """The suite's neutral handle as vLLM's ``shm_broadcast.Handle``."""
    from vllm.distributed.device_communicators.shm_broadcast import Handle

    return handle.as_handle(Handle)


class VllmRingReader:
    def __init__(self, handle: RingHandle, rank: int) -> None:
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

        ranks = list(handle.reader_ranks or range(handle.n_reader))
        self.queue = MessageQueue.create_from_handle(_vllm_handle(handle), ranks[rank])
        self.dequeue: Callable[[float | None], Any] = self.queue.dequeue  # as the writer's

    def wait_until_ready(self, timeout: float) -> None:
        _bounded(self.queue.wait_until_ready, timeout, "reader wait_until_ready")

    def close(self) -> None:
        _close_queue(self.queue)


def _bounded(func: Any, timeout: float, what: str) -> None:
    """Run a blocking vLLM call that has no timeout of its own in a thread, bounded."""
    import threading

    error: list[BaseException] = []

    def body() -> None:
        try:
            func()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            error.append(exc)

    worker = threading.Thread(target=body, daemon=True, name=what)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"{what} did not finish within {timeout:g} s")
    if error:
        raise error[0]


#: ipc socket files vLLM's queues leave behind (vLLM does not remove them,
#: ring.lifecycle.ipc-files); removed when the target closes, after the checks looked.
_LEFTOVER_IPC: list[str] = []


def _close_queue(queue: Any) -> None:
    """Close a queue the way vLLM's own finalizer does (sockets and context, the segment
    unlinked by its creator), and remember the writer's ipc files for :func:`sweep`."""
    queue.shutdown()
    # What vLLM's finalizer (_close_zmq, shm_broadcast.py:604-620) does, now rather than at
    # garbage collection.
    sockets = [queue.local_socket, getattr(queue, "remote_socket", None)]
    condition = getattr(queue, "_spin_condition", None)
    if condition is not None:
        sockets += [condition.local_notify_socket, condition.read_cancel_socket,
                    condition.write_cancel_socket]
    contexts = set()
    for sock in sockets:
        if sock is not None:
            contexts.add(sock.context)
            sock.close(linger=0)
    for context in contexts:
        context.term()
    buffer = getattr(queue, "buffer", None)
    if buffer is not None and getattr(buffer, "is_creator", False):
        # Unlink first: close() raises BufferError while a view of the segment is still alive
        # (a frame or a traceback may keep one), and the name must go all the same.
        try:
            buffer.shared_memory.unlink()
        except FileNotFoundError:
            pass
        try:
            buffer.shared_memory.close()
        except BufferError:
            pass  # unmapped when the last view goes
        buffer.is_creator = False
    if queue._is_writer:
        for address in (queue.handle.local_subscribe_addr, queue.handle.local_notify_addr):
            if address and address.startswith("ipc://"):
                _LEFTOVER_IPC.append(address[len("ipc://"):])


def sweep() -> None:
    """Remove the ipc files vLLM's closed queues left behind."""
    import os

    while _LEFTOVER_IPC:
        try:
            os.unlink(_LEFTOVER_IPC.pop())
        except FileNotFoundError:
            pass


class VllmWorker:
    """vLLM's ``WorkerProc`` without a model: its message-queue set-up
    (``_init_message_queues``: reader of the broadcast ring, ``MessageQueue(1, 1)`` for the
    replies) and its ``worker_busy_loop`` on a thread, executing calls on the suite's worker
    object (``multiproc_executor.py:1091-1183``)."""

    def __init__(self, broadcast: RingHandle, rank: int, worker: Any) -> None:
        import threading
        from types import SimpleNamespace

        from vllm.v1.executor.multiproc_executor import WorkerProc

        from enginewire.conformance.targets.reference import ring_handle

        proc = WorkerProc.__new__(WorkerProc)
        proc.rank = rank
        proc.worker = worker
        proc.use_async_scheduling = False
        proc._init_message_queues(
            _vllm_handle(broadcast),
            SimpleNamespace(parallel_config=SimpleNamespace(nnodes_within_dp=1)),
        )
        self.proc = proc
        self.response_handle = ring_handle(proc.worker_response_mq.export_handle(), 1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"vllm worker {rank}")
        self.thread.start()

    def _run(self) -> None:
        try:
            # WorkerProc.worker_main's order (multiproc_executor.py:1042-1043).
            self.proc.rpc_broadcast_mq.wait_until_ready()
            self.proc.worker_response_mq.wait_until_ready()
            self.proc.worker_busy_loop()
        except BaseException as exc:  # noqa: BLE001 - "cancelled" after stop(), kept otherwise
            self.error = exc

    def stop(self, timeout: float = 5.0) -> None:
        self.proc.rpc_broadcast_mq.shutdown()
        self.thread.join(timeout)
        _close_queue(self.proc.rpc_broadcast_mq)
        _close_queue(self.proc.worker_response_mq)

    def alive(self) -> bool:
        return self.thread.is_alive()


class VllmExecutor:
    """vLLM's ``MultiprocExecutor`` without workers processes: its broadcast queue as
    ``_init_executor`` creates it, readers of the suite's response rings, and its own
    ``collective_rpc`` (``multiproc_executor.py:162-185``, ``:266-273``, ``:447-556``);
    fault tolerance off."""

    def __init__(self, world_size: int, max_chunk_bytes: int, max_chunks: int) -> None:
        from collections import deque
        from types import SimpleNamespace

        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        from enginewire.conformance.targets.reference import ring_handle

        executor = MultiprocExecutor.__new__(MultiprocExecutor)
        executor.is_failed = False
        executor.vllm_config = SimpleNamespace(  # type: ignore[assignment]
            parallel_config=SimpleNamespace(enable_fault_tolerance=False))
        executor.futures_queue = deque()
        executor.response_mqs = []
        executor.rpc_broadcast_mq = MessageQueue(
            world_size, world_size, max_chunk_bytes=max_chunk_bytes, max_chunks=max_chunks)
        self.executor = executor
        self.broadcast_handle = ring_handle(executor.rpc_broadcast_mq.export_handle(),
                                            world_size)

    def connect(self, response_handles: list[RingHandle], timeout: float) -> None:
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

        executor = self.executor
        executor.response_mqs = [MessageQueue.create_from_handle(_vllm_handle(h), 0)
                                 for h in response_handles]

        def ready() -> None:
            # _init_executor's order: the broadcast queue, then every response queue.
            executor.rpc_broadcast_mq.wait_until_ready()  # type: ignore[union-attr]
            for queue in executor.response_mqs:
                queue.wait_until_ready()

        _bounded(ready, timeout, "executor wait_until_ready")

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None,
                       unique_reply_rank: int | None = None,
                       timeout: float | None = None) -> Any:
        return self.executor.collective_rpc(method, timeout=timeout, args=args, kwargs=kwargs,
                                            unique_reply_rank=unique_reply_rank)

    def close(self) -> None:
        for queue in (self.executor.rpc_broadcast_mq, *self.executor.response_mqs):
            _close_queue(queue)


class VllmRing(VllmMemoryRing):
    """vLLM's ring: its ``MessageQueue`` over real shared memory and sockets, its executor and
    workers, and its ring steps over the suite's memory (``ring.memory``, from
    :class:`~.ring_memory.VllmMemoryRing`)."""

    #: vLLM implements the shared-memory tensor arena (ring.payload.tensor-arena).
    tensor_arena = True

    def start_worker(self, broadcast: RingHandle, rank: int, worker: Any) -> VllmWorker:
        import logging

        # WorkerProc logs every exception of a worker method with its traceback; the checks
        # raise some on purpose.
        logging.getLogger("vllm.v1.executor.multiproc_executor").setLevel(logging.CRITICAL)
        return VllmWorker(broadcast, rank, worker)

    def create_executor(self, *, world_size: int, max_chunk_bytes: int,
                        max_chunks: int) -> VllmExecutor:
        return VllmExecutor(world_size, max_chunk_bytes, max_chunks)

    def zmq_sockets(self, end: Any) -> list[tuple[str, Any]]:
        queue = end.queue
        condition = getattr(queue, "_spin_condition", None)
        found = [("subscribe", queue.local_socket),
                 ("notify", condition.local_notify_socket if condition else None),
                 ("remote", queue.remote_socket)]
        return [(channel, sock) for channel, sock in found if sock is not None]

    def create_writer(self, *, n_reader: int, max_chunk_bytes: int, max_chunks: int) -> Any:
        return VllmRingWriter(n_reader, max_chunk_bytes, max_chunks)

    def create_remote_writer(self, *, n_reader: int, n_local_reader: int, max_chunk_bytes: int,
                             max_chunks: int, connect_ip: str | None = None) -> Any:
        return VllmRingWriter(n_reader, max_chunk_bytes, max_chunks, n_local_reader, connect_ip)

    def attach_reader(self, handle: RingHandle, rank: int) -> Any:
        return VllmRingReader(handle, rank)


def vllm_target() -> Target:
    """vLLM 0.33.0's codec, ring, engine core and front end (requires the ``vllm`` package)."""
    from enginewire.conformance.targets.vllm.engine_core import (
        VllmEngines,
        default_cache_root,
        engine_environment,
    )

    # Before vLLM resolves its platform: the engine core runs on vLLM's CPU platform.
    engine_environment(default_cache_root())
    try:
        import vllm.v1.serial_utils  # noqa: F401
    except ImportError as exc:
        from enginewire.conformance.targets.contract import TargetError

        raise TargetError(f"vllm: the vllm package is not importable: {exc}") from exc
    from enginewire.conformance.targets.vllm.frontend_client import VllmFrontends

    codec = VllmCodec()
    frontends = VllmFrontends(codec)
    engines = VllmEngines()
    target = Target(
        name="vllm",
        codec=codec,
        ring=VllmRing(),
        engine=engines,
        frontend=frontends,
        description="vLLM 0.33.0's own code: MsgpackEncoder/MsgpackDecoder (codec); "
                    "MessageQueue, MultiprocExecutor.collective_rpc and WorkerProc's busy loop "
                    "(ring; MessageQueue.enqueue/dequeue also over the suite's logged memory, "
                    "ring.memory); EngineCoreProc launched by CoreEngineProcManager, with its "
                    "MultiprocExecutor and worker processes, only the worker a stand-in "
                    "(engine); AsyncMPClient given client_addresses, so without a handshake "
                    "channel (frontend)",
    )
    target._closers += [sweep, frontends.close, engines.close]
    return target
