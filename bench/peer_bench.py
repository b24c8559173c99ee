"""The peers bench: ADD to first output, over ipc:// and tcp://.

A round trip starts just before the front end sends an ADD (a request for one token, built
beforehand) and ends when that request's first output is back in the front end's hands.

- ``reference``: :class:`~enginewire.reference.frontend.ReferenceFrontend` with a reference
  engine process (:func:`~enginewire.reference.engine.spawn_engine`), handshake and all.
- ``vllm``: vLLM's own front-end client (``AsyncMPClient``, what vLLM's API server runs) with
  the same reference engine process: vLLM's engine core needs a model, the wire does not. The
  difference between the two is the front end's cost; the engine's is common to both.
- ``router_dealer`` (the ceiling): a bare ROUTER sends the same pre-encoded ADD frames and a
  bare DEALER process answers with pre-encoded output frames over the same socket pair.
- ``reference+tap``: the ``reference`` session through ``enginewire tap``;
  ``router_dealer+proxy`` (the forwarding floor, with it): the ceiling's round trip through a
  ``zmq.proxy`` process, the least two more hops through a process in the middle can cost.
- ``msgspec_peers`` (the codec floor, with ``reference``): peers that encode the ADD and
  decode its outputs with bare msgspec per round trip, over the protocol's own topology (the
  outputs on PUSH/PULL), and nothing else: what the reference's layers cost is its ratio to it.

Each session is set up once for the run (the constructor starts the processes, ``wait_ready``
waits for them, so several sessions start side by side); a round sends ``round_trips``
requests one after the other and reports the median and the 99th percentile. Every wait has a
timeout; engines and the other child processes are stopped and ipc files removed on :meth:`close`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import zmq

from enginewire.bench.results import CODEC_FLOOR, PROXIED, TAPPED

SPAWN = multiprocessing.get_context("spawn")
PROMPT = (1, 2, 3)
#: The identity of the bare DEALER (engine rank 0, 2 bytes little-endian).
BARE_IDENTITY = b"\x00\x00"
STOP = b"STOP"


def free_tcp_address(host: str = "127.0.0.1") -> str:
    """A tcp:// address on a port that was free a moment ago (for peers that cannot bind
    port 0 and report the port back, like vLLM's client)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return f"tcp://{host}:{probe.getsockname()[1]}"


def _address(transport: str) -> str:
    from enginewire.reference.addresses import ipc_address

    return ipc_address() if transport == "ipc" else free_tcp_address()


class PeerError(RuntimeError):
    """A round trip failed: no output in time, or an output for another request."""


def _check(request_id: str, outputs: Any) -> None:
    got = [o.request_id for o in outputs.outputs]
    if got != [request_id]:
        raise PeerError(f"expected the output of {request_id!r}, got outputs for {got}")


class ReferencePeers:
    """The reference front end and a reference engine process."""

    name = "reference"

    def __init__(self, transport: str, timeout: float, step_delay: float = 0.0) -> None:
        from enginewire.reference.engine import EngineOptions, spawn_engine
        from enginewire.reference.frontend import ReferenceFrontend

        self.timeout = timeout
        address = "tcp://127.0.0.1:0" if transport == "tcp" else None  # None: fresh ipc paths
        self.frontend = ReferenceFrontend(1, handshake_address=address, input_address=address,
                                          output_address=address)
        self.engine = None
        try:
            self.engine = spawn_engine(
                EngineOptions(handshake_address=self._engine_handshake(transport), tokens=1,
                              step_delay=step_delay),
                stderr=subprocess.DEVNULL)
        except BaseException:
            self.close()
            raise

    def _engine_handshake(self, transport: str) -> str:
        """The handshake address the engine is given: the front end's own."""
        return str(self.frontend.handshake_address)

    def wait_ready(self) -> None:
        """The handshake, in short slices so an engine that died is noticed at once."""
        from enginewire.reference.errors import ProtocolTimeout

        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.frontend.wait_ready(min(0.5, max(0.0, deadline - time.monotonic())))
                return
            except ProtocolTimeout:
                if self.engine is not None and not self.engine.alive():
                    raise PeerError(f"the reference engine exited with status "
                                    f"{self.engine.wait(1)} before the handshake") from None
                if time.monotonic() >= deadline:
                    raise

    def measure(self, count: int, prefix: str) -> list[float]:
        from enginewire.reference.engine import generation_request

        requests = [generation_request(f"{prefix}-{i}", PROMPT, max_tokens=1)
                    for i in range(count)]
        frontend = self.frontend
        clock = time.perf_counter
        found = []
        for request in requests:
            start = clock()
            frontend.add_request(request)
            outputs = frontend.get_output(self.timeout)
            found.append(clock() - start)
            _check(request.request_id, outputs)
        return found

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop(timeout=10)
        self.frontend.close()


