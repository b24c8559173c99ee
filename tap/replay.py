"""``enginewire replay``: play one side of a recording against a live target and compare.

``against="engine"``: the replay is the front end. It binds a handshake ROUTER (when the
recording has a handshake), an input ROUTER and an output PULL, starts the target engines
(``launch``: one per engine rank of the recording) and sends the recorded front-end messages
in order, each as recorded (the init with the replay's addresses in place of the recorded
ones: :func:`.rewrite.rewrite_init`), each only once the target has said everything the
recorded engines had said before it (:meth:`.facts.Facts.uncovered`). ``against="frontend"``:
the replay is the engine cores. The target front end binds the addresses it is given; the
replay connects (a handshake DEALER per rank, then the input and output addresses the init
names, or the given ones without a handshake) and sends the recorded engine messages in
order, each once the front end has said what it had said before it. The target is driven by
its own command (the recording must come from the same scenario).

Either way the target's messages are decoded (:class:`.annotate.Annotator`), reduced to facts
(:mod:`.facts`) and compared with the recording's: :class:`ReplayResult` holds the first
divergence (both values) and every clause the target's messages broke. A wait that runs out
(``timeout``) or a target fact that can no longer grow ends the replay at that point; the
divergence is reported from what came.
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from enginewire.reference.addresses import ipc_address, remove_ipc_file
from enginewire.reference.transport import ChannelSocket, open_socket

from .annotate import Annotation, Annotator
from .capture import Record
from .facts import Divergence, Facts, first_divergence
from .rewrite import rewrite_init

POLL_MS = 20


@dataclass
class Addresses:
    """Where the target connects (against an engine) or binds (against a front end)."""

    handshake: str | None
    input: str
    output: str


#: Starts the target for ``(addresses, rank)`` and stops it on exit.
Launch = Callable[[Addresses, int], contextlib.AbstractContextManager[Any]]


@dataclass
class ReplayResult:
    divergence: Divergence | None
    violations: list[Annotation] = field(default_factory=list)
    sent: int = 0
    received: int = 0
    #: Why the replay ended early (a wait ran out, a target fact stopped growing).
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None and not self.violations


def _ranks(records: Sequence[Record], annotator: Annotator) -> list[int]:
    ranks = {annotator.codec.decode_identity(r.identity) for r in records
             if r.identity is not None}
    return sorted(ranks) or [0]


class _Replay:
    """State shared by both directions: what the target said, and waiting on it."""

    def __init__(self, records: Sequence[Record], played: str, release: str | None,
                 timeout: float) -> None:
        self.records = list(records)
        self.played = played
        self.annotator = Annotator(release, explain_skew=False)
        self.timeout = timeout
        self.got = Facts()
        self.result = ReplayResult(None)
        self.ctx = zmq.Context()
        self.sockets: list[ChannelSocket] = []
        self.poller = zmq.Poller()
        self.handlers: dict[Any, Callable[[list[bytes]], None]] = {}
        self._t0 = time.monotonic_ns()
        self.recorded_call_ids: list[int] = []

    def open(self, channel: str, role: str, address: str, identity: bytes | None = None,
             handler: Callable[[list[bytes]], None] | None = None) -> ChannelSocket:
        sock = open_socket(self.ctx, channel, role, address, identity=identity)
        self.sockets.append(sock)
        if handler is not None:
            self.poller.register(sock.socket, zmq.POLLIN)
            self.handlers[sock.socket] = handler
        return sock

    def observe(self, channel: str, identity: bytes | None, frames: list[bytes]) -> None:
        sender = "engine" if self.played == "frontend" else "frontend"
        record = Record(time.monotonic_ns() - self._t0, channel, sender, identity,
                        tuple(frames))
        annotation = self.annotator.annotate(record)
        if annotation.violations:
            self.result.violations.append(annotation)
        self.got.add(annotation, self.result.received)
        self.result.received += 1

    def pump(self, timeout_ms: int) -> None:
        for sock, _ in self.poller.poll(timeout_ms):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handlers[sock](frames)

    def wait_for(self, expected: Facts) -> bool:
        """Pump until the target covers ``expected``; False (and ``stopped`` set) when the
        wait runs out or the fact waited for can no longer grow."""
        deadline = time.monotonic() + self.timeout
        while True:
            key = self.got.uncovered(expected)
            if key is None:
                return True
            if self.got.final(key):
                self.result.stopped = f"the target's {key!r} is final and differs"
                return False
            if time.monotonic() > deadline:
                self.result.stopped = f"waited {self.timeout} s for {key!r}"
                return False
            self.pump(POLL_MS)

    def run(self, send: Callable[[Record], None]) -> ReplayResult:
        """Send the played side's records in order, each after the target covered what the
        other side had said before it (a request: as many tokens as it had then); then
        compare with the whole recording."""
        recorded = Facts()
        progress = Facts()  # the other side's facts, as they stood at each message
        waits: list[tuple[Record, Facts]] = []
        for index, record in enumerate(self.records):
            annotation = self.annotator.annotate(record)
            recorded.add(annotation, index)
            if record.sender == self.played:
                waits.append((record, Facts(dict(progress.values),
                                            dict(progress.first_seen))))
            else:
                progress.add(annotation, index)
        expected = _other(recorded, self.played)
        self.recorded_call_ids = recorded.call_ids
        for record, before in waits:
            if not self.wait_for(before):
                break
            send(self._answer_by_target_call_id(record))
            self.result.sent += 1
        else:
            self.wait_for(expected)
        self.result.divergence = first_divergence(expected, self.got)
        return self.result

    def _answer_by_target_call_id(self, record: Record) -> Record:
        """A recorded utility reply, addressed to the call_id the target gave the same call
        (its n-th call, where the recording's was the n-th); any other record as it is."""
        if self.played != "engine" or record.channel != "output":
            return record
        annotation = self.annotator.annotate(record)
        if annotation.kind != "utility_reply":
            return record
        value = annotation.value
        utility = value.utility_output
        try:
            nth = self.recorded_call_ids.index(utility.call_id)
            call_id = self.got.call_ids[nth]
        except (ValueError, IndexError):
            return record
        if call_id == utility.call_id:
            return record
        value = msgspec.structs.replace(
            value, utility_output=msgspec.structs.replace(utility, call_id=call_id))
        frames = tuple(bytes(f) for f in self.annotator.codec.encode("utility_reply", value))
        return Record(record.t_ns, record.channel, record.sender, record.identity, frames)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.ctx.term()


_ENGINE_KEYS = frozenset({"hello", "ready", "ready_response", "request", "utility", "dead"})


def _other(recorded: Facts, played: str) -> Facts:
    """The recorded facts of the side not played (the target's)."""
    engine_side = played == "frontend"
    keep = Facts()
    for key, value in recorded.values.items():
        if (key[0] in _ENGINE_KEYS) == engine_side:
            keep.values[key] = value
            keep.first_seen[key] = recorded.first_seen[key]
    return keep


def replay_against_engine(records: Sequence[Record], launch: Launch, *,
                          release: str | None = None, timeout: float = 10.0) -> ReplayResult:
    """Play the recording's front end against engines started by ``launch``."""
    replay = _Replay(records, "frontend", release, timeout)
    try:
        with contextlib.ExitStack() as stack:
            handshake = None
            if any(r.channel == "handshake" for r in records):
                handshake = replay.open(
                    "handshake", "frontend", ipc_address(),
                    handler=lambda f: replay.observe("handshake", f[0], f[1:]))
            inputs = replay.open("input", "frontend", ipc_address(),
                                 handler=lambda f: replay.observe("input", f[0], f[1:]))
            output = replay.open("output", "frontend", ipc_address(),
                                 handler=lambda f: replay.observe("output", None, f))
            addresses = Addresses(handshake.address if handshake else None, inputs.address,
                                  output.address)
            for rank in _ranks(records, replay.annotator):
                stack.enter_context(launch(addresses, rank))

            def send(record: Record) -> None:
                frames = list(record.frames)
                if record.channel == "handshake":
                    assert handshake is not None and record.identity is not None
                    ours = {"input": inputs.address, "output": output.address}
                    frames = [rewrite_init(frames[0], lambda ch, a: ours.get(ch, a))] + \
                        frames[1:]
                    handshake.socket.send_multipart([record.identity, *frames])
                elif record.channel == "input":
                    assert record.identity is not None
                    inputs.socket.send_multipart([record.identity, *frames])

            return replay.run(send)
    finally:
        replay.close()


def replay_against_frontend(records: Sequence[Record], launch: Launch, *,
                            release: str | None = None,
                            timeout: float = 10.0) -> ReplayResult:
    """Play the recording's engines against a front end started by ``launch`` (rank 0's
    launch starts it; it binds the addresses given)."""
    replay = _Replay(records, "engine", release, timeout)
    has_handshake = any(r.channel == "handshake" for r in records)
    addresses = Addresses(ipc_address() if has_handshake else None, ipc_address(),
                          ipc_address())
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(launch(addresses, 0))
            handshakes: dict[bytes, ChannelSocket] = {}
            inputs: dict[bytes, ChannelSocket] = {}
            outputs: list[ChannelSocket] = []

            def connect(identity: bytes, input_address: str, output_address: str) -> None:
                if identity not in inputs:
                    inputs[identity] = replay.open(
                        "input", "engine", input_address, identity,
                        handler=functools.partial(replay.observe, "input", identity))
                if not outputs:
                    outputs.append(replay.open("output", "engine", output_address))

            def on_init(identity: bytes, frames: list[bytes]) -> None:
                from .rewrite import init_addresses

                found = init_addresses(frames[0]) if frames else None
                if found and found[0] and found[1]:
                    connect(identity, found[0][0], found[1][0])
                replay.observe("handshake", identity, frames)

            def send(record: Record) -> None:
                identity = record.identity
                if record.channel == "handshake":
                    assert identity is not None and addresses.handshake is not None
                    sock = handshakes.get(identity)
                    if sock is None:
                        sock = handshakes[identity] = replay.open(
                            "handshake", "engine", addresses.handshake, identity,
                            handler=functools.partial(on_init, identity))
                    sock.socket.send_multipart(list(record.frames))
                elif record.channel == "input":
                    assert identity is not None
                    if not has_handshake:
                        connect(identity, addresses.input, addresses.output)
                    inputs[identity].socket.send_multipart(list(record.frames))
                elif record.channel == "output":
                    if not has_handshake and not outputs:
                        outputs.append(replay.open("output", "engine", addresses.output))
                    outputs[0].socket.send_multipart(list(record.frames))

            return replay.run(send)
    finally:
        replay.close()
        # The target bound these; one killed on a timeout may leave its socket files.
        for address in (addresses.handshake, addresses.input, addresses.output):
            if address is not None:
                remove_ipc_file(address)


# --- launching targets -----------------------------------------------------------------------


@contextlib.contextmanager
def reference_engine(addresses: Addresses, rank: int, **options: Any) -> Iterator[Any]:
    """The reference engine core as a child process (``options``: more EngineOptions)."""
    from enginewire.reference.engine import EngineOptions, spawn_engine

    if addresses.handshake is not None:
        opts = EngineOptions(handshake_address=addresses.handshake, rank=rank, **options)
    else:
        opts = EngineOptions(input_addresses=[addresses.input],
                             output_addresses=[addresses.output], rank=rank, **options)
    with spawn_engine(opts, stderr=subprocess.DEVNULL) as engine:
        yield engine


@contextlib.contextmanager
def command_target(template: str, addresses: Addresses, rank: int,
                   once: bool = False) -> Iterator[Any]:
    """A target started from a shell-style command template: ``{handshake}``, ``{input}``,
    ``{output}`` and ``{rank}`` are replaced; ``enginewire ...`` runs this interpreter's
    enginewire. With ``once``, only rank 0 starts a process (a front end)."""
    if once and rank != 0:
        yield None
        return
    argv = [part.format(handshake=addresses.handshake or "", input=addresses.input,
                        output=addresses.output, rank=rank)
            for part in shlex.split(template)]
    if argv and argv[0] == "enginewire":
        argv = [sys.executable, "-m", "enginewire", *argv[1:]]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
