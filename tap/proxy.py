"""The tap's ZMQ forwarding: the only part of the tap that touches sockets.

The tap stands where the engines think the front end is. Two ways in:

- **handshake** (``upstream_handshake``): it binds ``listen_handshake`` (a ROUTER, as the front
  end's handshake end) and, for each engine identity that speaks there, connects a DEALER with
  the same identity to the front end's real handshake address. When the front end's init
  message for an engine comes back, the tap binds, for that engine, one input DEALER of its
  own per input address the init names, and one output PULL per output address (shared by
  every engine told that address), each on the front end's transport (a fresh ipc path, or tcp
  port 0 on the same host); it re-encodes the init with those addresses in their place and
  sends it on: the rest of the session flows through the tap. Nothing else is changed; the init
  is recorded as the front end sent it.
- **direct** (``upstream_inputs`` / ``upstream_outputs``, for engines given addresses
  directly, as vLLM's ``client_addresses``): it binds ``listen_inputs`` / ``listen_outputs``
  at once, each standing for the upstream address at the same position.

Forwarding. The input and output channels, the hot path, are forwarded by C devices
(pyzmq's ``monitored_queue``, one thread per device, running without the GIL), so no Python
runs between a frame's arrival and its forwarding:

- output: per upstream output address, the tap's PULL -> a PUSH connected to the front end's
  PULL;
- input, handshake way: per engine identity and upstream input address, the DEALER the tap
  bound for that engine alone <-> a DEALER with the engine's identity connected to the front
  end's input ROUTER (connected when the init is rewritten). The front end's ROUTER sees the
  engine's identity, the engine sees a peer that answers; both directions run through one
  device;
- input, direct way: engines share the address, so the tap cannot know their identities before
  they speak: a ROUTER of the tap receives ``[identity, payload...]`` and the tap's Python loop
  writes the payload through a DEALER with that identity (made at the identity's first message:
  the engine always speaks first there), and back.

The handshake channel (where the init is rewritten), the DP coordinator's channels and the
direct way's input channel are forwarded by the tap's Python loop, on a thread of its own: a
poll, then every waiting message forwarded (``zmq.Frame``, no copy).

DP coordinator (data parallel > 1), where the init names its addresses: coordinator_input
(the coordinator's XPUB): the tap binds an XPUB for the engines and connects an XSUB to the
coordinator; subscriptions go up, START_DP_WAVE and READY come down. coordinator_output (the
coordinator's PULL): the tap binds a PULL and connects a PUSH, like the output channel. The
front end's stats publisher (``frontend_stats_publish_address``) is front end <-> coordinator
traffic that engines never see and the init does not carry: it is left as it is, unless a
caller puts the tap there itself (:meth:`Tap.add_coordinator` with ``stats_publish``: an XPUB
for the front ends, an XSUB connected to the coordinator).

Capture. Every device and the Python loop send a copy of each message they forward (a device
right after forwarding it, in C; the Python loop right before), prefixed with a tag naming its
channel, sender and identity, into an inproc queue: the copy is a reference to the same ZMQ
message (no copy of a large payload), the queue has no high-water mark, and a send on it never
waits, so a capture that falls behind never slows forwarding (the copies wait in memory
meanwhile) and no message is left out of it. A merger
(``zmq.proxy_steerable``, in C) takes the copies in the order they come, microseconds after
each forward, into one queue; the capture thread reads that queue in batches (it lets
copies gather for :data:`BATCH_S` after one wakes it), at nice :data:`CAPTURE_NICE` on Linux,
so the engine, the front end and the forwarding threads get the CPU first. It turns each copy
into a :class:`Record` (``t_ns``: when it read the copy) and hands it to ``record`` at once, in
the order merged: within a channel and direction, the order forwarded; across channels (each
forwarded by its own thread), the order the copies reached the merger, the forwarding order
unless the merger was kept off the CPU for longer than a peer takes to answer. Then, whenever
no copy is waiting, it hands the oldest record not yet observed to ``observer`` (the decoder):
at most ``max_behind`` records wait for it; a record that comes while that many wait is not
observed (counted in :attr:`Tap.unobserved`), never dropped from ``record`` nor from
forwarding.

:class:`Tap` starts its threads at :meth:`start`; every wait is bounded, and :meth:`close`
stops the devices (terminating their context), hands over what was captured, closes every
socket and removes the ipc files it bound.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.devices import monitored_queue

from enginewire.reference.addresses import bind_ipc, ipc_address
from enginewire.reference.transport import ChannelSocket, open_socket

from .capture import Record
from .rewrite import rewrite_init

Observer = Callable[[Record], None]

POLL_MS = 50
#: Most captured records waiting for the observer; a record captured while that many wait is
#: not observed (:attr:`Tap.unobserved`): the decoder runs at most this far behind.
MAX_BEHIND = 1024

#: Seconds the capture thread lets copies gather after one wakes it: it reads them in batches
#: (a wakeup per batch, not per message: CPU the engine and the front end keep).
BATCH_S = 0.002
#: Niceness of the capture thread (recording and decoding) on Linux: the kernel gives the
#: engine, the front end and the forwarding threads the CPU first.
CAPTURE_NICE = 19

_ids = itertools.count()


def local_address_like(upstream: str) -> str:
    """A fresh address on the transport of ``upstream``: an ipc path, or tcp port 0 on the
    same host."""
    if upstream.startswith("tcp://"):
        host = upstream[len("tcp://"):].rsplit(":", 1)[0]
        return f"tcp://{host}:0"
    return ipc_address()


@dataclass
class TapConfig:
    """Where the tap listens and where the front end is (see the module docstring)."""

    listen_handshake: str | None = None
    upstream_handshake: str | None = None
    listen_inputs: Sequence[str] = ()
    upstream_inputs: Sequence[str] = ()
    listen_outputs: Sequence[str] = ()
    upstream_outputs: Sequence[str] = ()

    def __post_init__(self) -> None:
        handshake = self.upstream_handshake is not None
        direct = bool(self.upstream_inputs or self.upstream_outputs)
        if handshake == direct:
            raise ValueError("a tap forwards either a handshake address or input/output "
                             "addresses, exactly one of the two")
        if handshake and self.listen_handshake is None:
            self.listen_handshake = local_address_like(self.upstream_handshake or "")
        if direct:
            if len(self.upstream_inputs) != len(self.upstream_outputs):
                raise ValueError("as many upstream inputs as outputs (one pair per client), "
                                 f"got {len(self.upstream_inputs)} and "
                                 f"{len(self.upstream_outputs)}")
            self.listen_inputs = list(self.listen_inputs) or [
                local_address_like(a) for a in self.upstream_inputs]
            self.listen_outputs = list(self.listen_outputs) or [
                local_address_like(a) for a in self.upstream_outputs]
            if (len(self.listen_inputs) != len(self.upstream_inputs)
                    or len(self.listen_outputs) != len(self.upstream_outputs)):
                raise ValueError("one listen address per upstream address")


@dataclass
class _Input:
    """The direct way's input channel, forwarded by the Python loop."""

    router: ChannelSocket
    upstream: str
    #: identity -> DEALER connected upstream with that identity.
    dealers: dict[bytes, ChannelSocket] = field(default_factory=dict)


