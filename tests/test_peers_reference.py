"""The reference front end and reference engines as separate processes, over ipc and tcp."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from enginewire.reference import codec, structs
from enginewire.reference.addresses import ipc_address, ipc_path, remove_ipc_file
from enginewire.reference.engine import (
    EXIT_CLEAN,
    EXIT_DIED,
    EXIT_STARTUP_FAILED,
    EngineOptions,
    EngineProcess,
    generation_request,
    scripted_tokens,
    spawn_engine,
)
from enginewire.reference.errors import EngineDeadError, HandshakeError, ProtocolTimeout
from enginewire.reference.frontend import ReferenceFrontend, UtilityCallError

TIMEOUT = 20.0
FinishReason = structs.FinishReason


def tcp_addresses() -> dict[str, str]:
    return {name: "tcp://127.0.0.1:0"
            for name in ("handshake_address", "input_address", "output_address")}


@pytest.fixture
def frontends() -> Iterator[Callable[..., ReferenceFrontend]]:
    opened: list[ReferenceFrontend] = []

    def make(*args, **kwargs) -> ReferenceFrontend:
        frontend = ReferenceFrontend(*args, **kwargs)
        opened.append(frontend)
        return frontend

    yield make
    for frontend in opened:
        frontend.close()


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Callable[..., EngineProcess]]:
    """Spawn reference engines whose logs go to tmp_path; every one is stopped at the end."""
    started: list[tuple[EngineProcess, object]] = []

    def spawn(**options) -> EngineProcess:
        rank = options.get("rank", 0)
        log = open(tmp_path / f"engine-{rank}-{len(started)}.log", "wb")
        process = spawn_engine(EngineOptions(**options), stderr=log)
        process.log_path = Path(log.name)
        started.append((process, log))
        return process

    yield spawn
    for process, log in started:
        process.stop(timeout=10)
        log.close()
        assert not process.alive()


def collect(frontend: ReferenceFrontend, request_ids: set[str]) -> dict[str, tuple[list, int]]:
    """Read outputs until every request finished: id -> (tokens, finish_reason)."""
    tokens: dict[str, list[int]] = {r: [] for r in request_ids}
    reasons: dict[str, int] = {}
    engines: dict[str, int] = {}
    while set(reasons) != request_ids:
        outputs = frontend.get_output(TIMEOUT)
        for output in outputs.outputs:
            tokens[output.request_id] += list(output.new_token_ids)
            engines.setdefault(output.request_id, outputs.engine_index)
            assert engines[output.request_id] == outputs.engine_index
            if output.finish_reason is not None:
                reasons[output.request_id] = output.finish_reason
                assert output.request_id in (outputs.finished_requests or ())
    return {r: (tokens[r], reasons[r], engines[r]) for r in request_ids}


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_handshake_and_generation(transport, frontends, engines) -> None:
    frontend = frontends(1, **(tcp_addresses() if transport == "tcp" else {}))
    assert frontend.handshake_address.startswith(f"{transport}://")
    assert not frontend.handshake_address.endswith(":0")
    engine = engines(handshake_address=frontend.handshake_address, tokens=5)
    frontend.wait_ready(TIMEOUT)
    response = frontend.ready_responses[0]
    assert response.data_parallel_rank == 0 and response.max_model_len == 4096
    assert frontend.session.states() == {0: "RUNNING"}

    frontend.add_request(generation_request("a", [7, 8], max_tokens=3))
    frontend.add_request(generation_request("b", [1000], max_tokens=None))
    results = collect(frontend, {"a", "b"})
    assert results["a"] == (scripted_tokens([7, 8], 3), FinishReason.LENGTH, 0)
    assert results["b"] == (scripted_tokens([1000], 5), FinishReason.STOP, 0)
    assert frontend.session.engines[0].requests == set()

    paths = [ipc_path(a) for a in (frontend.handshake_address, frontend.input_address,
                                   frontend.output_address)]
    assert engine.stop() == EXIT_CLEAN
    frontend.close()
    assert not [p for p in paths if p and os.path.exists(p)], "ipc files left behind"


def test_abort_mid_generation(frontends, engines) -> None:
    frontend = frontends(1)
    engines(handshake_address=frontend.handshake_address, tokens=10_000, step_delay=0.02)
    frontend.wait_ready(TIMEOUT)
    frontend.add_request(generation_request("long"))
    first = frontend.get_output(TIMEOUT)
    assert first.outputs[0].request_id == "long" and first.outputs[0].finish_reason is None
    frontend.abort(["long"])
    assert frontend.session.rank_of_request("long") is None
    while True:
        outputs = frontend.get_output(TIMEOUT)
        [output] = outputs.outputs
        if output.finish_reason is not None:
            break
        assert output.new_token_ids, "only the abort output comes without tokens"
    assert output.finish_reason == FinishReason.ABORT and output.new_token_ids == []
    assert list(outputs.finished_requests) == ["long"]
    with pytest.raises(ProtocolTimeout):
        frontend.get_output(0.3)


def test_utility_echo_and_failure(frontends, engines) -> None:
    frontend = frontends(1)
    engines(handshake_address=frontend.handshake_address)
    frontend.wait_ready(TIMEOUT)
    assert frontend.call_utility("echo", [1, "two", [3, 4], {"k": None}], timeout=TIMEOUT) == [
        1, "two", [3, 4], {"k": None}
    ]
    assert frontend.call_utility("echo", [], timeout=TIMEOUT) == []
    with pytest.raises(UtilityCallError) as caught:
        frontend.call_utility("no_such_method", [1], timeout=TIMEOUT)
    assert caught.value.failure_message.startswith("Call to no_such_method method failed:")
    assert frontend.session.pending_calls == {}
    # Requests still work after a failed call.
    frontend.add_request(generation_request("after", max_tokens=1))
    assert collect(frontend, {"after"})["after"][1] == FinishReason.LENGTH


def test_two_engines_dp(frontends, engines) -> None:
    frontend = frontends(2, **tcp_addresses())
    for rank in (1, 0):
        engines(handshake_address=frontend.handshake_address, rank=rank, dp_size=2, tokens=2)
    frontend.wait_ready(TIMEOUT)
    assert {r: resp.data_parallel_rank for r, resp in frontend.ready_responses.items()} == {
        0: 0, 1: 1
    }
    routed = {f"r{i}": frontend.add_request(generation_request(f"r{i}", [i + 1]))
              for i in range(4)}
    assert sorted(routed.values()) == [0, 0, 1, 1]
    explicit = generation_request("pinned", [9], max_tokens=1, data_parallel_rank=1)
    assert frontend.add_request(explicit) == 1
    results = collect(frontend, {*routed, "pinned"})
    for request_id, rank in routed.items():
        index = int(request_id[1:])
        assert results[request_id] == (scripted_tokens([index + 1], 2), FinishReason.STOP, rank)
    assert results["pinned"][2] == 1
    for rank in (0, 1):
        assert frontend.call_utility("echo", [rank], rank, TIMEOUT) == [rank]


def test_garbage_to_engine_is_logged_and_engine_keeps_serving(frontends, engines) -> None:
    frontend = frontends(1)
    engine = engines(handshake_address=frontend.handshake_address)
    frontend.wait_ready(TIMEOUT)
    garbage = [
        [b"\x07", b"\x90"],  # unknown type byte
        [b"\x04", b"\x90"],  # internal sentinel byte
        [b"\x00\x00", b"\x90"],  # type frame of two bytes
        [b"\x00"],  # type frame without payload
        [b"\x00", b"\xc1"],  # ADD whose payload is not msgpack
        [b"\x00", msgspec.msgpack.encode(["only-an-id"])],  # ADD missing required fields
        [b"\x01", msgspec.msgpack.encode("not-a-list")],  # ABORT with a bad payload
        [b"\x03", msgspec.msgpack.encode([0, "x", "echo"])],  # UTILITY with a bad payload
    ]
    for frames in garbage:
        frontend.send_raw(0, frames)
    frontend.send_raw(0, codec.encode("start_dp_wave", (1, 0)))  # accepted, no answer
    # A request it can decode but not serve gets an ERROR output.
    frontend.add_request(generation_request("zero", max_tokens=0))
    frontend.add_request(generation_request("fine", [5], max_tokens=2))
    results = collect(frontend, {"zero", "fine"})
    assert results["zero"] == ([], FinishReason.ERROR, 0)
    assert results["fine"] == (scripted_tokens([5], 2), FinishReason.LENGTH, 0)
    assert frontend.call_utility("echo", ["still here"], timeout=TIMEOUT) == ["still here"]
    assert engine.alive()
    assert engine.stop() == EXIT_CLEAN
    log = engine.log_path.read_text()
    for clause in (
        "request_types.unknown-byte-rejected",
        "request_types.sentinels-never-on-wire",
        "request_types.one-byte-frame",
        "frames.frame-count",
        "frames.payload-matches-type",
        "structs.array.missing-required-rejected",
    ):
        assert f"[{clause}]" in log, clause
    assert log.count("rejected [") >= len(garbage)


def test_die_utility_sends_engine_core_dead(frontends, engines) -> None:
    frontend = frontends(1)
    engine = engines(handshake_address=frontend.handshake_address, tokens=10_000,
                     step_delay=0.05)
    frontend.wait_ready(TIMEOUT)
    frontend.add_request(generation_request("running"))
    frontend.get_output(TIMEOUT)
    with pytest.raises(EngineDeadError) as caught:
        frontend.call_utility("die", [], timeout=TIMEOUT)
    assert caught.value.clause == "handshake.session.dead-is-final"
    assert frontend.dead and frontend.session.states() == {0: "DEAD"}
    # Outputs that came before the sentinel are still delivered, then the error.
    with pytest.raises(EngineDeadError):
        while True:
            frontend.get_output(TIMEOUT)
    with pytest.raises(EngineDeadError):
        frontend.add_request(generation_request("late"))
    assert engine.wait(TIMEOUT) == EXIT_DIED


def test_signal_death_and_clean_stop(frontends, engines) -> None:
    frontend = frontends(2)
    first = engines(handshake_address=frontend.handshake_address, rank=0)
    second = engines(handshake_address=frontend.handshake_address, rank=1)
    frontend.wait_ready(TIMEOUT)
    # SIGTERM: clean shutdown, no sentinel.
    assert second.stop() == EXIT_CLEAN
    with pytest.raises(ProtocolTimeout):
        frontend.get_output(0.3)
    assert not frontend.dead
    pending = frontend.call_utility_async("echo", 1, engine_index=1)  # nobody will answer
    # SIGUSR1: ENGINE_CORE_DEAD; the sentinel names no engine, so the session is over.
    first.kill_with(signal.SIGUSR1)
    with pytest.raises(EngineDeadError):
        frontend.get_output(TIMEOUT)
    assert isinstance(pending.exception(0), EngineDeadError)
    assert first.wait(TIMEOUT) == EXIT_DIED


def test_without_handshake_channel(frontends, engines) -> None:
    frontend = frontends(1, handshake=False)
    assert frontend.handshake_address is None
    engines(input_addresses=[frontend.input_address],
            output_addresses=[frontend.output_address], tokens=2)
    frontend.wait_ready(TIMEOUT)
    frontend.add_request(generation_request("x", [3]))
    assert collect(frontend, {"x"})["x"] == (scripted_tokens([3], 2), FinishReason.STOP, 0)


def test_an_engine_stops_though_its_ready_response_was_never_delivered() -> None:
    """An engine on a thread (the suite's reference engine surface) whose front end never
    binds holds its ready response on the input DEALER; asked to stop, it still ends (the
    input closes at linger 0: a front end that rejected READY and left first is the same)."""
    from enginewire.conformance.targets.contract import EngineLaunch
    from enginewire.conformance.targets.reference import ReferenceEnginePeer

    engine = ReferenceEnginePeer(EngineLaunch(None, input_addresses=(ipc_address(),),
                                              output_addresses=(ipc_address(),)))
    time.sleep(0.2)  # connected, the ready response queued
    engine.stop(TIMEOUT)
    assert not engine.alive(), "the engine's thread still ran after stop"
    assert (engine.status, engine.error) == (EXIT_CLEAN, None)


def test_frontend_rejects_engine_with_wrong_local_flag(frontends, engines) -> None:
    frontend = frontends(1)
    engine = engines(handshake_address=frontend.handshake_address, local=False,
                     handshake_timeout=1.0)
    with pytest.raises(HandshakeError) as caught:
        frontend.wait_ready(TIMEOUT)
    assert caught.value.clause == "handshake.local-must-match"
    # The engine never gets init: it gives up within its handshake timeout.
    assert engine.wait(TIMEOUT) == EXIT_STARTUP_FAILED
    assert "handshake.engine-init-timeout" in engine.log_path.read_text()


def test_frontend_handshake_timeout(frontends) -> None:
    frontend = frontends(2)
    with pytest.raises(ProtocolTimeout) as caught:
        frontend.wait_ready(0.2)
    assert caught.value.clause == "handshake.frontend.bounded-handshake"


def test_engine_waits_for_ready_response_order(frontends, engines, tmp_path) -> None:
    """The engine's first input message is its ready response (raw ROUTER view)."""
    ctx = zmq.Context()
    try:
        handshake = ctx.socket(zmq.ROUTER)
        handshake.bind("tcp://127.0.0.1:0")
        inputs = ctx.socket(zmq.ROUTER)
        inputs.bind("tcp://127.0.0.1:0")
        outputs = ctx.socket(zmq.PULL)
        outputs.bind("tcp://127.0.0.1:0")
        engine = engines(handshake_address=handshake.getsockopt_string(zmq.LAST_ENDPOINT),
                         rank=3)
        assert handshake.poll(TIMEOUT * 1000)
        identity, hello = handshake.recv_multipart()
        assert identity == b"\x03\x00"
        assert msgspec.msgpack.decode(hello) == {"status": "HELLO", "local": True,
                                                 "headless": False}
        metadata = structs.EngineHandshakeMetadata(
            addresses=structs.EngineZmqAddresses(
                inputs=[inputs.getsockopt_string(zmq.LAST_ENDPOINT)],
                outputs=[outputs.getsockopt_string(zmq.LAST_ENDPOINT)],
            ),
            parallel_config={},
        )
        handshake.send_multipart([identity, *codec.encode("init", metadata)])
        assert inputs.poll(TIMEOUT * 1000)
        first = inputs.recv_multipart()
        assert len(first) == 2 and first[0] == b"\x03\x00"
        response = codec.decode("ready_response", first[1:])
        assert response.data_parallel_rank == 3
        assert handshake.poll(TIMEOUT * 1000)
        identity, ready = handshake.recv_multipart()
        assert msgspec.msgpack.decode(ready)["status"] == "READY"
        assert engine.stop() == EXIT_CLEAN
    finally:
        ctx.destroy(linger=0)


def test_spawned_engine_exits_with_its_parent() -> None:
    """An engine whose parent dies without stopping it stops on its own: no orphans."""
    script = (
        "import os\n"
        "from enginewire.reference.engine import EngineOptions, spawn_engine\n"
        "from enginewire.reference.frontend import ReferenceFrontend\n"
        "tcp = 'tcp://127.0.0.1:0'\n"
        "f = ReferenceFrontend(1, handshake_address=tcp, input_address=tcp, output_address=tcp)\n"
        "p = spawn_engine(EngineOptions(handshake_address=f.handshake_address))\n"
        "f.wait_ready(20)\n"
        "print(p.pid, flush=True)\n"
        "os._exit(0)  # a crash: nothing is stopped or closed\n"
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=TIMEOUT, check=True)
    child = int(parent.stdout.strip())
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the orphaned engine kept running")


# --- the transport facts the spec states, measured on this libzmq ------------------------------


def test_open_socket_applies_the_spec_options() -> None:
    from enginewire.reference.transport import open_socket

    ctx = zmq.Context()
    opened = []
    try:
        router = open_socket(ctx, "input", "frontend", "tcp://127.0.0.1:0")
        opened.append(router)
        dealer = open_socket(ctx, "input", "engine", router.address, identity=b"\x01\x00")
        pull = open_socket(ctx, "output", "frontend", "tcp://127.0.0.1:0")
        push = open_socket(ctx, "output", "engine", pull.address)
        handshake = open_socket(ctx, "handshake", "engine", router.address, identity=b"\x01\x00")
        opened += [dealer, pull, push, handshake]
        assert router.bound and not dealer.bound and not router.address.endswith(":0")
        for sock in (router, dealer):
            assert sock.socket.getsockopt(zmq.SNDHWM) == sock.socket.getsockopt(zmq.RCVHWM) == 0
        assert pull.socket.getsockopt(zmq.RCVHWM) == 0
        assert push.socket.getsockopt(zmq.SNDHWM) == 0
        assert push.socket.getsockopt(zmq.LINGER) == 4000
        assert handshake.socket.getsockopt(zmq.LINGER) == 5000
        assert dealer.socket.getsockopt(zmq.IDENTITY) == b"\x01\x00"
    finally:
        for sock in opened:
            sock.close(linger=0)
        ctx.term()


def _closes_recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int | None]]:
    """Record ``(channel, linger)`` of every ChannelSocket the reference closes."""
    from enginewire.reference.transport import ChannelSocket

    closes: list[tuple[str, int | None]] = []
    close = ChannelSocket.close

    def recording(self: ChannelSocket, linger: int | None = None) -> None:
        closes.append((self.channel, linger))
        close(self, linger)

    monkeypatch.setattr(ChannelSocket, "close", recording)
    return closes


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        time.sleep(0.01)


