"""ZMQ addresses for enginewire's own sockets, and their cleanup.

Every ipc:// endpoint enginewire binds lives at ``{tempdir}/enginewire-{uuid4}`` so that tests
and users can find (and a test session can check for) leftovers by name. Whoever binds an ipc
endpoint removes its file when it closes the socket: ZMQ itself never does.
"""

from __future__ import annotations

import os
import tempfile
import uuid

IPC_PREFIX = "enginewire-"


def ipc_address(base_dir: str | None = None) -> str:
    """A fresh ``ipc://`` address under ``base_dir`` (default: the temp dir)."""
    directory = base_dir or tempfile.gettempdir()
    return f"ipc://{os.path.join(directory, IPC_PREFIX + uuid.uuid4().hex)}"


def tcp_address(host: str = "127.0.0.1", port: int = 0) -> str:
    """A ``tcp://`` address; port 0 lets the binding socket pick one (read LAST_ENDPOINT)."""
    return f"tcp://{host}:{port}"


def ipc_path(address: str) -> str | None:
    """The filesystem path of an ``ipc://`` address, or None for other transports."""
    return address[len("ipc://"):] if address.startswith("ipc://") else None


def remove_ipc_file(address: str) -> None:
    """Delete the socket file of an ``ipc://`` address if it exists; other addresses: no-op."""
    path = ipc_path(address)
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
