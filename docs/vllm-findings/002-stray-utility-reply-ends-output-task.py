#!/usr/bin/env python3
"""Reproduction: one stray utility reply ends the client's output task (vLLM 0.33.0).

AsyncMPClient's output task resolves a utility reply with ``utility_results.pop(call_id)``
(_process_utility_output); a reply whose call_id matches no pending call raises KeyError,
which ends the task: no later output or utility reply is delivered.

This script plays the engine with raw zmq sockets, sends a utility reply to a call that was
never made, then makes a real call, answers it, and waits at most WAIT_S seconds for it.

Exit 1: the real call never returned (the bug reproduces). Exit 0: it returned (fixed).
Exit 2: the reproduction itself failed. Needs only vLLM, pyzmq and msgspec; CPU only.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import shutil
import sys
import tempfile
import threading
import traceback
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["VLLM_ENGINE_READY_TIMEOUT_S"] = "10"  # the client's ready-response wait

import msgspec  # noqa: E402
import zmq  # noqa: E402

WAIT_S = 3.0
HARD_STOP_S = 60
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


def ready_response() -> bytes:
    """The engine's ready response, as EngineCoreProc._make_ready_response builds it."""
    from vllm.v1.engine import EngineCoreReadyResponse

    return msgspec.msgpack.encode(EngineCoreReadyResponse(
        max_model_len=2048, num_gpu_blocks=1024, block_size=16, dp_stats_address=None,
        dtype="float32", vllm_version="0.33.0", world_size=1, data_parallel_size=1,
        tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
        data_parallel_rank=0, max_num_seqs=8, max_num_batched_tokens=2048,
        instance_id="repro", supports_lora=False, max_loras=0,
    ))


def make_client(input_address: str, output_address: str):
    """vLLM's AsyncMPClient for externally managed engines, without a model."""
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.v1.engine.core_client import AsyncMPClient
    from vllm.v1.executor import Executor

    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    object.__setattr__(config, "model_config",
                       SimpleNamespace(max_model_len=2048, multimodal_config=None))
    return AsyncMPClient(config, Executor, False, client_addresses={
        "input_address": input_address, "output_address": output_address})


async def engine_recv(sock: zmq.Socket) -> list[bytes]:
    """The engine's next message, polled without blocking the client's event loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not sock.poll(0):
        if loop.time() > deadline:
            raise RuntimeError(f"the engine received nothing within {WAIT_S} s")
        await asyncio.sleep(0.01)
    return sock.recv_multipart()


@contextlib.asynccontextmanager
async def peers(tmp: str):
    """vLLM's client, bound in ``tmp``, and the two raw sockets of the engine it talks to."""
    input_address, output_address = f"ipc://{tmp}/input", f"ipc://{tmp}/output"
    ctx = zmq.Context()
    engine_in = ctx.socket(zmq.DEALER)
    engine_in.setsockopt(zmq.IDENTITY, (0).to_bytes(2, "little"))
    engine_in.setsockopt(zmq.LINGER, 0)
    engine_in.connect(input_address)
    engine_in.send(ready_response())
    engine_out = ctx.socket(zmq.PUSH)
    engine_out.setsockopt(zmq.LINGER, 0)
    engine_out.connect(output_address)
    client = make_client(input_address, output_address)
    try:
        yield client, engine_in, engine_out
    finally:
        client.shutdown()
        engine_in.close()
        engine_out.close()
        ctx.term()


def reply(call_id: int, value: object) -> list[bytes]:
    """An EngineCoreOutputs frame holding a utility reply, as the engine encodes it."""
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput
    from vllm.v1.serial_utils import MsgpackEncoder, UtilityResult

    outputs = EngineCoreOutputs(utility_output=UtilityOutput(call_id, result=UtilityResult(value)))
    return list(MsgpackEncoder().encode(outputs))


async def reproduce(tmp: str) -> bool:
    """True when the bug reproduces."""
    import msgspec.msgpack

    async with peers(tmp) as (client, engine_in, engine_out):
        # Start the output task with a first, answered call.
        call = asyncio.ensure_future(client.call_utility_async("is_sleeping"))
        _type, payload = await engine_recv(engine_in)
        engine_out.send_multipart(reply(msgspec.msgpack.decode(payload)[1], False))
        await asyncio.wait_for(call, WAIT_S)
        # A reply to a call that was never made (say, a duplicate or a late one).
        engine_out.send_multipart(reply(12345, True))
        await asyncio.sleep(0.2)
        call = asyncio.ensure_future(client.call_utility_async("still_there"))
        _type, payload = await engine_recv(engine_in)
        engine_out.send_multipart(reply(msgspec.msgpack.decode(payload)[1], "yes"))
        try:
            result = await asyncio.wait_for(call, WAIT_S)
        except TimeoutError:
            print(f"BUG: after a stray utility reply, the reply to a real call was not "
                  f"delivered within {WAIT_S} s (the client's output task ended)")
            return True
        print(f"fixed: the real call returned {result!r}")
        return False


def hard_stop() -> None:
    """Print every thread's stack and end the process with EXIT_BROKEN."""
    print(f"the reproduction did not finish within {HARD_STOP_S} s", file=sys.stderr)
    faulthandler.dump_traceback()
    os._exit(EXIT_BROKEN)


def main() -> int:
    import vllm.v1.engine.core_client  # noqa: F401 - slow; not counted in the hard stop

    # A hard stop once vLLM is imported: a wait this script does not bound ends it (exit 2).
    stop = threading.Timer(HARD_STOP_S, hard_stop)
    stop.daemon = True
    stop.start()
    tmp = tempfile.mkdtemp(prefix="vllm-finding-")
    try:
        return EXIT_REPRODUCED if asyncio.run(reproduce(tmp)) else EXIT_FIXED
    except Exception:  # noqa: BLE001 - the reproduction itself failed: neither verdict
        traceback.print_exc()
        return EXIT_BROKEN
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the client leaves its ipc files behind


if __name__ == "__main__":
    sys.exit(main())