class VllmPeers:
    """vLLM's ``AsyncMPClient`` and a reference engine process."""

    name = "vllm"

    def __init__(self, transport: str, timeout: float, step_delay: float = 0.0) -> None:
        from enginewire.reference.engine import EngineOptions, spawn_engine

        self.timeout = timeout
        self.addresses = {"input_address": _address(transport),
                          "output_address": _address(transport)}
        self.loop = asyncio.new_event_loop()
        self.client: Any = None
        # The engine connects to the client's addresses (retrying until the client binds).
        self.engine = spawn_engine(EngineOptions(
            input_addresses=[self.addresses["input_address"]],
            output_addresses=[self.addresses["output_address"]], tokens=1,
            step_delay=step_delay), stderr=subprocess.DEVNULL)

    def wait_ready(self) -> None:
        """Start the client; it returns once the engine's ready response came."""
        from types import SimpleNamespace

        import vllm.v1.engine.core_client as core_client
        from vllm.config import DeviceConfig, ParallelConfig, VllmConfig
        from vllm.v1.executor import Executor

        config = VllmConfig(device_config=DeviceConfig(device="cpu"),
                            parallel_config=ParallelConfig(data_parallel_size=1))
        # The client reads only these two attributes of the model config; VllmConfig
        # validates assignments, hence object.__setattr__.
        object.__setattr__(config, "model_config",
                           SimpleNamespace(max_model_len=2048, multimodal_config=None))
        # The client waits this module global (default 600 s) for the engine's ready response.
        saved = core_client.VLLM_ENGINE_READY_TIMEOUT_S
        core_client.VLLM_ENGINE_READY_TIMEOUT_S = max(1, int(self.timeout))
        try:
            async def make() -> Any:
                return core_client.AsyncMPClient(config, Executor, False,
                                                 client_addresses=self.addresses)

            self.client = self.loop.run_until_complete(make())
        finally:
            core_client.VLLM_ENGINE_READY_TIMEOUT_S = saved

    def measure(self, count: int, prefix: str) -> list[float]:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine import EngineCoreRequest

        requests = [EngineCoreRequest(
            request_id=f"{prefix}-{i}", prompt_token_ids=list(PROMPT), mm_features=None,
            sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
            arrival_time=time.time(), lora_request=None, cache_salt=None,
            data_parallel_rank=None) for i in range(count)]
        client, timeout = self.client, self.timeout

        async def batch() -> list[float]:
            clock = time.perf_counter
            found = []
            for request in requests:
                start = clock()
                await client.add_request_async(request)
                outputs = await asyncio.wait_for(client.get_output_async(), timeout)
                found.append(clock() - start)
                _check(request.request_id, outputs)
            return found

        return self.loop.run_until_complete(batch())

    def close(self) -> None:
        from enginewire.reference.addresses import remove_ipc_file

        try:
            if self.client is not None:
                client, self.client = self.client, None

                async def shutdown() -> None:
                    client.shutdown()

                self.loop.run_until_complete(shutdown())
        finally:
            self.engine.stop(timeout=10)
            if not self.loop.is_closed():
                self.loop.close()
            # vLLM's client leaves its ipc socket files behind (transport.ipc-files-removed).
            for address in self.addresses.values():
                remove_ipc_file(address)


