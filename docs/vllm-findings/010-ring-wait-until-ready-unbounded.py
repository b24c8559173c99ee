#!/usr/bin/env python3
"""Reproduction: MessageQueue.wait_until_ready has no timeout (vLLM 0.33.0).

The writer of vLLM's shared-memory broadcast ring
(vllm.distributed.device_communicators.shm_broadcast.MessageQueue) waits in
wait_until_ready for one subscription per local reader with a blocking recv() and takes no
timeout: a reader that never connects (it crashed while starting) blocks the writer for ever.

This script creates MessageQueue(n_reader=1, n_local_reader=1), calls the writer's
wait_until_ready on a thread with no reader, and checks after WAIT_S seconds whether it is
still blocked. A fixed vLLM takes a timeout: the script then calls
wait_until_ready(timeout=1) and expects TimeoutError. Afterwards a raw zmq SUB subscribes so
the blocked call returns, and the ring's socket files (left by vLLM, finding 021) are removed
with the temporary VLLM_RPC_BASE_PATH.

Exit 1: blocked with no way to bound it (reproduces). Exit 0: bounded (fixed). Exit 2: the
reproduction itself failed. Needs only vLLM and pyzmq; CPU only; a few seconds.
"""

from __future__ import annotations

import faulthandler
import gc
import inspect
import os
import shutil
import sys
import tempfile
import threading
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="vllm-finding-rpc-")

import zmq  # noqa: E402

WAIT_S = 3.0
HARD_STOP_S = 60
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


def wait_then_set(queue, done: threading.Event) -> None:
    """The writer's wait_until_ready, then ``done``."""
    queue.wait_until_ready()
    done.set()


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    writer = MessageQueue(n_reader=1, n_local_reader=1, max_chunk_bytes=1024, max_chunks=2)
    ctx = zmq.Context()
    try:
        if "timeout" in inspect.signature(writer.wait_until_ready).parameters:
            try:
                writer.wait_until_ready(timeout=1.0)
            except TimeoutError:
                print("fixed: wait_until_ready(timeout=1.0) raised TimeoutError")
                return False
            print("wait_until_ready(timeout=1.0) returned with no reader")
            return True
        done = threading.Event()

        threading.Thread(target=wait_then_set, args=(writer, done),
                         name="writer wait_until_ready", daemon=True).start()
        blocked = not done.wait(WAIT_S)
        # Let the blocked call return: subscribe the way a reader does.
        reader = ctx.socket(zmq.SUB)
        reader.setsockopt(zmq.LINGER, 0)
        reader.setsockopt_string(zmq.SUBSCRIBE, "")
        reader.connect(writer.handle.local_subscribe_addr)
        released = done.wait(WAIT_S)
        reader.close()
        if blocked:
            print(f"BUG: the writer's wait_until_ready was still blocked {WAIT_S} s after it was "
                  f"called with no reader connected, and it takes no timeout "
                  f"(it returned once a reader subscribed: {released})")
        return blocked
    finally:
        ctx.term()
        writer.shutdown()
        segment = f"/dev/shm/{writer.buffer.shared_memory.name}"
        del writer  # ShmRingBuffer.__del__ unlinks the writer's segment
        gc.collect()
        assert not os.path.exists(segment), f"{segment} was left behind"


def hard_stop() -> None:
    """Print every thread's stack and end the process with EXIT_BROKEN."""
    print(f"the reproduction did not finish within {HARD_STOP_S} s", file=sys.stderr)
    faulthandler.dump_traceback()
    os._exit(EXIT_BROKEN)


def main() -> int:
    import vllm.distributed.device_communicators.shm_broadcast  # noqa: F401 - slow; not counted in the hard stop

    # A hard stop once vLLM is imported: a wait this script does not bound ends it (exit 2).
    stop = threading.Timer(HARD_STOP_S, hard_stop)
    stop.daemon = True
    stop.start()
    tmp = tempfile.mkdtemp(prefix="vllm-finding-")
    try:
        return EXIT_REPRODUCED if reproduce(tmp) else EXIT_FIXED
    except Exception:  # noqa: BLE001 - the reproduction itself failed: neither verdict
        traceback.print_exc()
        return EXIT_BROKEN
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if "vllm-finding-rpc-" in os.environ.get("VLLM_RPC_BASE_PATH", ""):
            shutil.rmtree(os.environ["VLLM_RPC_BASE_PATH"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
