"""Engine checks: the suite is the front end, the target is the engine core.

The suite binds the handshake ROUTER and one input ROUTER and output PULL per client
(:class:`~enginewire.conformance.peers.zmq_peers.SuiteFrontend`), starts the target's engine with
those addresses, and watches every frame: identity, HELLO, init, ready responses, READY, outputs.
Bad input is sent on the raw sockets; after each, the engine must still answer a utility call.

For a release without the handshake (before 0.9.0) the suite gives the engine its input and
output addresses directly and opens the release's sockets (history/constants.toml
``[[transport]]``); the checks of what the release lacks (the handshake, a ready message on the
wire, the engine identity on the input, an input/output pair per client) are NOT APPLICABLE
with that reason.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq

from enginewire.conformance.checks._helpers import (
    check_high_water_marks,
    require_ipv6_loopback,
    require_message,
)
from enginewire.conformance.framework.context import CheckContext
from enginewire.conformance.framework.evidence import in_release, probe_while_waiting
from enginewire.conformance.framework.registry import (
    CheckFailure,
    Reproduction,
    check,
    require_field,
)
from enginewire.conformance.oracle.samples import minimal_request
from enginewire.conformance.oracle.strict import handshake_problems, handshake_surplus
from enginewire.conformance.peers.zmq_peers import (
    ENGINE_CORE_DEAD,
    HandshakeProblem,
    SuiteFrontend,
    decode,
    encode,
    identity_of,
    require_clients,
    require_handshake,
    require_identity,
    require_ready_key,
    require_ready_response,
    require_wire_ready,
    type_byte,
)
from enginewire.conformance.peers.zmq_peers import (
    request_type_frame as _type,  # the release's type frame; NOT APPLICABLE where it has none
)
from enginewire.conformance.targets.contract import EngineLaunch, EngineSurface
from enginewire.spec.history.release_facts import (
    clients_gap,
    handshake_message_at,
    ready_response_at,
)

PEER_TIMEOUT = 25.0
PROBE_METHOD = "enginewire_conformance_no_such_method"


# --- plumbing ----------------------------------------------------------------------------


def _frontend(ctx: Any, *, clients: int = 1, transport: str = "ipc") -> SuiteFrontend:
    front = SuiteFrontend(ctx.spec, str(ctx.tmpdir), clients=clients, transport=transport)
    ctx.on_cleanup(front.close)
    return front


def _launch(engine: Any, ctx: Any, front: SuiteFrontend, rank: int = 0, **options: Any) -> Any:
    launch = EngineLaunch(**front.launch_addresses(), engine_index=rank, **options)
    peer = engine.start_engine(launch)
    ctx.on_cleanup(lambda: peer.stop(3.0))
    # An engine whose alive() says it has no code for it ends the suite's waits at once.
    probe_while_waiting("the engine peer's alive", peer.alive)
    exit_failure = getattr(peer, "exit_failure", None)  # an engine program's (targets.external)
    if exit_failure is not None:
        probe_while_waiting("the engine program's start",
                            lambda: _started_or_raise(exit_failure, front))
    return peer


def _started_or_raise(exit_failure: Any, front: SuiteFrontend) -> None:
    """Raise the engine program's start failure if it exited before sending ``front``
    anything (its first message)."""
    failure = None if front.heard else exit_failure()
    if failure is not None:
        raise failure


def _handshake(front: SuiteFrontend, ctx: Any, rank: int = 0) -> Any:
    try:
        return front.handshake(ctx.wait(10.0), expect=identity_of(rank))
    except HandshakeProblem as exc:
        raise CheckFailure(str(exc), Reproduction(received=exc.frames)) from exc
    except TimeoutError as exc:
        raise CheckFailure(f"handshake with engine {rank}: {_why(exc)}") from exc


def _why(exc: BaseException) -> str:
    """What a failed wait saw, without its timing (failure messages are compared as
    prefixes across runs): ``recv``'s "X: nothing within N s" becomes "nothing came: X"."""
    if isinstance(exc, TimeoutError):
        what, _, _ = str(exc).partition(": nothing within")
        return f"nothing came: {what}"
    return str(exc)


def _started(engine: Any, ctx: Any, *, rank: int = 0, clients: int = 1,
             **options: Any) -> tuple[SuiteFrontend, Any]:
    front = _frontend(ctx, clients=clients)
    _launch(engine, ctx, front, rank, **options)
    return front, _handshake(front, ctx, rank)


