"""The peers' express paths against the general path they stand for.

``FrontendConnection.receive_outputs_express`` and ``EngineConnection.receive_add_express``
take the message each side reads on every step in one call; they must return exactly what
``receive`` returns for it and leave the session exactly as ``receive`` does, and for every other
message return None having recorded nothing, so that ``receive`` of the same frames gives the
general path's events or error. Each case here runs on two connections prepared alike: one
takes every message through ``receive``, the other tries the express path first; their events
or errors and their sessions afterwards must be the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enginewire.fuzz.mutations import malformed
from enginewire.fuzz.strategies import messages, same_value
from enginewire.reference import structs
from enginewire.reference.codec import default_codec, encode
from enginewire.reference.connection import (
    EngineConnection,
    Event,
    FrontendConnection,
    OutputsReceived,
    RequestAdded,
)
from enginewire.reference.engine import EngineOptions, ReferenceEngine, generation_request
from enginewire.reference.errors import ProtocolError
from enginewire.reference.frontend import ReferenceFrontend

ADDRESSES = structs.EngineZmqAddresses(inputs=["ipc:///tmp/in"], outputs=["ipc:///tmp/out"])
MANAGED = (0, 1)  # engine 1 never becomes ready: outputs from it are out of order

Outcome = tuple[str, Any]


def _frames(kind: str, value: Any) -> list[Any]:
    """A message's frames as a socket delivers them (the first ones as bytes)."""
    return [bytes(memoryview(frame).cast("B")) for frame in encode(kind, value)]


def _outcome(events: list[Event]) -> Outcome:
    return ("events", [(type(event).__name__, astuple(event)) for event in events])


def _error(error: ProtocolError) -> Outcome:
    return ("error", (type(error).__name__, error.clause))


def _same(left: Outcome, right: Outcome) -> bool:
    return left[0] == right[0] and (left[1] == right[1] if left[0] == "error"
                                    else same_value(left[1], right[1]))


# --- front end ------------------------------------------------------------------------------


def _front(tracked: list[str], pending_call: bool, dead: bool) -> FrontendConnection:
    front = FrontendConnection(MANAGED, handshake=False)
    front.ready_without_message(0)
    for request_id in tracked:
        front.session.send_add(0, request_id)
    if pending_call:
        front.session.send_utility(0, front.free_call_id())
    if dead:
        front.receive("output", [b"ENGINE_CORE_DEAD"])
    return front


def _front_state(front: FrontendConnection) -> Any:
    session = front.session
    return (session.dead, dict(session.pending_calls),
            {rank: (link.state, sorted(link.requests)) for rank, link in session.engines.items()})


def _receives(connection: Any, channel: str, frames: list[Any],
              express: Callable[[list[Any]], Any] | None = None,
              event_of: Callable[[Any], Event] | None = None) -> tuple[Outcome, bool]:
    """What ``connection`` made of ``frames`` (through ``express`` first, its value wrapped in
    the event ``receive`` returns, where given) and whether the express path took them."""
    try:
        if express is not None and event_of is not None:
            value = express(frames)
            if value is not None:
                return _outcome([event_of(value)]), True
        return _outcome(connection.receive(channel, frames)), False
    except ProtocolError as error:
        return _error(error), False


def _compare(make: Callable[[], Any], state_of: Callable[[Any], Any], channel: str,
             express: str, event_of: Callable[[Any], Event], frames: list[Any]) -> bool:
    """Two connections made alike, one through ``receive`` only, the other through its method
    ``express`` first: the same events or error and the same session afterwards. Returns
    whether the express path took the message."""
    general, fast = make(), make()
    expected, _ = _receives(general, channel, frames)
    got, taken = _receives(fast, channel, frames, getattr(fast, express), event_of)
    assert _same(got, expected), (got, expected)
    assert state_of(fast) == state_of(general)
    return taken


@st.composite
def _output_messages(draw: st.DrawFn) -> tuple[list[Any], list[str]]:
    """Frames for the output channel and the request ids to track before they come: most
    are request outputs from an engine (one that is ready, one that is not, one that is not
    managed), some utility replies, the dead sentinel, and near-valid messages that break one
    rule."""
    codec = default_codec()
    choice = draw(st.sampled_from(["outputs", "outputs", "outputs", "utility", "dead",
                                   "malformed"]))
    if choice == "malformed":
        return list(draw(malformed("outputs", codec=codec)).frames), []
    if choice == "dead":
        return [b"ENGINE_CORE_DEAD"], []
    if choice == "utility":
        reply = draw(messages("utility_reply", codec=codec))
        return _frames("utility_reply", reply), []
    value = draw(messages("outputs", codec=codec))
    value.engine_index = draw(st.sampled_from([0, 0, 0, 1, 7]))
    ids = [output.request_id for output in value.outputs or ()]
    ids += list(value.finished_requests or ())
    tracked = draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    return _frames("outputs", value), [*tracked, "still-running"]


