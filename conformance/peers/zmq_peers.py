"""The suite as a peer over ZMQ: a conformance front end and a conformance engine core.

Both speak the wire through the spec oracle
(:func:`~enginewire.conformance.oracle.wire.expected_wire` to write,
:func:`~enginewire.conformance.oracle.wire.from_wire` to read), not through the reference
codec, and both can send any frames at all (:meth:`SuiteFrontend.send_input`,
:meth:`SuiteEngine.push_raw`) for the bad-input checks.

- :class:`SuiteFrontend` binds what a front end binds (handshake ROUTER, one input ROUTER and
  one output PULL per client) and drives a target engine through the handshake and requests.
- :class:`SuiteEngine` connects what an engine connects (a handshake DEALER with its identity,
  then an input DEALER and an output PUSH per client) and serves a target front end.

For a release without the HELLO/READY handshake (before 0.9.0) both speak the release's input
and output channels (history/constants.toml ``[[transport]]``, :func:`~enginewire.spec.history.
release_facts.transport_at`): the release's socket types, the end that binds (an end the
other side binds is connected to an address picked here), an identity frame only where the
input carries one, and no handshake ROUTER: the engine is given the input and output addresses
(:meth:`SuiteFrontend.launch_addresses`) and counts as ready once connected (a release that
signals readiness over a process pipe) or on its ``b"READY"`` (0.8.4, 0.8.5). Checks of what
such a release lacks raise :class:`NotInRelease` through :func:`require_handshake`,
:func:`require_wire_ready`, :func:`require_ready_response`, :func:`require_identity` and
:func:`require_clients`.

At a release that holds the handshake on the input socket (0.9.0, readiness
``handshake-on-input``: :func:`~enginewire.spec.history.release_facts.handshake_on_input`)
there is no handshake ROUTER: the engine is launched with the input ROUTER's address as its
handshake address, its input DEALER sends HELLO, reads the init message in the release's form
(a plain map naming the output address: :meth:`SuiteEngine.read_init`) and sends READY, which
is its ready response. The UTILITY payload has the release's items (no client_index up to
0.9.0: ``release_facts.utility_value``).

Every receive takes a timeout and raises ``TimeoutError``; every socket and ipc file is
released by ``close`` (registered with the check's context).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from enginewire.conformance.framework.evidence import in_release, refused
from enginewire.conformance.framework.registry import NotInRelease
from enginewire.conformance.oracle.strict import check_wire, handshake_problems
from enginewire.conformance.oracle.wire import (
    THRESHOLD_DEFAULT,
    expected_wire,
    from_wire,
    raw_decode,
)
from enginewire.conformance.targets.contract import Unsupported
from enginewire.spec import load
from enginewire.spec.history.release_facts import (
    Transport,
    clients_gap,
    conversation_gap,
    engine_handshake_map,
    handshake_gap,
    handshake_keys_at,
    handshake_message_at,
    handshake_on_input,
    identity_gap,
    init_addresses,
    init_message_at,
    init_message_value,
    ready_response_at,
    ready_response_gap,
    transport_at,
    utility_value,
    wire_ready_gap,
)
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

#: The engine's dying words, the literal frame of the engine_core_dead message (frames.toml).
ENGINE_CORE_DEAD = bytes.fromhex(next(
    m.frames[0].literal_hex or "" for m in load().surface("frames").messages
    if m.kind == "engine_core_dead"))


def type_byte(spec: Any, kind: str) -> bytes:
    """The type frame of message ``kind`` (``add``, ``abort``, ``utility``, ...) at ``spec``'s
    release: its request type's byte in the loaded spec's table (request_types.toml; UTILITY
    is 0x02 up to vLLM 0.8.2); NOT APPLICABLE where the release has no such message."""
    for t in spec.surface("request_types").types:
        if t.on_wire and t.message == kind:
            return bytes([t.byte])
    raise NotInRelease(f"vLLM {spec.version} has no request type for a {kind} message "
                       "(request_types.toml)")


def identity_of(rank: int) -> bytes:
    """The engine identity the spec prescribes: the rank in the identity surface's width and
    byte order (2 bytes little-endian)."""
    identity = load().surface("identity")
    return rank.to_bytes(identity.width, identity.byteorder)


def encode(value: Any, type_text: str, spec: Any,
           threshold: int = THRESHOLD_DEFAULT) -> list[bytes]:
    """``value`` as the spec's frames: ``[msgpack, oob...]``."""
    form = expected_wire(value, type_text, spec, threshold=threshold)
    return [msgspec.msgpack.encode(form.value), *form.oob]


