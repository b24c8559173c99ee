"""Front-end checks: the target is the front end, the suite plays its engine cores.

The suite picks three addresses, starts the target's front end on them, connects one
:class:`~enginewire.conformance.peers.zmq_peers.SuiteEngine` per engine rank and follows (or breaks)
the handshake; it then makes the front end send requests through the
:class:`~enginewire.conformance.targets.contract.FrontendClient` and checks every frame that
arrives, and pushes outputs (good, stray, malformed, ENGINE_CORE_DEAD) back.

For a release without the handshake (before 0.9.0) the suite's engines connect to (or bind,
where the release's engine binds) the front end's input and output addresses with the
release's sockets (history/constants.toml ``[[transport]]``) and send the release's ready
message (``b"READY"`` in 0.8.4 and 0.8.5; none before, where readiness went over a process
pipe); the checks of what the release lacks are NOT APPLICABLE with that reason.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec

from enginewire.conformance.checks._helpers import (
    check_high_water_marks,
    note_refusal,
    require_message,
)
from enginewire.conformance.framework.context import CheckContext
from enginewire.conformance.framework.registry import (
    CheckFailure,
    NotInRelease,
    Reproduction,
    check,
)
from enginewire.conformance.oracle.samples import minimal_request
from enginewire.conformance.oracle.values import neutral
from enginewire.conformance.peers.zmq_peers import (
    ENGINE_CORE_DEAD,
    SuiteEngine,
    decode,
    require_conversation,
    require_handshake,
    require_identity,
    require_ready_key,
    require_ready_response,
    type_byte,
)
from enginewire.conformance.targets.contract import FrontendLaunch, FrontendSurface
from enginewire.spec.history.release_facts import (
    STATE_KEYS,
    handshake_gap,
    handshake_message_at,
    handshake_on_input,
    ready_response_at,
    utility_fields,
    utility_payload_at,
)

PEER_TIMEOUT = 25.0
#: Seconds a front end gets to act on a message it received: return the call a reply answers,
#: deliver outputs, fail the calls pending on a dead engine. Generous: a front end that acts
#: at all takes milliseconds.
ACT_S = 3.0


def _on_thread(ctx: Any, client: Any, target: Any, name: str) -> Any:
    """Start ``target`` (a call into ``client``) on a thread that the check's clean-up ends:
    it stops the front end (so the call returns) and joins the thread, before the sockets
    and directories registered earlier go. Returns the started thread."""
    thread = threading.Thread(target=target, daemon=True, name=name)
    thread.start()

    def stop_and_join() -> None:
        client.stop(3.0)
        thread.join(5.0)
        if thread.is_alive():
            raise RuntimeError(f"{name} still ran 5 s after the front end stopped")

    ctx.on_cleanup(stop_and_join)
    return thread


class _Waiter:
    """``client.wait_ready`` on a thread, so the suite's engines can answer meanwhile; the
    check's clean-up stops the front end and joins it (:func:`_on_thread`)."""

    def __init__(self, client: Any, timeout: float, ctx: Any) -> None:
        self.error: BaseException | None = None
        self.thread = _on_thread(ctx, client, lambda: self._run(client, timeout),
                                 "frontend wait_ready")

    def _run(self, client: Any, timeout: float) -> None:
        try:
            client.wait_ready(timeout)
        except BaseException as exc:  # noqa: BLE001 - reported by the check
            self.error = exc
            note_refusal(exc, "the front end's wait_ready")

    def done(self) -> bool:
        return not self.thread.is_alive()

    def refused(self) -> BaseException | None:
        """What wait_ready raised, once it returned by raising; None while it runs or when
        it returned."""
        return self.error if self.done() else None

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise CheckFailure(f"the front end's wait_ready did not return within {timeout:g} s")
        if self.error is not None:
            raise CheckFailure(f"the front end's wait_ready raised "
                               f"{type(self.error).__name__}: {self.error}")


def _start(frontend: Any, ctx: Any, engine_count: int = 1) -> tuple[Any, FrontendLaunch]:
    # Before the front end starts: a release the suite's engines cannot speak leaves no
    # front end waiting on another thread.
    require_conversation(ctx.spec)
    launch = FrontendLaunch(
        handshake_address=ctx.ipc_address("fe-handshake"),
        input_address=ctx.ipc_address("fe-input"),
        output_address=ctx.ipc_address("fe-output"),
        engine_count=engine_count,
    )
    client = frontend.start_frontend(launch)
    ctx.on_cleanup(lambda: client.stop(3.0))
    return client, launch


def _has_handshake(ctx: Any) -> bool:
    """False for a front end that skips the handshake channel (``targets.MODES``), and at a
    release without the handshake."""
    return ctx.target.applies("frontend.handshake") and handshake_gap(ctx.spec.version) is None


def _engine(ctx: Any, launch: FrontendLaunch, rank: int = 0, **options: Any) -> SuiteEngine:
    # Where the release holds the handshake on the input socket (0.9.0), HELLO goes there.
    address = None if not _has_handshake(ctx) else launch.input_address \
        if handshake_on_input(ctx.spec.version) else launch.handshake_address
    engine = SuiteEngine(ctx.spec, str(ctx.tmpdir), address, rank, **options)
    ctx.on_cleanup(engine.close)
    return engine


