"""Scripted in-process peers for the tap's tests: a front end and an engine core, each a
sans-IO connection over its own sockets, that log every frame they send and receive, so a test
can compare what each end saw with and without a tap between them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from enginewire.reference import structs
from enginewire.reference.addresses import ipc_address
from enginewire.reference.connection import EngineConnection, FrontendConnection
from enginewire.reference.engine import generation_request
from enginewire.reference.transport import ChannelSocket, open_socket

TIMEOUT_MS = 10_000

Entry = tuple[str, str, list[bytes]]  # (sent | received, channel, frames)


@dataclass
class Log:
    entries: list[Entry] = field(default_factory=list)

    def sent(self, channel: str, frames: list[Any]) -> list[bytes]:
        frames = [bytes(f) for f in frames]
        self.entries.append(("sent", channel, frames))
        return frames

    def received(self, channel: str, sock: ChannelSocket) -> list[bytes]:
        if not sock.socket.poll(TIMEOUT_MS):
            raise TimeoutError(f"nothing on {channel} within {TIMEOUT_MS} ms")
        frames = sock.socket.recv_multipart()
        self.entries.append(("received", channel, frames))
        return frames


def ready_response(rank: int = 0) -> Any:
    return structs.EngineCoreReadyResponse(
        max_model_len=4096, num_gpu_blocks=1024, block_size=16, dp_stats_address=None,
        dtype="float16", vllm_version="0.33.0", world_size=1, data_parallel_size=1,
        tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
        data_parallel_rank=rank, max_num_seqs=256, max_num_batched_tokens=8192,
        instance_id="scripted", supports_lora=False, max_loras=0,
    )


def outputs_message(request_id: str, tokens: list[int], finished: bool) -> Any:
    return structs.EngineCoreOutputs(
        engine_index=0,
        outputs=[structs.EngineCoreOutput(
            request_id=request_id, new_token_ids=tokens,
            finish_reason=structs.FinishReason.LENGTH if finished else None)],
        finished_requests={request_id} if finished else None,
        timestamp=1.5,
    )


def skew_outputs(frames: list[bytes]) -> list[bytes]:
    """An outputs message as an engine of another layout writes it: a float inserted at
    position 2 of every EngineCoreOutput (between new_token_ids and new_logprobs)."""
    raw = msgspec.msgpack.decode(frames[0])
    for output in raw[1]:
        output.insert(2, 0.25)
    return [msgspec.msgpack.encode(raw), *frames[1:]]


def scripted_session(
    connect_to: Callable[[str], str] | None = None,
    *,
    engine_rewrite: Callable[[str, list[bytes]], list[bytes]] | None = None,
) -> tuple[Log, Log]:
    """One whole session (handshake, ready response, two requests with outputs, a utility
    call, an abort): the front end's and the engine's logs. ``connect_to(handshake_address)``
    gives the address the engine connects to (a tap's); ``engine_rewrite(kind, frames)`` lets
    the engine send other frames than its connection's (a skewed engine)."""
    ctx = zmq.Context()
    sockets: list[ChannelSocket] = []
    frontend_log, engine_log = Log(), Log()
    rewrite = engine_rewrite or (lambda _kind, frames: frames)

    def opened(channel: str, role: str, address: str, identity: bytes | None = None
               ) -> ChannelSocket:
        sock = open_socket(ctx, channel, role, address, identity=identity)
        sockets.append(sock)
        return sock

    try:
        front = FrontendConnection([0])
        engine = EngineConnection(0)
        f_hs = opened("handshake", "frontend", ipc_address())
        f_in = opened("input", "frontend", ipc_address())
        f_out = opened("output", "frontend", ipc_address())
        target = connect_to(f_hs.address) if connect_to else f_hs.address
        e_hs = opened("handshake", "engine", target, engine.identity)

        def f_send(sock: ChannelSocket, channel: str, frames: list[Any]) -> None:
            sock.socket.send_multipart(frontend_log.sent(channel, frames))

        def e_send(sock: ChannelSocket, channel: str, kind: str, value: Any = None) -> None:
            frames = [bytes(f) for f in engine.send(kind, value)]
            sock.socket.send_multipart(engine_log.sent(channel, rewrite(kind, frames)))

        e_send(e_hs, "handshake", "hello")
        front.receive("handshake", frontend_log.received("handshake", f_hs))
        metadata = structs.EngineHandshakeMetadata(
            addresses=structs.EngineZmqAddresses(inputs=[f_in.address],
                                                 outputs=[f_out.address]),
            parallel_config={"data_parallel_size": 1})
        f_send(f_hs, "handshake", front.send("init", metadata, rank=0))
        [init] = engine.receive("handshake", engine_log.received("handshake", e_hs))
        e_in = opened("input", "engine", init.addresses.inputs[0], engine.identity)
        e_out = opened("output", "engine", init.addresses.outputs[0])
        e_send(e_in, "input", "ready_response", ready_response())
        e_send(e_hs, "handshake", "ready")
        front.receive("handshake", frontend_log.received("handshake", f_hs))
        front.receive("input", frontend_log.received("input", f_in))

        for request_id in ("a", "b"):
            request = generation_request(request_id, [1, 2, 3], 2, arrival_time=100.0)
            f_send(f_in, "input", front.send("add", request, rank=0))
            engine.receive("input", engine_log.received("input", e_in))
        e_send(e_out, "output", "outputs", outputs_message("a", [7], False))
        e_send(e_out, "output", "outputs", outputs_message("a", [8], True))
        for _ in range(2):
            frontend_log.received("output", f_out)
        f_send(f_in, "input", front.send("utility", (0, 1, "echo", ["x"]), rank=0))
        engine.receive("input", engine_log.received("input", e_in))
        reply = structs.EngineCoreOutputs(
            engine_index=0, utility_output=structs.UtilityOutput(
                call_id=1, result=structs.UtilityResult(None, ["x"])), timestamp=2.0)
        e_send(e_out, "output", "utility_reply", reply)
        frontend_log.received("output", f_out)
        f_send(f_in, "input", front.send("abort", ["b"], rank=0))
        engine.receive("input", engine_log.received("input", e_in))
        time.sleep(0.05)
        return frontend_log, engine_log
    finally:
        for sock in sockets:
            sock.close(linger=0)
        ctx.term()
