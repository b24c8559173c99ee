#!/usr/bin/env python3
"""Reproduction: a timed-out overflow receive makes the ring reorder messages (vLLM 0.33.0).

MessageQueue.dequeue releases the ring slot of an overflow chunk (byte 0 = 1) before it
receives the message on the XPUB/SUB socket; when that receive times out, the next dequeue
reads the next ring chunk while the late overflow message waits in the socket, and that late
message is returned for a later overflow chunk: messages come out of order, and the reader
gets the wrong payload for a chunk with no error.

This script uses vLLM's MessageQueue for both ends (writer and one local reader, in one
process). The writer publishes overflow chunk A with its own acquire_write (as enqueue does),
but sends A's bytes on its socket only after the reader's dequeue(timeout=0.5) timed out (a
large message still in flight); it then enqueues B (in the ring) and C (overflow). The
reader's next two dequeues must return A then B, or B then C (A dropped); vLLM 0.33.0
returns B then A.

Exit 1: out of order (reproduces). Exit 0: in order (fixed). Exit 2: the reproduction itself
failed. Needs only vLLM and pyzmq; CPU only; a few seconds.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import pickle
import shutil
import sys
import tempfile
import threading
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="vllm-finding-rpc-")


WAIT_S = 3.0
HARD_STOP_S = 60
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    chunk = 1024
    writer = MessageQueue(n_reader=1, n_local_reader=1, max_chunk_bytes=chunk, max_chunks=4)
    reader = MessageQueue.create_from_handle(writer.export_handle(), rank=0)
    ready = threading.Thread(target=reader.wait_until_ready, daemon=True)
    ready.start()
    writer.wait_until_ready()
    ready.join(WAIT_S)
    big_a, big_c = "A" * (2 * chunk), "C" * (2 * chunk)
    try:
        # Overflow chunk A is published; its bytes are still on their way.
        with writer.acquire_write(WAIT_S) as buf:
            buf[0] = 1
        try:
            reader.dequeue(timeout=0.5)
            raise RuntimeError("the first dequeue returned before A's bytes were sent")
        except TimeoutError:
            pass  # what the caller sees; it moves on to the next message
        writer.local_socket.send(pickle.dumps(big_a, protocol=pickle.HIGHEST_PROTOCOL))
        writer.enqueue("B", timeout=WAIT_S)
        writer.enqueue(big_c, timeout=WAIT_S)
        got = [reader.dequeue(timeout=WAIT_S) for _ in range(2)]
        names = [value[0] for value in got]
        if names in (["A", "B"], ["B", "C"]):
            print(f"fixed: the reader returned {names} after the timed-out overflow receive")
            return False
        print(f"BUG: after an overflow receive timed out, the reader returned {names} for the "
              f"writer's B then C: the late overflow message A came back for C's chunk")
        return True
    finally:
        writer.shutdown()
        reader.shutdown()
        segment = f"/dev/shm/{writer.buffer.shared_memory.name}"
        del writer, reader  # ShmRingBuffer.__del__ unlinks the writer's segment
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