def _still_serving(front: SuiteFrontend, ctx: Any, identity: bytes, after: str,
                   sent: list[bytes] | None = None, call_id: int = 4242) -> None:
    """The engine must answer a utility call after ``after``."""
    try:
        outputs = front.call(identity, PROBE_METHOD, [], ctx.wait(6.0), call_id=call_id)
    except (TimeoutError, ConnectionError) as exc:
        raise CheckFailure(f"the engine stopped serving after {after}: a utility call got no "
                           f"reply ({_why(exc)})", Reproduction(sent=sent)) from exc
    reply = outputs["utility_output"]
    if reply.get("failure_message") is None and reply.get("result") is None:
        raise CheckFailure(f"after {after} the utility reply has neither result nor failure",
                           Reproduction(sent=sent, received=outputs))


def recv_input(front: SuiteFrontend, ctx: Any) -> list[bytes]:
    """The first message on input 0 (a release without the handshake: its ready message)."""
    try:
        return front.recv_input_frames(ctx.wait(10.0), "the engine's ready message")
    except TimeoutError as exc:
        raise CheckFailure("nothing came on input 0: the engine's ready message") from exc


# --- handshake -----------------------------------------------------------------------------


@check("engine/handshake/hello-first", clauses=["handshake.hello-first", "handshake.message-keys",
                                                "frames.routed-identity-first"],
       surface="engine", timeout=PEER_TIMEOUT)
def _hello(engine: EngineSurface, ctx: CheckContext) -> None:
    """The first handshake message is [identity, HELLO] with exactly the release's HELLO keys
    ({status, local, headless}; {status, local} before 0.10.0)."""
    require_handshake(ctx.spec)
    front = _frontend(ctx)
    _launch(engine, ctx, front)
    frames = front.recv_handshake(ctx.wait(10.0))
    if len(frames) != 2:
        raise CheckFailure(f"HELLO arrived as {len(frames)} frames at the ROUTER, expected 2",
                           Reproduction(received=frames))
    try:
        hello = msgspec.msgpack.decode(frames[1])
    except msgspec.DecodeError as exc:
        raise CheckFailure(f"HELLO payload is not msgpack: {exc}",
                           Reproduction(received=frames)) from exc
    problems = handshake_problems(hello, "HELLO", ctx.spec)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckFailure(f"[handshake.message-keys] HELLO that vLLM {ctx.spec.version} "
                           f"rejects: "
                           f"{problems[0]}{more}",
                           Reproduction(received=frames,
                                        notes={"problems": [str(p) for p in problems]}))
    if not isinstance(hello, dict) or hello.get("status") != "HELLO":
        raise CheckFailure(f"HELLO must be a map with status 'HELLO', got {hello!r}"[:300],
                           Reproduction(received=frames))
    _no_surplus(hello, "HELLO", ctx, frames)


def _no_surplus(message: dict[str, Any], what: str, ctx: Any,
                frames: list[bytes] | None = None) -> None:
    """``message`` carries only keys of the release's ``what`` (HELLO or READY)."""
    surplus = handshake_surplus(message, what, ctx.spec)
    if surplus:
        raise CheckFailure(f"[handshake.message-keys] {what} carries {surplus}, which vLLM "
                           f"{ctx.spec.version}'s {what} does not have: a {what} of another "
                           "release", Reproduction(received=frames or message))


def _identity_check(engine: Any, ctx: Any, rank: int) -> None:
    """The identity of HELLO, or without a handshake, of the ready message on the input."""
    require_identity(ctx.spec)
    front = _frontend(ctx)
    _launch(engine, ctx, front, rank, dp_size=rank + 1)
    if not front.transport.handshake:
        require_wire_ready(ctx.spec)
        frames = recv_input(front, ctx)
    else:
        frames = front.recv_handshake(ctx.wait(10.0))
    want = identity_of(rank)
    if frames[0] != want:
        raise CheckFailure(f"engine {rank} identifies as {frames[0].hex()} "
                           f"({len(frames[0])} bytes), expected {want.hex()}",
                           Reproduction(received=frames))


@check("engine/identity/rank-3", clauses=["identity.little-endian-rank",
                                          "identity.width-two-bytes",
                                          "transport.identity-before-connect"],
       surface="engine", timeout=PEER_TIMEOUT)
def _identity_3(engine: Any, ctx: Any) -> None:
    """Engine 3's identity is the two bytes 03 00."""
    _identity_check(engine, ctx, 3)


@check("engine/identity/rank-258", clauses=["identity.little-endian-rank",
                                            "identity.width-two-bytes"],
       surface="engine", timeout=PEER_TIMEOUT)
def _identity_258(engine: Any, ctx: Any) -> None:
    """Engine 258's identity is the two bytes 02 01 (little-endian, not 01 02)."""
    _identity_check(engine, ctx, 258)


