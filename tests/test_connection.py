"""The sans-IO connections, driven purely in memory: one engine, one front end, no sockets."""

from __future__ import annotations

from typing import Any

import pytest

from enginewire.reference import structs
from enginewire.reference.codec import encode
from enginewire.reference.connection import (
    DPWaveStarted,
    EngineConnection,
    EngineDied,
    FrontendConnection,
    HelloReceived,
    InitReceived,
    OutputsReceived,
    ReadyReceived,
    ReadyResponse,
    RequestAdded,
    RequestsAborted,
    UtilityCalled,
    UtilityReplied,
)
from enginewire.reference.engine import generation_request
from enginewire.reference.errors import (
    EngineDeadError,
    FramingError,
    HandshakeError,
    PayloadError,
    StateError,
)

ADDRESSES = structs.EngineZmqAddresses(inputs=["ipc:///tmp/in"], outputs=["ipc:///tmp/out"])
METADATA = structs.EngineHandshakeMetadata(addresses=ADDRESSES, parallel_config={})


def ready_response(rank: int = 0) -> Any:
    return structs.EngineCoreReadyResponse(
        max_model_len=64, num_gpu_blocks=8, block_size=16, dp_stats_address=None,
        dtype="float16", vllm_version="0.33.0", world_size=1, data_parallel_size=1,
        tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
        data_parallel_rank=rank, max_num_seqs=4, max_num_batched_tokens=64,
        instance_id="test", supports_lora=False, max_loras=0,
    )


def routed(engine: EngineConnection, frames: list[Any]) -> list[Any]:
    """What a front end's ROUTER receives from an engine's DEALER: its identity first."""
    return [engine.identity, *frames]


def unrouted(frames: list[Any]) -> list[Any]:
    """What an engine's DEALER receives from the ROUTER: the identity frame is consumed."""
    return frames[1:]


def connected(rank: int = 0) -> tuple[FrontendConnection, EngineConnection]:
    """A front end and an engine that went through the whole handshake."""
    front, engine = FrontendConnection([rank]), EngineConnection(rank)
    [hello] = front.receive("handshake", routed(engine, engine.send("hello")))
    assert hello == HelloReceived(rank, {"status": "HELLO", "local": True, "headless": False})
    init = front.send("init", METADATA, rank=rank)
    assert bytes(init[0]) == rank.to_bytes(2, "little")
    [got_init] = engine.receive("handshake", unrouted(init))
    assert isinstance(got_init, InitReceived)
    assert got_init.addresses.inputs == ADDRESSES.inputs
    response = engine.send("ready_response", ready_response(rank))
    [ready] = front.receive("handshake", routed(engine, engine.send("ready")))
    assert isinstance(ready, ReadyReceived) and ready.message["status"] == "READY"
    [got_response] = front.receive("input", routed(engine, response))
    assert isinstance(got_response, ReadyResponse) and got_response.rank == rank
    assert got_response.response.max_model_len == 64
    assert front.session.states() == {rank: "RUNNING"} and engine.state == "SERVING"
    return front, engine


def outputs(rank: int, *items: Any, finished: list[str] | None = None) -> Any:
    return structs.EngineCoreOutputs(engine_index=rank, outputs=list(items),
                                     finished_requests=finished)


def test_handshake_and_identity() -> None:
    front, engine = connected(3)
    assert engine.identity == b"\x03\x00"
    assert front.identity(3) == b"\x03\x00"
    assert FrontendConnection(range(259)).identity(258) == b"\x02\x01"


def test_add_outputs_and_finish() -> None:
    front, engine = connected()
    request = generation_request("r1", [5, 6], max_tokens=2)
    frames = front.send("add", request, rank=0)
    assert bytes(frames[0]) == b"\x00\x00" and bytes(frames[1]) == b"\x00"
    [added] = engine.receive("input", unrouted(frames))
    assert isinstance(added, RequestAdded) and added.request.request_id == "r1"
    assert front.session.rank_of_request("r1") == 0 and engine.session.requests == {"r1"}

    step = outputs(0, structs.EngineCoreOutput(request_id="r1", new_token_ids=[7]))
    [got] = front.receive("output", engine.send("outputs", step))
    assert isinstance(got, OutputsReceived) and got.outputs.outputs[0].new_token_ids == [7]
    assert front.session.rank_of_request("r1") == 0

    last = outputs(0, structs.EngineCoreOutput(request_id="r1", new_token_ids=[8],
                                               finish_reason=structs.FinishReason.LENGTH),
                   finished=["r1"])
    front.receive("output", engine.send("outputs", last))
    assert front.session.rank_of_request("r1") is None and engine.session.requests == set()