def _connected(engine: SuiteEngine, launch: FrontendLaunch, ctx: Any) -> None:
    """Bring ``engine`` to the point where only its ready response is missing: HELLO, init,
    connect (and READY, which a front end must not take for ready without the response), or
    with a front end without a handshake channel, connect to its addresses directly."""
    if not _has_handshake(ctx):
        engine.connect_direct(launch.input_address, launch.output_address)
        return
    engine.hello()
    engine.connect(engine.read_init(engine.recv_init(ctx.wait(8.0))))
    engine.ready()


def _running(frontend: Any, ctx: Any, engine_count: int = 1,
             **engine_options: Any) -> tuple[Any, list[SuiteEngine]]:
    """A front end whose start-up with ``engine_count`` suite engines completed (the
    handshake, or for a front end without a handshake channel, the ready responses)."""
    client, launch = _start(frontend, ctx, engine_count)
    waiter = _Waiter(client, ctx.wait(10.0), ctx)
    engines = []
    for rank in range(engine_count):
        engine = _engine(ctx, launch, rank, **engine_options)
        try:
            if _has_handshake(ctx):
                engine.start(ctx.wait(8.0))
            else:
                engine.connect_direct(launch.input_address, launch.output_address)
                engine.send_ready_response()
        except TimeoutError as exc:
            raise CheckFailure(f"engine {rank}: {exc}") from exc
        engines.append(engine)
    waiter.join(ctx.wait(10.0))
    return client, engines


def _no_init(engine: SuiteEngine, what: str, wait: float = 1.0) -> None:
    if engine.handshake_socket.poll(int(wait * 1000)):  # type: ignore[union-attr]
        raise CheckFailure(f"the front end answered {what} with a message",
                           Reproduction(received=engine.handshake_socket.recv_multipart()))  # type: ignore[union-attr]


def _request(engine: SuiteEngine, ctx: Any, what: str) -> list[bytes]:
    try:
        return engine.recv_request(ctx.wait(5.0))
    except TimeoutError as exc:
        raise CheckFailure(f"{what}: nothing arrived at the engine") from exc


# --- handshake -----------------------------------------------------------------------------


@check("frontend/handshake/init-answers-hello", clauses=["handshake.init-answers-hello",
                                                         "handshake.init-addresses",
                                                         "transport.frontend-binds"],
       surface="frontend", requires=["frontend.handshake"], timeout=PEER_TIMEOUT)