def decode(frames: Sequence[bytes], type_text: str, spec: Any,
           clause: str = "frames.payload-matches-type") -> Any:
    """Read what a target sent as ``spec``'s vLLM release reads it: frame 0 with the exact typing of
    ``type_text`` (:mod:`enginewire.conformance.oracle.strict`; a value vLLM's typed decoder
    rejects raises ``StrictWireError`` naming ``clause``, the ``$``-path and the field), then
    as a neutral value."""
    raw = raw_decode(frames[0])
    check_wire(raw, type_text, spec, clause=clause, what=f"a {type_text} payload")
    return from_wire(raw, type_text, spec, [bytes(f) for f in frames[1:]])


#: Values of the READY keys an older release requires beyond status, local and headless
#: (num_gpu_blocks, dp_stats_address before 0.20.0).
READY_KEY_VALUES: dict[str, Any] = {"num_gpu_blocks": 512, "dp_stats_address": None}


def require_conversation(spec: Any) -> None:
    """Raise :class:`NotInRelease` where the suite cannot hold a start-up conversation in the
    terms of ``spec``'s release (:func:`~enginewire.spec.history.release_facts.
    conversation_gap`: no HELLO/READY handshake, no init layout, no ready response frame)."""
    gap = conversation_gap(spec)
    if gap is not None:
        raise NotInRelease(gap)


def release_transport(spec: Any) -> Transport:
    """The input and output channels of ``spec``'s release (history/constants.toml)."""
    found = transport_at(spec.version)
    if found is None:
        raise NotInRelease(f"vLLM {spec.version} has no [[transport]] row in "
                           "history/constants.toml")
    return found


def _require(gap: str | None) -> None:
    if gap is not None:
        raise NotInRelease(gap)


def require_handshake(spec: Any) -> None:
    """NOT APPLICABLE where ``spec``'s release has no HELLO/READY handshake."""
    _require(handshake_gap(spec.version))


def require_wire_ready(spec: Any) -> None:
    """NOT APPLICABLE where ``spec``'s release's engine sends no ready message on the wire."""
    _require(wire_ready_gap(spec.version))


def require_ready_response(spec: Any) -> None:
    """NOT APPLICABLE where ``spec``'s release's engine sends no ready response of its own
    (a pipe; READY on the input socket at 0.9.0)."""
    _require(ready_response_gap(spec.version))


def require_identity(spec: Any) -> None:
    """NOT APPLICABLE where ``spec``'s release's input channel carries no engine identity."""
    _require(identity_gap(spec.version))


def require_clients(spec: Any) -> None:
    """NOT APPLICABLE where ``spec``'s release's engine has one input/output pair, not one per
    front-end client."""
    _require(clients_gap(spec.version))


def require_request_type(spec: Any, name: str) -> None:
    """Raise :class:`NotInRelease` where ``spec``'s release has no request type ``name`` (the
    loaded spec's request_types surface, which the spec check holds to history/constants.toml
    [[request_types]])."""
    table = spec.surface("request_types").types
    if not any(t.name == name for t in table):
        known = ", ".join(f"{t.name} 0x{t.byte:02x}" for t in table)
        raise NotInRelease(f"vLLM {spec.version} has no request type {name} (its table: "
                           f"{known}; request_types.toml)")


def request_type_frame(spec: Any, name: str) -> bytes:
    """The type frame of request type ``name`` at ``spec``'s release (UTILITY is 0x02 up to
    vLLM 0.8.2); NOT APPLICABLE (:func:`require_request_type`) where the release lacks it."""
    require_request_type(spec, name)
    return bytes(spec.request_type_byte(name))


