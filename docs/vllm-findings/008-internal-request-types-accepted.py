#!/usr/bin/env python3
"""Reproduction: the engine takes sentinel types and START_DP_WAVE from a front end (vLLM 0.33.0).

EngineCoreRequestType also holds two in-process sentinels, EXECUTOR_FAILED (0x04) and
WAKEUP (0x05), and START_DP_WAVE (0x02), which only the DP coordinator sends.
EngineCoreProc.process_input_sockets decodes every byte in the enum alike and puts the
message on the busy loop's input queue, whatever socket it came from. A front end (or
anything that reaches the input socket) sending the single byte 0x04 makes the busy loop
raise RuntimeError("Executor failed.") in EngineCoreProc._handle_client_request: the engine
shuts down as if its executor had died.

vLLM's own input thread (EngineCoreProc.process_input_sockets, unchanged) runs in-process on
an EngineCoreProc built without a model; a raw zmq ROUTER plays the front end and sends each
message to a fresh thread, followed by a valid ABORT as a probe. What reaches the input queue
is then handed to vLLM's own EngineCoreProc._handle_client_request, as the busy loop does.

With ``--launched`` the script shows the same on vLLM's real engine core process, launched by
vLLM's own CoreEngineProcManager with only the model layer stood in (launched_engine.py beside
this script; a few seconds per engine start): after EXECUTOR_FAILED from the front end the live
engine serves no further request and exits (WAKEUP and START_DP_WAVE are taken silently:
nothing shows outside).

Exit 1: a message reached the input queue (reproduces). Exit 0: none did (fixed). Exit 2:
the reproduction itself failed. Needs only vLLM, pyzmq and msgspec; CPU only.
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
    return {
        "EXECUTOR_FAILED (0x04) from a front end": [b"\x04", msgspec.msgpack.encode(None)],
        "WAKEUP (0x05) from a front end": [b"\x05", msgspec.msgpack.encode(None)],
        "START_DP_WAVE (0x02) from a front end":
            [b"\x02", msgspec.msgpack.encode([0, 0])],
    }


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


def reaches_engine(tmp: str, name: str, message: list[bytes]) -> list[tuple]:
    """What ``message`` puts on the engine's input queue before a valid ABORT probe."""
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
        queued = []
        while True:
            try:
                request_type, request = engine.input_queue.get(timeout=WAIT_S)
            except queue.Empty:
                raise RuntimeError(f"after {name}, the probe never came (the input thread "
                                   f"is {'alive' if thread.is_alive() else 'dead'})") from None
            if request == ["probe"]:
                return queued
            queued.append((request_type, request))
    finally:
        frontend.close()
        ctx.term()
        os.unlink(address.removeprefix("ipc://"))


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces (a message under test reached the input queue)."""
    from vllm.v1.engine.core import EngineCoreProc

    accepted = False
    for name, message in bad_messages().items():
        queued = reaches_engine(tmp, name, message)
        if not queued:
            print(f"fixed: {name}: dropped")
            continue
        accepted = True
        for request_type, request in queued:
            verdict = "queued for the busy loop"
            if request_type.name == "EXECUTOR_FAILED":
                try:
                    EngineCoreProc._handle_client_request(object.__new__(EngineCoreProc),
                                                          request_type, request)
                except RuntimeError as exc:
                    verdict += f"; the busy loop's dispatch raises RuntimeError({exc})"
            print(f"BUG: {name}: {request_type} {verdict}")
    return accepted


def reproduce_launched(tmp: str) -> bool:
    """``--launched``: EXECUTOR_FAILED (what shows outside the engine) to vLLM's real engine
    core process, launched by vLLM's CoreEngineProcManager with only the model layer stood in
    (launched_engine.py beside this script); True when it stops the engine from serving."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launched_engine import stops_serving

    messages = {name: message for name, message in bad_messages().items()
                if name.startswith("EXECUTOR_FAILED")}
    return stops_serving(tmp, messages, WAIT_S * 2)


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