@check("engine/identity/same-on-input", clauses=["identity.same-on-handshake-and-input",
                                                 "frames.ready-response-first"],
       surface="engine", timeout=PEER_TIMEOUT)
def _same_identity(engine: EngineSurface, ctx: CheckContext) -> None:
    """The ready response comes first on the input channel, from the handshake identity."""
    require_handshake(ctx.spec)
    _, handshake = _started(engine, ctx, rank=2, dp_size=3)
    frames = handshake.ready_responses[0]
    if frames[0] != handshake.identity:
        raise CheckFailure(f"the input DEALER's identity is {frames[0].hex()}, the handshake's "
                           f"{handshake.identity.hex()}", Reproduction(received=frames))
    if len(frames) != 2:
        raise CheckFailure(f"the ready response is {len(frames) - 1} frames, expected 1",
                           Reproduction(received=frames))


@check("engine/handshake/ready-response-map", clauses=["frames.ready-response-first",
                                                       "frames.plain-msgpack-control"],
       surface="engine", timeout=PEER_TIMEOUT)
def _ready_response(engine: EngineSurface, ctx: CheckContext) -> None:
    """The ready response is an EngineCoreReadyResponse map with every required field, or
    an empty frame; an empty frame only in a release whose engine sends one (0.9.1-0.19.1,
    history/constants.toml [[ready_response]]); in 0.8.4 and 0.8.5 the literal b"READY",
    which :meth:`SuiteFrontend.await_ready` requires."""
    require_ready_response(ctx.spec)
    _, handshake = _started(engine, ctx)
    frames = handshake.ready_responses[0]
    if not handshake.hello and frames[1] == b"READY":
        return  # a release without the handshake: its literal ready message
    form = ready_response_at(ctx.spec.version)
    if form == "empty" and frames[1:] != [b""]:
        raise CheckFailure(f"vLLM {ctx.spec.version}'s engine sends one empty ready-response "
                           f"frame (history/constants.toml [[ready_response]]: empty), got "
                           f"{len(frames) - 1} frame(s) of {len(frames[1])} bytes first",
                           Reproduction(received=frames))
    if frames[1] == b"":
        return  # an empty ready response is allowed (handshake.ready-response-empty-accepted)
    try:
        value = decode(frames[1:], "EngineCoreReadyResponse", ctx.spec)
    except Exception as exc:  # noqa: BLE001
        raise CheckFailure(f"the ready response is not an EngineCoreReadyResponse map: {exc}",
                           Reproduction(received=frames)) from exc
    if "data_parallel_rank" in value and value["data_parallel_rank"] != 0:
        raise CheckFailure(f"engine 0's ready response says data_parallel_rank "
                           f"{value['data_parallel_rank']}", Reproduction(received=frames))


@check("engine/handshake/ready-keys", clauses=["handshake.message-keys",
                                               "handshake.ready-optional-keys",
                                               "transport.handshake-dealer-linger"],
       surface="engine", timeout=PEER_TIMEOUT)
def _ready_keys(engine: EngineSurface, ctx: CheckContext) -> None:
    """READY carries the release's required keys and no key the release lacks ({status,
    local, headless} from 0.20.0; with num_gpu_blocks, and dp_stats_address from 0.9.2,
    before), with no parallel_config_hash when DP = 1. The keys' presence and types are
    checked as the handshake is read (:func:`~enginewire.conformance.peers.zmq_peers.
    SuiteFrontend.handshake`)."""
    require_handshake(ctx.spec)
    _, handshake = _started(engine, ctx)
    ready = handshake.ready
    if ready.get("status") != "READY":
        raise CheckFailure(f"READY must carry status 'READY', got {ready!r}"[:300])
    _no_surplus(ready, "READY", ctx)
    extra = {"parallel_config_hash", "coord_store_port", "elastic_ep_max_dp_size",
             "num_redundant_experts"} & set(ready)
    if extra:
        raise CheckFailure(f"READY of a DP=1 engine without elastic EP carries {sorted(extra)}")


@check("engine/handshake/ready-hash-with-dp", clauses=["handshake.ready-optional-keys"],
       surface="engine", requires=["engine.coordinated-dp"], timeout=PEER_TIMEOUT)
def _ready_hash(engine: EngineSurface, ctx: CheckContext) -> None:
    """READY of an engine with data_parallel_size 2 carries parallel_config_hash."""
    require_handshake(ctx.spec)
    require_ready_key(ctx.spec, "parallel_config_hash")
    _, handshake = _started(engine, ctx, rank=1, dp_size=2)
    if "parallel_config_hash" not in handshake.ready:
        raise CheckFailure(f"READY of a DP=2 engine has no parallel_config_hash: "
                           f"{handshake.ready!r}")