def require_ready_key(spec: Any, key: str) -> None:
    """Raise :class:`NotInRelease` where ``spec``'s release's engine never sends ``key`` in
    READY (history/constants.toml [[handshake]])."""
    if spec.version == REFERENCE_VLLM_VERSION:
        return
    keys = handshake_keys_at(spec.version, "READY")
    if keys is None or key not in {*keys[0], *keys[1]}:
        raise NotInRelease(f"vLLM {spec.version}'s READY has no {key} key "
                           "(history/constants.toml [[handshake]])")


def ready_response_payload(spec: Any, value: dict[str, Any]) -> bytes | None:
    """The ready-response frame of ``spec``'s release for ``value`` (a newest-layout map):
    an empty frame where the release's engine sends one, ``b"READY"`` where it sends that
    literal, None where it sends nothing on the wire (readiness over a process pipe), else the
    release's EngineCoreReadyResponse with the fields of ``value`` the release has."""
    if spec.version != REFERENCE_VLLM_VERSION:
        form = ready_response_at(spec.version)
        if form == "empty":
            return b""
        if form == "READY":
            return b"READY"
        if form in ("none", "handshake"):
            return None
        names = {f.name for f in spec.structs["EngineCoreReadyResponse"].fields}
        value = {k: v for k, v in value.items() if k in names}
    return msgspec.msgpack.encode(expected_wire(value, "EngineCoreReadyResponse", spec).value)


def ready_response_value(rank: int, dp_size: int = 1) -> dict[str, Any]:
    """A plausible EngineCoreReadyResponse for a conformance engine of ``rank``."""
    return {
        "max_model_len": 2048, "num_gpu_blocks": 512, "block_size": 16,
        "dp_stats_address": None, "dtype": "bfloat16", "vllm_version": "0.33.0",
        "world_size": 1, "data_parallel_size": dp_size, "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1, "decode_context_parallel_size": 1,
        "data_parallel_rank": rank, "max_num_seqs": 64, "max_num_batched_tokens": 4096,
        "instance_id": f"conformance-engine-{rank}", "supports_lora": False, "max_loras": 0,
    }


