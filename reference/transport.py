"""ZMQ sockets made exactly as the transport surface says, and closed without leftovers.

:func:`open_socket` reads the channel's table in ``spec/data/transport.toml`` (socket type,
whether this end binds, the integer socket options such as SNDHWM/RCVHWM 0 and LINGER) so the
reference peers never restate them. A tcp:// address with port 0 is resolved after binding;
:attr:`ChannelSocket.address` is always the address a peer can connect to. ipc:// socket files
are removed by whoever bound them, when the socket closes (transport.ipc-files-removed).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import zmq

from enginewire.spec import load
from enginewire.spec.schema import SocketEnd

from .addresses import bind_ipc, remove_ipc_file


def channel_end(channel: str, role: str) -> SocketEnd:
    """The transport surface's description of ``role``'s end of ``channel``."""
    for found in load().surface("transport").channels:
        if found.name == channel:
            for end in found.ends:
                if end.role == role:
                    return end
            raise KeyError(f"channel {channel!r} has no {role!r} end")
    raise KeyError(f"the transport surface has no channel {channel!r}")


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
) -> ChannelSocket:
    """Open ``role``'s socket of ``channel`` with the spec's type, options and bind rule."""
    end = channel_end(channel, role)
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
        if end.binds:
            bind_ipc(sock, address)
            address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            sock.connect(address)
    except BaseException:
        sock.close(linger=0)
        raise
    return ChannelSocket(sock, channel, role, address, end.binds)
