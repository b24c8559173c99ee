"""The built-in target ``vllm``: thin adapters over vLLM 0.33.0's own code.

- ``codec``: ``vllm.v1.serial_utils.MsgpackEncoder``/``MsgpackDecoder`` for tensors and structs,
  ``msgspec.msgpack`` for the handshake maps, exactly as vLLM's engine core and client call them
  (``vllm/v1/engine/core.py:1942-2040``, ``vllm/v1/engine/core_client.py:1005-1050``,
  ``vllm/v1/engine/utils.py:1485-1548``). Neutral values become vLLM's classes through the
  spec's ``vllm_class`` names.
- ``ring``: ``vllm.distributed.device_communicators.shm_broadcast.MessageQueue``.

The adapters decide nothing: where vLLM deviates from the spec, the checks fail against this
target, and the expected-failure list ``conformance/data/expected/vllm-0.33.0.txt`` records it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from enginewire.spec import load

from .targets import RingHandle, Target
from .values import build, import_class

#: Message kinds on the input channel: kind -> (type byte, payload type).
INPUT_KINDS = {
    "add": (b"\x00", "EngineCoreRequest"),
    "abort": (b"\x01", None),
    "start_dp_wave": (b"\x02", None),
    "utility": (b"\x03", None),
}
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
#: Single-frame literals: kind -> bytes (vllm/v1/engine/coordinator.py:247-254,
#: vllm/v1/engine/core.py:1981, vllm/v1/engine/core_client.py stats subscription).
LITERAL_KINDS = {
    "engine_core_dead": ENGINE_CORE_DEAD,
    "coordinator_subscribe": b"\x01",
    "coordinator_ready": b"READY",
    "stats_subscribe": b"\x01",
}
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
            return self._decode(kind, frames)

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

        from .reference_target import ring_handle

        local = n_reader if n_local_reader is None else n_local_reader
        self.queue = MessageQueue(
            n_reader, local, max_chunk_bytes=max_chunk_bytes, max_chunks=max_chunks,
            connect_ip=connect_ip,
        )
        self.handle = ring_handle(self.queue.export_handle(), n_reader)

    def wait_until_ready(self, timeout: float) -> None:
        _bounded(self.queue.wait_until_ready, timeout, "writer wait_until_ready")

    def enqueue(self, obj: Any, timeout: float | None = None) -> None:
        self.queue.enqueue(obj, timeout=timeout)

    def close(self) -> None:
        _close_queue(self.queue)


class VllmRingReader:
    def __init__(self, handle: RingHandle, rank: int) -> None:
        from vllm.distributed.device_communicators.shm_broadcast import Handle, MessageQueue

        ranks = list(handle.reader_ranks or range(handle.n_reader))
        vllm_handle = Handle(
            local_reader_ranks=ranks,
            buffer_handle=(handle.n_reader, handle.max_chunk_bytes, handle.max_chunks,
                           handle.shm_name),
            local_subscribe_addr=handle.subscribe_address,
            local_notify_addr=handle.notify_address,
            remote_subscribe_addr=handle.remote_subscribe_address,
            remote_addr_ipv6=handle.remote_ipv6,
            tensor_arena_handle=handle.tensor_arena_handle,
        )
        self.queue = MessageQueue.create_from_handle(vllm_handle, ranks[rank])

    def wait_until_ready(self, timeout: float) -> None:
        _bounded(self.queue.wait_until_ready, timeout, "reader wait_until_ready")

    def dequeue(self, timeout: float | None = None) -> Any:
        return self.queue.dequeue(timeout=timeout)

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


def _close_queue(queue: Any) -> None:
    import os

    queue.shutdown()
    buffer = getattr(queue, "buffer", None)
    if buffer is not None and getattr(buffer, "is_creator", False):
        try:
            buffer.shared_memory.close()
            buffer.shared_memory.unlink()
        except (FileNotFoundError, BufferError):
            pass
        buffer.is_creator = False
    for address in (getattr(queue.handle, "local_subscribe_addr", None),
                    getattr(queue.handle, "local_notify_addr", None)):
        if queue._is_writer and address and address.startswith("ipc://"):
            try:
                os.unlink(address.removeprefix("ipc://"))
            except FileNotFoundError:
                pass


class VllmRing:
    #: vLLM implements the shared-memory tensor arena (ring.payload.tensor-arena).
    tensor_arena = True

    def create_writer(self, *, n_reader: int, max_chunk_bytes: int, max_chunks: int) -> Any:
        return VllmRingWriter(n_reader, max_chunk_bytes, max_chunks)

    def create_remote_writer(self, *, n_reader: int, n_local_reader: int, max_chunk_bytes: int,
                             max_chunks: int, connect_ip: str | None = None) -> Any:
        return VllmRingWriter(n_reader, max_chunk_bytes, max_chunks, n_local_reader, connect_ip)

    def attach_reader(self, handle: RingHandle, rank: int) -> Any:
        return VllmRingReader(handle, rank)


def vllm_target() -> Target:
    """vLLM 0.33.0's codec and ring (requires the ``vllm`` package)."""
    try:
        import vllm.v1.serial_utils  # noqa: F401
    except ImportError as exc:
        from .targets import TargetError

        raise TargetError(f"vllm: the vllm package is not importable: {exc}") from exc
    return Target(
        name="vllm",
        codec=VllmCodec(),
        ring=VllmRing(),
        description="vLLM 0.33.0 MsgpackEncoder/Decoder and MessageQueue",
    )
