"""ZMQ addresses for enginewire's own sockets, and their cleanup.

Every ipc:// endpoint enginewire binds lives at ``{tempdir}/enginewire-p<pid>s<start>-<hex>``
(the creator's tag, :mod:`.liveness`) so that tests and users can find (and a test session can
check for) leftovers by name, and ``enginewire ring clean`` can tell whose they are. Whoever
binds an ipc endpoint removes its file when it closes the socket: ZMQ itself never does.

:func:`bind_ipc` makes the socket file owner-only (0600) whatever the umask, and a directory
it has to create for one owner-only (0700) (clause ring.lifecycle.file-modes).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from .processes import this_process

IPC_PREFIX = "enginewire-"
#: Modes of ipc socket files and of the directories enginewire creates for them.
IPC_FILE_MODE = 0o600
IPC_DIR_MODE = 0o700


def ipc_address(base_dir: str | None = None) -> str:
    """A fresh ``ipc://`` address under ``base_dir`` (default: the temp dir), named after the
    calling process."""
    directory = base_dir or tempfile.gettempdir()
    # 64 random bits keep the name short (sun_path holds 107 bytes) and still unique.
    name = f"{IPC_PREFIX}{this_process().tag}-{uuid.uuid4().hex[:16]}"
    return f"ipc://{os.path.join(directory, name)}"


def bind_ipc(sock: Any, address: str) -> None:
    """Bind ``sock`` (a zmq socket) to ``address``; for an ``ipc://`` address, make the socket
    file 0600 at once, whatever the umask."""
    sock.bind(address)
    path = ipc_path(address)
    if path:
        os.chmod(path, IPC_FILE_MODE)


def ensure_ipc_dir(directory: str) -> None:
    """Create ``directory`` (and missing parents) owner-only, 0700 whatever the umask; an
    existing directory is left as it is."""
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=IPC_DIR_MODE, exist_ok=True)
        os.chmod(directory, IPC_DIR_MODE)


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
