"""Sans-IO connections: the codec and the session state machine of one side, in one object.

In the manner of h11's ``Connection``: no sockets, no clocks, no threads. A peer hands in the
multipart messages its sockets received and gets typed events back; it asks for the frames of a
message it wants to send and writes them to a socket itself.

- :class:`EngineConnection`: the engine core's side (its handshake DEALER, its input DEALERs,
  its output PUSHes).
- :class:`FrontendConnection`: the front end's side (its handshake ROUTER, its input ROUTER,
  its output PULL) with every engine it manages.

``receive(channel, frames) -> list[Event]``: ``channel`` is the spec's channel name
(``handshake``, ``input``, ``output``); ``frames`` the multipart message as the socket
delivered it (bytes-like frames or ``zmq.Frame``; at a ROUTER the routing identity first).
``send(kind, value, ...) -> frames``: ``kind`` a message kind of ``spec/data/frames.toml``;
the frames are those to write to the socket (at a ROUTER, the routing identity first).

Where each rule is checked, once:

- frame layout (frame counts, fixed frames, payload types), routing identities (2 bytes,
  little-endian rank: ``identity.*``): the codec (:mod:`enginewire.reference.codec`), except the
  one-frame count of a handshake message at a socket (this module: the codec decodes payloads,
  it does not know which socket a message came through);
- the request type byte: read once, by :meth:`EngineSession.request_event`, which names the
  message kind the codec then decodes;
- states, transitions, handshake keys, pending calls, tracked requests: the sessions of
  :mod:`enginewire.reference.session`.

Express paths. The message each side reads on every step, request outputs at the front end
(:meth:`FrontendConnection.receive_outputs_express`) and an ADD at the engine
(:meth:`EngineConnection.receive_add_express`), can also be taken in one call: the codec's
decode of exactly that kind (:meth:`~enginewire.reference.codec.Codec.express_decoder`, its
rules included), then the session's bookkeeping for a state where the message is a self-loop.
Either returns the value ``receive`` would carry in its event, or None for any other message,
having recorded nothing: the peer then hands the same frames to ``receive``, which reads them
or raises what they break. The reference peers try them first (the per-message layers cost a
third of the round trip otherwise, docs/bench.md); tests/test_peer_express.py runs both paths
over the same messages and compares events, errors and sessions.

Error policy. Like h11, a message that breaks the protocol raises: ``receive`` raises the
:class:`~enginewire.reference.errors.ProtocolError` subclass naming the clause the *remote*
side broke (h11's ``RemoteProtocolError``), ``send`` the one naming the clause the *local*
side would break (h11's ``LocalProtocolError``); nothing is sent or recorded then. Unlike h11,
a raise does not move the connection to an error state: the state is left as it was before
the message, because the spec has an engine core survive a malformed request and keep serving
(the reference engine logs it and goes on). The only final state is the spec's own: after
ENGINE_CORE_DEAD both sides accept nothing more (``handshake.session.dead-is-final``). A peer
that wants h11's behaviour stops using the connection after the first error (the reference
front end fails start-up on any handshake error).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from enginewire.spec.history.release_facts import ready_response_at, utility_fields
from enginewire.spec.loader import REFERENCE_VLLM_VERSION, Spec

from .codec import Codec, Frame, default_codec
from .errors import FramingError, HandshakeError
from .session import EngineSession, FrontendSession, get_field, untrack_finished

# --- events ----------------------------------------------------------------------------------


class Event:
    """Base of every event a connection's ``receive`` returns."""


# Engine side (what the front end sent).


@dataclass(frozen=True)
class InitReceived(Event):
    """The init message (EngineHandshakeMetadata): connect to ``addresses``."""

    metadata: Any
    addresses: Any


@dataclass(frozen=True)
class RequestAdded(Event):
    """An ADD: the decoded EngineCoreRequest."""

    request: Any


@dataclass(frozen=True)
class RequestsAborted(Event):
    """An ABORT: the ids that were in flight (ids not in flight are dropped)."""

    request_ids: list[str]


@dataclass(frozen=True)
class UtilityCalled(Event):
    """A UTILITY call, to be answered with a ``utility_reply`` to ``client_index``."""

    client_index: int
    call_id: int
    method: str
    args: Sequence[Any]


@dataclass(frozen=True)
class DPWaveStarted(Event):
    """A START_DP_WAVE."""

    new_wave: int
    exclude_engine_index: int


# Front-end side (what an engine sent).


@dataclass(frozen=True)
class HelloReceived(Event):
    """An engine's HELLO: send it the init message (``send("init", metadata, rank=rank)``)."""

    rank: int
    message: Mapping[str, Any]


@dataclass(frozen=True)
class ReadyReceived(Event):
    """An engine's READY: its ready response comes next on the input channel."""

    rank: int
    message: Mapping[str, Any]


