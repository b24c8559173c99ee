#!/usr/bin/env python3
"""Reproduction: the front end's handshake waits for ever for a remote engine (vLLM 0.33.0).

vllm.v1.engine.utils.wait_for_engine_startup polls the handshake socket in 10 s periods
for as long as engines are pending. It notices local engine processes that exit (their
sentinels) but has no overall deadline: a remote engine (data-parallel rank on another
node) that never sends HELLO, or sends HELLO and never READY, blocks start-up for ever.

This script calls vLLM's wait_for_engine_startup on a raw zmq ROUTER handshake socket for
one remote engine that never connects, with VLLM_ENGINE_READY_TIMEOUT_S=1, on a daemon thread,
and checks whether it is still waiting after 1 + WAIT_S seconds. The parallel config and
the launch record are stand-ins holding only the fields the function reads (no local
engines, no coordinator, no watched processes).

Exit 1: still waiting (reproduces). Exit 0: start-up failed or ended in time (fixed).
Exit 2: the reproduction itself failed. Needs only vLLM and pyzmq; CPU only; a few seconds.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile
import threading
import traceback
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["VLLM_ENGINE_READY_TIMEOUT_S"] = "1"

import zmq  # noqa: E402

WAIT_S = 3.0
HARD_STOP_S = 60
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


def reproduce(tmp: str) -> bool:
    """True when the bug reproduces."""
    from vllm.v1.engine.utils import CoreEngine, CoreEngineLaunch, wait_for_engine_startup

    ctx = zmq.Context()
    handshake = ctx.socket(zmq.ROUTER)
    handshake.setsockopt(zmq.LINGER, 0)
    handshake.bind(f"ipc://{tmp}/handshake")
    parallel_config = SimpleNamespace(
        data_parallel_size_local=0, data_parallel_hybrid_lb=False,
        data_parallel_external_lb=False,
    )
    launch = CoreEngineLaunch(engine_manager=None, coordinator=None, addresses=None,
                              tensor_queue=None)
    outcome: list[str] = []

    def wait() -> None:
        try:
            wait_for_engine_startup(handshake, [CoreEngine(index=0, local=False)],
                                    parallel_config, False, SimpleNamespace(), launch)
            outcome.append("returned")
        except Exception as exc:  # noqa: BLE001 - any bounded end is the fix
            outcome.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=wait, name="wait_for_engine_startup", daemon=True)
    thread.start()
    thread.join(1 + WAIT_S)
    if thread.is_alive():
        print(f"BUG: wait_for_engine_startup was still waiting {1 + WAIT_S} s for a remote "
              f"engine that never connected (VLLM_ENGINE_READY_TIMEOUT_S=1)")
        # The thread polls the socket for ever; the process ends without closing it.
        return True
    print(f"fixed: start-up ended: {outcome}")
    handshake.close()
    ctx.term()
    return False


def hard_stop() -> None:
    """Print every thread's stack and end the process with EXIT_BROKEN."""
    print(f"the reproduction did not finish within {HARD_STOP_S} s", file=sys.stderr)
    faulthandler.dump_traceback()
    os._exit(EXIT_BROKEN)


def main() -> int:
    import vllm.v1.engine.utils  # noqa: F401 - slow; not counted in the hard stop

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
