"""The one exception hierarchy of enginewire's reference implementation.

Every violation of the protocol raises a :class:`ProtocolError` subclass that carries the ID
of the spec clause it breaks, what was expected and what came, so a log line or a conformance
report can point at the exact rule (``enginewire spec show CLAUSE``).
"""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """A peer, a frame or a ring broke a clause of the spec.

    ``path`` (``$[1][0][12]``) and ``field`` (``EngineCoreOutput.routed_experts``) say where in
    a payload, when the decoder knows; the message then starts with them too.
    """

    path: str | None = None
    field: str | None = None

    def __init__(
        self,
        clause: str,
        message: str,
        *,
        expected: Any = None,
        got: Any = None,
    ) -> None:
        self.clause = clause
        self.message = message
        self.expected = expected
        self.got = got
        detail = message
        if expected is not None or got is not None:
            detail += f" (expected {expected!r}, got {got!r})"
        super().__init__(f"[{clause}] {detail}")


class FramingError(ProtocolError):
    """Wrong frame count, type byte, identity or sentinel."""


class PayloadError(ProtocolError):
    """A msgpack payload does not decode to the struct or value the spec names."""


class TensorError(ProtocolError):
    """A tensor tuple breaks the tensors surface (dtype, shape, data, buffer index, ext code)."""


class StateError(ProtocolError):
    """An event that is not allowed in the session's current state."""


class HandshakeError(StateError):
    """The start-up handshake went off the spec's state machine."""


class RingError(ProtocolError):
    """The shared-memory ring's layout, flags or chunk framing break the ring surface."""


class ProtocolTimeout(ProtocolError, TimeoutError):
    """A wait bounded by the spec (or by the caller) ran out."""


class EngineDeadError(StateError, ConnectionError):
    """The engine sent ENGINE_CORE_DEAD (or the session already saw it): nothing more is
    sent to it or accepted from it."""


class ExecutorError(ProtocolError):
    """A request or reply of the executor RPC over the ring breaks a ``ring.executor.*``
    clause (a request that is not ``(method, args, kwargs, output_rank)``, a reply that is not
    ``(status, value)``)."""


class WorkerFailure(ExecutorError, RuntimeError):
    """A worker answered a call with FAILURE or FAILURE_WITH_KV_OUTPUT (clause
    ``ring.executor.failure``).

    A ``RuntimeError`` as vLLM's executor raises; ``message`` is vLLM's exact text,
    ``rank`` the worker that failed, ``status`` its reply status and ``value`` what it sent
    (the exception text, or the KV connector output).
    """

    def __init__(self, message: str, *, rank: int, status: Any, value: Any) -> None:
        super().__init__("ring.executor.failure", message)
        self.rank = rank
        self.status = status
        self.value = value


class RingPeerDead(RingError):
    """The process at the other end of a ring (its writer, or one of its local readers) is no
    longer running (clause ring.liveness.peer-dead); ``peer`` says which end, ``pid`` which
    process."""

    def __init__(self, clause: str, message: str, *, expected: Any = None, got: Any = None,
                 peer: str = "", pid: int = 0) -> None:
        super().__init__(clause, message, expected=expected, got=got)
        self.peer = peer
        self.pid = pid


class UnsafePickleError(RingError):
    """A ring payload names a global outside the allow-list of the reader's unpickler
    (clause ring.payload.pickle-allow-list); nothing of it ran."""