def test_engine_without_a_bound_front_end_stops_within_the_thread_guard(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process engine whose HELLO waits for a front end that never bound the handshake
    address stops at once: the handshake it gives up drops the unanswered HELLO (linger 0)
    instead of holding its thread for the handshake DEALER's 5000 ms linger
    (transport.handshake-dealer-linger covers the close after READY), well within the 2 s
    tests/conftest.py gives a thread to end after its teardown."""
    from enginewire.conformance.targets.contract import EngineLaunch
    from enginewire.conformance.targets.reference import ReferenceEngines
    from enginewire.reference.session import machine_table

    closes = _closes_recorded(monkeypatch)
    peer = ReferenceEngines().start_engine(
        EngineLaunch(handshake_address=ipc_address(), init_timeout=TIMEOUT))
    try:
        # HELLO is queued on the DEALER once the engine's session has left its first state.
        initial = machine_table("engine").initial
        _wait_for(lambda: peer.engine.session.state != initial or not peer.alive(),
                  "the engine's HELLO")
        assert peer.alive(), f"the engine ended before HELLO: {peer.error!r}"
        peer.stop(timeout=2.0)
        still_running = peer.alive()
    finally:
        peer.stop(timeout=10.0)
    assert not still_running, "the engine's thread still ran 2 s after stop()"
    assert peer.error is None and peer.status == EXIT_CLEAN
    assert closes == [("handshake", 0)]


def test_engine_closes_the_handshake_with_its_linger_after_ready(
        frontends, monkeypatch: pytest.MonkeyPatch) -> None:
    """transport.handshake-dealer-linger: after READY the engine closes its handshake DEALER
    with the spec's linger (5000 ms), so READY reaches a front end that is there."""
    from enginewire.conformance.targets.contract import EngineLaunch
    from enginewire.conformance.targets.reference import ReferenceEngines
    from enginewire.reference.transport import channel_end

    closes = _closes_recorded(monkeypatch)
    frontend = frontends(engine_count=1)
    peer = ReferenceEngines().start_engine(
        EngineLaunch(handshake_address=frontend.handshake_address, init_timeout=TIMEOUT))
    try:
        frontend.wait_ready(TIMEOUT)
    finally:
        peer.stop(timeout=10.0)
    assert not peer.alive()
    # None: the socket's own LINGER, the spec's 5000 ms (test_open_socket_applies_the_spec_options).
    assert closes[0] == ("handshake", None)
    assert channel_end("handshake", "engine").options["LINGER"] == 5000


def test_ipc_file_outlives_zmq_close_but_not_channel_close() -> None:
    from enginewire.reference.transport import open_socket

    ctx = zmq.Context()
    try:
        raw_address = ipc_address()
        raw = ctx.socket(zmq.PULL)
        raw.bind(raw_address)
        raw.close(linger=0)
        assert os.path.exists(ipc_path(raw_address)), "libzmq removed its ipc file after all"
        remove_ipc_file(raw_address)
        ours = open_socket(ctx, "output", "frontend", ipc_address())
        assert os.path.exists(ipc_path(ours.address))
        ours.close()
        assert not os.path.exists(ipc_path(ours.address))
    finally:
        ctx.term()


def _identity_dealer(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"\x07\x00")
    sock.connect(address)
    return sock


@pytest.mark.parametrize("handover", [False, True])
def test_second_connection_with_identity_in_use(handover: bool) -> None:
    """Without ROUTER_HANDOVER a second connection claiming a live identity is ignored."""
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_HANDOVER, int(handover))
        address = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
        old = _identity_dealer(ctx, address)
        old.send(b"old")
        assert router.poll(5000) and router.recv_multipart() == [b"\x07\x00", b"old"]
        new = _identity_dealer(ctx, address)
        new.send(b"new")
        heard = router.poll(500)
        assert heard == handover
        if heard:
            assert router.recv_multipart() == [b"\x07\x00", b"new"]
    finally:
        ctx.destroy(linger=0)


