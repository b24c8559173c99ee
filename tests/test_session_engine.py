"""The engine's session: handshake, ready responses, requests, utility replies, the sentinel."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from enginewire.reference.errors import FramingError, HandshakeError, PayloadError, StateError
from enginewire.reference.session import Action, EngineSession

ADDRESSES = {"inputs": ["ipc:///tmp/a"], "outputs": ["ipc:///tmp/b"]}
INIT = {"addresses": ADDRESSES, "parallel_config": {}}


def serving(rank: int = 0) -> EngineSession:
    session = EngineSession(rank)
    session.start()
    session.receive_init(INIT)
    session.send_ready_response()
    session.send_ready()
    return session


def request(request_id: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id)


def test_full_handshake() -> None:
    session = EngineSession(2, local=False, headless=True)
    assert session.start() == [
        Action("send_hello", 2, {"status": "HELLO", "local": False, "headless": True})
    ]
    assert session.state == "HELLO_SENT"
    assert session.receive_init(INIT) == [Action("connect_channels", 2, ADDRESSES)]
    assert session.send_ready_response() == [Action("send_ready_response", 2, 1)]
    assert session.send_ready({"parallel_config_hash": "h"}) == [
        Action(
            "send_ready", 2,
            {"status": "READY", "local": False, "headless": True, "parallel_config_hash": "h"},
        )
    ]
    assert session.state == "SERVING"


def test_ready_response_on_every_input() -> None:
    session = EngineSession(0)
    session.start()
    session.receive_init({
        "addresses": {"inputs": ["tcp://h:1", "tcp://h:2"], "outputs": ["tcp://h:3", "tcp://h:4"]},
        "parallel_config": {},
    })
    assert session.send_ready_response() == [Action("send_ready_response", 0, 2)]


def test_init_before_hello_and_twice() -> None:
    session = EngineSession(0)
    with pytest.raises(HandshakeError) as caught:
        session.receive_init(INIT)
    assert caught.value.clause == "handshake.engine.unexpected-event"
    session.start()
    session.receive_init(INIT)
    with pytest.raises(HandshakeError):
        session.receive_init(INIT)
    with pytest.raises(HandshakeError):
        session.start()


@pytest.mark.parametrize(
    "addresses",
    [
        {"inputs": [], "outputs": []},
        {"inputs": ["a"], "outputs": ["b", "c"]},
        {"inputs": "a", "outputs": "b"},
        {"inputs": [1], "outputs": [2]},
        None,
    ],
)
def test_bad_addresses(addresses) -> None:
    session = EngineSession(0)
    session.start()
    with pytest.raises(HandshakeError) as caught:
        session.receive_init({"addresses": addresses, "parallel_config": {}})
    assert caught.value.clause == "handshake.init-addresses"
    assert session.state == "HELLO_SENT"


def test_parallel_config_must_be_a_map() -> None:
    session = EngineSession(0)
    session.start()
    with pytest.raises(HandshakeError) as caught:
        session.receive_init({"addresses": ADDRESSES, "parallel_config": [1]})
    assert caught.value.clause == "handshake.init-parallel-config"


def test_ready_keys_checked() -> None:
    session = EngineSession(0)
    session.start()
    session.receive_init(INIT)
    with pytest.raises(HandshakeError) as caught:
        session.send_ready()
    assert caught.value.clause == "handshake.engine.unexpected-event", "READY before responses"
    session.send_ready_response()
    with pytest.raises(HandshakeError) as caught:
        session.send_ready({"favourite_colour": "blue"})
    assert caught.value.clause == "handshake.ready-optional-keys"
    with pytest.raises(HandshakeError) as caught:
        session.send_ready({"coord_store_port": "x"})
    assert caught.value.clause == "handshake.ready-optional-keys"
    assert session.state == "READY_RESPONSE_SENT"


def test_without_handshake() -> None:
    session = EngineSession(1, handshake=False)
    with pytest.raises(HandshakeError):
        session.start()
    assert session.use_addresses(ADDRESSES) == [Action("connect_channels", 1, ADDRESSES)]
    session.send_ready_response()
    with pytest.raises(HandshakeError):
        session.send_ready()
    assert session.begin_serving() == []
    assert session.state == "SERVING"


def test_requests_need_ready_response_first() -> None:
    session = EngineSession(0)
    session.start()
    session.receive_init(INIT)
    with pytest.raises(HandshakeError) as caught:
        session.receive_request(b"\x00", request("r"))
    assert caught.value.clause == "handshake.engine.unexpected-event"
    session.send_ready_response()
    # Requests may arrive before READY went out.
    assert session.receive_request(b"\x00", request("r")) == [
        Action("accept_request", 0, request("r"))
    ]


@pytest.mark.parametrize(
    ("frame", "clause"),
    [
        (b"\x07", "request_types.unknown-byte-rejected"),
        (b"\xff", "request_types.unknown-byte-rejected"),
        (b"\x04", "request_types.sentinels-never-on-wire"),
        (b"\x05", "request_types.sentinels-never-on-wire"),
        (b"", "request_types.one-byte-frame"),
        (b"\x00\x00", "request_types.one-byte-frame"),
    ],
)
def test_bad_type_frames(frame: bytes, clause: str) -> None:
    session = serving()
    with pytest.raises(FramingError) as caught:
        session.receive_request(frame, request("r"))
    assert caught.value.clause == clause
    # The engine keeps serving.
    session.receive_request(b"\x00", request("r"))


def test_add_and_abort_tracking() -> None:
    session = serving()
    session.receive_request(b"\x00", request("a"))
    session.receive_request(0, {"request_id": "b"})
    assert session.requests == {"a", "b"}
    assert session.receive_request(b"\x01", ["a", "zzz"]) == [Action("abort_requests", 0, ["a"])]
    session.send_outputs(finished=["b"])
    assert session.requests == set()


@pytest.mark.parametrize(
    ("frame", "payload", "clause"),
    [
        (b"\x00", {"prompt": "no id"}, "structs.array.missing-required-rejected"),
        (b"\x01", "abc", "frames.abort-payload"),
        (b"\x01", [1, 2], "frames.abort-payload"),
        (b"\x03", (0, 1, "echo"), "frames.utility-payload"),
        (b"\x03", (0, "1", "echo", ()), "frames.utility-payload"),
        (b"\x03", (0, 1, 5, ()), "frames.utility-payload"),
        (b"\x02", (1,), "frames.start-dp-wave-payload"),
        (b"\x02", ("a", 0), "frames.start-dp-wave-payload"),
    ],
)
def test_bad_payloads(frame: bytes, payload, clause: str) -> None:
    session = serving()
    with pytest.raises(PayloadError) as caught:
        session.receive_request(frame, payload)
    assert caught.value.clause == clause


def test_utility_calls_and_replies() -> None:
    session = serving()
    call = (0, 17, "echo", (1, 2))
    assert session.receive_request(b"\x03", list(call)) == [Action("accept_call", 0, call)]
    with pytest.raises(StateError) as caught:
        session.receive_request(b"\x03", call)
    assert caught.value.clause == "frames.utility-call-id"
    with pytest.raises(StateError) as caught:
        session.send_utility_reply(0, 18)
    assert caught.value.clause == "frames.utility-reply"
    session.send_utility_reply(0, 17)
    with pytest.raises(StateError) as caught:
        session.send_utility_reply(0, 17)
    assert caught.value.clause == "frames.utility-reply"


def test_start_dp_wave_accepted() -> None:
    session = serving()
    assert session.receive_request(b"\x02", (3, 1)) == []
    assert session.state == "SERVING"


def test_dead_is_final() -> None:
    session = serving()
    session.receive_request(b"\x03", (0, 1, "die", ()))
    assert session.send_dead() == [Action("send_dead", 0)]
    assert session.state == "DEAD" and session.pending_calls == set()
    for after in (
        lambda: session.receive_request(b"\x00", request("r")),
        lambda: session.send_outputs(),
        lambda: session.send_utility_reply(0, 1),
        session.send_dead,
    ):
        with pytest.raises(StateError) as caught:
            after()
        assert caught.value.clause == "handshake.engine.unexpected-event"
        assert not isinstance(caught.value, HandshakeError)


def test_outputs_only_while_serving() -> None:
    session = EngineSession(0)
    session.start()
    session.receive_init(INIT)
    session.send_ready_response()
    with pytest.raises(StateError):
        session.send_outputs()
    session.send_ready()
    session.send_outputs()


def test_the_engine_session_speaks_its_release_handshake_keys() -> None:
    """0.9.1: HELLO {status, local}; READY requires num_gpu_blocks and has no headless."""
    from enginewire.spec import load

    session = EngineSession(0, local=True, headless=False, spec=load("0.9.1"))
    [hello] = session.start()
    assert hello.data == {"status": "HELLO", "local": True}
    session.receive_init({"addresses": {"inputs": ["ipc://i"], "outputs": ["ipc://o"]},
                          "parallel_config": {}})
    session.send_ready_response()
    with pytest.raises(HandshakeError, match="requires the keys"):
        session.send_ready()
    [ready] = session.send_ready({"num_gpu_blocks": 8})
    assert ready.data == {"status": "READY", "local": True, "num_gpu_blocks": 8}


def test_a_release_without_the_handshake_sends_no_hello() -> None:
    from enginewire.spec import load

    session = EngineSession(0, spec=load("0.8.5"))
    with pytest.raises(HandshakeError, match="0.8.5 has no HELLO/READY handshake"):
        session.start()
    assert session.state == "START"