@check("engine/handshake/flags-follow-launch", clauses=["handshake.local-must-match",
                                                        "handshake.headless-rule"],
       surface="engine", timeout=PEER_TIMEOUT)
def _flags(engine: EngineSurface, ctx: CheckContext) -> None:
    """A remote headless engine says local=false, headless=true in HELLO and READY (local
    only, before 0.10.0: those releases' HELLO and READY have no headless key)."""
    require_handshake(ctx.spec)
    _, handshake = _started(engine, ctx, local=False, headless=True)
    want = {"local": False, "headless": True}
    for name, message in (("HELLO", handshake.hello), ("READY", handshake.ready)):
        keys = handshake_message_at(ctx.spec, name)
        names = {k.name for k in keys.keys} if keys is not None else set()
        said = {k: message.get(k) for k in want if k in names}
        if said != {k: v for k, v in want.items() if k in names}:
            raise CheckFailure(f"{name} says {said}; launched as remote and headless")


@check("engine/handshake/two-clients", clauses=["transport.one-socket-pair-per-client",
                                                "handshake.init-addresses",
                                                "transport.engine-connects"],
       surface="engine", timeout=PEER_TIMEOUT)
def _two_clients(engine: EngineSurface, ctx: CheckContext) -> None:
    """With two clients the engine sends a ready response on both inputs and answers client
    1's call on client 1's output."""
    require_clients(ctx.spec)
    front, handshake = _started(engine, ctx, clients=2)
    if len(handshake.ready_responses) != 2:
        raise CheckFailure("no ready response on the second input")
    outputs = front.call(handshake.identity, PROBE_METHOD, [], ctx.wait(6.0), call_id=91,
                         client=1)
    if outputs["utility_output"]["call_id"] != 91:
        raise CheckFailure(f"client 1's call was answered with {outputs!r}"[:300])
    if front.output_sockets[0].poll(200):
        raise CheckFailure("client 1's reply (or something else) arrived on client 0's output",
                           Reproduction(received=front.output_sockets[0].recv_multipart()))


@check("engine/handshake/tcp-addresses", clauses=["transport.tcp-when-remote",
                                                  "transport.engine-connects"],
       surface="engine", timeout=PEER_TIMEOUT)
def _tcp(engine: EngineSurface, ctx: CheckContext) -> None:
    """An engine connects to tcp:// addresses as well as ipc:// ones."""
    front = _frontend(ctx, transport="tcp")
    _launch(engine, ctx, front)
    handshake = _handshake(front, ctx)
    _still_serving(front, ctx, handshake.identity, "a tcp handshake")


@check("engine/handshake/ipv6-addresses", clauses=["transport.ipv6-brackets"],
       surface="engine", timeout=PEER_TIMEOUT)
def _ipv6(engine: Any, ctx: Any) -> None:
    """An engine connects to tcp://[::1]:port addresses (IPV6 option set before connect)."""
    require_ipv6_loopback()
    front = _frontend(ctx, transport="tcp6")
    _launch(engine, ctx, front)
    handshake = _handshake(front, ctx)
    _still_serving(front, ctx, handshake.identity, "an IPv6 handshake")


@check("engine/handshake/init-timeout", clauses=["handshake.engine-init-timeout"],
       surface="engine", timeout=PEER_TIMEOUT)
def _init_timeout(engine: EngineSurface, ctx: CheckContext) -> None:
    """An engine that gets no init gives up after its init timeout (1 s here)."""
    require_handshake(ctx.spec)
    front = _frontend(ctx)
    peer = _launch(engine, ctx, front, init_timeout=1.0)
    front.recv_handshake(ctx.wait(10.0))
    deadline = time.monotonic() + ctx.wait(12.0)
    while peer.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if peer.alive():
        raise CheckFailure("the engine still waits for init 12 s after HELLO with "
                           "init_timeout=1")


@check("engine/handshake/garbage-init", clauses=["handshake.engine.unexpected-event",
                                                 "frames.payload-matches-type"],
       surface="engine", timeout=PEER_TIMEOUT)
def _garbage_init(engine: EngineSurface, ctx: CheckContext) -> None:
    """An init that is not an EngineHandshakeMetadata map does not lead to READY."""
    require_handshake(ctx.spec)
    front = _frontend(ctx)
    _launch(engine, ctx, front, init_timeout=3.0)
    identity, _ = front.recv_handshake(ctx.wait(10.0))
    sent = [identity, msgspec.msgpack.encode(["not", "a", "map"])]
    front.router.send_multipart(sent)
    if front.router.poll(1500):
        got = front.router.recv_multipart()
        try:
            message = msgspec.msgpack.decode(got[-1])
        except msgspec.DecodeError:
            message = None
        if isinstance(message, dict) and message.get("status") == "READY":
            raise CheckFailure("the engine sent READY after a malformed init",
                               Reproduction(sent=sent, received=got))