def test_abort_reports_only_ids_in_flight() -> None:
    front, engine = connected()
    engine.receive("input", unrouted(front.send("add", generation_request("a"), rank=0)))
    [aborted] = engine.receive("input", unrouted(front.send("abort", ["a", "zzz"], rank=0)))
    assert aborted == RequestsAborted(["a"])
    assert front.session.rank_of_request("a") is None and engine.session.requests == set()


def test_utility_call_and_reply() -> None:
    front, engine = connected()
    call_id = front.free_call_id()
    frames = front.send("utility", (0, call_id, "echo", (1, "x")), rank=0)
    [called] = engine.receive("input", unrouted(frames))
    assert isinstance(called, UtilityCalled)
    assert (called.client_index, called.call_id, called.method) == (0, call_id, "echo")
    assert list(called.args) == [1, "x"]
    assert front.session.pending_calls == {call_id: 0}
    reply = structs.EngineCoreOutputs(
        engine_index=0,
        utility_output=structs.UtilityOutput(
            call_id=call_id, failure_message=None, result=structs.UtilityResult(None, [1, "x"])
        ),
    )
    [replied] = front.receive("output", engine.send("utility_reply", reply, client_index=0))
    assert isinstance(replied, UtilityReplied) and replied.call_id == call_id
    assert front.session.pending_calls == {} and engine.session.pending_calls == set()
    with pytest.raises(StateError) as caught:  # the call is answered: no second reply
        engine.send("utility_reply", reply, client_index=0)
    assert caught.value.clause == "frames.utility-reply"


def test_start_dp_wave() -> None:
    _, engine = connected()
    assert engine.receive("input", encode("start_dp_wave", (4, 1))) == [DPWaveStarted(4, 1)]


def test_engine_core_dead_is_final() -> None:
    front, engine = connected()
    call_id = front.free_call_id()
    engine.receive("input", unrouted(front.send("utility", (0, call_id, "slow", ()), rank=0)))
    assert front.receive("output", engine.send("engine_core_dead")) == [
        EngineDied({0: [call_id]})
    ]
    assert front.dead and engine.state == "DEAD"
    with pytest.raises(EngineDeadError) as caught:
        front.receive("output", encode("outputs", outputs(0)))
    assert caught.value.clause == "handshake.session.dead-is-final"
    with pytest.raises(EngineDeadError):
        front.send("add", generation_request("late"), rank=0)
    with pytest.raises(StateError):  # nothing after the sentinel on the engine side either
        engine.send("outputs", outputs(0))


# --- errors: the remote side breaks the protocol (receive raises, state unchanged) ---------


@pytest.mark.parametrize(
    ("frames", "error", "clause"),
    [
        ([], FramingError, "frames.frame-count"),
        ([b"\x00"], FramingError, "frames.frame-count"),
        ([b"\x09", b"\x90"], FramingError, "request_types.unknown-byte-rejected"),
        ([b"\x00\x00", b"\x90"], FramingError, "request_types.one-byte-frame"),
        ([b"\x04", b"\x90"], FramingError, "request_types.sentinels-never-on-wire"),
        ([b"\x01", b"\x01"], PayloadError, None),
    ],
)
def test_engine_rejects_and_keeps_serving(frames, error, clause) -> None:
    front, engine = connected()
    with pytest.raises(error) as caught:
        engine.receive("input", frames)
    if clause is not None:
        assert caught.value.clause == clause
    assert engine.state == "SERVING"
    [added] = engine.receive("input", unrouted(front.send("add", generation_request("ok"),
                                                          rank=0)))
    assert isinstance(added, RequestAdded)


def test_engine_rejects_requests_before_serving() -> None:
    engine = EngineConnection(0)
    engine.send("hello")
    frames = encode("add", generation_request("early"))
    with pytest.raises(HandshakeError) as caught:
        engine.receive("input", frames)
    assert caught.value.clause == engine.session.machine.table.illegal_event_clause
    assert engine.state == "HELLO_SENT"