@dataclass(frozen=True)
class ReadyResponse(Event):
    """An engine's ready response (None for the empty frame): it may be sent requests."""

    rank: int
    response: Any


@dataclass(frozen=True)
class OutputsReceived(Event):
    """An EngineCoreOutputs with request outputs."""

    rank: int
    outputs: Any


@dataclass(frozen=True)
class UtilityReplied(Event):
    """The UtilityOutput answering ``call_id`` (a reserved id: an engine notification)."""

    rank: int
    call_id: int
    utility_output: Any


@dataclass(frozen=True)
class EngineDied(Event):
    """ENGINE_CORE_DEAD: every engine is dead; ``failed_calls`` the pending call_ids per
    engine rank, to fail with an engine-dead error."""

    failed_calls: dict[int, list[int]]


def _check_channel(channel: str, allowed: Iterable[str], side: str) -> None:
    if channel not in allowed:
        raise ValueError(
            f"the {side} connection receives on {sorted(allowed)}, not on {channel!r}"
        )


def _handshake_frame_count(frames: Sequence[Frame], what: str, expected: int) -> None:
    """A handshake-channel message (init at the DEALER, HELLO/READY/ready response at a
    ROUTER with the identity first) is exactly ``expected`` frames at its socket."""
    if len(frames) != expected:
        raise HandshakeError(
            "frames.frame-count", f"{what} is {expected} frame(s) at this socket",
            expected=expected, got=len(frames),
        )


# --- engine ----------------------------------------------------------------------------------

_ENGINE_SENDS = frozenset({"ready_response", "outputs", "utility_reply", "engine_core_dead"})


class EngineConnection:
    """The engine core's side of the protocol: :class:`EngineSession` plus the codec.

    ``handshake``: False when the addresses come from elsewhere: call :meth:`use_addresses`
    and, after sending the ready responses, :meth:`begin_serving` (no HELLO, no READY).
    :attr:`identity` is the routing identity to set on the handshake and input DEALERs.
    ``input_address``: where the release holds the handshake on the input socket (0.9.0), the
    address of that socket (its init map names only the output).
    """

    def __init__(
        self,
        rank: int = 0,
        *,
        local: bool = True,
        headless: bool = False,
        handshake: bool = True,
        codec: Codec | None = None,
        spec: Spec | None = None,
        input_address: str | None = None,
    ) -> None:
        self.codec = codec or default_codec()
        self.session = EngineSession(
            rank, local=local, headless=headless, handshake=handshake,
            spec=spec or self.codec.spec, input_address=input_address,
        )
        self.rank = rank
        self.identity: bytes = self.codec.encode_identity(rank)
        #: Request type frames (bytes) already read -> the message kind they name.
        self._kinds_by_type_frame: dict[bytes, str] = {}
        #: The express path's decode of an ADD (:meth:`receive_add_express`; None: a codec of
        #: another release, whose messages all take the general path) and the states where it
        #: takes one.
        self._decode_add = self.codec.express_decoder("add") \
            if self.session.spec.version == REFERENCE_VLLM_VERSION else None
        self._adding_states = self.session.machine.quiet_states("add", "accept_request")

    @property
    def state(self) -> str:
        return self.session.state

    @property
    def addresses(self) -> Any:
        return self.session.addresses

    # --- receiving ---------------------------------------------------------------------

    def receive(self, channel: str, frames: Sequence[Frame]) -> list[Event]:
        """The events of one message the engine's ``channel`` socket received (no identity:
        DEALERs receive none). Raises the ProtocolError of a message that breaks the spec."""
        if channel != "input":
            _check_channel(channel, ("handshake", "input"), "engine")
        if channel == "handshake":
            _handshake_frame_count(frames, "the init message", 1)
            metadata = self.codec.decode("init", frames)
            [connect] = self.session.receive_init(metadata)
            return [InitReceived(metadata, connect.data)]
        if not frames:
            raise FramingError(
                "frames.frame-count",
                "an input message is a type frame followed by its payload frames",
                expected=">= 2 frames", got=0,
            )
        type_frame = frames[0]
        kind = self._kinds_by_type_frame.get(type_frame) if type(type_frame) is bytes else None
        if kind is None:
            _, kind = self.session.request_event(type_frame)
            if type(type_frame) is bytes:  # a valid type frame is read once per value
                self._kinds_by_type_frame[type_frame] = kind
        payload = self.codec.decode(kind, frames)
        events: list[Event] = []
        for action in self.session.receive_request(kind, payload):
            if action.name == "accept_request":
                events.append(RequestAdded(action.data))
            elif action.name == "abort_requests":
                events.append(RequestsAborted(action.data))
            elif action.name == "accept_call":
                events.append(UtilityCalled(*action.data))
        if kind == "start_dp_wave":
            events.append(DPWaveStarted(*payload))
        return events

    def receive_add_express(self, frames: Sequence[Frame]) -> Any:
        """The express path of the input channel: the message every request starts with, in
        one call. Where ``frames`` are an ADD, its type frame and one msgpack frame holding an
        EngineCoreRequest that keeps the request rules (no out-of-band tensor), and the session
        serves, returns the request, tracked: what :meth:`receive` returns in
        :class:`RequestAdded`. Returns None for any other message, having recorded nothing:
        hand the same frames to :meth:`receive`, which reads them or says what is wrong."""
        decode = self._decode_add
        if decode is None or self.session.machine.state not in self._adding_states:
            return None
        request = decode(frames)
        if request is not None:
            self.session.requests.add(request.request_id)
        return request

    # --- start-up without a handshake ----------------------------------------------------

    def use_addresses(self, addresses: Any) -> None:
        """Addresses handed over by another process (no handshake channel)."""
        self.session.use_addresses(addresses)

    def begin_serving(self) -> None:
        """Without a handshake channel: serve once the ready responses are sent."""
        self.session.begin_serving()

    # --- sending -----------------------------------------------------------------------

    def send(self, kind: str, value: Any = None, *, client_index: int = 0) -> list[Any]:
        """The frames of one message to send, recorded in the session.

        ``hello``: no value (the session builds HELLO); ``ready``: a map of optional READY
        keys or None; ``ready_response``: the EngineCoreReadyResponse (None: the empty
        frame), the same frames for every input DEALER; ``outputs``: an EngineCoreOutputs
        (requests with a finish_reason, or in ``finished_requests``, stop being tracked);
        ``utility_reply``: an EngineCoreOutputs with the utility_output answering a pending
        call of ``client_index``; ``engine_core_dead``: no value.
        """
        if kind == "outputs":  # the per-step message first
            frames = self.codec.encode(kind, value)
            # The codec checked the value is an EngineCoreOutputs: fields are attributes.
            finished = [output.request_id for output in value.outputs or ()
                        if output.finish_reason is not None]
            listed = getattr(value, "finished_requests", None)
            self.session.send_outputs([*finished, *listed] if listed else finished)
            return frames
        if kind == "hello":
            [hello] = self.session.start()
            return self.codec.encode("hello", hello.data)
        if kind == "ready":
            [ready] = self.session.send_ready(value)
            return self.codec.encode("ready", ready.data)
        if kind not in _ENGINE_SENDS:
            raise ValueError(f"an engine core does not send {kind!r} messages")
        frames = self.codec.encode(kind, value)
        if kind == "ready_response":
            self.session.send_ready_response()
        elif kind == "utility_reply":
            call_id = get_field(get_field(value, "utility_output"), "call_id")
            self.session.send_utility_reply(client_index, call_id)
        else:
            self.session.send_dead()
        return frames


