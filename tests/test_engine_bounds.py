"""The reference engine's bounds: work per message, memory for rejected messages, one poll
per batch, ENGINE_CORE_DEAD on a fatal error, signals at any time. The engine runs in this
process (on a thread) so its memory and its socket calls can be observed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from enginewire.reference import structs
from enginewire.reference.engine import (
    EXIT_CLEAN,
    EXIT_DIED,
    VIOLATION_MESSAGE_CHARS,
    VIOLATIONS_KEPT,
    EngineOptions,
    ReferenceEngine,
    Violations,
    generation_request,
    scripted_tokens,
)
from enginewire.reference.errors import EngineDeadError
from enginewire.reference.frontend import ReferenceFrontend

TIMEOUT = 20.0


class Running:
    """A reference engine on a thread, and the front end it serves."""

    def __init__(self, engine: ReferenceEngine, frontend: ReferenceFrontend) -> None:
        self.engine = engine
        self.frontend = frontend
        self.status: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.status = self.engine.run()


@pytest.fixture
def serve() -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(engine_cls: type[ReferenceEngine] = ReferenceEngine, **options: Any) -> Running:
        frontend = ReferenceFrontend(1)
        engine = engine_cls(EngineOptions(handshake_address=frontend.handshake_address,
                                          handshake_timeout=TIMEOUT, **options))
        running = Running(engine, frontend)
        started.append(running)
        running.thread.start()
        frontend.wait_ready(TIMEOUT)
        return running

    yield start
    for running in started:
        running.engine.request_stop()
        running.thread.join(TIMEOUT)
        running.frontend.close()
        assert not running.thread.is_alive()


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_huge_max_tokens_allocates_nothing_up_front(serve) -> None:
    running = serve()
    before = rss_bytes()
    running.frontend.add_request(generation_request("huge", [3, 4], max_tokens=2**31 - 1))
    first = running.frontend.get_output(TIMEOUT)
    assert first.outputs[0].request_id == "huge"
    assert list(first.outputs[0].new_token_ids) == scripted_tokens([3, 4], 1)
    assert first.outputs[0].finish_reason is None
    assert rss_bytes() - before < 100 * 2**20
    running.frontend.abort(["huge"])


def test_rejected_messages_are_counted_and_sampled(serve) -> None:
    running = serve()
    count = 10_000
    for index in range(count):
        running.frontend.send_raw(0, [b"\x09", b"\xa1x"] if index % 2 else [b"\x00"])
    # One input socket delivers in order: once the echo is answered, every message was read.
    assert running.frontend.call_utility("echo", ["done"], timeout=120.0) == ["done"]
    violations = running.engine.violations
    assert violations.total == count
    assert violations.counts == {"request_types.unknown-byte-rejected": count // 2,
                                 "frames.frame-count": count // 2}
    assert len(violations) == VIOLATIONS_KEPT


def test_kept_violation_messages_are_cut() -> None:
    violations = Violations()
    kept = violations.record("frames.abort-payload", "got " + "x" * 10**6)
    assert len(kept) <= VIOLATION_MESSAGE_CHARS + 20
    assert list(violations) == [("frames.abort-payload", kept)]


def test_one_poll_per_batch(serve, monkeypatch) -> None:
    running = serve()
    inputs = [channel.socket for channel in running.engine._inputs]
    socket_polls: list[Any] = []
    original = zmq.Socket.poll

    def counting_poll(self: zmq.Socket, *args: Any, **kwargs: Any) -> int:
        if any(self is sock for sock in inputs):
            socket_polls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(zmq.Socket, "poll", counting_poll)
    for index in range(20):
        running.frontend.add_request(generation_request(f"r{index}", max_tokens=1))
    finished = set()
    while len(finished) < 20:
        for output in running.frontend.get_output(TIMEOUT).outputs:
            finished.add(output.request_id)
    # The engine's one poll (transport.wait_readable) covers every input socket; it never
    # polls one by one.
    assert socket_polls == []


class FailingStep(ReferenceEngine):
    def _step(self) -> None:
        raise RuntimeError("a bug in the generation step")


def test_fatal_error_sends_engine_core_dead(serve) -> None:
    running = serve(FailingStep)
    running.frontend.add_request(generation_request("r"))
    with pytest.raises(EngineDeadError):
        running.frontend.get_output(TIMEOUT)
    running.thread.join(TIMEOUT)
    assert running.status == EXIT_DIED


def test_sigterm_while_the_engine_is_built_stops_it_cleanly() -> None:
    """The signal arrives before the engine exists; it must still stop it (exit 0), not kill
    the process with the default handler."""
    script = (
        "import os, signal, sys\n"
        "from enginewire.reference import engine\n"
        "init = engine.ReferenceEngine.__init__\n"
        "def slow_init(self, options):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    init(self, options)\n"
        "engine.ReferenceEngine.__init__ = slow_init\n"
        "options = engine.EngineOptions(input_addresses=['tcp://127.0.0.1:9'],\n"
        "                               output_addresses=['tcp://127.0.0.1:9'])\n"
        "sys.exit(engine.main(options))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True)
    assert done.returncode == EXIT_CLEAN, done.stderr.decode()[-2000:]


def test_lazy_tokens_match_the_list() -> None:
    from enginewire.reference.engine import scripted_token

    for prompt in ([], [5], [1, 2, 3]):
        assert [scripted_token(prompt, k) for k in range(7)] == scripted_tokens(prompt, 7)
    assert structs.FinishReason.LENGTH != structs.FinishReason.STOP