def answer_until_stop(dealer: zmq.Socket[Any], conn: Connection, parent: int,
                      answer: Callable[[list[Any]], object], *, copy: bool) -> None:
    """The loop of a bench engine process: HELLO on its connected ``dealer``, "connected" on
    ``conn``, then every message (its frames as ``bytes``, or as ``zmq.Frame`` without
    ``copy``) handed to ``answer``, until ``STOP`` or until process ``parent`` is no longer the
    parent."""
    dealer.send(b"HELLO")
    conn.send("connected")
    while True:
        if not dealer.poll(200):
            if os.getppid() != parent:
                return
            continue
        frames: list[Any] = dealer.recv_multipart(0, copy)
        first = frames[0]
        if (first.bytes if isinstance(first, zmq.Frame) else first) == STOP:
            return
        answer(frames)


def bare_dealer(address: str, reply: Sequence[bytes], conn: Connection) -> None:
    """The ceiling's engine: answer every message with ``reply`` until ``STOP`` or until the
    parent process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    parent = os.getppid()
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, BARE_IDENTITY)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        answer_until_stop(sock, conn, parent, lambda _frames: sock.send_multipart(reply),
                          copy=False)
    finally:
        sock.close(linger=0)
        context.term()
        conn.close()


class BarePeers:
    """A bare ROUTER here and a bare DEALER process exchanging pre-encoded frames."""

    name = "router_dealer"

    def __init__(self, transport: str, timeout: float) -> None:
        from enginewire.reference import codec, structs
        from enginewire.reference.engine import generation_request

        self.timeout = timeout
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.process: Any = None
        self.address = ""
        self.identity = BARE_IDENTITY
        try:
            self.socket.bind(_bind_address(transport))
            self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
            self.request = [bytes(memoryview(f).cast("B")) for f in codec.encode(
                "add", generation_request("bench-bare", PROMPT, max_tokens=1))]
            outputs = structs.EngineCoreOutputs(
                engine_index=0, timestamp=time.monotonic(), finished_requests=["bench-bare"],  # type: ignore[arg-type]
                outputs=[structs.EngineCoreOutput(request_id="bench-bare",
                                                  new_token_ids=[PROMPT[0] + 1],
                                                  finish_reason=structs.FinishReason.LENGTH)])
            reply = [bytes(memoryview(f).cast("B")) for f in codec.encode("outputs", outputs)]
            self._start_peer(transport, reply)
        except BaseException:
            self.close()
            raise

    def _start_peer(self, transport: str, reply: list[bytes]) -> None:
        """Start the DEALER process that answers with ``reply``."""
        self._spawn(bare_dealer, self._dealer_address(transport), reply,
                    name="enginewire-bench-dealer")

    def _spawn(self, target: Callable[..., None], *args: Any, name: str) -> None:
        """Start ``target(*args, conn)`` as the peer process; :meth:`wait_ready` waits for
        what it reports on ``conn``."""
        parent, child = SPAWN.Pipe(duplex=False)
        self.process = SPAWN.Process(target=target, args=(*args, child), daemon=True,
                                     name=name)
        self.process.start()
        child.close()
        self._started = parent

    def _dealer_address(self, transport: str) -> str:
        """Where the DEALER process connects: the ROUTER itself."""
        return self.address

    def wait_ready(self) -> None:
        if not self._started.poll(self.timeout * 3):
            raise PeerError("the bare DEALER process did not start in time")
        self._started.recv()
        self._started.close()
        if not self.socket.poll(int(self.timeout * 1000)):
            raise PeerError("no HELLO from the bare DEALER")
        self.identity = self.socket.recv_multipart()[0]

    def measure(self, count: int, prefix: str) -> list[float]:
        sock, timeout_ms = self.socket, int(self.timeout * 1000)
        message = [self.identity, *self.request]
        clock = time.perf_counter
        found = []
        for _ in range(count):
            start = clock()
            sock.send_multipart(message)
            if not sock.poll(timeout_ms):
                raise PeerError(f"no reply within {self.timeout} s")
            sock.recv_multipart()
            found.append(clock() - start)
        return found

    def close(self) -> None:
        from enginewire.reference.addresses import remove_ipc_file

        if self.process is not None and self.process.is_alive():
            try:
                self.socket.send_multipart([self.identity, STOP])
            except zmq.ZMQError:
                pass
            self.process.join(5)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(5)
        self.socket.close(linger=0)
        self.context.term()
        if self.address:
            remove_ipc_file(self.address)


def msgspec_engine(input_address: str, output_address: str, conn: Connection) -> None:
    """The codec floor's engine: a DEALER with the engine's identity and a PUSH, as the
    protocol has them. Each ADD is decoded by bare msgspec into the reference
    ``EngineCoreRequest`` and answered with one ``EngineCoreOutputs`` for that request (one
    token, finished), encoded by bare msgspec; until ``STOP`` or until the parent process is
    gone."""
    import msgspec

    from enginewire.reference import structs

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, also on Ctrl-C
    parent = os.getppid()
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder(structs.EngineCoreRequest).decode
    output, outputs, length = (structs.EngineCoreOutput, structs.EngineCoreOutputs,
                               structs.FinishReason.LENGTH)
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, BARE_IDENTITY)
    push = context.socket(zmq.PUSH)
    for sock in (dealer, push):
        sock.setsockopt(zmq.LINGER, 0)

    def answer(frames: list[bytes]) -> None:
        request = decode(frames[1])
        prompt = request.prompt_token_ids or PROMPT
        push.send(encode(outputs(
            engine_index=0, timestamp=time.monotonic(),
            finished_requests=[request.request_id],  # type: ignore[arg-type]
            outputs=[output(request_id=request.request_id, new_token_ids=[prompt[0] + 1],
                            finish_reason=length)])))

    try:
        dealer.connect(input_address)
        push.connect(output_address)
        answer_until_stop(dealer, conn, parent, answer, copy=True)
    finally:
        dealer.close(linger=0)
        push.close(linger=0)
        context.term()
        conn.close()


class MsgspecPeers(BarePeers):
    """The codec floor: the ceiling's sockets plus a PULL for the outputs (the protocol's
    topology), with the ADD encoded and the outputs decoded here by bare msgspec per round
    trip, and a DEALER/PUSH process doing the same on its side (:func:`msgspec_engine`). The
    least a pair of Python peers speaking these messages costs; its ratio to the ceiling is the
    floor under the reference's, and the reference's ratio to it is what the reference's
    layers (sessions, checks, events) cost."""

    name = CODEC_FLOOR
    pull: Any = None
    output_address = ""

    def _start_peer(self, transport: str, reply: list[bytes]) -> None:
        import msgspec

        from enginewire.reference import structs

        self.pull = self.context.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(_bind_address(transport))
        self.output_address = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(structs.EngineCoreOutputs)
        self._spawn(msgspec_engine, self.address, self.output_address,
                    name="enginewire-bench-msgspec-engine")

    def measure(self, count: int, prefix: str) -> list[float]:
        from enginewire.reference.engine import generation_request

        requests = [generation_request(f"{prefix}-{i}", PROMPT, max_tokens=1)
                    for i in range(count)]
        sock, pull, timeout_ms = self.socket, self.pull, int(self.timeout * 1000)
        identity, type_frame = self.identity, self.request[0]
        encode, decode = self.encoder.encode, self.decoder.decode
        clock = time.perf_counter
        found = []
        for request in requests:
            start = clock()
            sock.send_multipart([identity, type_frame, encode(request)])
            if not pull.poll(timeout_ms):
                raise PeerError(f"no outputs within {self.timeout} s")
            outputs = decode(pull.recv())
            found.append(clock() - start)
            _check(request.request_id, outputs)
        return found

    def close(self) -> None:
        from enginewire.reference.addresses import remove_ipc_file

        if self.pull is not None:
            self.pull.close(linger=0)
        super().close()
        if self.output_address:
            remove_ipc_file(self.output_address)


def bare_proxy(router_address: str, listen: str, conn: Connection) -> None:
    """The forwarding floor's middle: ``zmq.proxy`` (C, no Python per message) between a
    DEALER connected to the bench's ROUTER (with the bare DEALER's identity) and a DEALER bound
    at ``listen`` for the bare DEALER process. Reports the bound address, then forwards until
    it is terminated."""
    context = zmq.Context()
    front = context.socket(zmq.DEALER)
    front.setsockopt(zmq.IDENTITY, BARE_IDENTITY)
    back = context.socket(zmq.DEALER)
    for sock in (front, back):
        sock.setsockopt(zmq.LINGER, 0)
    try:
        back.bind(listen)
        front.connect(router_address)
        conn.send(back.getsockopt_string(zmq.LAST_ENDPOINT))
        conn.close()
        zmq.proxy(front, back)
    except zmq.ContextTerminated:
        pass
    finally:
        front.close(linger=0)
        back.close(linger=0)
        context.term()


class ProxiedBarePeers(BarePeers):
    """The ceiling's round trip with ``zmq.proxy`` in a process of its own between ROUTER and
    DEALER: two more hops, each forwarded in C. Its ratio to the bare round trip is the least
    any forwarding process in the middle (``enginewire tap``) can cost."""

    name = PROXIED
    proxy: Any = None
    listen = ""

    def _dealer_address(self, transport: str) -> str:
        parent, child = SPAWN.Pipe(duplex=False)
        self.proxy = SPAWN.Process(target=bare_proxy,
                                   args=(self.address, _bind_address(transport), child),
                                   daemon=True, name="enginewire-bench-proxy")
        self.proxy.start()
        child.close()
        if not parent.poll(self.timeout * 3):
            raise PeerError("the zmq.proxy process did not start in time")
        self.listen = str(parent.recv())
        parent.close()
        return self.listen

    def close(self) -> None:
        from enginewire.reference.addresses import remove_ipc_file

        try:
            super().close()
        finally:
            if self.proxy is not None and self.proxy.is_alive():
                self.proxy.terminate()
                self.proxy.join(5)
                if self.proxy.is_alive():
                    self.proxy.kill()
                    self.proxy.join(5)
            if self.listen:
                remove_ipc_file(self.listen)


class TappedPeers(ReferencePeers):
    """The reference session with ``enginewire tap`` between the front end and the engine.

    The tap runs as its own process (as a user runs it), decoding and checking every frame
    and printing its line to /dev/null; the engine gets the tap's handshake address. Its
    figure, divided by ``reference``'s of the same round, is the tap's cost (goal: 1.3x).
    """

    name = TAPPED
    tap: Any = None
    listen: str | None = None

    def _engine_handshake(self, transport: str) -> str:
        """The tap's listening address, with the tap started in front of the front end."""
        self.listen = _address(transport)
        self.tap = spawn_tap(["--handshake", str(self.frontend.handshake_address),
                              "--listen", self.listen])
        return self.listen

    def close(self) -> None:
        try:
            super().close()
        finally:
            stop_tap(self.tap)
            from enginewire.reference.addresses import remove_ipc_file

            if self.listen is not None:
                remove_ipc_file(self.listen)


