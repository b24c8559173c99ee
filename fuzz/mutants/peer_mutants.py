"""Peer mutants: the reference engine core with one thing broken.

Each is a subclass of :class:`~enginewire.reference.engine.ReferenceEngine` run on a thread,
behind the conformance ``engine`` surface (:class:`MutantEngines`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from enginewire.conformance.targets.reference import ReferenceEngines
from enginewire.reference.engine import EngineOptions, ReferenceEngine


class BigEndianIdentity(ReferenceEngine):
    """Announces its engine index as a big-endian routing identity (01 02 for engine 258).

    vLLM derives the identity with ``index.to_bytes(2, "little")``
    (``vllm/v1/engine/core.py``); a peer that writes it big-endian is a different engine to
    the front end's ROUTER, the identity confusion behind issue 23247 (an identity reused or
    mistaken on reconnect routes requests to the wrong engine).
    """

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self.connection.identity = options.rank.to_bytes(2, "big")


class _ReusedArenaSocket:
    """A socket whose outgoing frames live in one reused buffer that zmq still reads from.

    A send stages the frames into the arena and leaves them queued; the queued message goes
    out when the next send comes, after that send has staged its own frames over the same
    bytes, or intact when the engine goes idle (:meth:`flush`).
    """

    ARENA_BYTES = 1 << 20

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._arena = bytearray(self.ARENA_BYTES)
        self._queued: list[memoryview] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)

    def send_multipart(self, frames: Sequence[Any], *args: Any, **kwargs: Any) -> None:
        views: list[memoryview] = []
        offset = 0
        arena = memoryview(self._arena)
        for frame in frames:
            data = memoryview(frame).cast("B")
            arena[offset:offset + data.nbytes] = data
            views.append(arena[offset:offset + data.nbytes])
            offset += data.nbytes
        self.flush()
        self._queued = views

    def flush(self) -> None:
        if self._queued is not None:
            queued, self._queued = self._queued, None
            self._socket.send_multipart([bytes(v) for v in queued])


class ReusedFrameBuffer(ReferenceEngine):
    """Encodes every output message into one buffer it hands to zmq without copying, and
    reuses that buffer for the next message while zmq is still sending the previous one.

    vLLM issues 15207 and 17203 and PR 50053: ``send_multipart(..., copy=False)`` returns
    before zmq's I/O thread has sent the frames; a buffer reused (or a tensor changed) in that
    window changes a message already "sent". Under a stream of outputs every message but the
    last arrives with the next one's bytes.
    """

    def _connect(self, addresses: Any) -> None:
        super()._connect(addresses)
        for channel in self._outputs:
            channel.socket = _ReusedArenaSocket(channel.socket)  # type: ignore[assignment]

    def _flush_when_idle(self) -> None:
        if not self._running:
            for channel in self._outputs:
                flush = getattr(channel.socket, "flush", None)
                if flush is not None:
                    flush()

    def _handle(self, frames: list[bytes]) -> None:
        super()._handle(frames)
        self._flush_when_idle()

    def _step(self) -> None:
        super()._step()
        self._flush_when_idle()

    def _send_dead(self) -> None:
        super()._send_dead()
        for channel in self._outputs:
            flush = getattr(channel.socket, "flush", None)
            if flush is not None:
                flush()


class MutantEngines(ReferenceEngines):
    """The reference engine surface, starting ``engine_cls`` engines."""

    def __init__(self, engine_cls: type[ReferenceEngine]) -> None:
        super().__init__(engine_cls)