@dataclass
class _Device:
    """A C device forwarding between ``listen`` (the engines' end) and ``upstream`` (the front
    end's), sending a tagged copy of each message to ``capture``."""

    listen: ChannelSocket
    upstream: ChannelSocket
    capture: zmq.Socket[Any]
    #: Tags of messages from upstream (the front end) and from listen (the engines).
    from_upstream: bytes
    from_listen: bytes
    thread: threading.Thread | None = None

    def run(self, tap: Tap) -> None:
        try:
            monitored_queue(self.upstream.socket, self.listen.socket, self.capture,
                            self.from_upstream, self.from_listen)
        except zmq.ContextTerminated:
            pass
        except BaseException as exc:  # the thread's only report
            tap.error = exc
        finally:
            self.close()

    def close(self) -> None:
        self.listen.close(linger=0)
        self.upstream.close(linger=0)
        # The copies already sent stay readable (inproc, linger unset: not discarded).
        self.capture.close()


class Tap:
    """A running tap (see the module docstring). ``record`` gets every forwarded message as a
    :class:`Record` as soon as the capture thread reads its copy; ``observer`` gets them in
    the same order when no copy is waiting, at most ``max_behind`` behind (:attr:`unobserved`
    counts those it did not get). Both run on the capture thread, never on a forwarding path,
    and must not raise; records still waiting when the tap stops are handed over before
    :meth:`close` returns."""

    def __init__(self, config: TapConfig, observer: Observer | None = None, *,
                 record: Observer | None = None, max_behind: int = MAX_BEHIND) -> None:
        self.config = config
        self.observer = observer
        self.record = record
        self.max_behind = max_behind
        #: The forwarding sockets' context (terminated first at close: it stops the devices).
        self._ctx = zmq.Context()
        #: The capture's context (inproc copies; terminated once they are all read).
        self._capture_ctx = zmq.Context()
        base = f"inproc://enginewire-tap-capture-{next(_ids)}"
        self._capture_address = base + "-in"
        #: The merger (a C proxy): every copy, in the order it reaches it -> ``_capture``.
        self._merge_in = self._capture_ctx.socket(zmq.PULL)
        self._merge_in.setsockopt(zmq.RCVHWM, 0)
        self._merge_in.bind(self._capture_address)
        self._capture = self._capture_ctx.socket(zmq.PULL)
        self._capture.setsockopt(zmq.RCVHWM, 0)
        self._capture.bind(base + "-out")
        self._merge_out = self._capture_ctx.socket(zmq.PUSH)
        self._merge_out.setsockopt(zmq.SNDHWM, 0)
        self._merge_out.connect(base + "-out")
        self._merge_control = self._capture_ctx.socket(zmq.PAIR)
        self._merge_control.bind(base + "-control")
        self._merge_command = self._capture_ctx.socket(zmq.PAIR)
        self._merge_command.connect(base + "-control")
        self._merger: threading.Thread | None = None
        #: The Python loop's own capture end.
        self._loop_capture = self._capture_socket()
        #: tag -> (channel, sender, identity) of the copies, and back.
        self._tags: dict[bytes, tuple[str, str, bytes | None]] = {}
        self._tag_of: dict[tuple[str, str, bytes | None], bytes] = {}
        self._sockets: list[ChannelSocket] = []
        self._devices: list[_Device] = []
        self._poller = zmq.Poller()
        #: socket -> handler(frames)
        self._handlers: dict[zmq.Socket[Any], Callable[[list[zmq.Frame]], None]] = {}
        self._inputs: dict[str, _Input] = {}
        #: (upstream input address, engine identity) -> the input device for that engine.
        self._input_devices: dict[tuple[str, bytes], _Device] = {}
        self._outputs: dict[str, _Device] = {}
        #: (channel, coordinator's address) -> the tap's bound socket there.
        self._coordinator: dict[tuple[str, str], ChannelSocket] = {}
        self._hs_router: ChannelSocket | None = None
        self._hs_dealers: dict[bytes, ChannelSocket] = {}
        self._stop = threading.Event()
        self._devices_stopped = threading.Event()
        self._started = False
        self._thread: threading.Thread | None = None
        self._capture_thread: threading.Thread | None = None
        self._t0 = time.monotonic_ns()
        self.error: BaseException | None = None
        #: Messages captured (every message forwarded, once its copy was read).
        self.forwarded = 0
        #: Captured records the observer did not get (it was ``max_behind`` behind).
        self.unobserved = 0
        #: Most records that waited for the observer at once.
        self.most_behind = 0
        self._unobserved: deque[Record] = deque()
        try:
            if config.upstream_handshake is not None:
                assert config.listen_handshake is not None
                self._hs_router = self._open("handshake", "frontend", config.listen_handshake)
                self._watch(self._hs_router, self._from_engine_handshake)
            for listen, upstream in zip(config.listen_inputs, config.upstream_inputs,
                                        strict=True):
                self._add_direct_input(upstream, listen)
            for listen, upstream in zip(config.listen_outputs, config.upstream_outputs,
                                        strict=True):
                self._add_output(upstream, listen)
        except BaseException:
            self.close()
            raise

    # --- addresses -----------------------------------------------------------------------

    @property
    def handshake_address(self) -> str | None:
        """Where engines connect their handshake DEALER (give engines this address)."""
        return self._hs_router.address if self._hs_router is not None else None

    @property
    def input_addresses(self) -> list[str]:
        """The tap's input addresses: the direct way's, then one per engine and upstream
        address (the handshake way's)."""
        return ([i.router.address for i in self._inputs.values()]
                + [d.listen.address for d in list(self._input_devices.values())])

    @property
    def output_addresses(self) -> list[str]:
        return [d.listen.address for d in list(self._outputs.values())]

    # --- sockets -------------------------------------------------------------------------

    def _open(self, channel: str, role: str, address: str,
              identity: bytes | None = None) -> ChannelSocket:
        sock = open_socket(self._ctx, channel, role, address, identity=identity)
        self._sockets.append(sock)
        return sock

    def _capture_socket(self) -> zmq.Socket[Any]:
        """A PUSH into the capture: no high-water mark, so a send never waits."""
        sock = self._capture_ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(self._capture_address)
        return sock

    def _tag(self, channel: str, sender: str, identity: bytes | None) -> bytes:
        key = (channel, sender, identity)
        tag = self._tag_of.get(key)
        if tag is None:
            tag = self._tag_of[key] = len(self._tag_of).to_bytes(4, "big")
            self._tags[tag] = key
        return tag

    def _watch(self, sock: ChannelSocket, handler: Callable[[list[zmq.Frame]], None]) -> None:
        self._poller.register(sock.socket, zmq.POLLIN)
        self._handlers[sock.socket] = handler

    def _add_device(self, listen: ChannelSocket, upstream: ChannelSocket, channel: str,
                    identity: bytes | None) -> _Device:
        device = _Device(listen, upstream, self._capture_socket(),
                         self._tag(channel, "frontend", identity),
                         self._tag(channel, "engine", identity))
        self._devices.append(device)
        if self._started:
            self._start_device(device)
        return device

    def _start_device(self, device: _Device) -> None:
        device.thread = threading.Thread(target=device.run, args=(self,), daemon=True,
                                         name=f"enginewire-tap-{device.listen.channel}")
        device.thread.start()

    def _add_direct_input(self, upstream: str, listen: str) -> _Input:
        router = self._open("input", "frontend", listen)
        found = self._inputs[upstream] = _Input(router, upstream)
        self._watch(router, functools.partial(self._from_engine_input, found))
        return found

    def _add_engine_input(self, upstream: str, identity: bytes) -> _Device:
        """The input device of the engine ``identity`` for the front end's ``upstream``."""
        found = self._input_devices.get((upstream, identity))
        if found is None:
            sock = self._ctx.socket(zmq.DEALER)
            listen = None
            try:
                # As the front end's ROUTER, without routing: this address is one engine's.
                sock.setsockopt(zmq.RCVHWM, 0)
                sock.setsockopt(zmq.SNDHWM, 0)
                bind_ipc(sock, local_address_like(upstream))
                listen = ChannelSocket(sock, "input", "frontend",
                                       sock.getsockopt_string(zmq.LAST_ENDPOINT), True)
                up = open_socket(self._ctx, "input", "engine", upstream, identity=identity)
            except BaseException:
                if listen is not None:
                    listen.close(linger=0)
                else:
                    sock.close(linger=0)
                raise
            found = self._input_devices[(upstream, identity)] = self._add_device(
                listen, up, "input", identity)
        return found

    def _add_output(self, upstream: str, listen: str | None = None) -> _Device:
        found = self._outputs.get(upstream)
        if found is None:
            pull = open_socket(self._ctx, "output", "frontend",
                               listen or local_address_like(upstream))
            try:
                push = open_socket(self._ctx, "output", "engine", upstream)
            except BaseException:
                pull.close(linger=0)
                raise
            found = self._outputs[upstream] = self._add_device(pull, push, "output", None)
        return found

    def _add_coordinator(self, channel: str, upstream: str) -> ChannelSocket:
        found = self._coordinator.get((channel, upstream))
        if found is not None:
            return found
        # The far end of a coordinator channel: the engines', or the front ends' on the
        # stats channel.
        far = "frontend" if channel == "stats_publish" else "engine"
        listen = self._open(channel, "coordinator", local_address_like(upstream))
        up = self._open(channel, far, upstream)
        self._coordinator[(channel, upstream)] = listen

        def far_side(frames: list[zmq.Frame]) -> None:
            self._observe(channel, far, None, frames)
            up.socket.send_multipart(frames, copy=False)

        self._watch(listen, far_side)
        if channel in ("coordinator_input", "stats_publish"):

            def coordinator_side(frames: list[zmq.Frame]) -> None:
                self._observe(channel, "coordinator", None, frames)
                listen.socket.send_multipart(frames, copy=False)

            self._watch(up, coordinator_side)
        return listen

    def add_coordinator(self, channel: str, upstream: str) -> str:
        """Stand for the DP coordinator's ``upstream`` address of ``channel``
        (``coordinator_input``, ``coordinator_output``, or ``stats_publish``, the channel the
        init does not carry: front ends are given it directly) and return the address to give
        the engines or front ends instead. Call before :meth:`start`."""
        return self._add_coordinator(channel, upstream).address

    # --- the Python loop -------------------------------------------------------------------

    def _observe(self, channel: str, sender: str, identity: bytes | None,
                 frames: Sequence[zmq.Frame]) -> None:
        """Send a copy of a message the Python loop is about to forward to the capture: before
        forwarding it, so that no answer to it (forwarded by a device, on another thread) can
        reach the capture first."""
        self._loop_capture.send_multipart([self._tag(channel, sender, identity), *frames],
                                          copy=False)

    def _from_engine_handshake(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        dealer = self._hs_dealers.get(identity)
        if dealer is None:
            assert self.config.upstream_handshake is not None
            dealer = self._hs_dealers[identity] = self._open(
                "handshake", "engine", self.config.upstream_handshake, identity)
            self._watch(dealer, functools.partial(self._from_frontend_handshake, identity))
        self._observe("handshake", "engine", identity, frames[1:])
        dealer.socket.send_multipart(frames[1:], copy=False)

    def _from_frontend_handshake(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        assert self._hs_router is not None
        out: list[Any] = list(frames)
        if len(frames) == 1:
            out = [self._rewrite_init(frames[0].bytes, identity)]
        self._observe("handshake", "frontend", identity, frames)
        self._hs_router.socket.send_multipart([identity, *out], copy=False)

    def _rewrite_init(self, payload: bytes, identity: bytes) -> bytes:
        """The init payload for the engine ``identity`` with the tap's own input/output
        addresses in place of the front end's, binding them on first sight
        (:func:`.rewrite.rewrite_init`)."""

        def substitute(channel: str, upstream: str) -> str:
            if channel == "input":
                return self._add_engine_input(upstream, identity).listen.address
            if channel == "output":
                return self._add_output(upstream).listen.address
            return self._add_coordinator(channel, upstream).address

        return rewrite_init(payload, substitute)

    def _from_engine_input(self, forward: _Input, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        dealer = forward.dealers.get(identity)
        if dealer is None:
            dealer = forward.dealers[identity] = self._open("input", "engine", forward.upstream,
                                                            identity)
            self._watch(dealer, functools.partial(self._from_frontend_input, forward, identity))
        self._observe("input", "engine", identity, frames[1:])
        dealer.socket.send_multipart(frames[1:], copy=False)

    def _from_frontend_input(self, forward: _Input, identity: bytes,
                             frames: list[zmq.Frame]) -> None:
        self._observe("input", "frontend", identity, frames)
        forward.router.socket.send_multipart([identity, *frames], copy=False)

    def poll_once(self, timeout_ms: int = POLL_MS) -> int:
        """The Python loop's step: forward every message waiting on its sockets (one poll for
        the batch of ready sockets). Returns the number forwarded."""
        count = 0
        for sock, _event in self._poller.poll(timeout_ms):
            handler = self._handlers[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                handler(frames)
                count += 1
        return count

    def run(self) -> None:
        """The Python loop: forward until :meth:`stop`; an unexpected error is kept in
        :attr:`error`."""
        try:
            while not self._stop.is_set():
                self.poll_once()
        except BaseException as exc:  # the thread's only report
            self.error = exc

    # --- the capture -----------------------------------------------------------------------

    def _read_copies(self, sock: zmq.Socket[Any] | None = None) -> int:
        """Read every copy waiting (on ``sock``, the merger's output by default): each to
        ``record`` and, unless ``max_behind`` wait, queued for the observer. Returns the
        number read."""
        sock = self._capture if sock is None else sock
        count = 0
        while True:
            try:
                message = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return count
            count += 1
            self.forwarded += 1
            channel, sender, identity = self._tags[message[0]]
            found = Record(time.monotonic_ns() - self._t0, channel, sender, identity,
                           tuple(message[1:]))
            if self.record is not None:
                self.record(found)
            if self.observer is None:
                continue
            if len(self._unobserved) >= self.max_behind:
                self.unobserved += 1
            else:
                self._unobserved.append(found)
                self.most_behind = max(self.most_behind, len(self._unobserved))

    def _merge(self) -> None:
        """The merger's thread: forward copies in C until told ``TERMINATE``."""
        try:
            zmq.proxy_steerable(self._merge_in, self._merge_out, None, self._merge_control)
        except zmq.ContextTerminated:
            pass
        except BaseException as exc:  # the thread's only report
            self.error = exc

    def _capture_loop(self) -> None:
        """Read copies in batches; observe one record whenever none is waiting. After the
        devices and the merger stopped: read what is left, and observe everything queued."""
        if CAPTURE_NICE and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):  # this thread only (Linux: per thread)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CAPTURE_NICE)
        try:
            while not self._devices_stopped.is_set():
                if self._read_copies():
                    continue
                if self._unobserved:
                    self._observe_one()
                elif self._capture.poll(POLL_MS):
                    time.sleep(BATCH_S)
            self._read_copies()
            self._read_copies(self._merge_in)  # what the merger had not forwarded yet
            while self._unobserved:
                self._observe_one()
        except BaseException as exc:  # the thread's only report
            self.error = exc
            # Keep reading (and dropping) so the copies do not pile up in memory.
            while not self._devices_stopped.wait(POLL_MS / 1000):
                self._drain_discarding(self._capture)
            self._drain_discarding(self._capture, self._merge_in)

    def _drain_discarding(self, *sockets: zmq.Socket[Any]) -> None:
        for sock in sockets:
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break

    def _observe_one(self) -> None:
        record = self._unobserved.popleft()
        if self.observer is not None:
            self.observer(record)

    # --- life ------------------------------------------------------------------------------

    def start(self) -> Tap:
        """Start the devices, the Python loop and the capture."""
        self._started = True
        for device in self._devices:
            self._start_device(device)
        self._merger = threading.Thread(target=self._merge, daemon=True,
                                        name="enginewire-tap-merger")
        self._merger.start()
        self._capture_thread = threading.Thread(target=self._capture_loop, daemon=True,
                                                name="enginewire-tap-capture")
        self._capture_thread.start()
        self._thread = threading.Thread(target=self.run, name="enginewire-tap", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the Python loop and the devices, hand over what was captured, close every
        socket (ipc files removed) and both contexts."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the tap loop did not stop within {timeout} s")
            self._thread = None
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        self._loop_capture.close()
        for device in self._devices:
            if device.thread is None:
                device.close()  # never started: nothing else closes its sockets
        # Terminating the context wakes every device with ETERM: each closes its sockets.
        self._ctx.term()
        for device in self._devices:
            if device.thread is not None:
                device.thread.join(timeout)
                if device.thread.is_alive():
                    raise TimeoutError(f"a tap device did not stop within {timeout} s")
        self._devices.clear()
        if self._merger is not None:
            self._merge_command.send(b"TERMINATE")
            self._merger.join(timeout)
            if self._merger.is_alive():
                raise TimeoutError(f"the tap's capture merger did not stop within {timeout} s")
            self._merger = None
        self._devices_stopped.set()
        if self._capture_thread is not None:
            self._capture_thread.join(timeout + 5.0)
            if self._capture_thread.is_alive():
                raise TimeoutError(f"the tap's capture did not stop within {timeout + 5} s")
            self._capture_thread = None
        for inproc in (self._capture, self._merge_in, self._merge_out, self._merge_control,
                       self._merge_command):
            inproc.close(linger=0)
        self._capture_ctx.term()

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