@check("engine/handshake/ready-after-connect", clauses=["handshake.ready-after-connect"],
       surface="engine", timeout=PEER_TIMEOUT)
def _ready_after_connect(engine: EngineSurface, ctx: CheckContext) -> None:
    """When READY arrives the ready response is already on its way and the output channel is
    connected: a call sent at once is answered."""
    require_handshake(ctx.spec)
    front = _frontend(ctx)
    _launch(engine, ctx, front)
    identity, _ = front.recv_handshake(ctx.wait(10.0))
    front.send_init(identity)
    ready = front.recv_handshake(ctx.wait(10.0))
    if front.on_input:  # READY on the input socket is the ready response (0.9.0)
        _still_serving(front, ctx, identity, "READY")
        return
    try:
        front.input_sockets[0].poll(1000)
        response = front.input_sockets[0].recv_multipart(zmq.NOBLOCK)
    except zmq.Again as exc:
        raise CheckFailure("READY came, but no ready response within 1 s of it",
                           Reproduction(received=ready)) from exc
    if response[0] != identity:
        raise CheckFailure("the first input message is not from the engine's identity",
                           Reproduction(received=response))
    _still_serving(front, ctx, identity, "READY")


# --- serving -------------------------------------------------------------------------------


@check("engine/serve/add-generates", clauses=["frames.outputs-payload",
                                              "frames.type-byte-before-payload",
                                              "transport.output-has-no-identity"],
       surface="engine", timeout=PEER_TIMEOUT)
def _add(engine: EngineSurface, ctx: CheckContext) -> None:
    """An ADD (max_tokens 2) gets outputs on the output channel until it finishes, each an
    EngineCoreOutputs with the engine's index (where the release has engine_index) and no
    identity or type frame."""
    front, handshake = _started(engine, ctx, rank=1, dp_size=2)
    front.add(handshake.identity, minimal_request("req-add"))
    try:
        seen = front.finish("req-add", ctx.wait(10.0))
    except TimeoutError as exc:
        raise CheckFailure(f"req-add did not finish: {_why(exc)}") from exc
    tokens = [t for output in seen for t in output.get("new_token_ids") or []]
    if not tokens or len(tokens) > 2:
        raise CheckFailure(f"max_tokens 2 produced {len(tokens)} tokens: {tokens}")
    has_index = any(f.name == "engine_index"
                    for f in ctx.spec.struct("EngineCoreOutputs").fields)
    if has_index and any(output["_engine_index"] != 1 for output in seen):
        raise CheckFailure(f"engine 1's outputs carry engine_index "
                           f"{sorted({o['_engine_index'] for o in seen})}")


@check("engine/serve/timestamp-set", clauses=["structs.outputs.timestamp-set"],
       surface="engine", timeout=PEER_TIMEOUT)
def _timestamp(engine: EngineSurface, ctx: CheckContext) -> None:
    """Outputs carry a non-zero timestamp."""
    front, handshake = _started(engine, ctx)
    front.add(handshake.identity, minimal_request("req-ts"))
    outputs = front.outputs(ctx.wait(10.0))
    if not outputs.get("timestamp"):
        raise CheckFailure(f"EngineCoreOutputs.timestamp is {outputs.get('timestamp')!r}")


@check("engine/serve/abort", clauses=["frames.abort-payload"], surface="engine",
       timeout=PEER_TIMEOUT)
def _abort(engine: EngineSurface, ctx: CheckContext) -> None:
    """After ABORT a long request stops producing tokens, and the engine keeps serving."""
    front, handshake = _started(engine, ctx)
    request = minimal_request("req-long")
    request["sampling_params"] = {**request["sampling_params"], "max_tokens": 100000}
    front.add(handshake.identity, request)
    front.outputs(ctx.wait(10.0))
    front.abort(handshake.identity, ["req-long"])
    deadline = time.monotonic() + ctx.wait(5.0)
    while time.monotonic() < deadline:
        try:
            outputs = front.outputs(0.5)
        except TimeoutError:
            break
        for output in outputs.get("outputs") or []:
            if output["request_id"] == "req-long" and output.get("finish_reason") is not None:
                deadline = 0
    else:
        if deadline != 0:
            raise CheckFailure("req-long kept producing outputs for 5 s after ABORT")
    _still_serving(front, ctx, handshake.identity, "an ABORT")


@check("engine/utility/unknown-method-fails",
       clauses=["handshake.session.unknown-method-fails-call", "frames.utility-reply"],
       surface="engine", timeout=PEER_TIMEOUT)
