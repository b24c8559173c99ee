"""ZMQ sockets made exactly as the transport surface says, and closed without leftovers.

:func:`open_socket` reads the channel's table in ``spec/data/transport.toml`` (socket type,
whether this end binds, the integer socket options such as SNDHWM/RCVHWM 0 and LINGER) so the
reference peers never restate them. For another vLLM release (``version``) the input and
output channels' socket types and binds are the release's (history/constants.toml
``[[transport]]``: before 0.8.4 the input is PUSH -> PULL, and before 0.8.3 the engine binds
its output PUSH); the options are the spec's for the end, those the socket type has (SNDHWM on
a sending socket, RCVHWM on a receiving one). A tcp:// address with port 0 is resolved after
binding;
:attr:`ChannelSocket.address` is always the address a peer can connect to. ipc:// socket files
are removed by whoever bound them, when the socket closes (transport.ipc-files-removed).

The peers' per-message socket calls: :func:`send_frames` (one multipart message),
:func:`receive_frames` (one multipart message that is known to be there) and
:func:`readable` (whether another one is). On pyzmq's own socket class they call its compiled
methods directly: ``send_multipart`` and ``recv_multipart`` check every frame, combine enum
flags and go through a Python-level ``send`` per frame, which for a small message costs more
than the sends themselves, and a non-blocking receive that finds nothing raises ``zmq.Again``
(about 5 µs) where asking the socket (:func:`readable`, a zero-timeout poll) costs about
1 µs. :func:`wait_readable` is the peers' one blocking poll per batch over their receiving
sockets (``zmq_poll`` itself, without ``zmq.Poller``'s Python frame). Any other socket object
(a wrapper a test or a mutant puts in place) is driven through its own
``send_multipart``/``recv_multipart``. The frames on the wire are the same either way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
from zmq.backend import Socket as _CompiledSocket
from zmq.backend import zmq_poll as _zmq_poll

from enginewire.spec import load
from enginewire.spec.history.release_facts import transport_at
from enginewire.spec.loader import REFERENCE_VLLM_VERSION
from enginewire.spec.schema import SocketEnd

from .addresses import bind_ipc, remove_ipc_file

#: Socket options by the socket types that have them (make_zmq_socket sets them so).
_SENDING = frozenset({"PUSH", "DEALER", "ROUTER"})
_RECEIVING = frozenset({"PULL", "DEALER", "ROUTER"})


def channel_end(channel: str, role: str, version: str | None = None) -> SocketEnd:
    """The transport surface's description of ``role``'s end of ``channel``; with an older
    ``version``, the input and output channels as that release had them."""
    for found in load().surface("transport").channels:
        if found.name == channel:
            for end in found.ends:
                if end.role == role:
                    return _in_release(end, channel, version)
            raise KeyError(f"channel {channel!r} has no {role!r} end")
    raise KeyError(f"the transport surface has no channel {channel!r}")


def _in_release(end: SocketEnd, channel: str, version: str | None) -> SocketEnd:
    if version in (None, REFERENCE_VLLM_VERSION) or channel not in ("input", "output"):
        return end
    release = transport_at(version)
    if release is None:
        return end
    ends = release.channel(channel)
    socket = ends.socket(end.role)
    options = {name: value for name, value in end.options.items()
               if (name != "SNDHWM" or socket in _SENDING)
               and (name != "RCVHWM" or socket in _RECEIVING)
               and (not name.startswith("ROUTER_") or socket == "ROUTER")}
    options.update({name: 0 for name, types in (("SNDHWM", _SENDING), ("RCVHWM", _RECEIVING))
                    if socket in types and name not in options})
    identity = end.identity if channel == "input" and release.identity else None
    return msgspec.structs.replace(end, socket=socket, binds=ends.role_binds(end.role),
                                   options=options, identity=identity)


def _is_ipv6_tcp(address: str) -> bool:
    if not address.startswith("tcp://["):
        return False
    host = address[len("tcp://["):].split("]", 1)[0]
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


@dataclass
class ChannelSocket:
    """One open socket of a channel: the zmq socket, where it is, and whether it bound."""

    socket: zmq.Socket[bytes]
    channel: str
    role: str
    address: str
    bound: bool

    def close(self, linger: int | None = None) -> None:
        """Close the socket (with ``linger`` ms if given, else the option set at opening) and
        remove the ipc file if this end bound it."""
        if not self.socket.closed:
            self.socket.close(linger=linger)
        if self.bound:
            remove_ipc_file(self.address)


def open_socket(
    ctx: zmq.Context[zmq.Socket[bytes]],
    channel: str,
    role: str,
    address: str,
    *,
    identity: bytes | None = None,
    version: str | None = None,
    immediate: bool = False,
) -> ChannelSocket:
    """Open ``role``'s socket of ``channel`` with the spec's type, options and bind rule (of
    release ``version``'s input and output channels: :func:`channel_end`). ``immediate``: a
    connecting socket queues only to a completed connection (ZMQ_IMMEDIATE), so it becomes
    writable once its peer has bound (nothing on the wire changes)."""
    end = channel_end(channel, role, version)
    sock = ctx.socket(getattr(zmq, end.socket))
    try:
        for name, value in end.options.items():
            # Options whose value is prose (ROUTER_HANDOVER's "only with elastic EP") are
            # conditional and left to the caller.
            if isinstance(value, bool | int):
                sock.setsockopt(getattr(zmq, name), int(value))
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        if _is_ipv6_tcp(address):
            sock.setsockopt(zmq.IPV6, 1)
        if immediate and not end.binds:
            sock.setsockopt(zmq.IMMEDIATE, 1)
        if end.binds:
            bind_ipc(sock, address)
            address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            sock.connect(address)
    except BaseException:
        sock.close(linger=0)
        raise
    return ChannelSocket(sock, channel, role, address, end.binds)


_SEND = _CompiledSocket.send
_RECV = _CompiledSocket.recv
_SNDMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)

#: Frames of a received message that come as ``bytes`` (copied out of zmq's message): the
#: fixed frames and the msgpack frame of every message kind lie within them (a type byte and
#: the payload on the input channel, the payload on the output channel). Frames after them are
#: out-of-band tensor data, at least the inline threshold in size, and come as ``zmq.Frame``
#: without a copy.
COPIED_FRAMES = 2


def send_frames(sock: Any, frames: Sequence[Any], *, copy: bool = True) -> None:
    """Send ``frames`` as one multipart message (``copy=False``: frames of pyzmq's
    ``copy_threshold`` bytes or more go without a copy, so they must not change until sent,
    frames.oob-not-mutated-in-flight)."""
    if type(sock) is not zmq.Socket:
        sock.send_multipart(frames, copy=copy)
        return
    last = len(frames) - 1
    if copy:
        for index in range(last):
            _SEND(sock, frames[index], _SNDMORE, True)
        _SEND(sock, frames[last], 0, True)
        return
    # pyzmq copies a frame under the threshold anyway, after building a memoryview of it to
    # learn its size (about 0.25 µs a frame): a ``bytes`` frame's size is its len, so the
    # small ones (identities, type bytes, most msgpack frames) are sent as copies at once.
    threshold = sock.copy_threshold
    for index in range(last + 1):
        frame = frames[index]
        _SEND(sock, frame, _SNDMORE if index < last else 0,
              type(frame) is bytes and len(frame) < threshold)


def receive_frames(sock: Any) -> list[Any]:
    """One multipart message from ``sock``, which has one waiting (a poll or :func:`readable`
    said so; else ``zmq.Again``): the first :data:`COPIED_FRAMES` frames as ``bytes``, the
    others as ``zmq.Frame``."""
    if type(sock) is not zmq.Socket:
        return list(sock.recv_multipart(zmq.NOBLOCK))
    # Each frame as a zmq.Frame, which says whether another one follows (``more``, read from
    # the message: asking the socket for RCVMORE costs about as much as the receive).
    frame = _RECV(sock, _NOBLOCK, False)
    frames: list[Any] = [frame.bytes]
    while frame.more:
        frame = _RECV(sock, _NOBLOCK, False)
        frames.append(frame.bytes if len(frames) < COPIED_FRAMES else frame)
    return frames


def readable(sock: Any) -> bool:
    """Whether ``sock`` has a message waiting."""
    if type(sock) is not zmq.Socket:
        return bool(sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)
    # A zero-timeout poll: the socket's ZMQ_EVENTS through Socket.get (the compiled one too)
    # first turns the option into an enum member, which costs more than the poll's second
    # system call (1.7 µs against 1.3 µs of CPU time, side by side).
    return bool(_zmq_poll([(sock, _POLLIN)], 0))


def poll_items(sockets: Sequence[Any]) -> list[tuple[Any, int]]:
    """The argument of :func:`wait_readable` for ``sockets`` (built once per peer)."""
    return [(sock, _POLLIN) for sock in sockets]


def wait_readable(items: list[tuple[Any, int]], timeout_ms: int) -> list[tuple[Any, int]]:
    """Wait at most ``timeout_ms`` (>= 0) for a message on any socket of ``items``
    (:func:`poll_items`); returns ``(socket, events)`` for each ready one, as
    ``zmq.Poller.poll`` does."""
    return _zmq_poll(items, timeout_ms)
