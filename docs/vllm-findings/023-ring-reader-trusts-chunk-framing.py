#!/usr/bin/env python3
"""Reproduction: the ring reader trusts a chunk's framing bytes (vLLM 0.33.0).

MessageQueue.dequeue reads byte 0 of a chunk as "overflow" only when it is 1 and treats
every other value as an in-ring message; it then reads the buffer count and each 4-byte
length and slices the chunk with no check that they stay within max_chunk_bytes. Slices past
the end silently come out short, and pickle.loads stops at its STOP opcode, so a chunk whose
framing is corrupt still decodes to a message.

This script uses vLLM's MessageQueue for both ends (writer and one local reader, in one
process, max_chunk_bytes=1024). The writer frames two chunks itself with its own
acquire_write, each holding a valid pickle: one with byte 0 = 2 (neither 0 nor 1), one whose
length field says 4096 bytes (past the chunk). The reader dequeues each.

Exit 1: the reader returned a message for a malformed chunk (reproduces). Exit 0: it raised
for both (fixed). Exit 2: the reproduction itself failed. Needs only vLLM and pyzmq; CPU only.
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


def frame(kind: int, length: int | None = None) -> bytes:
    """A chunk's framing (byte 0, buffer count 1, one length) and a valid pickle."""
    payload = pickle.dumps("decoded anyway", protocol=pickle.HIGHEST_PROTOCOL)
    size = len(payload) if length is None else length
    return bytes([kind]) + (1).to_bytes(2, "big") + size.to_bytes(4, "big") + payload


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
    cases = {
        "byte 0 = 2 (neither in-ring 0 nor overflow 1)": frame(2),
        f"a buffer length of 4096 in a {chunk}-byte chunk": frame(0, 4096),
    }
    accepted = False
    try:
        for name, data in cases.items():
            with writer.acquire_write(WAIT_S) as buf:
                buf[:len(data)] = data
            try:
                value = reader.dequeue(timeout=WAIT_S)
            except TimeoutError:
                raise RuntimeError(f"{name}: the reader saw no chunk") from None
            except Exception as exc:  # noqa: BLE001 - any error is a rejection
                print(f"fixed: {name}: rejected ({type(exc).__name__}: {exc})")
                continue
            print(f"BUG: {name}: the reader returned {value!r}")
            accepted = True
        return accepted
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
