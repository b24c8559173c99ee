#!/usr/bin/env python3
"""Reproduction: vLLM leaves its ipc socket files behind (vLLM 0.33.0).

ZMQ does not remove the socket file of an ipc:// endpoint a socket bound; whoever binds must
unlink it after closing. AsyncMPClient.shutdown() closes its input ROUTER and output PULL
without removing their files (only pre-bound ZmqListener objects are cleaned up), and the
shared-memory ring's writer (MessageQueue) never removes the files of its XPUB and notify
sockets in VLLM_RPC_BASE_PATH.

This script creates vLLM's real AsyncMPClient on two ipc addresses in a temporary directory
(a raw zmq DEALER sends the engine's ready response), shuts it down, and lists the files
left; then creates a MessageQueue writer with VLLM_RPC_BASE_PATH pointed at another
temporary directory, shuts it down, drops it, and lists the files left there. Both
directories are removed afterwards.

Exit 1: files were left (reproduces). Exit 0: none (fixed). Exit 2: the reproduction itself
failed. Needs only vLLM, pyzmq and msgspec; CPU only; a few seconds.
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


async def reproduce(tmp: str) -> bool:
    """True when the bug reproduces."""
    import gc

    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    client_dir, ring_dir = os.path.join(tmp, "client"), os.path.join(tmp, "ring")
    os.mkdir(client_dir)
    os.mkdir(ring_dir)
    async with peers(client_dir) as (client, _engine_in, _engine_out):
        pass  # peers() shuts the client down on exit
    await asyncio.sleep(0.2)
    client_left = sorted(os.listdir(client_dir))

    os.environ["VLLM_RPC_BASE_PATH"] = ring_dir
    writer = MessageQueue(n_reader=1, n_local_reader=1, max_chunk_bytes=1024, max_chunks=2)
    segment = f"/dev/shm/{writer.buffer.shared_memory.name}"
    writer.shutdown()
    del writer
    gc.collect()
    await asyncio.sleep(0.2)
    ring_left = sorted(os.listdir(ring_dir))
    if os.path.exists(segment):
        raise RuntimeError(f"{segment} was left behind")

    if client_left or ring_left:
        print(f"BUG: AsyncMPClient.shutdown() left {client_left} and a closed MessageQueue "
              f"writer left {len(ring_left)} ipc socket file(s) in VLLM_RPC_BASE_PATH")
        return True
    print("fixed: no ipc socket file left")
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
