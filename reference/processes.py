"""Which process made a resource, and whether it still runs (spec: ring.liveness.*).

A process is named by its pid *and* its start time (clock ticks since boot, field 22 of
``/proc/<pid>/stat``), so a pid the kernel reused for another process does not pass for the
dead one. enginewire writes this pair, as a :class:`Creator` tag, into the names of the
shared-memory segments and ipc socket files it creates, so that a later process can find what a
dead process left behind and remove it (``enginewire ring clean``), and into a liveness record
after the ring's spec'd bytes (:mod:`.ring.liveness`) so that the ends of a ring notice a dead
peer.

Start times come from ``/proc`` (Linux). Where there is no ``/proc``, the start time is 0 and a
process counts as alive while its pid exists.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

#: Marks a creator tag inside a resource name: ``...-p<pid hex>s<start hex>-...``.
_TAG = re.compile(r"p([0-9a-f]+)s([0-9a-f]+)")


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, 0 without ``/proc``, None when
    the process does not exist (or is a zombie: killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
        return 0 if _pid_exists(pid) else None
    except OSError:
        return 0 if _pid_exists(pid) else None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Creator:
    """A process: its pid and start time (0: unknown)."""

    pid: int
    start: int

    @property
    def tag(self) -> str:
        """The form written into resource names: ``p<pid hex>s<start hex>``."""
        return f"p{self.pid:x}s{self.start:x}"

    def alive(self) -> bool:
        """True while the process runs (a zombie counts as dead); a reused pid with another
        start time counts as dead."""
        if self.pid <= 0:
            return False
        start = process_start_time(self.pid)
        if start is None:
            return False
        return self.start == 0 or start == 0 or start == self.start


_SELF: dict[int, Creator] = {}


def this_process() -> Creator:
    """The calling process (recomputed after a fork)."""
    pid = os.getpid()
    found = _SELF.get(pid)
    if found is None:
        found = _SELF[pid] = Creator(pid, process_start_time(pid) or 0)
    return found


def creator_of(name: str) -> Creator | None:
    """The creator tagged in a resource name, None when the name carries no tag."""
    match = _TAG.search(name)
    if match is None:
        return None
    return Creator(int(match.group(1), 16), int(match.group(2), 16))
