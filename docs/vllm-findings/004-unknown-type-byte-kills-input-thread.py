#!/usr/bin/env python3
"""Reproduction: an unknown request-type byte kills the engine's input thread (vLLM 0.33.0).

EngineCoreProc.process_input_sockets decodes the type frame with
EngineCoreRequestType(bytes(...)) and has no guard around it: the ValueError for a byte
outside the table ends the thread, and the engine reads no request after it.

This script runs vLLM's own input thread (EngineCoreProc.process_input_sockets, unchanged)
in-process on an EngineCoreProc built without a model: only the attributes the thread
reads are set (no tensor IPC receiver, the two queues, a ready response). A raw zmq ROUTER
plays the front end: it sends the bad message, then a valid ABORT as a probe, and waits at
most WAIT_S seconds for the probe to reach the engine's input queue.

With ``--launched`` the script shows the same on vLLM's real engine core process, launched by
vLLM's own CoreEngineProcManager with only the model layer stood in (launched_engine.py beside
this script; a few seconds per engine start): after the message the live engine serves no
further request.

Exit 1: the probe never came (the thread died: the bug reproduces). Exit 0: it came (fixed).
Exit 2: the reproduction itself failed. Needs only vLLM, pyzmq and msgspec; CPU only.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import shutil
import sys
import tempfile
import threading
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import msgspec  # noqa: E402
import zmq  # noqa: E402

WAIT_S = 3.0
HARD_STOP_S = 60
#: ``--launched``: engine starts (config, fork, READY) take seconds each on a loaded machine.
LAUNCHED_HARD_STOP_S = 300
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2
IDENTITY = (0).to_bytes(2, "little")


def bad_messages() -> dict[str, list[bytes]]:
    """The messages under test (type frame, payload frames), each sent to a fresh thread."""
    return {"type byte 0x07 (outside the table)": [b"\x07", msgspec.msgpack.encode(["req-0"])]}


def start_input_thread(address: str):
    """vLLM's engine input thread, on an EngineCoreProc that holds only what it reads."""
    from vllm.v1.engine.core import EngineCoreProc

    engine = object.__new__(EngineCoreProc)
    engine.tensor_ipc_receiver = None
    engine.input_queue = queue.Queue()
    engine.aborts_queue = queue.Queue()
    engine._make_ready_response = lambda: {"stand-in": "ready response"}
    thread = threading.Thread(
        target=engine.process_input_sockets,
        args=([address], None, IDENTITY, threading.Event()),
        name="engine input thread", daemon=True,
    )
    thread.start()
    return engine, thread


def kills_input_thread(tmp: str, name: str, message: list[bytes]) -> bool:
    """True when ``message`` stops the engine's input thread from reading later requests."""
    address = f"ipc://{tmp}/input"
    ctx = zmq.Context()
    frontend = ctx.socket(zmq.ROUTER)
    frontend.setsockopt(zmq.LINGER, 0)
    frontend.bind(address)
    try:
        engine, thread = start_input_thread(address)
        if not frontend.poll(int(WAIT_S * 1000)):
            raise RuntimeError("the engine's input thread sent no ready response")
        identity, _ready = frontend.recv_multipart()
        assert identity == IDENTITY, identity
        frontend.send_multipart([IDENTITY, *message])
        frontend.send_multipart([IDENTITY, b"\x01", msgspec.msgpack.encode(["probe"])])
        try:
            while True:
                request_type, request = engine.input_queue.get(timeout=WAIT_S)
                if request == ["probe"]:
                    print(f"fixed: after {name}, the engine still reads requests")
                    return False
        except queue.Empty:
            alive = "alive" if thread.is_alive() else "dead"
            print(f"BUG: after {name}, a valid ABORT never reached the engine's input queue "
                  f"within {WAIT_S} s; the input thread is {alive}")
            return True
    finally:
        frontend.close()
        ctx.term()
        os.unlink(address.removeprefix("ipc://"))


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces (any message under test kills the thread)."""
    results = [kills_input_thread(tmp, name, message)
               for name, message in bad_messages().items()]
    return any(results)


def reproduce_launched(tmp: str) -> bool:
    """``--launched``: the same messages to vLLM's real engine core process (a fresh one per
    message, launched by vLLM's CoreEngineProcManager with only the model layer stood in:
    launched_engine.py beside this script); True when one stops it from serving."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launched_engine import stops_serving

    return stops_serving(tmp, bad_messages(), WAIT_S * 2)


def hard_stop() -> None:
    """Print every thread's stack and end the process with EXIT_BROKEN."""
    print(f"the reproduction did not finish within {HARD_STOP_S} s", file=sys.stderr)
    faulthandler.dump_traceback()
    os._exit(EXIT_BROKEN)


def main() -> int:
    import vllm.v1.engine.core_client  # noqa: F401 - slow; not counted in the hard stop

    # A hard stop once vLLM is imported: a wait this script does not bound ends it (exit 2).
    launched = "--launched" in sys.argv[1:]
    stop = threading.Timer(LAUNCHED_HARD_STOP_S if launched else HARD_STOP_S, hard_stop)
    stop.daemon = True
    stop.start()
    tmp = tempfile.mkdtemp(prefix="vllm-finding-")
    try:
        found = reproduce_launched(tmp) if launched else reproduce(tmp)
        return EXIT_REPRODUCED if found else EXIT_FIXED
    except Exception:  # noqa: BLE001 - the reproduction itself failed: neither verdict
        traceback.print_exc()
        return EXIT_BROKEN
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