def test_identity_free_again_once_old_connection_closed() -> None:
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        address = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
        monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        old = _identity_dealer(ctx, address)
        old.send(b"old")
        assert router.poll(5000) and router.recv_multipart() == [b"\x07\x00", b"old"]
        old.close(linger=0)
        assert monitor.poll(5000), "the ROUTER never saw the old connection go"
        recv_monitor_message(monitor)
        router.poll(50)  # let the ROUTER process the pipe's termination
        restarted = _identity_dealer(ctx, address)
        restarted.send(b"restarted")
        assert router.poll(5000) and router.recv_multipart() == [b"\x07\x00", b"restarted"]
        router.disable_monitor()
        monitor.close(linger=0)
    finally:
        ctx.destroy(linger=0)


def test_command_line_frontend_with_spawned_engines() -> None:
    def run(*args: str) -> list[dict]:
        done = subprocess.run(
            [sys.executable, "-m", "enginewire", "frontend", "--engines", "2", "--spawn",
             "--timeout", str(TIMEOUT), *args],
            capture_output=True, text=True, timeout=2 * TIMEOUT,
        )
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    lines = run("send", "--count", "2", "--max-tokens", "2", "--prompt", "4,5")
    by_request: dict[str, list[int]] = {}
    for line in lines:
        by_request.setdefault(line["request_id"], []).extend(line["new_token_ids"])
    assert by_request == {"cli-0": scripted_tokens([4, 5], 2), "cli-1": scripted_tokens([4, 5], 2)}
    assert {line["engine"] for line in lines} == {0, 1}
    assert [line["finish_reason"] for line in lines if line["finish_reason"]] == ["LENGTH"] * 2
    assert run("utility", "echo", "7", "x") == [
        {"engine": 0, "method": "echo", "result": [7, "x"]},
        {"engine": 1, "method": "echo", "result": [7, "x"]},
    ]


