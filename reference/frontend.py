"""A reference front end over ZMQ: a thin loop over a
:class:`~enginewire.reference.connection.FrontendConnection` (the codec and the session).

It binds what vLLM's front end binds (the handshake ROUTER, the input ROUTER, the output PULL),
runs the handshake with ``engine_count`` engines (ranks 0..N-1), waits for one ready response
per engine identity, and then sends requests and utility calls and reads outputs.

Built for a release without the HELLO/READY handshake (before 0.9.0: history/constants.toml
``[[transport]]``) it opens that release's input and output sockets (before 0.8.4 a PUSH input
without identity frames, before 0.8.3 an output PULL that connects to the engine's bound PUSH)
and the engines are given the addresses directly; an engine counts as ready once its input
is connected (before 0.8.4: the release signals readiness over a process pipe) or once its
``b"READY"`` came (0.8.4, 0.8.5).

It is single-threaded and has no background reader: outputs and utility replies are read while
:meth:`ReferenceFrontend.get_output`, :meth:`ReferenceFrontend.call_utility` or
:meth:`ReferenceFrontend.pump` run. Request outputs read while waiting for a utility reply are
queued for :meth:`get_output`. Every wait takes a timeout and raises
:class:`~enginewire.reference.errors.ProtocolTimeout` (a ``TimeoutError``) when it runs out.
After ENGINE_CORE_DEAD, :meth:`get_output` first returns the outputs that came before it, then
raises :class:`~enginewire.reference.errors.EngineDeadError` (a ``ConnectionError``), as does
every send; pending utility calls fail with it at once.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import zmq

from enginewire.spec.history.release_facts import (
    handshake_on_input,
    init_message_value,
    transport_at,
    utility_value,
)
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

from . import structs
from .addresses import ipc_address
from .codec import default_codec
from .connection import (
    EngineDied,
    FrontendConnection,
    HelloReceived,
    OutputsReceived,
    UtilityReplied,
)
from .errors import EngineDeadError, ProtocolError, ProtocolTimeout
from .session import FrontendSession, get_field
from .transport import (
    ChannelSocket,
    open_socket,
    poll_items,
    readable,
    receive_frames,
    send_frames,
    wait_readable,
)

#: Most messages one :meth:`ReferenceFrontend.pump` reads after its poll, so a flood of outputs
#: cannot hold off the caller (as the engine bounds its reads per poll).
MAX_MESSAGES_PER_PUMP = 256


class UtilityCallError(ProtocolError):
    """The engine answered a utility call with a failure message."""

    def __init__(self, method: str, failure_message: str) -> None:
        super().__init__("handshake.session.unknown-method-fails-call",
                         f"utility call {method!r} failed: {failure_message}")
        self.method = method
        self.failure_message = failure_message


class ReferenceFrontend:
    """Front end for ``engine_count`` engines.

    Addresses default to fresh ``ipc://`` paths; pass ``tcp://host:0`` to bind any free port
    (the resolved address is in :attr:`handshake_address`, :attr:`input_address`,
    :attr:`output_address`). ``handshake=False`` skips the handshake channel (the engines are
    given the input/output addresses directly, as with vLLM's ``client_addresses``); a
    ``version`` without the handshake (before 0.9.0) always does, opening that release's
    input and output sockets (a connecting one at the address its engine binds); at 0.9.0
    the handshake runs on the input ROUTER (:attr:`handshake_address` is its address, the init
    message the release's plain map, READY the ready response).
    ``local`` and ``remote_headless`` are what the engines' HELLO/READY must say.
    ``version``: the vLLM release whose struct layouts it sends and reads (its codec is built
    for that release; None: the spec's reference release).
    """

    def __init__(
        self,
        engine_count: int = 1,
        *,
        handshake_address: str | None = None,
        input_address: str | None = None,
        output_address: str | None = None,
        handshake: bool = True,
        local: bool = True,
        remote_headless: bool = True,
        client_index: int = 0,
        version: str | None = None,
    ) -> None:
        self.engine_count = engine_count
        self.client_index = client_index
        if version == REFERENCE_VLLM_VERSION:
            version = None
        #: The vLLM release whose layouts it speaks (None: the spec's reference release).
        self.version = version
        release = transport_at(version) if version is not None else None
        if release is not None and not release.handshake:
            handshake = False  # the release has none: the engines get the addresses directly
        #: Whether input messages carry the engine identity first (a ROUTER input).
        self._routed = release is None or release.identity
        #: Engines count as ready once connected (the release's ready signal has no wire form).
        self._ready_on_connect = release is not None and release.readiness == "pipe"
        #: The handshake runs on the input ROUTER (0.9.0): no handshake socket of its own.
        self._on_input = version is not None and handshake_on_input(version)
        if not self._routed and engine_count != 1:
            raise ValueError(f"vLLM {version}'s input channel carries no engine identity: "
                             "one engine per front end")
        self.connection = FrontendConnection(
            range(engine_count), local=local, remote_headless=remote_headless,
            handshake=handshake,
            codec=default_codec(version=version) if version is not None else None,
        )
        self.structs = structs.ReleaseStructs(
            self.connection.codec if version is not None else None)
        self._ctx = zmq.Context()
        self._sockets: list[ChannelSocket] = []
        self._handshake: ChannelSocket | None = None
        # Set before any socket opens: close() after a failed bind reads them.
        self._outputs: deque[Any] = deque()
        self._calls: dict[int, tuple[str, Future[Any]]] = {}
        try:
            if handshake and not self._on_input:
                self._handshake = self._open("handshake", handshake_address or ipc_address())
            self._input = self._open("input", input_address or ipc_address())
            self._output = self._open("output", output_address or ipc_address())
            self._output_items = poll_items([self._output.socket])
        except BaseException:
            self.close()
            raise
        self._round_robin = itertools.cycle(range(engine_count))
        #: Whether this class reads outputs as this module does (:meth:`_express_path`).
        self._own_receive = type(self)._receive is ReferenceFrontend._receive

    def _open(self, channel: str, address: str) -> ChannelSocket:
        # Ready once connected: a connecting input is writable only once the engine is there.
        sock = open_socket(self._ctx, channel, "frontend", address, version=self.version,
                           immediate=self._ready_on_connect and channel == "input")
        self._sockets.append(sock)
        return sock

    # --- addresses -----------------------------------------------------------------------

    @property
    def handshake_address(self) -> str | None:
        """Where engines send HELLO: the handshake ROUTER, the input ROUTER where the release
        holds the handshake there (0.9.0), None without a handshake."""
        if self._on_input:
            return self._input.address
        return self._handshake.address if self._handshake is not None else None

    @property
    def input_address(self) -> str:
        return self._input.address

    @property
    def output_address(self) -> str:
        return self._output.address

    @property
    def session(self) -> FrontendSession:
        """The connection's session state machines."""
        return self.connection.session

    @property
    def dead(self) -> bool:
        return self.connection.dead

    # --- start-up ------------------------------------------------------------------------

    def wait_ready(self, timeout: float) -> None:
        """Run the handshake and wait for every engine's ready response, within ``timeout`` s.

        A protocol violation during start-up raises (as vLLM's front end fails start-up).
        """
        deadline = time.monotonic() + timeout
        if self.session.awaiting_handshake():
            self._run_handshake(deadline)
        if self._ready_on_connect:
            # Ready once the input can take a message: a connected engine (a connecting input
            # is opened with ZMQ_IMMEDIATE, so it waits for the engine's bind too).
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._input.socket.poll(int(remaining * 1000), zmq.POLLOUT):
                raise ProtocolTimeout(
                    "handshake.frontend.bounded-handshake",
                    "timed out waiting for the engine to connect its input",
                    expected="a connected engine", got=self.session.states(),
                )
            for rank in self.session.awaiting_ready_response():
                self.connection.ready_without_message(rank)
        while self.session.awaiting_ready_response():
            frames = self._recv(self._input, deadline, "a ready response from every engine")
            self.connection.receive("input", frames)

    def _run_handshake(self, deadline: float) -> None:
        """HELLO, init and READY with every engine."""
        make = self.structs.make
        metadata: Any
        if self._on_input:  # the release's plain init map (history [[init_message]])
            metadata = init_message_value(self.version or "", inputs=[self.input_address],
                                          outputs=[self.output_address])
        else:
            metadata = make(
                "EngineHandshakeMetadata",
                addresses=make("EngineZmqAddresses", inputs=[self.input_address],
                               outputs=[self.output_address]),
                parallel_config={},
            )
        sock = self._input if self._on_input else self._handshake
        while self.session.awaiting_handshake():
            assert sock is not None
            frames = self._recv(sock, deadline, "HELLO/READY from every engine")
            for event in self.connection.receive("handshake", frames):
                if isinstance(event, HelloReceived):
                    sock.socket.send_multipart(
                        self.connection.send("init", metadata, rank=event.rank)
                    )

    def _recv(self, sock: ChannelSocket, deadline: float, what: str) -> list[bytes]:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sock.socket.poll(int(remaining * 1000)):
            raise ProtocolTimeout(
                "handshake.frontend.bounded-handshake", f"timed out waiting for {what}",
                expected=what, got=self.session.states(),
            )
        return sock.socket.recv_multipart()

    @property
    def ready_responses(self) -> dict[int, Any]:
        return {rank: link.ready_response for rank, link in self.session.engines.items()}

    # --- requests ------------------------------------------------------------------------

    def _send(self, rank: int, kind: str, value: Any) -> None:
        frames = self.connection.send(kind, value, rank=rank)
        send_frames(self._input.socket, frames if self._routed else frames[1:], copy=False)

    def send_raw(self, engine_index: int, frames: Sequence[Any]) -> None:
        """Send ``frames`` as they are to engine ``engine_index``'s identity on the input
        channel (no identity where the release's input has none), bypassing the codec and the
        session (for robustness tests and fuzzing)."""
        routing = [self.connection.identity(engine_index)] if self._routed else []
        send_frames(self._input.socket, [*routing, *frames], copy=False)

    def add_request(self, request: Any, engine_index: int | None = None) -> int:
        """Send an ADD (an EngineCoreRequest); returns the engine it went to.

        The engine is ``engine_index``, else the request's ``data_parallel_rank``, else the
        next one in turn. The request's client_index is set to this front end's.
        """
        if engine_index is None:  # the request is an object: its client_index is set below
            engine_index = getattr(request, "data_parallel_rank", None)
        if engine_index is None:
            engine_index = next(self._round_robin)
        if hasattr(request, "client_index"):  # releases before 0.8.3 have no client_index
            request.client_index = self.client_index
        self._send(engine_index, "add", request)
        return engine_index

    def abort(self, request_ids: Sequence[str], engine_index: int | None = None) -> None:
        """Send an ABORT; without ``engine_index``, to the engine each request went to."""
        if not request_ids:
            return
        groups: dict[int, list[str]] = {}
        for request_id in request_ids:
            rank = engine_index if engine_index is not None else (
                self.session.rank_of_request(request_id)
            )
            groups.setdefault(0 if rank is None else rank, []).append(request_id)
        for rank, ids in groups.items():
            self._send(rank, "abort", list(ids))

    def call_utility_async(
        self, method: str, *args: Any, engine_index: int = 0
    ) -> Future[Any]:
        """Send a UTILITY call; the future resolves while outputs are read (see :meth:`pump`)
        with the result, a :class:`UtilityCallError`, or an :class:`EngineDeadError`."""
        call_id = self.connection.free_call_id()
        self._send(engine_index, "utility", utility_value(
            self.connection.session.spec.version, client_index=self.client_index,
            call_id=call_id, method=method, args=tuple(args)))
        future: Future[Any] = Future()
        self._calls[call_id] = (method, future)
        return future

    def call_utility(
        self, method: str, args: Sequence[Any] = (), engine_index: int = 0,
        timeout: float = 5.0,
    ) -> Any:
        """Call a utility method and return its result (raises on failure or timeout)."""
        future = self.call_utility_async(method, *args, engine_index=engine_index)
        deadline = time.monotonic() + timeout
        while not future.done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProtocolTimeout(
                    "frames.utility-reply", f"no reply to utility call {method!r} within "
                    f"{timeout} s",
                )
            self.pump(remaining)
        return future.result()

    # --- outputs -------------------------------------------------------------------------

    def pump(self, timeout: float, *, until_output: bool = False) -> bool:
        """Read one batch from the output channel: one poll that waits at most ``timeout`` s,
        then every message the socket holds (at most :data:`MAX_MESSAGES_PER_PUMP`), each
        read without blocking, asking the socket whether another one waits; returns whether
        one came. Utility replies resolve their futures; outputs are queued (request outputs
        through the connection's express path, ``receive_outputs_express``). A message that
        breaks the spec raises its ProtocolError here (the session state is unchanged; the
        messages after it stay in the socket).

        ``until_output``: stop once an output is queued (what :meth:`get_output` waits for;
        the messages behind it stay in the socket for the next poll, which finds them at
        once), so a lone output costs no second question to the socket."""
        session = self.connection.session
        if session.dead:
            return False
        # The output socket's poll items are built once (Socket.poll builds and registers a
        # new Poller on every call).
        if not wait_readable(self._output_items, max(0, int(timeout * 1000))):
            return False
        sock, outputs = self._output.socket, self._outputs
        express = self._express_path()
        for _ in range(MAX_MESSAGES_PER_PUMP):
            frames = receive_frames(sock)
            found = express(frames) if express is not None else None
            if found is not None:
                outputs.append(found)
            else:
                self._receive(frames)
            if session.dead or (until_output and outputs) or not readable(sock):
                break
        return True

    def _express_path(self) -> Callable[[Sequence[Any]], Any] | None:
        """The connection's express path for request outputs (what :meth:`_receive` does with
        them, in one call) where every message would reach the connection's own ``receive``
        through this module's :meth:`_receive`; None where a subclass reads messages its own
        way or ``receive`` was replaced on the connection (to watch or rewrite what comes):
        those see every message."""
        if not self._own_receive or "receive" in vars(self.connection):
            return None
        return self.connection.receive_outputs_express

    def _receive(self, frames: list[Any]) -> None:
        for event in self.connection.receive("output", frames):
            if type(event) is OutputsReceived:  # the common case first
                self._outputs.append(event.outputs)
            elif isinstance(event, EngineDied):
                for rank, call_ids in event.failed_calls.items():
                    for call_id in call_ids:
                        method, future = self._calls.pop(call_id)
                        future.set_exception(EngineDeadError(
                            "handshake.session.dead-is-final",
                            f"engine {rank} died before answering {method!r}",
                        ))
            elif isinstance(event, UtilityReplied):
                self._resolve(event.utility_output)
            elif isinstance(event, OutputsReceived):
                self._outputs.append(event.outputs)

    def _resolve(self, utility: Any) -> None:
        found = self._calls.pop(get_field(utility, "call_id"), None)
        if found is None:  # an engine notification (reserved call_id): nobody waits for it
            return
        method, future = found
        failure = get_field(utility, "failure_message")
        if failure is not None:
            future.set_exception(UtilityCallError(method, failure))
        else:
            result = get_field(utility, "result")
            # Releases before 0.10.1 carry the bare result (no UtilityResult pair).
            bare = not self.structs.has("UtilityResult")
            future.set_result(None if result is None else result if bare else result[1])

    def get_output(self, timeout: float) -> Any:
        """The next EngineCoreOutputs with request outputs, within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        if not self._outputs and not self.connection.session.dead:
            self.pump(timeout, until_output=True)  # the common case: one pump brings it
        while not self._outputs:
            if self.session.dead:
                raise EngineDeadError(
                    "handshake.session.dead-is-final", "the engine sent ENGINE_CORE_DEAD"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProtocolTimeout(
                    "frames.outputs-payload", f"no outputs within {timeout} s"
                )
            self.pump(remaining, until_output=True)
        return self._outputs.popleft()

    # --- shutdown ------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Close every socket and remove the ipc files this front end bound; idempotent.

        ``timeout`` is accepted for symmetry with engine processes: closing never waits
        (linger 0, as vLLM's client closes its sockets)."""
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        if not self._ctx.closed:
            self._ctx.term()
        for _, future in self._calls.values():
            if not future.done():
                future.cancel()
        self._calls.clear()

    stop = close

    def alive(self) -> bool:
        """True until :meth:`close`."""
        return not self._ctx.closed

    def __enter__(self) -> ReferenceFrontend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