def _unknown_method(engine: EngineSurface, ctx: CheckContext) -> None:
    """A call to a method the engine lacks gets a failure_message, the call_id, no outputs."""
    front, handshake = _started(engine, ctx)
    outputs = front.call(handshake.identity, PROBE_METHOD, [1], ctx.wait(6.0), call_id=5)
    reply = outputs["utility_output"]
    if not isinstance(reply.get("failure_message"), str) or reply.get("result") is not None:
        raise CheckFailure(f"expected a failure_message and no result, got {reply!r}")
    if outputs.get("outputs"):
        raise CheckFailure("a utility reply must carry an empty outputs list")
    _still_serving(front, ctx, handshake.identity, "a failed utility call")


@check("engine/utility/call-ids-echoed", clauses=["frames.utility-reply",
                                                  "frames.utility-call-id"],
       surface="engine", timeout=PEER_TIMEOUT)
def _call_ids(engine: EngineSurface, ctx: CheckContext) -> None:
    """Replies carry the call_id of their call, up to 2**64 - 1."""
    front, handshake = _started(engine, ctx)
    for call_id in (0, 2**63 + 5, 2**64 - 1):
        outputs = front.call(handshake.identity, PROBE_METHOD, [], ctx.wait(6.0),
                             call_id=call_id)
        if outputs["utility_output"]["call_id"] != call_id:
            raise CheckFailure(f"call {call_id} answered as {outputs['utility_output']!r}")


# --- bad input: the engine must survive ----------------------------------------------------


def _garbage(frames_of: Any, what: str, clauses: list[str], check_id: str) -> None:
    @check(check_id, clauses=clauses, surface="engine", timeout=PEER_TIMEOUT,
           description=f"the engine survives {what} and keeps serving")
    def _run(engine: EngineSurface, ctx: CheckContext) -> None:
        frames = frames_of(ctx.spec)
        front, handshake = _started(engine, ctx)
        front.send_input(handshake.identity, frames)
        _still_serving(front, ctx, handshake.identity, what, frames)


def _add_payload(spec: Any, **fields: Any) -> list[bytes]:
    request = in_release(minimal_request("req-bad", **fields), "EngineCoreRequest", spec)
    return encode(request, "EngineCoreRequest", spec)


_garbage(lambda spec: [b"\x09", msgspec.msgpack.encode(["x"])], "type byte 0x09",
         ["request_types.unknown-byte-rejected"], "engine/garbage/unknown-type-byte")
_garbage(lambda spec: [_type(spec, "EXECUTOR_FAILED"), b""], "type byte 0x04 (EXECUTOR_FAILED)",
         ["request_types.sentinels-never-on-wire"], "engine/garbage/sentinel-executor-failed")
_garbage(lambda spec: [_type(spec, "WAKEUP"), b""], "type byte 0x05 (WAKEUP)",
         ["request_types.sentinels-never-on-wire"], "engine/garbage/sentinel-wakeup")
_garbage(lambda spec: [b"\x00\x00", *_add_payload(spec)], "a two-byte type frame",
         ["request_types.one-byte-frame"], "engine/garbage/two-byte-type")
_garbage(lambda spec: [_type(spec, "ADD")], "an ADD without payload", ["frames.frame-count"],
         "engine/garbage/add-without-payload")
_garbage(lambda spec: [_type(spec, "ADD"), b"\xc1\xc1"],
         "an ADD with a payload that is not msgpack",
         ["frames.payload-matches-type"], "engine/garbage/add-not-msgpack")
_garbage(lambda spec: [_type(spec, "ADD"), msgspec.msgpack.encode({"request_id": "m"})],
         "an ADD whose payload is a map", ["frames.payload-matches-type",
                                           "structs.array.type-checked"],
         "engine/garbage/add-wrong-shape")
_garbage(lambda spec: [_type(spec, "UTILITY"), msgspec.msgpack.encode([0, 1])],
         "a UTILITY payload of two elements", ["frames.utility-payload",
                                               "frames.payload-matches-type"],
         "engine/garbage/utility-short")
_garbage(lambda spec: [_type(spec, "ABORT"), msgspec.msgpack.encode(17)],
         "an ABORT payload that is an int",
         ["frames.abort-payload"], "engine/garbage/abort-not-list")
_garbage(lambda spec: [b"READY"], "a READY frame on the input channel",
         ["frames.coordinator-subscribe-first"], "engine/garbage/ready-on-input")
_garbage(lambda spec: [_type(spec, "START_DP_WAVE"), msgspec.msgpack.encode([1, 0])],
         "a START_DP_WAVE from the front end", ["frames.start-dp-wave-from-coordinator",
                                                "frames.start-dp-wave-payload"],
         "engine/garbage/start-dp-wave-on-input")