def _check_frontend(frames: list[Any], tracked: list[str], pending_call: bool, dead: bool
                    ) -> bool:
    """Both paths alike on one output message; returns whether the express path took it."""
    return _compare(lambda: _front(tracked, pending_call, dead), _front_state, "output",
                    "receive_outputs_express",
                    lambda outputs: OutputsReceived(outputs.engine_index, outputs), frames)


def _finishing_step(engine_index: int = 0) -> Any:
    return structs.EngineCoreOutputs(engine_index=engine_index, outputs=[
        structs.EngineCoreOutput(request_id="a", new_token_ids=[1]),
        structs.EngineCoreOutput(request_id="b", new_token_ids=[2],
                                 finish_reason=structs.FinishReason.LENGTH)],
        finished_requests=["c"])


def _utility_reply(call_id: int) -> Any:
    return structs.EngineCoreOutputs(engine_index=0, utility_output=structs.UtilityOutput(
        call_id=call_id, failure_message=None, result=structs.UtilityResult(None, 1)))


#: (frames, tracked, pending call, dead): the cases every run compares, whatever the draws.
FRONTEND_CASES = [
    (_frames("outputs", _finishing_step()), ["a", "b", "c", "d"], False, False),
    (_frames("outputs", _finishing_step(engine_index=1)), ["a", "b"], False, False),
    (_frames("outputs", _finishing_step(engine_index=9)), ["a", "b"], False, False),
    (_frames("outputs", _finishing_step()), ["a", "b"], False, True),
    (_frames("utility_reply", _utility_reply(1)), ["a"], True, False),
    (_frames("utility_reply", _utility_reply(1)), ["a"], False, False),
    ([b"ENGINE_CORE_DEAD"], ["a"], True, False),
    ([b"\x93\x00"], [], False, False),
]


def test_frontend_express_is_the_general_path_on_each_kind_of_message() -> None:
    taken = [_check_frontend(*case) for case in FRONTEND_CASES]
    assert taken == [True] + [False] * (len(FRONTEND_CASES) - 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=_output_messages(), pending_call=st.booleans(),
       dead=st.sampled_from([False, False, False, True]))
def test_frontend_express_is_the_general_path(
    message: tuple[list[Any], list[str]], pending_call: bool, dead: bool
) -> None:
    _check_frontend(message[0], message[1], pending_call, dead)


def test_frontend_express_takes_request_outputs() -> None:
    """The express path takes the step's message (else the test above compares nothing)."""
    front = _front(["a", "b"], pending_call=True, dead=False)
    step = structs.EngineCoreOutputs(engine_index=0, outputs=[
        structs.EngineCoreOutput(request_id="a", new_token_ids=[1]),
        structs.EngineCoreOutput(request_id="b", new_token_ids=[2],
                                 finish_reason=structs.FinishReason.LENGTH)])
    got = front.receive_outputs_express(_frames("outputs", step))
    assert got is not None and got.outputs[1].new_token_ids == [2]
    assert front.session.engines[0].requests == {"a"}
    # Not taken: a frame that is not bytes, the other frame kinds, an engine not ready.
    assert front.receive_outputs_express([memoryview(_frames("outputs", step)[0])]) is None
    assert front.receive_outputs_express([b"ENGINE_CORE_DEAD"]) is None
    step.engine_index = 1
    assert front.receive_outputs_express(_frames("outputs", step)) is None
    assert front.session.engines[0].requests == {"a"}


# --- engine ---------------------------------------------------------------------------------


def _engine(serving: bool, running: list[str]) -> EngineConnection:
    """An engine serving requests, or one that has not sent its ready response yet."""
    engine = EngineConnection(0, handshake=False)
    engine.use_addresses(ADDRESSES)
    if serving:
        engine.send("ready_response", None)
        engine.begin_serving()
        for request_id in running:
            engine.receive("input", _frames("add", generation_request(request_id)))
    return engine


def _engine_state(engine: EngineConnection) -> Any:
    session = engine.session
    return session.machine.state, sorted(session.requests), sorted(session.pending_calls)


@st.composite
def _input_messages(draw: st.DrawFn) -> list[Any]:
    """Frames for the input channel: mostly ADDs (some of a running request id), the other
    request types, and near-valid ADDs that break one rule."""
    codec = default_codec()
    choice = draw(st.sampled_from(["add", "add", "add", "running", "other", "malformed"]))
    if choice == "malformed":
        return list(draw(malformed("add", codec=codec)).frames)
    if choice == "running":
        return _frames("add", generation_request("running"))
    kind = "add" if choice == "add" else draw(st.sampled_from(
        ["abort", "utility", "start_dp_wave"]))
    return _frames(kind, draw(messages(kind, codec=codec)))


def _check_engine(frames: list[Any], serving: bool) -> bool:
    """Both paths alike on one input message; returns whether the express path took it."""
    return _compare(lambda: _engine(serving, ["running"]), _engine_state, "input",
                    "receive_add_express", RequestAdded, frames)


