"""The tap's ZMQ forwarding loop: the only part of the tap that touches sockets.

The tap stands where the engines think the front end is. Two ways in:

- **handshake** (``upstream_handshake``): it binds ``listen_handshake`` (a ROUTER, as the front
  end's handshake end) and, for each engine identity that speaks there, connects a DEALER with
  the same identity to the front end's real handshake address. When the front end's init
  message comes back, the tap binds one input ROUTER and one output PULL of its own for each
  input and output address the init names (same transport as the front end's: a fresh ipc
  path, or tcp port 0 on the same host), re-encodes the init with those addresses in their
  place, and sends it on: the rest of the session flows through the tap. Nothing else is
  changed; the init is recorded as the front end sent it.
- **direct** (``upstream_inputs`` / ``upstream_outputs``, for engines given addresses
  directly, as vLLM's ``client_addresses``): it binds ``listen_inputs`` / ``listen_outputs``
  at once, each standing for the upstream address at the same position.

Per channel: input, engine -> front end: the tap's ROUTER receives ``[identity, payload...]``
and writes the payload through a DEALER with that identity, connected to the front end's
input ROUTER (made at the identity's first message: the engine always speaks first there);
front end -> engine: that DEALER receives ``[type, payload...]`` and the tap's ROUTER writes
``[identity, type, payload...]``. Output: the tap's PULL receives and a PUSH connected to the
front end's PULL writes. Frames are forwarded as received (``zmq.Frame``, no copy) before the
observer sees them, and the observer sees them when no socket has a message waiting, so
decoding never sits between a frame and its forwarding, nor between one forward and the next.

DP coordinator (data parallel > 1), where the init names its addresses: coordinator_input
(the coordinator's XPUB): the tap binds an XPUB for the engines and connects an XSUB to the
coordinator; subscriptions go up, START_DP_WAVE and READY come down. coordinator_output (the
coordinator's PULL): the tap binds a PULL and connects a PUSH, like the output channel. The
front end's stats publisher (``frontend_stats_publish_address``) is front end <-> coordinator
traffic that engines never see and the init does not carry: it is left as it is, unless a
caller puts the tap there itself (:meth:`Tap.add_coordinator` with ``stats_publish``: an XPUB
for the front ends, an XSUB connected to the coordinator).

:class:`Tap` runs on a thread of its own (:meth:`start` / :meth:`close`); every wait is a
bounded poll, and :meth:`close` closes every socket and removes the ipc files it bound.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from enginewire.reference.addresses import ipc_address
from enginewire.reference.transport import ChannelSocket, open_socket

from .capture import Record
from .rewrite import rewrite_init

Observer = Callable[[Record], None]

POLL_MS = 50
#: Most forwarded messages waiting for the observer before it is served between forwards (in
#: a flood the tap then decodes one message per message forwarded: it runs at its decoding
#: rate, not ahead of it).
MAX_UNOBSERVED = 64


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
    router: ChannelSocket
    upstream: str
    #: identity -> DEALER connected upstream with that identity.
    dealers: dict[bytes, ChannelSocket] = field(default_factory=dict)


@dataclass
class _Output:
    pull: ChannelSocket
    push: ChannelSocket


class Tap:
    """A running tap. ``observer`` gets every forwarded message as a :class:`Record`, in the
    order forwarded, on the tap's thread, when no socket has a message waiting (forwarding
    comes first: decoding a message never delays the next one); it must not raise. Records
    still waiting when the loop stops are handed over before :meth:`run` returns."""

    def __init__(self, config: TapConfig, observer: Observer | None = None) -> None:
        self.config = config
        self.observer = observer
        self._ctx = zmq.Context()
        self._sockets: list[ChannelSocket] = []
        self._poller = zmq.Poller()
        #: socket -> handler(frames)
        self._handlers: dict[zmq.Socket[Any], Callable[[list[zmq.Frame]], None]] = {}
        self._inputs: dict[str, _Input] = {}
        self._outputs: dict[str, _Output] = {}
        #: (channel, coordinator's address) -> the tap's bound socket there.
        self._coordinator: dict[tuple[str, str], ChannelSocket] = {}
        self._hs_router: ChannelSocket | None = None
        self._hs_dealers: dict[bytes, ChannelSocket] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic_ns()
        self.error: BaseException | None = None
        self.forwarded = 0
        #: Forwarded messages not yet handed to the observer.
        self._unobserved: deque[Record] = deque()
        try:
            if config.upstream_handshake is not None:
                assert config.listen_handshake is not None
                self._hs_router = self._open("handshake", "frontend", config.listen_handshake)
                self._watch(self._hs_router, self._from_engine_handshake)
            for listen, upstream in zip(config.listen_inputs, config.upstream_inputs,
                                        strict=True):
                self._add_input(upstream, listen)
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
        return [i.router.address for i in self._inputs.values()]

    @property
    def output_addresses(self) -> list[str]:
        return [o.pull.address for o in self._outputs.values()]

    # --- sockets -------------------------------------------------------------------------

    def _open(self, channel: str, role: str, address: str,
              identity: bytes | None = None) -> ChannelSocket:
        sock = open_socket(self._ctx, channel, role, address, identity=identity)
        self._sockets.append(sock)
        return sock

    def _watch(self, sock: ChannelSocket, handler: Callable[[list[zmq.Frame]], None]) -> None:
        self._poller.register(sock.socket, zmq.POLLIN)
        self._handlers[sock.socket] = handler

    def _add_input(self, upstream: str, listen: str | None = None) -> _Input:
        found = self._inputs.get(upstream)
        if found is None:
            router = self._open("input", "frontend", listen or local_address_like(upstream))
            found = self._inputs[upstream] = _Input(router, upstream)
            self._watch(router, functools.partial(self._from_engine_input, found))
        return found

    def _add_output(self, upstream: str, listen: str | None = None) -> _Output:
        found = self._outputs.get(upstream)
        if found is None:
            pull = self._open("output", "frontend", listen or local_address_like(upstream))
            push = self._open("output", "engine", upstream)
            found = self._outputs[upstream] = _Output(pull, push)
            self._watch(pull, functools.partial(self._from_engine_output, found))
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
            up.socket.send_multipart(frames, copy=False)
            self._observe(channel, far, None, frames)

        self._watch(listen, far_side)
        if channel in ("coordinator_input", "stats_publish"):

            def coordinator_side(frames: list[zmq.Frame]) -> None:
                listen.socket.send_multipart(frames, copy=False)
                self._observe(channel, "coordinator", None, frames)

            self._watch(up, coordinator_side)
        return listen

    def add_coordinator(self, channel: str, upstream: str) -> str:
        """Stand for the DP coordinator's ``upstream`` address of ``channel``
        (``coordinator_input``, ``coordinator_output``, or ``stats_publish``, the channel the
        init does not carry: front ends are given it directly) and return the address to give
        the engines or front ends instead. Call before :meth:`start`."""
        return self._add_coordinator(channel, upstream).address

    # --- forwarding ----------------------------------------------------------------------

    def _observe(self, channel: str, sender: str, identity: bytes | None,
                 frames: Sequence[zmq.Frame | bytes]) -> None:
        self.forwarded += 1
        if self.observer is None:
            return
        self._unobserved.append(Record(
            time.monotonic_ns() - self._t0, channel, sender, identity,
            tuple(f.bytes if isinstance(f, zmq.Frame) else bytes(f) for f in frames)))

    def _from_engine_handshake(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        dealer = self._hs_dealers.get(identity)
        if dealer is None:
            assert self.config.upstream_handshake is not None
            dealer = self._hs_dealers[identity] = self._open(
                "handshake", "engine", self.config.upstream_handshake, identity)
            self._watch(dealer, functools.partial(self._from_frontend_handshake, identity))
        dealer.socket.send_multipart(frames[1:], copy=False)
        self._observe("handshake", "engine", identity, frames[1:])

    def _from_frontend_handshake(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        assert self._hs_router is not None
        out: list[Any] = list(frames)
        if len(frames) == 1:
            out = [self._rewrite_init(frames[0].bytes)]
        self._hs_router.socket.send_multipart([identity, *out], copy=False)
        self._observe("handshake", "frontend", identity, frames)

    def _rewrite_init(self, payload: bytes) -> bytes:
        """The init payload with the tap's own input/output addresses in place of the front
        end's, binding them on first sight (:func:`.rewrite.rewrite_init`)."""

        def substitute(channel: str, upstream: str) -> str:
            if channel == "input":
                return self._add_input(upstream).router.address
            if channel == "output":
                return self._add_output(upstream).pull.address
            return self._add_coordinator(channel, upstream).address

        return rewrite_init(payload, substitute)

    def _from_engine_input(self, forward: _Input, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        dealer = forward.dealers.get(identity)
        if dealer is None:
            dealer = forward.dealers[identity] = self._open("input", "engine", forward.upstream,
                                                            identity)
            self._watch(dealer, functools.partial(self._from_frontend_input, forward, identity))
        dealer.socket.send_multipart(frames[1:], copy=False)
        self._observe("input", "engine", identity, frames[1:])

    def _from_frontend_input(self, forward: _Input, identity: bytes,
                             frames: list[zmq.Frame]) -> None:
        forward.router.socket.send_multipart([identity, *frames], copy=False)
        self._observe("input", "frontend", identity, frames)

    def _from_engine_output(self, forward: _Output, frames: list[zmq.Frame]) -> None:
        forward.push.socket.send_multipart(frames, copy=False)
        self._observe("output", "engine", None, frames)

    # --- loop ----------------------------------------------------------------------------

    def poll_once(self, timeout_ms: int = POLL_MS) -> int:
        """Forward every message waiting (one poll for the batch of ready sockets); when none
        waits, hand one forwarded message to the observer instead (the poll does not wait
        then). While more than :data:`MAX_UNOBSERVED` forwarded messages wait for the
        observer, it gets one after each forward (a flood runs at the decoding rate instead
        of piling them up). Returns the number forwarded."""
        ready = self._poller.poll(0 if self._unobserved else timeout_ms)
        if not ready:
            if self._unobserved:
                self._observe_one()
            return 0
        count = 0
        for sock, _event in ready:
            handler = self._handlers[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                handler(frames)
                count += 1
                if len(self._unobserved) > MAX_UNOBSERVED:
                    self._observe_one()
        return count

    def _observe_one(self) -> None:
        record = self._unobserved.popleft()
        if self.observer is not None:
            self.observer(record)

    def run(self) -> None:
        """Forward until :meth:`stop`, then hand the observer what it has not seen yet; an
        unexpected error is kept in :attr:`error`."""
        try:
            while not self._stop.is_set():
                self.poll_once()
            while self._unobserved:
                self._observe_one()
        except BaseException as exc:  # the thread's only report
            self.error = exc

    def start(self) -> Tap:
        self._thread = threading.Thread(target=self.run, name="enginewire-tap", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop, close every socket (ipc files removed) and the context."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the tap loop did not stop within {timeout} s")
            self._thread = None
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        self._ctx.term()

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
