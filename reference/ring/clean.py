"""Find and remove what dead processes left behind (clause ring.liveness.creator-named).

A writer killed with SIGKILL cannot unlink its shared-memory segment or remove its ipc socket
files. Every such resource enginewire creates carries its creator's tag (pid and start time,
:mod:`enginewire.reference.processes`) in its name: ``/dev/shm/ew-p<pid>s<start>-<random>`` and
``<dir>/enginewire-p<pid>s<start>-<uuid>``. :func:`leftovers` lists those whose creator no longer
runs, and only those; :func:`clean` removes them. Names without a tag (vLLM's ``psm_*``
segments, anything else) are never touched.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..addresses import IPC_PREFIX
from ..processes import Creator, creator_of
from .shm import SEGMENT_PREFIX

SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class Leftover:
    """A segment or ipc socket file whose creator is dead."""

    path: Path
    kind: str  # "segment" or "ipc"
    creator: Creator


def _candidates(directory: Path, prefix: str, kind: str) -> Iterable[Leftover]:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        creator = creator_of(name[len(prefix):])
        if creator is None:
            continue
        path = directory / name
        if kind == "ipc":
            try:
                if not stat.S_ISSOCK(path.lstat().st_mode):
                    continue
            except OSError:
                continue
        yield Leftover(path, kind, creator)


def leftovers(shm_dir: Path | None = SHM_DIR,
              ipc_dirs: Iterable[Path] | None = None) -> list[Leftover]:
    """Segments in ``shm_dir`` and ipc socket files in ``ipc_dirs`` (default: the temp dir)
    that enginewire created and whose creator no longer runs."""
    found: list[Leftover] = []
    if shm_dir is not None:
        found += _candidates(shm_dir, SEGMENT_PREFIX, "segment")
    for directory in ipc_dirs if ipc_dirs is not None else [Path(tempfile.gettempdir())]:
        found += _candidates(Path(directory), IPC_PREFIX, "ipc")
    return sorted((item for item in found if not item.creator.alive()),
                  key=lambda item: str(item.path))


def clean(shm_dir: Path | None = SHM_DIR, ipc_dirs: Iterable[Path] | None = None,
          *, dry_run: bool = False) -> list[Leftover]:
    """Remove every :func:`leftovers` item (unless ``dry_run``) and return them."""
    found = leftovers(shm_dir, ipc_dirs)
    if not dry_run:
        for item in found:
            try:
                item.path.unlink()
            except FileNotFoundError:
                pass  # another clean-up was quicker
    return found