def spawn_tap(argv: Sequence[str], lines: bool = False) -> subprocess.Popen[bytes]:
    """``enginewire tap ARGV`` as a child process, its lines to /dev/null (or to a pipe, with
    ``lines``)."""
    import sys

    return subprocess.Popen([sys.executable, "-m", "enginewire", "tap", *argv],
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE if lines else subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop_tap(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM (the tap closes its sockets and removes its ipc files), then SIGKILL."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


class _LineCount:
    """Counts the lines a child writes to its stdout pipe, on a thread, with the time each
    count was reached."""

    def __init__(self, stream: Any) -> None:
        self.count = 0
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        for _line in stream:
            with self.changed:
                self.count += 1
                self.changed.notify_all()

    def wait_for(self, count: int, timeout: float) -> float:
        """Wait until ``count`` lines came; return the time (``perf_counter``) it was seen."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.count >= count, timeout):
                raise PeerError(f"the tap printed {self.count} lines of {count} within "
                                f"{timeout} s")
        return time.perf_counter()


class TapOutputRate:
    """Steps per second ``enginewire tap`` forwards (``tap_steps_per_s``) and decodes, checks
    and prints (``tap_decoded_steps_per_s``), for EngineCoreOutputs of ``outputs_per_step``
    request outputs each (one token each), sent back to back by a PUSH into the tap and read
    from the front end's PULL behind it: the tap's ceiling rates.

    Like the other sessions, the tap process starts once for the run (the constructor starts
    it, :meth:`wait_ready` waits until one message went through it and was printed) and each
    round :meth:`measure` times ``steps`` steps; ``steps`` stays under the tap's
    ``--max-behind``, so every step is decoded.
    """

    def __init__(self, transport: str, outputs_per_step: int, steps: int,
                 timeout: float) -> None:
        from enginewire.reference import codec, structs

        self.steps, self.timeout = steps, timeout
        outputs = structs.EngineCoreOutputs(
            engine_index=0, timestamp=time.monotonic(),
            outputs=[structs.EngineCoreOutput(request_id=f"bench-{i}", new_token_ids=[i])
                     for i in range(outputs_per_step)])
        self.message = [bytes(memoryview(f).cast("B"))
                        for f in codec.encode("outputs", outputs)]
        self.context = zmq.Context()
        self.pull = self.context.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.push = self.context.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        upstream_in, listen_in, self.listen_out = (_address(transport) for _ in range(3))
        self.addresses = [upstream_in, listen_in, self.listen_out]
        self.tap: subprocess.Popen[bytes] | None = None
        self.printed: _LineCount | None = None
        self.sent = 0
        try:
            self.pull.bind(_bind_address(transport))
            upstream_out = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
            self.addresses.append(upstream_out)
            self.tap = spawn_tap(["--input", upstream_in, "--output", upstream_out,
                                  "--listen-input", listen_in, "--listen-output",
                                  self.listen_out, "--max-behind", str(steps + 1)], lines=True)
            self.printed = _LineCount(self.tap.stdout)
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        """One message through first: the tap is up and connected both ways."""
        assert self.printed is not None
        self.push.connect(self.listen_out)
        deadline = time.monotonic() + self.timeout * 3
        while not self.pull.poll(100):
            self.push.send_multipart(self.message)
            self.sent += 1
            if time.monotonic() > deadline:
                raise PeerError("the tap forwarded nothing in time")
        while self.pull.poll(200):
            self.pull.recv_multipart()
        self.printed.wait_for(self.sent, self.timeout)

    def measure(self) -> dict[str, float]:
        assert self.printed is not None
        pull, timeout_ms = self.pull, int(self.timeout * 1000)
        start = time.perf_counter()
        for _ in range(self.steps):
            self.push.send_multipart(self.message)
        self.sent += self.steps
        for _ in range(self.steps):
            if not pull.poll(timeout_ms):
                raise PeerError(f"the tap forwarded no output within {self.timeout} s")
            pull.recv_multipart()
        forwarded = time.perf_counter() - start
        decoded = self.printed.wait_for(self.sent, self.timeout * 3) - start
        return {"tap_steps_per_s": self.steps / forwarded,
                "tap_decoded_steps_per_s": self.steps / decoded}

    def close(self) -> None:
        from enginewire.reference.addresses import remove_ipc_file

        stop_tap(self.tap)
        if self.printed is not None:
            self.printed.thread.join(5)
        if self.tap is not None and self.tap.stdout is not None:
            self.tap.stdout.close()
        self.push.close(linger=0)
        self.pull.close(linger=0)
        self.context.term()
        for address in self.addresses:
            remove_ipc_file(address)


def _bind_address(transport: str) -> str:
    from enginewire.reference.addresses import ipc_address

    return ipc_address() if transport == "ipc" else "tcp://127.0.0.1:0"


#: The sessions whose engine is the reference engine (``step_delay`` applies to them).
ENGINE_SESSIONS = ("reference", "vllm", TAPPED)
#: Contender name -> session class.
SESSIONS: dict[str, type] = {"reference": ReferencePeers, "vllm": VllmPeers,
                             "router_dealer": BarePeers, TAPPED: TappedPeers,
                             PROXIED: ProxiedBarePeers, CODEC_FLOOR: MsgspecPeers}