def _missing_oob(spec: Any) -> list[bytes]:
    import numpy as np

    from enginewire.conformance.oracle.wire import expected_wire

    require_field(spec, "EngineCoreRequest", "prompt_embeds")
    request = in_release(minimal_request("req-oob", prompt_token_ids=None),
                         "EngineCoreRequest", spec)
    wire = list(expected_wire(request, "EngineCoreRequest", spec).value)
    index = [f.name for f in spec.struct("EngineCoreRequest").fields].index("prompt_embeds")
    wire[index] = ["float32", [4, 64], 1]
    _ = np  # the data frame is the thing missing
    return [spec.request_type_byte("ADD"), msgspec.msgpack.encode(wire)]


_garbage(_missing_oob, "an ADD naming an out-of-band frame that is not there",
         ["frames.oob-count-matches", "tensors.index-in-range"], "engine/garbage/missing-oob")


@check("engine/garbage/request-still-served-after", clauses=["frames.payload-matches-type",
                                                            "request_types.unknown-byte-rejected"],
       surface="engine", timeout=PEER_TIMEOUT)
def _served_after(engine: EngineSurface, ctx: CheckContext) -> None:
    """After a burst of malformed messages an ADD is still generated to the end."""
    front, handshake = _started(engine, ctx)
    for frames in ([b"\x07"], [type_byte(ctx.spec, "add"), b"\xc1"],
                   [type_byte(ctx.spec, "utility"), b"\x90"], [b""]):
        front.send_input(handshake.identity, frames)
    front.add(handshake.identity, minimal_request("req-after"))
    try:
        front.finish("req-after", ctx.wait(10.0))
    except (TimeoutError, ConnectionError) as exc:
        raise CheckFailure(f"no finished output for an ADD sent after malformed input "
                           f"({_why(exc)})") from exc


@check("engine/serve/many-requests-intact", clauses=["frames.tracked-buffer-reuse",
                                                   "frames.oob-not-mutated-in-flight",
                                                   "frames.outputs-payload"],
       surface="engine", timeout=PEER_TIMEOUT + 10)
def _many(engine: EngineSurface, ctx: CheckContext) -> None:
    """24 concurrent requests of 6 tokens: every output message decodes, no request gets a
    token twice or another request's output (a reused send buffer would corrupt them)."""
    front, handshake = _started(engine, ctx)
    ids = [f"req-many-{i:02d}" for i in range(24)]
    for request_id in ids:
        request = minimal_request(request_id)
        request["sampling_params"] = {**request["sampling_params"], "max_tokens": 6}
        front.add(handshake.identity, request)
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    finished: set[str] = set()
    deadline = time.monotonic() + ctx.wait(15.0)
    while len(finished) < len(ids):
        try:
            outputs = front.outputs(deadline - time.monotonic())
        except TimeoutError as exc:
            raise CheckFailure(f"{len(finished)} of {len(ids)} requests finished: {_why(exc)}") \
                from exc
        except Exception as exc:  # noqa: BLE001 - a corrupted message
            raise CheckFailure(f"an output message did not decode: {exc}") from exc
        for output in outputs.get("outputs") or []:
            request_id = output["request_id"]
            if request_id not in tokens or request_id in finished:
                raise CheckFailure(f"output for {request_id!r}, which is unknown or finished")
            tokens[request_id] += output.get("new_token_ids") or []
            if output.get("finish_reason") is not None:
                finished.add(request_id)
    wrong = {i: t for i, t in tokens.items() if not 1 <= len(t) <= 6}
    if wrong:
        raise CheckFailure(f"requests with a token count outside 1..6: {wrong}")


# --- several engines, death -----------------------------------------------------------------


@check("engine/dp/three-identities", clauses=["identity.little-endian-rank",
                                              "identity.known-rank",
                                              "transport.output-has-no-identity"],
       surface="engine", timeout=PEER_TIMEOUT + 10)
