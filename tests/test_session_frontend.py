"""The front end's session: handshake, ready responses, requests, utility calls, the sentinel."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from enginewire.reference.codec import encode_identity
from enginewire.reference.errors import EngineDeadError, HandshakeError, StateError
from enginewire.reference.session import Action, FrontendSession

#: Engines are named by rank: the connection decodes their routing identities.
R0, R1 = 0, 1


def hello(local: bool = True, headless: bool = False) -> dict:
    return {"status": "HELLO", "local": local, "headless": headless}


def ready(local: bool = True, headless: bool = False, **extra) -> dict:
    return {"status": "READY", "local": local, "headless": headless, **extra}


def running(ranks=(0,)) -> FrontendSession:
    session = FrontendSession(ranks)
    for rank in ranks:
        session.receive_handshake(rank, hello())
        session.receive_handshake(rank, ready())
        session.receive_ready_response(rank, None)
    return session


def outputs(engine_index=0, outputs=(), finished=None, utility=None):
    return SimpleNamespace(
        engine_index=engine_index, outputs=list(outputs), finished_requests=finished,
        utility_output=utility,
    )


def out(request_id, finish_reason=None):
    return SimpleNamespace(request_id=request_id, finish_reason=finish_reason)


def test_identity_is_two_bytes_little_endian() -> None:
    assert encode_identity(3) == b"\x03\x00"
    assert encode_identity(258) == b"\x02\x01"


def test_full_handshake_two_engines() -> None:
    session = FrontendSession([0, 1])
    assert session.awaiting_handshake() == [0, 1]
    assert session.receive_handshake(R1, hello()) == [Action("send_init", 1, hello())]
    assert session.states() == {0: "NEW", 1: "CONNECTED"}
    assert session.receive_handshake(R1, ready()) == [
        Action("await_ready_response", 1, ready())
    ]
    session.receive_handshake(R0, hello())
    session.receive_handshake(R0, ready())
    assert session.awaiting_ready_response() == [0, 1]
    assert not session.running
    response = {"max_model_len": 64}
    assert session.receive_ready_response(R0, response) == [Action("engine_ready", 0, response)]
    assert not session.running
    session.receive_ready_response(R1, None)
    assert session.running
    assert session.engines[0].ready_response == response


def test_unknown_identity_rejected() -> None:
    session = FrontendSession([0])
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(5, hello())
    assert caught.value.clause == "identity.known-rank"
    assert caught.value.got == 5


@pytest.mark.parametrize(
    "message",
    [
        ["HELLO", True, False],
        {"status": "HELLO", "local": True},
        {"local": True, "headless": False},
        {"status": "HELLO", "local": "yes", "headless": False},
        {"status": 1, "local": True, "headless": False},
    ],
)
def test_malformed_handshake_message(message) -> None:
    session = FrontendSession([0])
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, message)
    assert caught.value.clause == "handshake.message-keys"
    assert session.states() == {0: "NEW"}


def test_unexpected_status_names_state() -> None:
    session = FrontendSession([0])
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, {"status": "BOGUS", "local": True, "headless": False})
    assert caught.value.clause == "handshake.frontend.unexpected-event"
    assert str(caught.value).startswith(
        "[handshake.frontend.unexpected-event] Unexpected BOGUS message for local engine 0 in "
        "NEW state"
    )


@pytest.mark.parametrize(
    ("first", "second", "state"),
    [(hello(), hello(), "CONNECTED"), (None, ready(), "NEW")],
)
def test_out_of_order_handshake(first, second, state) -> None:
    session = FrontendSession([0])
    if first is not None:
        session.receive_handshake(R0, first)
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, second)
    assert caught.value.clause == "handshake.frontend.unexpected-event"
    assert f"in {state} state" in str(caught.value)
    assert session.states() == {0: state}


def test_local_must_match_on_hello_and_ready() -> None:
    session = FrontendSession([0])
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, hello(local=False, headless=True))
    assert caught.value.clause == "handshake.local-must-match"
    session.receive_handshake(R0, hello())
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, ready(local=False, headless=True))
    assert caught.value.clause == "handshake.local-must-match"


@pytest.mark.parametrize("remote_headless", [True, False])
def test_headless_rule_for_remote_engines(remote_headless: bool) -> None:
    session = FrontendSession([0, 1], local={0: True, 1: False}, remote_headless=remote_headless)
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R1, hello(local=False, headless=not remote_headless))
    assert caught.value.clause == "handshake.headless-rule"
    session.receive_handshake(R1, hello(local=False, headless=remote_headless))
    # The rule is for remote engines only: a local one may say either.
    session.receive_handshake(R0, hello(local=True, headless=not remote_headless))
    assert session.states() == {0: "CONNECTED", 1: "CONNECTED"}


def test_config_hash_checked_on_ready() -> None:
    session = FrontendSession([0], config_hash="abc")
    session.receive_handshake(R0, hello())
    for wrong in ({}, {"parallel_config_hash": "xyz"}):
        with pytest.raises(HandshakeError) as caught:
            session.receive_handshake(R0, ready(**wrong))
        assert caught.value.clause == "handshake.config-hash-match"
    session.receive_handshake(R0, ready(parallel_config_hash="abc"))
    assert session.states() == {0: "READY"}


def test_ready_optional_keys_typed() -> None:
    session = FrontendSession([0])
    session.receive_handshake(R0, hello())
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, ready(coord_store_port="1234"))
    assert caught.value.clause == "handshake.message-keys"
    session.receive_handshake(R0, ready(coord_store_port=1234, num_redundant_experts=0))


def test_ready_response_rules() -> None:
    session = FrontendSession([0])
    with pytest.raises(HandshakeError) as caught:
        session.receive_ready_response(R0, None)
    assert caught.value.clause == "handshake.frontend.unexpected-event"
    session.receive_handshake(R0, hello())
    session.receive_handshake(R0, ready())
    with pytest.raises(HandshakeError) as caught:
        session.receive_ready_response(R1, None)
    assert caught.value.clause == "handshake.ready-response-per-identity"
    session.receive_ready_response(R0, None)
    with pytest.raises(HandshakeError) as caught:
        session.receive_ready_response(R0, None)
    assert caught.value.clause == "handshake.ready-response-per-identity"


def test_without_handshake_starts_waiting_for_ready_response() -> None:
    session = FrontendSession([0, 1], handshake=False)
    assert session.states() == {0: "READY", 1: "READY"}
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, hello())
    assert caught.value.clause == "handshake.frontend.unexpected-event"
    session.receive_ready_response(R0, None)
    session.receive_ready_response(R1, None)
    assert session.running


def test_no_send_before_ready_response() -> None:
    session = FrontendSession([0])
    session.receive_handshake(R0, hello())
    session.receive_handshake(R0, ready())
    for send in (
        lambda: session.send_add(0, "r"),
        lambda: session.send_abort(0, ["r"]),
        lambda: session.send_utility(0),
    ):
        with pytest.raises(HandshakeError) as caught:
            send()
        assert caught.value.clause == "frames.ready-response-first"
    assert session.states() == {0: "READY"}
    assert session.pending_calls == {}


def test_finished_requests_untracked_from_maps_and_structs() -> None:
    """Finished outputs stop being tracked whatever form the outputs have: the codec's
    structs, maps, or both in one message (the fast path over attributes falls back)."""
    from enginewire.reference import structs

    session = running()
    for request_id in ("s1", "s2", "m1", "m2", "x"):
        session.send_add(0, request_id)
    decoded = structs.EngineCoreOutputs(engine_index=0, outputs=[
        structs.EngineCoreOutput(request_id="s1", new_token_ids=[1]),
        structs.EngineCoreOutput(request_id="s2", new_token_ids=[],
                                 finish_reason=structs.FinishReason.STOP)])
    session.receive_outputs(decoded)
    assert session.engines[0].requests == {"s1", "m1", "m2", "x"}
    mixed = outputs(0, [out("s1", finish_reason=1), {"request_id": "m1"},
                        {"request_id": "m2", "finish_reason": 0}])
    session.receive_outputs(mixed)
    assert session.engines[0].requests == {"m1", "x"}


def test_send_to_unmanaged_engine() -> None:
    session = running()
    with pytest.raises(StateError) as caught:
        session.send_add(4, "r")
    assert caught.value.clause == "handshake.frontend.unexpected-event"


def test_requests_tracked_until_finished_or_aborted() -> None:
    session = running([0, 1])
    for request_id, rank in (("a", 0), ("b", 0), ("c", 1), ("d", 1)):
        session.send_add(rank, request_id)
    assert session.rank_of_request("c") == 1
    batch = outputs(0, [out("a"), out("b", finish_reason=0)])
    assert session.receive_outputs(batch) == [Action("deliver_outputs", 0, batch)]
    assert session.engines[0].requests == {"a"}
    session.receive_outputs(outputs(1, [], finished=["c"]))
    assert session.engines[1].requests == {"d"}
    session.send_abort(1, ["d"])
    assert session.rank_of_request("d") is None
    # Outputs for ids no longer tracked are legal.
    session.receive_outputs(outputs(1, [out("d", finish_reason=2)]))


def test_outputs_from_unmanaged_engine_index() -> None:
    session = running([0])
    with pytest.raises(StateError) as caught:
        session.receive_outputs(outputs(engine_index=7))
    assert caught.value.clause == "handshake.frontend.unexpected-event"


def test_outputs_before_running_rejected() -> None:
    session = FrontendSession([0])
    session.receive_handshake(R0, hello())
    with pytest.raises(HandshakeError) as caught:
        session.receive_outputs(outputs())
    assert caught.value.clause == "handshake.frontend.unexpected-event"


def test_utility_call_ids() -> None:
    session = running([0, 1])
    first, second = session.send_utility(0), session.send_utility(1)
    assert first != second
    assert session.pending_calls == {first: 0, second: 1}
    explicit = session.send_utility(0, call_id=2**64 - 1)
    for bad in (first, -1):
        with pytest.raises(StateError) as caught:
            session.send_utility(0, call_id=bad)
        assert caught.value.clause == "frames.utility-call-id"
    reply = SimpleNamespace(call_id=second, failure_message=None, result=[None, 1])
    assert session.receive_outputs(outputs(1, utility=reply)) == [
        Action("resolve_call", 1, reply)
    ]
    assert session.pending_calls == {first: 0, explicit: 0}


def test_reply_for_unknown_call_id() -> None:
    session = running()
    call_id = session.send_utility(0)
    stray = SimpleNamespace(call_id=call_id + 1, failure_message=None, result=None)
    with pytest.raises(StateError) as caught:
        session.receive_outputs(outputs(utility=stray))
    assert caught.value.clause == "handshake.session.reply-known-call-id"
    assert caught.value.expected == [call_id]
    session.receive_outputs(outputs(utility=SimpleNamespace(call_id=call_id)))
    with pytest.raises(StateError) as caught:
        session.receive_outputs(outputs(utility=SimpleNamespace(call_id=call_id)))
    assert caught.value.clause == "handshake.session.reply-known-call-id"


def test_reserved_call_ids_are_notifications() -> None:
    session = running()
    note = SimpleNamespace(call_id=-1, failure_message=None, result=None)
    assert session.receive_outputs(outputs(utility=note)) == [Action("resolve_call", 0, note)]


def test_engine_dead_fails_pending_calls_and_ends_session() -> None:
    session = running([0, 1])
    call0, call1 = session.send_utility(0), session.send_utility(1)
    session.send_add(0, "a")
    assert session.receive_engine_dead() == [
        Action("fail_pending", 0, [call0]),
        Action("fail_pending", 1, [call1]),
    ]
    assert session.dead and session.states() == {0: "DEAD", 1: "DEAD"}
    assert session.pending_calls == {}
    for after in (
        lambda: session.send_add(0, "b"),
        lambda: session.send_utility(1),
        lambda: session.receive_outputs(outputs()),
        session.receive_engine_dead,
        lambda: session.receive_handshake(R0, hello()),
    ):
        with pytest.raises(EngineDeadError) as caught:
            after()
        assert caught.value.clause == "handshake.session.dead-is-final"
        assert isinstance(caught.value, ConnectionError)


def test_engine_dead_before_any_engine_connected() -> None:
    session = FrontendSession([0])
    with pytest.raises(HandshakeError) as caught:
        session.receive_engine_dead()
    assert caught.value.clause == "handshake.frontend.unexpected-event"
    assert not session.dead


def test_engine_dead_marks_only_engines_that_could_have_sent_it() -> None:
    session = FrontendSession([0, 1])
    session.receive_handshake(R0, hello())
    session.receive_engine_dead()
    assert session.states() == {0: "DEAD", 1: "NEW"}
    assert session.dead


def test_the_front_end_session_requires_its_release_handshake_keys() -> None:
    """0.15.0: READY requires num_gpu_blocks and dp_stats_address; 0.9.1: no headless key
    anywhere (a remote engine's HELLO is judged by local alone)."""
    from enginewire.spec import load

    session = FrontendSession([0], spec=load("0.15.0"))
    session.receive_handshake(R0, hello())
    with pytest.raises(HandshakeError) as caught:
        session.receive_handshake(R0, ready(num_gpu_blocks=8))
    assert caught.value.clause == "handshake.message-keys"
    assert "dp_stats_address" in str(caught.value)
    session.receive_handshake(R0, ready(num_gpu_blocks=8, dp_stats_address=None))

    old = FrontendSession([0], local=False, spec=load("0.9.1"))
    old.receive_handshake(R0, {"status": "HELLO", "local": False})
    with pytest.raises(HandshakeError):
        old.receive_handshake(R0, {"status": "READY", "local": False})
    old.receive_handshake(R0, {"status": "READY", "local": False, "num_gpu_blocks": 8})