class _Net:
    """A ZMQ context, its sockets and the ipc files they bound."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.context = zmq.Context()
        self.sockets: list[zmq.Socket] = []
        self.files: list[str] = []

    def socket(self, kind: int, identity: bytes | None = None) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if kind in (zmq.ROUTER, zmq.DEALER, zmq.PUSH):
            sock.setsockopt(zmq.SNDHWM, 0)
        if kind in (zmq.ROUTER, zmq.DEALER, zmq.PULL):
            sock.setsockopt(zmq.RCVHWM, 0)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        self.sockets.append(sock)
        return sock

    def reserve(self, address: str) -> str:
        """A concrete address for a socket the peer binds and this end connects to: a free
        port in place of port 0 (the peer cannot tell the port it got); an ipc path is removed
        at :meth:`close` if the peer left it."""
        import socket as sockets

        if address.startswith("ipc://"):
            self.files.append(address[len("ipc://"):])
            return address
        if address.endswith(":0"):
            v6 = address.startswith("tcp://[")
            host = address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
            with sockets.socket(sockets.AF_INET6 if v6 else sockets.AF_INET) as probe:
                probe.bind((host, 0))
                port = probe.getsockname()[1]
            return f"{address[:-2]}:{port}"
        return address

    def open(self, kind: int, address: str, binds: bool,
             immediate: bool = False) -> tuple[zmq.Socket, str]:
        """A socket of ``kind`` bound to or connected to ``address``, and the address a peer
        uses for it. ``immediate``: a connecting socket is writable only once its peer bound
        (ZMQ_IMMEDIATE; the wire is the same)."""
        sock = self.socket(kind)
        return sock, self.attach(sock, address, binds, immediate)

    def attach(self, sock: zmq.Socket, address: str, binds: bool,
               immediate: bool = False) -> str:
        """Bind ``sock`` to ``address`` or connect it there; the address a peer uses."""
        if binds:
            return self.bind(sock, address)
        if immediate:
            sock.setsockopt(zmq.IMMEDIATE, 1)
        if address.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(address)
        return address

    def address(self, name: str, transport: str = "ipc") -> str:
        if transport == "tcp":
            return "tcp://127.0.0.1:0"
        if transport == "tcp6":
            return "tcp://[::1]:0"
        return f"ipc://{self.directory}/{name}-{uuid.uuid4().hex[:10]}"

    def bind(self, sock: zmq.Socket, address: str) -> str:
        if address.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        sock.bind(address)
        if address.startswith("ipc://"):
            self.files.append(address[len("ipc://"):])
            return address
        return sock.getsockopt(zmq.LAST_ENDPOINT).decode()  # type: ignore[union-attr]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.sockets.clear()
        if not self.context.closed:
            self.context.term()
        for path in self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.files.clear()


#: Seconds between two looks at the running check's evidence while a suite peer waits.
REFUSAL_LOOK_S = 0.05


def wait_for(sock: zmq.Socket, timeout: float, what: str, event: int = zmq.POLLIN) -> None:
    """Return once ``sock`` has ``event`` (a message to read; ``zmq.POLLOUT``: a connected
    peer to take one) within ``timeout`` seconds, else raise ``TimeoutError`` ("``what``:
    nothing within N s"). Raises ``contract.Unsupported`` at once when the target, on another
    thread of the check or through a probe (a running engine's ``alive``), said it has no code
    for an operation (:func:`~enginewire.conformance.framework.evidence.refused`): the check
    is NOT IMPLEMENTED then, whatever would come. Every wait of a suite peer for the target
    goes through here, with or without the release's handshake."""
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        left = deadline - time.monotonic()
        if sock.poll(int(max(min(left, REFUSAL_LOOK_S), 0.0) * 1000), event):
            return
        refusal = refused()
        if refusal is not None:
            raise Unsupported(f"{what}: the target has no code for {refusal}")
        if left <= 0:
            raise TimeoutError(f"{what}: nothing within {timeout:g} s")


def recv(sock: zmq.Socket, timeout: float, what: str) -> list[bytes]:
    """The next multipart message on ``sock`` within ``timeout`` seconds, else
    ``TimeoutError``; ``contract.Unsupported`` once the target refused (:func:`wait_for`)."""
    wait_for(sock, timeout, what)
    return sock.recv_multipart()


@dataclass
class Handshake:
    """What an engine said during a handshake run by :meth:`SuiteFrontend.handshake`."""

    identity: bytes
    hello: dict[str, Any]
    ready: dict[str, Any]
    #: The ready-response frames per client input socket, identity frame first.
    ready_responses: list[list[bytes]] = field(default_factory=list)


class SuiteFrontend:
    """The suite as the front end of ``clients`` clients (it binds everything)."""

    def __init__(self, spec: Any, directory: str, *, clients: int = 1,
                 transport: str = "ipc") -> None:
        require_conversation(spec)
        self.spec = spec
        #: Whether an engine has sent this front end anything (HELLO, a ready message, an
        #: output): an engine program that exits before is a start failure, not a verdict.
        self.heard = False
        #: The release's input and output channels.
        self.transport = release_transport(spec)
        self.net = _Net(directory)
        self.handshake_socket: zmq.Socket | None = None
        self.handshake_address: str | None = None
        #: The release holds the handshake on the input ROUTER (0.9.0): no handshake socket.
        self.on_input = handshake_on_input(spec.version)
        try:
            if self.transport.handshake and not self.on_input:
                self.handshake_socket = self.net.socket(zmq.ROUTER)
                self.handshake_address = self.net.bind(
                    self.handshake_socket, self.net.address("handshake", transport))
            self.input_sockets: list[zmq.Socket] = []
            self.output_sockets: list[zmq.Socket] = []
            self.input_addresses: list[str] = []
            self.output_addresses: list[str] = []
            for client in range(clients):
                for channel, sockets, addresses in (
                        ("input", self.input_sockets, self.input_addresses),
                        ("output", self.output_sockets, self.output_addresses)):
                    ends = self.transport.channel(channel)
                    binds = ends.role_binds("frontend")
                    address = self.net.address(f"{channel}{client}", transport)
                    sock, address = self.net.open(
                        getattr(zmq, ends.frontend),
                        address if binds else self.net.reserve(address), binds,
                        immediate=channel == "input" and self.transport.readiness == "pipe")
                    sockets.append(sock)
                    addresses.append(address)
        except BaseException:
            self.net.close()
            raise

    def launch_addresses(self) -> dict[str, Any]:
        """The addresses an engine launch names: the handshake ROUTER, or without a handshake
        the input and output addresses (``EngineLaunch`` fields)."""
        if self.on_input:  # HELLO goes to the input ROUTER
            return {"handshake_address": self.input_addresses[0]}
        if self.handshake_address is not None:
            return {"handshake_address": self.handshake_address}
        return {"handshake_address": None, "input_addresses": tuple(self.input_addresses),
                "output_addresses": tuple(self.output_addresses)}

    def close(self) -> None:
        self.net.close()

    # -- handshake ------------------------------------------------------------------------

    @property
    def router(self) -> zmq.Socket:
        """The ROUTER the handshake runs on: the handshake ROUTER, or the input ROUTER where
        the release holds the handshake there (0.9.0); only a release with the HELLO/READY
        handshake has one."""
        if self.on_input:
            return self.input_sockets[0]
        assert self.handshake_socket is not None, "a release without the handshake"
        return self.handshake_socket

    def recv_handshake(self, timeout: float) -> list[bytes]:
        frames = recv(self.router, timeout, "a handshake message")
        self.heard = True
        return frames

    def init_value(self, **overrides: Any) -> dict[str, Any]:
        """The release's init message (EngineHandshakeMetadata, or 0.9.0's plain map) for
        this front end's addresses, then ``overrides``."""
        value = init_message_value(self.spec.version, inputs=list(self.input_addresses),
                                   outputs=list(self.output_addresses))
        value.update(overrides)
        return value

    def send_init(self, identity: bytes, value: dict[str, Any] | None = None) -> None:
        value = value or self.init_value()
        payload = [msgspec.msgpack.encode(value)] if self.on_input \
            else encode(value, "EngineHandshakeMetadata", self.spec)
        self.router.send_multipart([identity, *payload])

    def handshake(self, timeout: float, *, expect: bytes | None = None) -> Handshake:
        """Run one engine's handshake: HELLO, init, ready responses, READY (without a
        handshake: :meth:`await_ready`)."""
        if not self.transport.handshake:
            return self.await_ready(timeout, expect=expect)
        deadline = time.monotonic() + timeout
        frames = self.recv_handshake(timeout)
        if len(frames) != 2:
            raise HandshakeProblem(f"HELLO arrived as {len(frames)} frames at the ROUTER, "
                                   "expected 2 (identity, payload)", frames)
        identity, payload = frames
        if expect is not None and identity != expect:
            raise HandshakeProblem(f"HELLO came from identity {identity.hex()}, expected "
                                   f"{expect.hex()}", frames)
        hello = _map(payload, "HELLO", frames, self.spec)
        self.send_init(identity)
        responses = []
        if not self.on_input:  # on the input socket READY is the ready response (0.9.0)
            for client, sock in enumerate(self.input_sockets):
                got = recv(sock, deadline - time.monotonic(),
                           f"the ready response on input {client}")
                responses.append(got)
        ready_frames = recv(self.router, deadline - time.monotonic(), "READY")
        if len(ready_frames) != 2 or ready_frames[0] != identity:
            raise HandshakeProblem("READY must be [identity, payload] from the same identity",
                                   ready_frames)
        ready = _map(ready_frames[1], "READY", ready_frames, self.spec)
        if self.on_input:
            responses.append(ready_frames)
        return Handshake(identity, hello, ready, responses)

    def await_ready(self, timeout: float, *, expect: bytes | None = None) -> Handshake:
        """A release without the handshake: the engine's ``b"READY"`` on every input
        ([identity, b"READY"] at the ROUTER), or, where the release signals readiness over a
        process pipe, its input connected (the input socket takes a message). HELLO and READY
        are empty maps; the identity is the one the ready message came from (``expect``, or
        rank 0's, where the input carries none)."""
        deadline = time.monotonic() + timeout
        identity = expect if expect is not None else identity_of(0)
        responses: list[list[bytes]] = []
        if self.transport.readiness == "pipe":
            for client, sock in enumerate(self.input_sockets):
                wait_for(sock, deadline - time.monotonic(),
                         f"the engine connecting input {client}", zmq.POLLOUT)
            return Handshake(identity, {}, {}, responses)
        for client, sock in enumerate(self.input_sockets):
            got = recv(sock, deadline - time.monotonic(), f"the ready message on input {client}")
            if len(got) != 2 or got[1] != b"READY":
                raise HandshakeProblem(f"vLLM {self.spec.version}'s ready message is "
                                       '[identity, b"READY"] at the ROUTER', got)
            if expect is not None and got[0] != expect:
                raise HandshakeProblem(f"the ready message came from identity {got[0].hex()}, "
                                       f"expected {expect.hex()}", got)
            identity = got[0]
            responses.append(got)
        return Handshake(identity, {}, {}, responses)

    # -- requests -------------------------------------------------------------------------

    def send_input(self, identity: bytes, frames: Sequence[bytes], client: int = 0) -> None:
        """``frames`` to the engine of ``identity`` (where the release's input carries no
        identity, to the one engine connected)."""
        routing = [identity] if self.transport.identity else []
        self.input_sockets[client].send_multipart([*routing, *frames])

    def add(self, identity: bytes, request: dict[str, Any], client: int = 0) -> None:
        request = in_release(request, "EngineCoreRequest", self.spec)
        self.send_input(identity, [type_byte(self.spec, "add"),
                                   *encode(request, "EngineCoreRequest", self.spec)], client)

    def abort(self, identity: bytes, request_ids: list[str], client: int = 0) -> None:
        self.send_input(identity, [type_byte(self.spec, "abort"),
                                   msgspec.msgpack.encode(request_ids)], client)

    def utility(self, identity: bytes, call_id: int, method: str, args: list[Any],
                client: int = 0) -> None:
        payload = msgspec.msgpack.encode(utility_value(
            self.spec.version, client_index=client, call_id=call_id, method=method, args=args))
        self.send_input(identity, [type_byte(self.spec, "utility"), payload], client)

    def recv_input_frames(self, timeout: float, what: str) -> list[bytes]:
        """A message on input 0 (a release without the handshake: an engine's ready
        message), the engine's identity first where the release's input is a ROUTER."""
        frames = recv(self.input_sockets[0], timeout, what)
        self.heard = True
        return frames

    def recv_output_frames(self, timeout: float, client: int = 0) -> list[bytes]:
        frames = recv(self.output_sockets[client], timeout, f"a message on output {client}")
        self.heard = True
        return frames

    def outputs(self, timeout: float, client: int = 0) -> dict[str, Any]:
        frames = self.recv_output_frames(timeout, client)
        if frames == [ENGINE_CORE_DEAD]:
            raise ConnectionError("ENGINE_CORE_DEAD")
        return decode(frames, "EngineCoreOutputs", self.spec, "frames.outputs-payload")

    def call(self, identity: bytes, method: str, args: list[Any], timeout: float, *,
             call_id: int = 7, client: int = 0) -> dict[str, Any]:
        """Send a utility call and return the UtilityOutput answering it (request outputs
        read meanwhile are dropped)."""
        self.utility(identity, call_id, method, args, client)
        deadline = time.monotonic() + timeout
        while True:
            outputs = self.outputs(deadline - time.monotonic(), client)
            reply = outputs.get("utility_output")
            if reply is not None and reply.get("call_id") == call_id:
                return outputs

    def finish(self, request_id: str, timeout: float, client: int = 0) -> list[dict[str, Any]]:
        """Read outputs until ``request_id`` finishes; return its EngineCoreOutput entries."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            outputs = self.outputs(deadline - time.monotonic(), client)
            for output in outputs.get("outputs") or []:
                if output.get("request_id") == request_id:
                    seen.append({**output, "_engine_index": outputs.get("engine_index")})
                    if output.get("finish_reason") is not None:
                        return seen


class HandshakeProblem(ValueError):
    def __init__(self, message: str, frames: Sequence[bytes]) -> None:
        super().__init__(message)
        self.frames = list(frames)


def _map(payload: bytes, what: str, frames: Sequence[bytes],
         spec: Any = None) -> dict[str, Any]:
    """A HELLO or READY map; with ``spec``, its keys as vLLM reads them (a required key
    missing or of another type raises :class:`HandshakeProblem` with the path)."""
    try:
        value = raw_decode(payload)
    except Exception as exc:  # noqa: BLE001
        raise HandshakeProblem(f"{what} is not msgpack: {exc}", frames) from exc
    if not isinstance(value, dict):
        raise HandshakeProblem(f"{what} must be a msgpack map, got {type(value).__name__}",
                               frames)
    if spec is not None:
        problems = handshake_problems(value, what, spec)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise HandshakeProblem(f"[handshake.message-keys] {what} that vLLM "
                                   f"{spec.version} rejects: {problems[0]}{more}", frames)
    return value


class SuiteEngine:
    """The suite as engine core ``rank`` (it connects; the front end binds)."""

    def __init__(self, spec: Any, directory: str, handshake_address: str | None, rank: int = 0,
                 *, local: bool = True, headless: bool = False, input_rcvhwm: int = 0) -> None:
        """``handshake_address`` None: a front end without a handshake channel (the engine is
        given its addresses, :meth:`connect_direct`). ``input_rcvhwm``: the receive
        high-water mark of the input DEALERs; 1 makes the engine a slow reader whose pending
        input piles up at the front end's ROUTER, where a high-water mark would drop it."""
        require_conversation(spec)
        self.spec = spec
        self.transport = release_transport(spec)
        self.rank = rank
        self.identity = identity_of(rank)
        self.local = local
        self.headless = headless
        self.input_rcvhwm = input_rcvhwm
        self.net = _Net(directory)
        self.handshake_address = handshake_address
        #: The release holds the handshake on the input socket (0.9.0): the handshake DEALER
        #: is the input, the init map names the output only.
        self.on_input = handshake_on_input(spec.version)
        self.handshake_socket: zmq.Socket | None = None
        if handshake_address is not None:
            self.handshake_socket = self.net.socket(zmq.DEALER, self.identity)
            self.handshake_socket.connect(handshake_address)
        self.inputs: list[zmq.Socket] = []
        self.outputs: list[zmq.Socket] = []

    def close(self) -> None:
        self.net.close()

    def handshake_value(self, message: str, /, **overrides: Any) -> dict[str, Any]:
        """The ``message`` (HELLO or READY) map this engine sends in its release: exactly the
        release's required keys (headless from 0.10.0, num_gpu_blocks and dp_stats_address
        in READY before 0.20.0), then ``overrides``."""
        spec = handshake_message_at(self.spec, message)
        assert spec is not None  # require_conversation: the release has the handshake
        return {**engine_handshake_map(spec, local=self.local, headless=self.headless,
                                       values=READY_KEY_VALUES), **overrides}

    def hello(self, **overrides: Any) -> None:
        value = self.handshake_value("HELLO", **overrides)
        self.handshake_socket.send(msgspec.msgpack.encode(value))  # type: ignore[union-attr]

    def ready(self, **overrides: Any) -> None:
        value = self.handshake_value("READY", **overrides)
        self.handshake_socket.send(msgspec.msgpack.encode(value))  # type: ignore[union-attr]

    def recv_init(self, timeout: float) -> list[bytes]:
        return recv(self.handshake_socket, timeout, "init after HELLO")  # type: ignore[arg-type]

    def read_init(self, frames: Sequence[bytes]) -> dict[str, Any]:
        """The init message as the release's engine reads it (the EngineHandshakeMetadata
        struct, or 0.9.0's plain map of history/constants.toml [[init_message]]: its keys
        required, the output address a str, parallel_config a map), with ``addresses`` and
        ``parallel_config`` added for the map form (the input: the handshake socket). A
        value the release's engine would not read raises ``ValueError``."""
        if init_message_at(self.spec.version).get("form") != "map":
            return decode(frames, "EngineHandshakeMetadata", self.spec)
        value = raw_decode(frames[0])
        keys = list(init_message_at(self.spec.version).get("keys", []))
        if not isinstance(value, dict) or any(k not in value for k in keys):
            raise ValueError(f"vLLM {self.spec.version}'s init message is a map of "
                             f"{', '.join(keys)}, got {value!r}")
        addresses = init_addresses(value, self.handshake_address)
        if not all(isinstance(a, str) for a in addresses["outputs"]) or not isinstance(
                value.get("parallel_config", {}), dict):
            raise ValueError(f"vLLM {self.spec.version}'s init map needs a str output address "
                             f"and a map parallel_config, got {value!r}")
        return {**value, "addresses": addresses,
                "parallel_config": value.get("parallel_config", {})}

    def connect(self, init: dict[str, Any]) -> None:
        """Open the input and output sockets on the addresses ``init`` (:meth:`read_init`)
        names, with the release's socket types, binds and input identity; where the release
        holds the handshake on the input socket (0.9.0), that socket is the input."""
        ends = self.transport.input
        identity = self.identity if self.transport.identity else None
        if self.on_input:
            assert self.handshake_socket is not None
            self.inputs.append(self.handshake_socket)
        for address in [] if self.on_input else init["addresses"]["inputs"]:
            sock = self.net.socket(getattr(zmq, ends.engine), identity)
            if self.input_rcvhwm:
                sock.setsockopt(zmq.RCVHWM, self.input_rcvhwm)
            self.net.attach(sock, address, ends.role_binds("engine"))
            self.inputs.append(sock)
        ends = self.transport.output
        for address in init["addresses"]["outputs"]:
            sock = self.net.socket(getattr(zmq, ends.engine))
            self.net.attach(sock, address, ends.role_binds("engine"))
            self.outputs.append(sock)

    def connect_direct(self, input_address: str, output_address: str) -> None:
        """Connect to a front end without a handshake channel, as if init had named these."""
        self.connect({"addresses": {"inputs": [input_address], "outputs": [output_address]}})

    def send_ready_response(self, value: dict[str, Any] | None = None, *,
                            raw: bytes | None = None) -> None:
        payload = raw if raw is not None else ready_response_payload(
            self.spec, value or ready_response_value(self.rank))
        if payload is None:  # a pipe, or READY on the input (0.9.0): no ready response frame
            return
        for sock in self.inputs:
            sock.send(payload)

    def start(self, timeout: float) -> dict[str, Any]:
        """The whole engine side of the handshake; returns the init value."""
        self.hello()
        init = self.read_init(self.recv_init(timeout))
        self.connect(init)
        self.send_ready_response()
        self.ready()
        return init

    def recv_request(self, timeout: float, client: int = 0) -> list[bytes]:
        return recv(self.inputs[client], timeout, f"a request on input {client}")

    def push_raw(self, frames: Sequence[bytes], client: int = 0) -> list[bytes]:
        """Send ``frames`` on output ``client``; returns them (for reproductions)."""
        self.outputs[client].send_multipart(list(frames))
        return list(frames)

    def push(self, outputs: dict[str, Any], client: int = 0) -> list[bytes]:
        # A fixed timestamp keeps reproductions byte-identical from run to run.
        value = {"engine_index": self.rank, "timestamp": 0.0, **outputs}
        value = in_release(value, "EngineCoreOutputs", self.spec)
        return self.push_raw(encode(value, "EngineCoreOutputs", self.spec), client)

    def reply(self, call_id: int, *, result: Any = None, failure: str | None = None,
              client: int = 0) -> list[bytes]:
        # Releases before 0.10.1 carry the bare result (no UtilityResult pair).
        pair = "UtilityResult" in self.spec.structs
        utility = {"call_id": call_id, "failure_message": failure,
                   "result": None if failure is not None else {"type_info": None,
                                                               "value": result}
                   if pair else result}
        return self.push({"utility_output": utility}, client)