# --- front end -------------------------------------------------------------------------------


class FrontendConnection:
    """The front end's side of the protocol with engines ``ranks``: :class:`FrontendSession`
    plus the codec. Keywords as :class:`FrontendSession`'s."""

    def __init__(
        self,
        ranks: Iterable[int] = (0,),
        *,
        local: bool | Mapping[int, bool] = True,
        remote_headless: bool = True,
        handshake: bool = True,
        config_hash: str | None = None,
        codec: Codec | None = None,
        spec: Spec | None = None,
    ) -> None:
        self.codec = codec or default_codec()
        self.session = FrontendSession(
            ranks, local=local, remote_headless=remote_headless, handshake=handshake,
            config_hash=config_hash, spec=spec or self.codec.spec,
        )
        #: Engines that sent HELLO and have not been sent the init message yet.
        self._init_due: set[int] = set()
        version = self.session.spec.version
        #: The express path's decode of request outputs (:meth:`receive_outputs_express`;
        #: None: a codec of another release, whose messages all take the general path) and
        #: the link states where it takes them.
        self._decode_outputs = self.codec.express_decoder("outputs") \
            if version == REFERENCE_VLLM_VERSION else None
        any_link = next(iter(self.session.engines.values()))
        self._delivering_states = any_link.machine.quiet_states("outputs", "deliver_outputs")
        #: READY is the engine's ready response (0.9.0 holds the handshake on the input
        #: socket: history/constants.toml [[ready_response]] ``handshake``).
        self._ready_is_response = version != REFERENCE_VLLM_VERSION \
            and ready_response_at(version) == "handshake"

    @property
    def dead(self) -> bool:
        return self.session.dead

    def identity(self, rank: int) -> bytes:
        """The routing identity of managed engine ``rank``."""
        return self.codec.encode_identity(self.session.link(rank).rank)

    # --- receiving ---------------------------------------------------------------------

    def receive(self, channel: str, frames: Sequence[Frame]) -> list[Event]:
        """The events of one message the front end's ``channel`` socket received (at the
        ROUTERs, the routing identity first). Raises the ProtocolError of a message that breaks
        the spec."""
        if channel == "output":
            return self._receive_output(frames)
        _check_channel(channel, ("handshake", "input", "output"), "front end")
        what = "a handshake message" if channel == "handshake" else "a ready response"
        _handshake_frame_count(frames, f"{what} at the ROUTER ([identity, payload])", 2)
        rank = self.codec.decode_identity(frames[0])
        if channel == "handshake":
            message = self.codec.decode_message("handshake", frames[1:], sender="engine").value
            [action] = self.session.receive_handshake(rank, message)
            if action.name == "send_init":
                self._init_due.add(rank)
                return [HelloReceived(rank, message)]
            if self._ready_is_response:
                self.session.receive_ready_response(rank, None)
                return [ReadyReceived(rank, message), ReadyResponse(rank, None)]
            return [ReadyReceived(rank, message)]
        response = self.codec.decode("ready_response", frames[1:])
        self.session.receive_ready_response(rank, response)
        return [ReadyResponse(rank, response)]

    def ready_without_message(self, rank: int) -> list[Event]:
        """Engine ``rank`` of a release that signals readiness over a process pipe (no wire
        form: history/constants.toml [[transport]] ``pipe``) counts as ready once its input
        socket is connected; the front end says when."""
        self.session.receive_ready_response(rank, None)
        return [ReadyResponse(rank, None)]

    def receive_outputs_express(self, frames: Sequence[Frame]) -> Any:
        """The express path of the output channel: the message every engine step sends, in
        one call. Where ``frames`` are one msgpack frame holding an EngineCoreOutputs with
        request outputs (no utility output, no out-of-band buffer) from a managed engine whose
        link is in a state where outputs change nothing but the requests tracked, returns it,
        with its finished requests untracked: what :meth:`receive` returns in
        :class:`OutputsReceived`. Returns None for any other message, having recorded nothing:
        hand the same frames to :meth:`receive`, which reads them or says what is wrong."""
        decode, session = self._decode_outputs, self.session
        if decode is None or session.dead:
            return None
        outputs = decode(frames)
        if outputs is None:
            return None
        link = session.engines.get(outputs.engine_index)
        if link is None or link.machine.state not in self._delivering_states:
            return None
        if link.requests:
            untrack_finished(link.requests, outputs)
        return outputs

    def _receive_output(self, frames: Sequence[Frame]) -> list[Event]:
        message = self.codec.decode_message("output", frames, sender="engine")
        if message.kind == "engine_core_dead":
            actions = self.session.receive_engine_dead()
            return [EngineDied({action.rank: list(action.data) for action in actions
                                if action.rank is not None})]
        events: list[Event] = []
        for action in self.session.receive_outputs(message.value):
            assert action.rank is not None
            if action.name == "resolve_call":
                call_id = get_field(action.data, "call_id")
                events.append(UtilityReplied(action.rank, call_id, action.data))
            elif action.name == "deliver_outputs":
                events.append(OutputsReceived(action.rank, action.data))
        return events

    # --- sending -----------------------------------------------------------------------

    def free_call_id(self) -> int:
        """A call_id for the next ``utility`` message (no pending call uses it)."""
        return self.session.free_call_id()

    def send(self, kind: str, value: Any, *, rank: int) -> list[Any]:
        """The frames (routing identity first) of one message to engine ``rank``, recorded
        in the session.

        ``init``: the EngineHandshakeMetadata, once after the engine's HELLO; ``add``: an
        EngineCoreRequest; ``abort``: a list of request ids; ``utility``: the release's
        payload (:func:`~enginewire.spec.history.release_facts.utility_value`: ``(client_index,
        call_id, method, args)``, without client_index up to 0.9.0) with a fresh call_id
        (:meth:`free_call_id`).
        """
        link = self.session.link(rank)
        if kind not in ("init", "add", "abort", "utility"):
            raise ValueError(f"a front end does not send {kind!r} messages")
        frames = self.codec.encode_routed(kind, value, link.rank)
        if kind == "init":
            if rank not in self._init_due:
                raise HandshakeError(
                    self.session.table.illegal_event_clause,
                    f"an init message for engine {rank}, which sent no HELLO awaiting one",
                    expected=sorted(self._init_due), got=rank,
                )
            self._init_due.discard(rank)
        elif kind == "add":
            self.session.send_add(rank, get_field(value, "request_id"))
        elif kind == "abort":
            self.session.send_abort(rank, value)
        else:
            fields = utility_fields(self.session.spec.version, list(value))
            assert fields is not None  # the codec encoded it in the release's form
            self.session.send_utility(rank, fields["call_id"])
        return frames