class _Wrapped:
    """A socket wrapper (as a test or a mutant puts in place): only the sugar methods."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames, copy=True):  # type: ignore[no-untyped-def]
        self.sent.append([bytes(f) for f in frames])
        self.sock.send_multipart(frames, copy=copy)

    def recv_multipart(self, flags=0):  # type: ignore[no-untyped-def]
        return self.sock.recv_multipart(flags)

    def getsockopt(self, option):  # type: ignore[no-untyped-def]
        return self.sock.getsockopt(option)


def test_transport_frames_helpers() -> None:
    """send_frames, receive_frames and readable over a socket pair, on pyzmq's own sockets and
    through a wrapper: the same frames arrive, the first two as bytes, the rest as frames that
    hold the same bytes; readable says whether a message waits."""
    from enginewire.reference.transport import readable, receive_frames, send_frames

    context = zmq.Context()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        a.bind("inproc://transport-helpers")
        b.connect("inproc://transport-helpers")
        big = memoryview(bytes(range(256)) * 512)
        message = [b"\x00", b"payload", big]
        assert not readable(b)
        send_frames(a, message, copy=False)
        assert b.poll(5000)
        assert readable(b)
        got = receive_frames(b)
        assert [type(f) for f in got[:2]] == [bytes, bytes] and isinstance(got[2], zmq.Frame)
        assert [bytes(f) for f in got] == [bytes(f) for f in message]
        assert not readable(b)
        wrapped = _Wrapped(a)
        send_frames(wrapped, [b"x", b"y"])
        assert wrapped.sent == [[b"x", b"y"]]
        assert b.poll(5000) and readable(_Wrapped(b))
        assert [bytes(f) for f in receive_frames(_Wrapped(b))] == [b"x", b"y"]
        assert not readable(_Wrapped(b))
    finally:
        a.close(linger=0)
        b.close(linger=0)
        context.term()