def _init(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """HELLO gets one init frame: EngineHandshakeMetadata with one input and one output."""
    require_handshake(ctx.spec)
    client, launch = _start(frontend, ctx)
    waiter = _Waiter(client, ctx.wait(10.0), ctx)
    engine = _engine(ctx, launch)
    engine.hello()
    frames = engine.recv_init(ctx.wait(8.0))
    if len(frames) != 1:
        raise CheckFailure(f"init arrived as {len(frames)} frames at the DEALER, expected 1",
                           Reproduction(received=frames))
    try:
        init = engine.read_init(frames)
    except Exception as exc:  # noqa: BLE001
        raise CheckFailure(f"init is not vLLM {ctx.spec.version}'s init message: {exc}",
                           Reproduction(received=frames)) from exc
    addresses = init["addresses"]
    if len(addresses["inputs"]) != 1 or len(addresses["outputs"]) != 1:
        raise CheckFailure(f"one client must send one input and one output address, got "
                           f"{addresses!r}", Reproduction(received=frames))
    engine.connect(init)
    engine.send_ready_response()
    engine.ready()
    waiter.join(ctx.wait(8.0))


@check("frontend/handshake/parallel-config-empty", clauses=["handshake.init-parallel-config"],
       surface="frontend", requires=["frontend.handshake"], timeout=PEER_TIMEOUT)
def _parallel_config(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """Without coordinated DP, init's parallel_config is an empty map."""
    require_handshake(ctx.spec)
    client, launch = _start(frontend, ctx)
    _Waiter(client, ctx.wait(10.0), ctx)
    engine = _engine(ctx, launch)
    engine.hello()
    init = engine.read_init(engine.recv_init(ctx.wait(8.0)))
    if init["parallel_config"] != {}:
        raise CheckFailure(f"parallel_config is {init['parallel_config']!r}, expected {{}}")


@check("frontend/handshake/waits-for-ready-response",
       clauses=["handshake.ready-response-per-identity", "frames.ready-response-first"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _waits_ready_response(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """The front end is not ready (and sends nothing) until the ready response arrives."""
    require_ready_response(ctx.spec)
    client, launch = _start(frontend, ctx)
    waiter = _Waiter(client, ctx.wait(12.0), ctx)
    engine = _engine(ctx, launch)
    _connected(engine, launch, ctx)
    time.sleep(0.6)
    if waiter.done():
        raise CheckFailure("wait_ready returned before any ready response")
    if engine.inputs[0].poll(0):
        raise CheckFailure("the front end sent on the input channel before the ready response",
                           Reproduction(received=engine.inputs[0].recv_multipart()))
    engine.send_ready_response()
    waiter.join(ctx.wait(8.0))


@check("frontend/handshake/ready-response-empty",
       clauses=["handshake.ready-response-empty-accepted"], surface="frontend",
       timeout=PEER_TIMEOUT)
def _empty_ready_response(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """An empty ready-response frame counts as ready."""
    require_ready_response(ctx.spec)
    if ready_response_at(ctx.spec.version) == "READY":
        raise NotInRelease(f'vLLM {ctx.spec.version}\'s ready message is the literal b"READY" '
                           "and its front end takes no other (history/constants.toml "
                           "[[ready_response]])")
    client, launch = _start(frontend, ctx)
    waiter = _Waiter(client, ctx.wait(10.0), ctx)
    engine = _engine(ctx, launch)
    _connected(engine, launch, ctx)
    engine.send_ready_response(raw=b"")
    waiter.join(ctx.wait(8.0))


@check("frontend/handshake/every-engine-ready",
       clauses=["handshake.ready-response-per-identity"], surface="frontend",
       timeout=PEER_TIMEOUT)
def _every_engine(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """With two engines, the front end is ready only once both sent their ready response."""
    require_ready_response(ctx.spec)
    require_identity(ctx.spec)
    client, launch = _start(frontend, ctx, engine_count=2)
    waiter = _Waiter(client, ctx.wait(12.0), ctx)
    first = _engine(ctx, launch, 0)
    _connected(first, launch, ctx)
    first.send_ready_response()
    second = _engine(ctx, launch, 1)
    _connected(second, launch, ctx)
    time.sleep(0.6)
    if waiter.done():
        raise CheckFailure("wait_ready returned while engine 1 had sent no ready response")
    second.send_ready_response()
    waiter.join(ctx.wait(8.0))


def _rejected_hello(check_id: str, clauses: list[str], what: str, rank: int,
                    send: Any) -> None:
    @check(check_id, clauses=clauses, surface="frontend", timeout=PEER_TIMEOUT,
           requires=["frontend.handshake"],
           description=f"the front end does not answer {what}")
    def _run(frontend: FrontendSurface, ctx: CheckContext) -> None:
        require_handshake(ctx.spec)
        client, launch = _start(frontend, ctx)
        waiter = _Waiter(client, ctx.wait(15.0), ctx)
        engine = _engine(ctx, launch, rank)
        send(engine)
        refused = waiter.refused()
        if isinstance(refused, NotImplementedError):
            raise refused  # no code for it: NOT IMPLEMENTED, whatever the silence says
        _no_init(engine, what)
        _refused_not_deaf(ctx, launch, waiter, engine, what)


def _refused_not_deaf(ctx: Any, launch: FrontendLaunch, waiter: _Waiter, engine: SuiteEngine,
                      what: str) -> None:
    """The evidence that a front end which sent no init after ``what`` refused it, and did not
    just hear nothing: its wait_ready ended with an error other than a timeout (vLLM's
    start-up raises), or it still answers a well-formed HELLO from engine 0 with init.
    Silence both times is no refusal (a front end that never bound its handshake address is
    silent too)."""

    def verdict() -> bool:
        """True once wait_ready ended by refusing; raises when it ended otherwise."""
        if not waiter.done():
            return False
        error = waiter.error
        if error is None:
            raise CheckFailure(f"the front end's wait_ready returned after {what}, though no "
                               f"engine completed the handshake")
        if isinstance(error, NotImplementedError):
            raise error  # the target has no code for it: NOT IMPLEMENTED, never passed
        if isinstance(error, TimeoutError):
            raise CheckFailure(f"the front end's wait_ready timed out ({error}) after {what}: "
                               f"no evidence that it refused {what} rather than heard nothing")
        return True

    if verdict():
        return
    # The bad HELLO's engine goes first: a second connection with its identity (rank 0) would
    # be refused by the ROUTER, not by the front end.
    engine.close()
    control = _engine(ctx, launch, 0)
    control.hello()
    try:
        control.recv_init(ctx.wait(8.0))
    except TimeoutError:
        if not verdict():
            raise CheckFailure(
                f"the front end sent no init after {what}, nor after a well-formed HELLO "
                f"from engine 0, and its wait_ready still runs: no evidence that it refused "
                f"{what} rather than heard nothing") from None


def _remote_hello(engine: SuiteEngine) -> None:
    engine.local, engine.headless = False, True
    engine.hello()


def _hello_lacking_a_key(engine: SuiteEngine) -> None:
    """The release's HELLO without its last required key after status (headless from
    0.10.0, local before)."""
    value = engine.handshake_value("HELLO")
    value.pop("headless" if "headless" in value else "local")
    engine.handshake_socket.send(msgspec.msgpack.encode(value))  # type: ignore[union-attr]


_rejected_hello("frontend/handshake/unknown-rank-ignored", ["identity.known-rank"],
                "a HELLO from rank 5 when it manages only rank 0", 5, lambda e: e.hello())
_rejected_hello("frontend/handshake/local-mismatch", ["handshake.local-must-match"],
                "a HELLO saying local=false from an engine it expects local", 0,
                _remote_hello)
_rejected_hello("frontend/handshake/missing-keys", ["handshake.message-keys"],
                "a HELLO without one of the release's required keys (headless; local "
                "before 0.10.0)", 0, _hello_lacking_a_key)
_rejected_hello("frontend/handshake/ready-before-hello", ["handshake.frontend.unexpected-event"],
                "a READY before any HELLO", 0, lambda e: e.ready())
_rejected_hello("frontend/handshake/unknown-status", ["handshake.frontend.unexpected-event"],
                "a handshake message with status 'HOWDY'", 0,
                lambda e: e.hello(status="HOWDY"))
_rejected_hello("frontend/handshake/two-frame-hello", ["frames.frame-count"],
                "a HELLO sent as two frames", 0,
                lambda e: e.handshake_socket.send_multipart([msgspec.msgpack.encode(
                    e.handshake_value("HELLO")), b"extra"]))
_rejected_hello("frontend/handshake/garbage-hello", ["handshake.message-keys",
                                                     "frames.payload-matches-type"],
                "a HELLO that is not msgpack", 0,
                lambda e: e.handshake_socket.send(b"\xc1garbage"))


@check("frontend/handshake/ready-missing-key", clauses=["handshake.message-keys"],
       surface="frontend", requires=["frontend.handshake"], timeout=PEER_TIMEOUT)
def _ready_missing_key(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """A READY without a key the release requires beyond status, local and headless
    (dp_stats_address at 0.9.2-0.19.1, num_gpu_blocks at 0.9.0-0.19.1) does not make the
    front end ready: vLLM reads it with ``msg[key]``."""
    require_conversation(ctx.spec)
    message = handshake_message_at(ctx.spec, "READY")
    reported = [k.name for k in message.keys if k.required and k.name not in STATE_KEYS] \
        if message is not None else []
    if not reported:
        raise NotInRelease(f"vLLM {ctx.spec.version}'s READY requires no key beyond "
                           f"{', '.join(STATE_KEYS)} (history/constants.toml [[handshake]])")
    client, launch = _start(frontend, ctx)
    waiter = _Waiter(client, ctx.wait(5.0), ctx)
    engine = _engine(ctx, launch)
    engine.hello()
    engine.connect(engine.read_init(engine.recv_init(ctx.wait(8.0))))
    engine.send_ready_response()
    ready = engine.handshake_value("READY")
    del ready[reported[-1]]
    engine.handshake_socket.send(msgspec.msgpack.encode(ready))  # type: ignore[union-attr]
    waiter.thread.join(ACT_S / 2)
    if waiter.done() and waiter.error is None:
        raise CheckFailure(f"the front end became ready after a READY without "
                           f"{reported[-1]!r}, which vLLM {ctx.spec.version}'s READY requires",
                           Reproduction(sent=[msgspec.msgpack.encode(ready)]))


@check("frontend/handshake/second-hello", clauses=["handshake.frontend.unexpected-event"],
       surface="frontend", requires=["frontend.handshake"], timeout=PEER_TIMEOUT)
def _second_hello(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """A second HELLO (the engine is already CONNECTED) gets no second init."""
    require_handshake(ctx.spec)
    client, launch = _start(frontend, ctx)
    _Waiter(client, ctx.wait(5.0), ctx)
    engine = _engine(ctx, launch)
    engine.hello()
    engine.recv_init(ctx.wait(8.0))
    engine.hello()
    _no_init(engine, "a second HELLO")


# --- requests --------------------------------------------------------------------------------


@check("frontend/requests/add-frames", clauses=["frames.type-byte-before-payload",
                                                "frames.routed-identity-first",
                                                "request_types.byte-table",
                                                "structs.exclusive-params"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _add_frames(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """add_request arrives as [0x00, EngineCoreRequest] with the request as given."""
    client, (engine,) = _running(frontend, ctx)
    request = minimal_request("req-fe", prompt_token_ids=[5, 6, 7])
    client.add_request(request, 0)
    frames = _request(engine, ctx, "add_request")
    if frames[0] != type_byte(ctx.spec, "add"):
        raise CheckFailure(f"the type frame is {frames[0].hex()}, expected "
                           f"{type_byte(ctx.spec, 'add').hex()}",
                           Reproduction(received=frames))
    value = decode(frames[1:], "EngineCoreRequest", ctx.spec)
    if value["request_id"] != "req-fe" or value["prompt_token_ids"] != [5, 6, 7]:
        raise CheckFailure(f"the engine got {value['request_id']!r} with prompt "
                           f"{value['prompt_token_ids']!r}", Reproduction(received=frames))
    for rule in ctx.spec.constraints("EngineCoreRequest", "exactly-one-of"):
        if sum(value[name] is not None for name in rule.fields) != 1:
            raise CheckFailure(f"an ADD must carry exactly one of {rule.fields} "
                               f"({rule.clause})", Reproduction(received=frames))


@check("frontend/requests/routed-to-engine", clauses=["identity.little-endian-rank",
                                                      "frames.routed-identity-first"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _routed(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """With two engines, a request for engine 1 reaches engine 1 and not engine 0."""
    require_identity(ctx.spec)
    client, engines = _running(frontend, ctx, engine_count=2)
    client.add_request(minimal_request("req-one"), 1)
    frames = _request(engines[1], ctx, "a request for engine 1")
    if decode(frames[1:], "EngineCoreRequest", ctx.spec)["request_id"] != "req-one":
        raise CheckFailure("engine 1 got another request", Reproduction(received=frames))
    if engines[0].inputs[0].poll(300):
        raise CheckFailure("engine 0 got a message meant for engine 1",
                           Reproduction(received=engines[0].inputs[0].recv_multipart()))


@check("frontend/requests/abort-frames", clauses=["frames.abort-payload",
                                                  "request_types.byte-table"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _abort_frames(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """abort arrives as [0x01, [request ids]]."""
    client, (engine,) = _running(frontend, ctx)
    client.add_request(minimal_request("req-x"), 0)
    _request(engine, ctx, "add_request")
    client.abort(["req-x"], 0)
    frames = _request(engine, ctx, "abort")
    if (frames[0] != type_byte(ctx.spec, "abort") or len(frames) != 2
            or msgspec.msgpack.decode(frames[1]) != ["req-x"]):
        raise CheckFailure("expected [01, ['req-x']]", Reproduction(received=frames))


@check("frontend/requests/no-empty-abort", clauses=["frames.abort-not-empty"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _empty_abort(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """An abort of no request ids sends nothing."""
    client, (engine,) = _running(frontend, ctx)
    client.abort([], 0)
    if engine.inputs[0].poll(500):
        raise CheckFailure("an empty abort reached the engine",
                           Reproduction(received=engine.inputs[0].recv_multipart()))


def _utility(client: Any, engine: SuiteEngine, ctx: Any, method: str, args: list[Any],
             *, result: Any = None, failure: str | None = None) -> tuple[Any, list[bytes]]:

    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = client.call_utility(method, args, 0, ctx.wait(8.0))
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    caller = _on_thread(ctx, client, call, f"call_utility({method!r})")
    frames = _request(engine, ctx, f"call_utility({method!r})")
    payload = msgspec.msgpack.decode(frames[1]) if len(frames) > 1 else None
    fields = utility_fields(ctx.spec.version, payload)
    if frames[0] != type_byte(ctx.spec, "utility") or fields is None:
        raise CheckFailure(f"a utility call of vLLM {ctx.spec.version} must be "
                           f"[{type_byte(ctx.spec, 'utility').hex()}, "
                           f"[{', '.join(utility_payload_at(ctx.spec.version))}]] "
                           "(history/constants.toml [[utility_payload]])",
                           Reproduction(received=frames))
    engine.reply(fields["call_id"], result=result, failure=failure)
    caller.join(ctx.wait(ACT_S))
    if caller.is_alive():
        raise CheckFailure(f"call_utility({method!r}) did not return after the reply",
                           Reproduction(received=frames))
    return outcome, frames


def _call_survives(client: Any, engine: SuiteEngine, ctx: Any, after: str,
                   sent: list[bytes]) -> None:
    """A utility call must succeed after ``after`` (the frames ``sent``); one call may first
    fail reporting the bad message (a front end may raise the violation from the next call),
    the one after may not."""
    errors = []
    for attempt in range(2):
        try:
            outcome, _ = _utility(client, engine, ctx, "still_there", [], result=attempt)
        except CheckFailure as exc:
            raise CheckFailure(f"after {after}, {exc.message}", Reproduction(
                sent=sent, notes={"then": "call_utility('still_there') and its reply"},
            )) from exc
        if outcome.get("value") == attempt and "error" not in outcome:
            return
        errors.append(outcome.get("error"))
    raise CheckFailure(f"after {after} the front end's calls keep failing: "
                       f"{type(errors[-1]).__name__}: {errors[-1]}", Reproduction(sent=sent))


@check("frontend/utility/call-and-reply", clauses=["frames.utility-payload",
                                                   "frames.utility-call-id",
                                                   "structs.utility-result.pair"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _call(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """call_utility sends [0, call_id, method, args] ([call_id, method, args] up to 0.9.0)
    and returns the reply's result."""
    client, (engine,) = _running(frontend, ctx)
    outcome, frames = _utility(client, engine, ctx, "sum_them", [1, 2], result=42)
    fields = utility_fields(ctx.spec.version, msgspec.msgpack.decode(frames[1]))
    assert fields is not None  # _utility checked the release's items
    call_id, method, args = fields["call_id"], fields["method"], fields["args"]
    if method != "sum_them" or args != [1, 2] or not (
            isinstance(call_id, int) and 0 <= call_id < 2**64):
        raise CheckFailure(f"payload is {msgspec.msgpack.decode(frames[1])!r}",
                           Reproduction(received=frames))
    if outcome.get("value") != 42:
        raise CheckFailure(f"call_utility returned {outcome!r}, expected 42")


@check("frontend/utility/failure-raises",
       clauses=["handshake.session.unknown-method-fails-call"], surface="frontend",
       timeout=PEER_TIMEOUT)
def _failure(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """A reply with a failure_message makes call_utility raise."""
    client, (engine,) = _running(frontend, ctx)
    outcome, _ = _utility(client, engine, ctx, "nope", [], failure="Call to nope method failed")
    if "error" not in outcome:
        raise CheckFailure(f"call_utility returned {outcome.get('value')!r} for a failed call")


@check("frontend/utility/stray-reply", clauses=["handshake.session.reply-known-call-id"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _stray(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """A reply to no pending call does not resolve a later call, nor break the front end."""
    client, (engine,) = _running(frontend, ctx)
    sent = engine.reply(987654321, result="stray")
    time.sleep(0.2)
    _call_survives(client, engine, ctx, "a reply to a call that was never made", sent)


# --- outputs ---------------------------------------------------------------------------------


@check("frontend/outputs/delivered", clauses=["frames.outputs-payload"], surface="frontend",
       timeout=PEER_TIMEOUT)
def _delivered(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """Outputs pushed for a request come back from next_outputs."""
    client, (engine,) = _running(frontend, ctx)
    client.add_request(minimal_request("req-out"), 0)
    _request(engine, ctx, "add_request")
    engine.push({"outputs": [{"request_id": "req-out", "new_token_ids": [11, 12],
                              "finish_reason": 1}]})
    got = neutral(client.next_outputs(ctx.wait(5.0)))
    outputs = got.get("outputs") or []
    if not outputs or outputs[0]["request_id"] != "req-out" or \
            outputs[0]["new_token_ids"] != [11, 12]:
        raise CheckFailure(f"next_outputs gave {got!r}"[:300])


@check("frontend/outputs/unknown-request-ignored",
       clauses=["handshake.session.outputs-for-unknown-requests-ignored"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _unknown_request(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """Outputs for a request the front end never sent do not break it: later outputs for a
    real request still come through."""
    client, (engine,) = _running(frontend, ctx)
    engine.push({"outputs": [{"request_id": "never-sent", "new_token_ids": [1],
                              "finish_reason": 2}]})
    client.add_request(minimal_request("req-real"), 0)
    _request(engine, ctx, "add_request")
    engine.push({"outputs": [{"request_id": "req-real", "new_token_ids": [9],
                              "finish_reason": 1}]})
    deadline = time.monotonic() + ctx.wait(5.0)
    while time.monotonic() < deadline:
        got = neutral(client.next_outputs(deadline - time.monotonic()))
        ids = [o["request_id"] for o in got.get("outputs") or []]
        if "req-real" in ids:
            return
    raise CheckFailure("the outputs for req-real never came through")


@check("frontend/outputs/garbage-survived", clauses=["frames.payload-matches-type"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _garbage_output(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """A malformed output message does not stop later outputs from being delivered."""
    client, (engine,) = _running(frontend, ctx)
    client.add_request(minimal_request("req-g"), 0)
    _request(engine, ctx, "add_request")
    sent = engine.push_raw([b"\xc1 not msgpack"])
    sent += engine.push({"outputs": [{"request_id": "req-g", "new_token_ids": [3],
                                      "finish_reason": 1}]})
    deadline = time.monotonic() + ctx.wait(ACT_S)
    while time.monotonic() < deadline:
        try:
            got = neutral(client.next_outputs(deadline - time.monotonic()))
        except TimeoutError:
            break
        except Exception:  # noqa: BLE001 - reporting the bad message is allowed
            continue
        if any(o["request_id"] == "req-g" for o in got.get("outputs") or []):
            return
    raise CheckFailure("after a malformed output message, the next outputs never came",
                       Reproduction(sent=sent, notes={"frames": "a malformed message, then an "
                                                      "EngineCoreOutputs for req-g"}))


@check("frontend/outputs/dead-near-miss", clauses=["frames.engine-core-dead-literal"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _near_miss(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """'ENGINE_CORE_DEAD' plus a second frame is not the sentinel: the engine is not dead.

    Reading it may fail as a malformed message (see frontend/outputs/garbage-survived), but
    the front end's next request still reaches the engine. NOT APPLICABLE before the
    release had the sentinel (:func:`require_message`)."""
    require_message(ctx.spec, "engine_core_dead")
    client, (engine,) = _running(frontend, ctx)
    sent = engine.push_raw([ENGINE_CORE_DEAD, b""])
    try:
        client.next_outputs(ctx.wait(1.0))
    except ConnectionError as exc:
        raise CheckFailure("a two-frame near-miss of ENGINE_CORE_DEAD made the front end "
                           f"report the engine dead: {exc}", Reproduction(sent=sent)) from exc
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - a timeout or a rejection of the malformed message
        pass
    try:
        client.add_request(minimal_request("req-after-near-miss"), 0)
    except ConnectionError as exc:
        raise CheckFailure("after a two-frame near-miss of ENGINE_CORE_DEAD the front end "
                           f"refused to send: {exc}", Reproduction(sent=sent)) from exc
    frames = _request(engine, ctx, "a request after a near-miss of ENGINE_CORE_DEAD")
    if decode(frames[1:], "EngineCoreRequest", ctx.spec)["request_id"] != "req-after-near-miss":
        raise CheckFailure("the engine got another request", Reproduction(received=frames))


@check("frontend/outputs/dead-fails-pending-call", clauses=["frames.engine-core-dead-fatal"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _dead_fails_call(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """A utility call waiting when ENGINE_CORE_DEAD arrives fails at once.

    It must not be left waiting for a reply that cannot come. NOT APPLICABLE before the
    release had the sentinel (:func:`require_message`)."""
    require_message(ctx.spec, "engine_core_dead")
    client, (engine,) = _running(frontend, ctx)
    outcome: dict[str, Any] = {}
    call_timeout = ctx.wait(15.0)

    def call() -> None:
        try:
            outcome["value"] = client.call_utility("never_answered", [], 0, call_timeout)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    caller = _on_thread(ctx, client, call, "pending utility call")
    _request(engine, ctx, "call_utility('never_answered')")
    sent = engine.push_raw([ENGINE_CORE_DEAD])
    caller.join(ctx.wait(ACT_S))
    if caller.is_alive():
        raise CheckFailure("a utility call waiting when ENGINE_CORE_DEAD came was still "
                           f"waiting {ACT_S:g} s later", Reproduction(sent=sent, notes={
                               "before": "call_utility('never_answered'), no reply"}))
    if "error" not in outcome:
        raise CheckFailure(f"the pending call returned {outcome.get('value')!r} after "
                           "ENGINE_CORE_DEAD", Reproduction(sent=sent))


@check("frontend/outputs/engine-core-dead", clauses=["frames.engine-core-dead-fatal",
                                                     "handshake.session.dead-is-final"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _dead(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """ENGINE_CORE_DEAD fails waiting reads with a ConnectionError, later sends fail, and
    nothing more reaches the engine. NOT APPLICABLE before the release had the sentinel
    (:func:`require_message`)."""
    require_message(ctx.spec, "engine_core_dead")
    client, (engine,) = _running(frontend, ctx)
    client.add_request(minimal_request("req-d"), 0)
    _request(engine, ctx, "add_request")
    engine.push_raw([ENGINE_CORE_DEAD])
    try:
        client.next_outputs(ctx.wait(5.0))
    except ConnectionError:
        pass
    except TimeoutError as exc:
        raise CheckFailure("next_outputs timed out instead of reporting the dead engine") \
            from exc
    else:
        raise CheckFailure("next_outputs returned outputs after ENGINE_CORE_DEAD")
    try:
        client.add_request(minimal_request("req-after-death"), 0)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - failing the send is right
        pass
    if engine.inputs[0].poll(500):
        raise CheckFailure("the front end sent to a dead engine",
                           Reproduction(received=engine.inputs[0].recv_multipart()))


@check("frontend/requests/type-bytes-only-from-table",
       clauses=["request_types.sentinels-never-on-wire", "frames.start-dp-wave-from-coordinator",
                "request_types.one-byte-frame"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _type_bytes(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """Across add, abort and utility, the front end sends only their type bytes at the run's
    release (00, 01 and 03; UTILITY is 02 up to vLLM 0.8.2)."""
    client, (engine,) = _running(frontend, ctx)
    client.add_request(minimal_request("req-t"), 0)
    client.abort(["req-t"], 0)
    seen = [_request(engine, ctx, "add_request")[0], _request(engine, ctx, "abort")[0]]
    _, frames = _utility(client, engine, ctx, "m", [], result=1)
    seen.append(frames[0])
    while engine.inputs[0].poll(300):
        seen.append(engine.inputs[0].recv_multipart()[0])
    sent = [type_byte(ctx.spec, kind) for kind in ("add", "abort", "utility")]
    if seen[:3] != sent or any(t not in sent for t in seen):
        raise CheckFailure(f"type frames seen: {[t.hex() for t in seen]}, expected "
                           f"{' '.join(t.hex() for t in sent)}")


# --- transport ---------------------------------------------------------------------------------

#: More messages than ZMQ's default high-water mark (1000) lets a ROUTER queue for one peer.
HWM_BURST = 3000


@check("frontend/transport/no-drop-at-high-water-mark", clauses=["transport.hwm-zero"],
       surface="frontend", timeout=60.0)
def _no_drop(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """3000 aborts sent while the engine does not read all arrive once it reads.

    The suite's engine receives with a high-water mark of 1, so what it does not read piles up
    at the front end's input ROUTER; a ROUTER with ZMQ's default SNDHWM (1000) silently drops
    what does not fit, one with SNDHWM 0 queues it all.
    """
    client, (engine,) = _running(frontend, ctx, input_rcvhwm=1)
    sent = [f"hwm-{index}" for index in range(HWM_BURST)]
    for request_id in sent:
        client.abort([request_id], 0)
    time.sleep(0.5)
    seen: list[str] = []
    while engine.inputs[0].poll(int(ctx.wait(1.0) * 1000)):
        frames = engine.inputs[0].recv_multipart()
        if frames[0] == type_byte(ctx.spec, "abort"):
            seen.extend(msgspec.msgpack.decode(frames[1]))
    if seen != sent:
        missing = [r for r in sent if r not in set(seen)]
        raise CheckFailure(
            f"{len(seen)} of {HWM_BURST} aborts reached the engine, {len(missing)} lost while "
            "the engine was not reading: the input ROUTER has a high-water mark",
            Reproduction(notes={"first lost": missing[:5], "engine RCVHWM": 1}))


@check("frontend/transport/high-water-marks-zero", clauses=["transport.hwm-zero"],
       surface="frontend", requires=["frontend.sockets"], timeout=PEER_TIMEOUT)
def _hwm_options(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """The front end's ROUTERs and PULL have SNDHWM/RCVHWM 0 (read with getsockopt)."""
    client, _ = _running(frontend, ctx)
    check_high_water_marks(list(frontend.zmq_sockets(client)), "front end")  # type: ignore[attr-defined]


@check("frontend/transport/duplicate-identity-ignored",
       clauses=["transport.identity-reuse-needs-old-connection-gone",
                "transport.router-handover-elastic-only"],
       surface="frontend", timeout=PEER_TIMEOUT)
def _duplicate_identity(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """A second connection with engine 0's identity neither takes its requests nor is heard.

    Without ROUTER_HANDOVER (a front end without elastic EP must not set it) the input ROUTER
    keeps the identity bound to the first connection: the requests for engine 0 still reach
    the engine that made it, and nothing reaches the newcomer.
    """
    import zmq

    require_identity(ctx.spec)
    client, (engine,) = _running(frontend, ctx)
    launch_input = engine.inputs[0].getsockopt_string(zmq.LAST_ENDPOINT)
    newcomer = engine.net.socket(zmq.DEALER, engine.identity)
    newcomer.connect(launch_input)
    newcomer.send(b"")
    time.sleep(0.3)
    client.add_request(minimal_request("req-dup"), 0)
    if newcomer.poll(int(ctx.wait(1.0) * 1000)):
        raise CheckFailure("a request for engine 0 went to a second connection that reused "
                           "its identity (the input ROUTER hands identities over)",
                           Reproduction(received=newcomer.recv_multipart()))
    frames = _request(engine, ctx, "a request for engine 0 after a duplicate connected")
    if decode(frames[1:], "EngineCoreRequest", ctx.spec)["request_id"] != "req-dup":
        raise CheckFailure("engine 0 got another request", Reproduction(received=frames))


# --- coordinated data parallelism ----------------------------------------------------------


def _coordinated(frontend: Any, ctx: Any, config_hash: str) -> tuple[_Waiter, SuiteEngine]:
    """A coordinated front end waiting for its start-up, and its engine 0 past HELLO, init
    and the ready response: only READY is missing."""
    launch = FrontendLaunch(
        handshake_address=ctx.ipc_address("fe-handshake"),
        input_address=ctx.ipc_address("fe-input"),
        output_address=ctx.ipc_address("fe-output"),
        engine_count=1, parallel_config_hash=config_hash,
    )
    client = frontend.start_frontend(launch)
    ctx.on_cleanup(lambda: client.stop(3.0))
    waiter = _Waiter(client, ctx.wait(8.0), ctx)
    engine = _engine(ctx, launch, 0)
    engine.hello()
    engine.connect(engine.read_init(engine.recv_init(ctx.wait(6.0))))
    engine.send_ready_response()
    return waiter, engine


@check("frontend/handshake/config-hash-checked", clauses=["handshake.config-hash-match"],
       surface="frontend", requires=["frontend.handshake", "frontend.coordinated"],
       timeout=40.0)
def _config_hash(frontend: FrontendSurface, ctx: CheckContext) -> None:
    """With coordinated DP, only a READY with the front end's parallel_config_hash counts.

    A READY with another hash fails the start-up; the same READY with the front end's hash
    completes it."""
    require_handshake(ctx.spec)
    require_ready_key(ctx.spec, "parallel_config_hash")
    config_hash = "5f0c4e3b2a1d"
    waiter, engine = _coordinated(frontend, ctx, config_hash)
    engine.ready(parallel_config_hash="0" * 12)
    waiter.thread.join(ctx.wait(6.0))
    if not waiter.thread.is_alive() and waiter.error is None:
        raise CheckFailure("the front end completed its start-up after a READY whose "
                           "parallel_config_hash differs from its own",
                           Reproduction(notes={"front end's hash": config_hash,
                                               "READY's hash": "0" * 12}))
    waiter, engine = _coordinated(frontend, ctx, config_hash)
    engine.ready(parallel_config_hash=config_hash)
    waiter.join(ctx.wait(8.0))