def _three(engine: EngineSurface, ctx: CheckContext) -> None:
    """Three engines (ranks 0-2) on one front end: each routed request is answered by its
    engine, whose outputs carry its engine_index."""
    require_identity(ctx.spec)
    front = _frontend(ctx)
    for rank in range(3):
        _launch(engine, ctx, front, rank, dp_size=3)
    if not front.transport.handshake:
        _three_without_handshake(front, ctx)
        return
    hellos: set[bytes] = set()
    readies: set[bytes] = set()
    deadline = time.monotonic() + ctx.wait(12.0)
    while len(readies) < 3:
        try:
            identity, payload = front.recv_handshake(deadline - time.monotonic())[:2]
        except TimeoutError as exc:
            raise CheckFailure(f"HELLO from {sorted(i.hex() for i in hellos)}, READY from "
                               f"{sorted(i.hex() for i in readies)}: {_why(exc)}") from exc
        status = msgspec.msgpack.decode(payload).get("status")
        if status == "HELLO":
            hellos.add(identity)
            front.send_init(identity)
        elif status == "READY":
            readies.add(identity)
    if hellos != {identity_of(r) for r in range(3)}:
        raise CheckFailure(f"identities {sorted(i.hex() for i in hellos)}, expected "
                           "0000, 0100, 0200")
    for _ in range(0 if front.on_input else 3):  # on the input, READY was the response
        try:
            front.recv_input_frames(deadline - time.monotonic(), "a ready response on input 0")
        except TimeoutError as exc:
            raise CheckFailure(f"READY from {sorted(i.hex() for i in readies)}, but "
                               f"{_why(exc)}") from exc
    _three_serve(front, ctx, hellos, deadline)


def _three_without_handshake(front: SuiteFrontend, ctx: Any) -> None:
    """Three engines of a release without the handshake on one input ROUTER: each one's
    b"READY" names its identity, and each routed request is answered by its engine."""
    deadline = time.monotonic() + ctx.wait(12.0)
    identities: set[bytes] = set()
    while len(identities) < 3:
        try:
            frames = front.recv_input_frames(deadline - time.monotonic(),
                                             "the engines' ready messages")
        except TimeoutError as exc:
            raise CheckFailure(f"ready messages from {sorted(i.hex() for i in identities)} "
                               "only") from exc
        identities.add(frames[0])
    _three_serve(front, ctx, identities, deadline)


def _three_serve(front: SuiteFrontend, ctx: Any, identities: set[bytes],
                 deadline: float) -> None:
    if identities != {identity_of(r) for r in range(3)}:
        raise CheckFailure(f"identities {sorted(i.hex() for i in identities)}, expected "
                           "0000, 0100, 0200")
    for rank in range(3):
        front.add(identity_of(rank), minimal_request(f"req-rank{rank}"))
    finished: dict[str, int] = {}
    while len(finished) < 3:
        outputs = front.outputs(deadline - time.monotonic())
        for output in outputs.get("outputs") or []:
            if output.get("finish_reason") is not None:
                finished[output["request_id"]] = outputs["engine_index"]
    want = {f"req-rank{r}": r for r in range(3)}
    if finished != want:
        raise CheckFailure(f"requests finished on engines {finished}, expected {want}")


@check("engine/dead/sentinel-last", clauses=["frames.engine-core-dead-last",
                                             "frames.engine-core-dead-literal",
                                             "transport.output-push-linger"],
       surface="engine", requires=["engine.die"], timeout=PEER_TIMEOUT)
def _dies(engine: EngineSurface, ctx: CheckContext) -> None:
    """A failing engine sends the 16-byte ENGINE_CORE_DEAD on every output and then
    nothing (on its one output where the release has one pair). NOT APPLICABLE before the
    release had the sentinel (:func:`require_message`: 0.8.5)."""
    require_message(ctx.spec, "engine_core_dead")
    front = _frontend(ctx, clients=2 if clients_gap(ctx.spec.version) is None else 1)
    peer = _launch(engine, ctx, front)
    _handshake(front, ctx)
    engine.die(peer)  # type: ignore[attr-defined]
    for client in range(len(front.output_sockets)):
        got = None
        deadline = time.monotonic() + ctx.wait(8.0)
        while got != [ENGINE_CORE_DEAD]:
            try:
                got = front.recv_output_frames(deadline - time.monotonic(), client)
            except TimeoutError as exc:
                raise CheckFailure(f"no ENGINE_CORE_DEAD on output {client}") from exc
        if front.output_sockets[client].poll(500):
            raise CheckFailure(f"output {client} carried a message after ENGINE_CORE_DEAD",
                               Reproduction(received=front.output_sockets[client].recv_multipart()))


# --- transport -------------------------------------------------------------------------------


@check("engine/transport/high-water-marks-zero", clauses=["transport.hwm-zero"],
       surface="engine", requires=["engine.sockets"], timeout=PEER_TIMEOUT)
def _hwm_options(engine: EngineSurface, ctx: CheckContext) -> None:
    """After the handshake the engine's DEALERs and PUSHes have high-water marks of 0.

    Read with getsockopt: an engine's high-water marks block, never drop, so nothing outside
    it can see them."""
    front = _frontend(ctx)
    peer = _launch(engine, ctx, front)
    _handshake(front, ctx)
    check_high_water_marks(list(engine.zmq_sockets(peer)), "engine")  # type: ignore[attr-defined]