def test_engine_init_is_one_frame() -> None:
    engine = EngineConnection(0)
    engine.send("hello")
    init = encode("init", METADATA)
    with pytest.raises(HandshakeError) as caught:
        engine.receive("handshake", [*init, b""])
    assert caught.value.clause == "frames.frame-count"
    assert engine.state == "HELLO_SENT"
    [event] = engine.receive("handshake", init)
    assert isinstance(event, InitReceived)


def test_frontend_rejects_bad_handshake_frames() -> None:
    front, engine = FrontendConnection([0]), EngineConnection(0)
    hello = engine.send("hello")
    with pytest.raises(HandshakeError) as caught:
        front.receive("handshake", [engine.identity, *hello, b"extra"])
    assert caught.value.clause == "frames.frame-count"
    with pytest.raises(FramingError) as caught:
        front.receive("handshake", [b"\x00\x00\x00", *hello])
    assert caught.value.clause == "identity.width-two-bytes"
    with pytest.raises(HandshakeError) as caught:
        front.receive("handshake", [b"\x05\x00", *hello])
    assert caught.value.clause == "identity.known-rank"
    with pytest.raises(HandshakeError) as caught:  # big-endian rank 1 is engine 256
        FrontendConnection([1]).receive("handshake", [b"\x00\x01", *EngineConnection(1).send(
            "hello")])
    assert caught.value.clause == "identity.known-rank"
    assert front.session.states() == {0: front.session.table.initial}
    [event] = front.receive("handshake", routed(engine, hello))
    assert isinstance(event, HelloReceived)


def test_frontend_rejects_stray_utility_reply() -> None:
    front, engine = connected()
    reply = structs.EngineCoreOutputs(
        engine_index=0,
        utility_output=structs.UtilityOutput(call_id=99, failure_message="no", result=None),
    )
    # The engine side refuses to send it; bypass it with the codec to play a broken engine.
    with pytest.raises(StateError):
        engine.send("utility_reply", reply)
    with pytest.raises(StateError) as caught:
        front.receive("output", encode("utility_reply", reply))
    assert caught.value.clause == "handshake.session.reply-known-call-id"


# --- errors: the local side would break the protocol (send raises, nothing recorded) -------


def test_frontend_send_errors() -> None:
    front, engine = FrontendConnection([0]), EngineConnection(0)
    with pytest.raises(HandshakeError):  # no HELLO came: no init is due
        front.send("init", METADATA, rank=0)
    with pytest.raises(HandshakeError) as caught:
        front.send("add", generation_request("early"), rank=0)
    assert caught.value.clause == "frames.ready-response-first"
    with pytest.raises(StateError):
        front.send("add", generation_request("x"), rank=7)
    front.receive("handshake", routed(engine, engine.send("hello")))
    front.send("init", METADATA, rank=0)
    with pytest.raises(HandshakeError):  # once per HELLO
        front.send("init", METADATA, rank=0)
    with pytest.raises(ValueError):
        front.send("outputs", None, rank=0)


def test_frontend_utility_call_ids() -> None:
    front, _ = connected()
    call_id = front.free_call_id()
    front.send("utility", (0, call_id, "echo", ()), rank=0)
    with pytest.raises(StateError) as caught:
        front.send("utility", (0, call_id, "echo", ()), rank=0)
    assert caught.value.clause == "frames.utility-call-id"
    assert front.free_call_id() != call_id


def test_engine_send_errors() -> None:
    engine = EngineConnection(0)
    with pytest.raises(StateError):
        engine.send("outputs", outputs(0))
    with pytest.raises(ValueError):
        engine.send("add", generation_request("x"))
    with pytest.raises(ValueError):
        engine.receive("output", [b"x"])
    assert engine.state == engine.session.machine.table.initial


def test_utility_from_a_client_without_output_socket_is_not_recorded() -> None:
    """The call could never be answered: it is rejected before it is recorded, so a stream of
    them leaves no pending calls behind."""
    front, engine = connected()
    for call_id in range(1, 4):
        with pytest.raises(PayloadError) as caught:
            engine.receive("input", encode("utility", (5, call_id, "echo", ())))
        assert caught.value.clause == "transport.one-socket-pair-per-client"
    assert engine.session.pending_calls == set()