#: (frames, serving): the cases every run compares, whatever the draws.
ENGINE_CASES = [
    (_frames("add", generation_request("new")), True),
    (_frames("add", generation_request("new")), False),
    (_frames("add", generation_request("running")), True),
    (_frames("abort", ["running", "other"]), True),
    (_frames("utility", (0, 1, "echo", (1,))), True),
    ([b"\x00", b"\x93\x00"], True),
]


def test_engine_express_is_the_general_path_on_each_kind_of_message() -> None:
    taken = [_check_engine(*case) for case in ENGINE_CASES]
    # (An ADD of a running id is the engine's to refuse, not the connection's.)
    assert taken == [True, False, True, False, False, False]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=_input_messages(), serving=st.sampled_from([True, True, True, False]))
def test_engine_express_is_the_general_path(frames: list[Any], serving: bool) -> None:
    _check_engine(frames, serving)


def test_engine_express_takes_adds() -> None:
    """The express path takes an ADD (else the test above compares nothing)."""
    engine = _engine(serving=True, running=[])
    frames = _frames("add", generation_request("r1", [3, 4]))
    request = engine.receive_add_express(frames)
    assert request is not None and request.prompt_token_ids == [3, 4]
    assert engine.session.requests == {"r1"}
    # Not taken: a body that is not bytes, another request type, a message short of its
    # payload, an engine before its ready response.
    assert engine.receive_add_express([frames[0], memoryview(frames[1])]) is None
    assert engine.receive_add_express(_frames("abort", ["r1"])) is None
    assert engine.receive_add_express(_frames("add", generation_request("r2"))[:1]) is None
    idle = _engine(serving=False, running=[])
    assert idle.receive_add_express(frames) is None and idle.session.requests == set()


def test_express_paths_only_for_the_reference_release_and_class() -> None:
    """A codec of another release, and a peer class that reads messages its own way, get
    every message through the general path."""
    older = default_codec(version="0.10.0")
    assert EngineConnection(0, codec=older).receive_add_express(
        _frames("add", generation_request("x"))) is None
    assert FrontendConnection([0], codec=older).receive_outputs_express(
        _frames("outputs", structs.EngineCoreOutputs(engine_index=0))) is None

    options = EngineOptions(input_addresses=["ipc:///tmp/in"],
                            output_addresses=["ipc:///tmp/out"])

    class OwnHandling(ReferenceEngine):
        def _handle(self, frames: list[bytes]) -> None:
            super()._handle(frames)

    plain_engine = ReferenceEngine(options)
    assert plain_engine._express_path() is not None
    assert OwnHandling(options)._express_path() is None
    plain_engine.connection.receive = lambda *args: []  # type: ignore[method-assign]
    assert plain_engine._express_path() is None

    class OwnReading(ReferenceFrontend):
        def _receive(self, frames: list[Any]) -> None:
            super()._receive(frames)

    with ReferenceFrontend(handshake=False) as plain, OwnReading(handshake=False) as own:
        assert plain._express_path() is not None and own._express_path() is None
        plain.connection.receive = lambda *args: []  # type: ignore[method-assign]
        assert plain._express_path() is None


# --- the comparison's power: express paths broken one way each are caught --------------------


def _skips_untracking(tracked: set[str], outputs: Any, read: Any = getattr) -> None:
    """Leaves finished requests tracked."""


def _ignores_rules(self: Any, kind: str) -> Any:
    """Decodes the step's message without the kind's rules (a utility reply passes as
    outputs)."""
    codec_decode = self.decode

    def decode(frames: list[Any]) -> Any:
        try:
            return codec_decode("utility_reply" if kind == "outputs" else kind, frames)
        except ProtocolError:
            return None

    return decode


def test_a_broken_express_path_fails_the_comparison(monkeypatch: Any) -> None:
    import enginewire.reference.connection as connection_module
    from enginewire.reference.codec import Codec

    broken = [
        ("finished requests left tracked", connection_module, "untrack_finished",
         _skips_untracking, test_frontend_express_is_the_general_path_on_each_kind_of_message),
        ("a utility reply taken as request outputs", Codec, "express_decoder", _ignores_rules,
         test_frontend_express_is_the_general_path_on_each_kind_of_message),
        ("an ADD taken before the ready response", EngineConnection, "receive_add_express",
         _adds_in_any_state, test_engine_express_is_the_general_path_on_each_kind_of_message),
    ]
    for what, owner, name, replacement, comparison in broken:
        with monkeypatch.context() as patched:
            patched.setattr(owner, name, replacement)
            try:
                comparison()
            except AssertionError:
                continue
            raise AssertionError(f"{what}: unnoticed by the comparison")


def _adds_in_any_state(self: EngineConnection, frames: list[Any]) -> Any:
    """Takes an ADD whatever the session's state."""
    request = self._decode_add(frames) if self._decode_add is not None else None
    if request is not None:
        self.session.requests.add(request.request_id)
    return request
