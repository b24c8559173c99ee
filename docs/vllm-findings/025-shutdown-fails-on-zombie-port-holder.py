#!/usr/bin/env python3
"""Reproduction: vllm serve exits 1 after a clean shutdown when a forked child that held its
socket has just exited (vLLM 0.33.0).

On SIGINT or SIGTERM, serve_http (vllm/entrypoints/launchers/launcher.py) cancels its server
task, catches the CancelledError, asks find_process_using_port(port) for "the process using
the port" and logs ``process.cmdline()``, unguarded. A process forked from the API server (the
engine core, and the workers it forks: fork is vLLM's default start method where CUDA is not
yet initialised) inherits the server's bound socket, and psutil names one process per socket,
the last one its /proc scan saw: the child. When that child exits between the lookup and the
cmdline() call (which it does at shutdown: the engine and its workers are stopping), it is a
zombie until its parent reaps it, psutil raises ZombieProcess, and the exception leaves
serve_http: ``vllm serve`` exits with status 1.

This script binds a socket with vLLM's create_server_socket, forks a child that holds it and
waits on a pipe, and runs vLLM's real serve_http on the socket (a bare FastAPI app, no engine
client, no lifespan events); once the server has started it sends itself SIGTERM. The exit of
the child is placed deterministically in the window: a profile hook sees
find_process_using_port return, tells the child to exit and waits until it is a zombie (not
reaped), and only then lets serve_http go on. vLLM's code is not changed. The child is reaped
and the socket closed at the end.

Exit 1: serve_http raised ZombieProcess (reproduces). Exit 0: serve_http finished its shutdown
(fixed). Exit 2: the reproduction itself failed. Needs only vLLM, psutil and the standard
library; CPU only; a few seconds once vLLM is imported.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import select
import signal
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import psutil  # noqa: E402

WAIT_S = 10.0
HARD_STOP_S = 60
EXIT_FIXED, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


class Child:
    """A forked process that holds every descriptor of this one (the server's socket among
    them) and exits when told to, or after ``WAIT_S * 6`` seconds at the latest."""

    def __init__(self) -> None:
        read_end, self._write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # child: wait for a byte, then exit without any clean-up
            try:
                select.select([read_end], [], [], WAIT_S * 6)
            finally:
                os._exit(0)
        os.close(read_end)
        self.told = False

    def tell_to_exit(self) -> None:
        if not self.told:
            self.told = True
            os.write(self._write_end, b"x")

    def wait_zombie(self) -> None:
        """Until the child has exited and is not reaped (a zombie), bounded."""
        deadline = time.monotonic() + WAIT_S
        while psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() > deadline:
                raise RuntimeError(f"child {self.pid} did not exit within {WAIT_S} s")
            time.sleep(0.01)

    def reap(self) -> None:
        """Tell the child to exit and reap it (killed if it does not exit in time)."""
        self.tell_to_exit()
        os.close(self._write_end)
        deadline = time.monotonic() + WAIT_S
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                return
            time.sleep(0.01)


def zombie_after_lookup(child: Child, seen: dict[str, Any]):
    """A profile function: when vLLM's find_process_using_port returns, record what it
    returned, and if it named ``child``, make the child exit and wait until it is a zombie."""
    from vllm.utils.network_utils import find_process_using_port

    code = find_process_using_port.__code__

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "return" or frame.f_code is not code:
            return
        seen["returned"] = None if arg is None else arg.pid
        if arg is not None and arg.pid == child.pid:
            child.tell_to_exit()
            child.wait_zombie()

    return profile


async def serve_and_terminate(sock: Any, port: int, child: Child,
                              seen: dict[str, Any]) -> None:
    """vLLM's serve_http on ``sock``; SIGTERM once it has started; its shutdown awaited."""
    from fastapi import FastAPI
    from vllm.entrypoints.launchers.launcher import serve_http

    app = FastAPI()
    app.state.engine_client = None  # no engine: serve_http skips the engine client's shutdown
    sys.setprofile(zombie_after_lookup(child, seen))
    try:
        task = asyncio.get_running_loop().create_task(serve_http(
            app, sock, host="127.0.0.1", port=port, log_level="warning",
            lifespan="off"))
        deadline = time.monotonic() + WAIT_S
        while getattr(getattr(app.state, "server", None), "started", False) is not True:
            if task.done():
                task.result()  # serve_http ended before it started: its error, if any
                raise RuntimeError("serve_http returned before its server started")
            if time.monotonic() > deadline:
                task.cancel()
                raise RuntimeError(f"serve_http did not start within {WAIT_S} s")
            await asyncio.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # serve_http's own handler starts the shutdown
        shutdown = await asyncio.wait_for(task, WAIT_S)
        await asyncio.wait_for(shutdown, WAIT_S)
    finally:
        sys.setprofile(None)


def reproduce() -> bool:
    """True when the bug reproduces."""
    from vllm.entrypoints.launchers.launcher import create_server_socket

    sock = create_server_socket(("127.0.0.1", 0), reuse_port=False)
    port = sock.getsockname()[1]
    seen: dict[str, Any] = {}
    child = Child()
    try:
        if child.pid < os.getpid():
            raise RuntimeError(f"the child's pid {child.pid} is below this process's "
                               f"{os.getpid()} (pids wrapped): psutil would name this process, "
                               "not the child, as the socket's holder; run it again")
        try:
            asyncio.run(serve_and_terminate(sock, port, child, seen))
        except psutil.ZombieProcess as exc:
            if seen.get("returned") != child.pid:
                raise RuntimeError(f"ZombieProcess, yet the lookup named {seen}") from exc
            print(f"BUG: serve_http raised {type(exc).__name__} ({exc}) after a clean "
                  f"shutdown on SIGTERM: find_process_using_port({port}) named pid {child.pid}, "
                  "a forked child holding the server's socket, which exited (not yet reaped) "
                  "before serve_http called its cmdline(); vllm serve exits 1 on this")
            return True
        if "returned" not in seen:
            raise RuntimeError("serve_http's shutdown did not call find_process_using_port")
        print(f"fixed: serve_http finished its shutdown on SIGTERM (find_process_using_port "
              f"named {seen['returned']}; the forked child {child.pid} had exited)")
        return False
    finally:
        child.reap()
        sock.close()


def hard_stop() -> None:
    """Print every thread's stack and end the process with EXIT_BROKEN."""
    print(f"the reproduction did not finish within {HARD_STOP_S} s", file=sys.stderr)
    faulthandler.dump_traceback()
    os._exit(EXIT_BROKEN)


def main() -> int:
    import vllm.entrypoints.launchers.launcher  # noqa: F401 - slow; not counted in the hard stop

    # A hard stop once vLLM is imported: a wait this script does not bound ends it (exit 2).
    stop = threading.Timer(HARD_STOP_S, hard_stop)
    stop.daemon = True
    stop.start()
    try:
        return EXIT_REPRODUCED if reproduce() else EXIT_FIXED
    except Exception:  # noqa: BLE001 - the reproduction itself failed: neither verdict
        traceback.print_exc()
        return EXIT_BROKEN


if __name__ == "__main__":
    sys.exit(main())
