"""``enginewire ring clean``: remove the segments and ipc files of dead processes.

Prints one line per item removed (``removed segment /dev/shm/ew-...  (creator pid N)``) and
exits 0, also when there was nothing to remove; ``--dry-run`` only lists. A directory given
with ``--ipc-dir`` that does not exist is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ring = subparsers.add_parser("ring", help="shared-memory ring utilities")
    actions = ring.add_subparsers(dest="action", metavar="ACTION", required=True)
    clean = actions.add_parser(
        "clean", help="remove segments and ipc socket files whose creator process is dead")
    clean.add_argument("--ipc-dir", action="append", type=Path, default=None, metavar="DIR",
                       help="directory holding ipc socket files (repeatable; default: the "
                            "temp dir)")
    clean.add_argument("--shm-dir", type=Path, default=None, metavar="DIR",
                       help="shared-memory directory (default: /dev/shm)")
    clean.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    clean.set_defaults(handler=cmd_clean)


def cmd_clean(args: argparse.Namespace) -> int:
    from .clean import SHM_DIR, clean

    for directory in [*(args.ipc_dir or []), *([args.shm_dir] if args.shm_dir else [])]:
        if not directory.is_dir():
            print(f"enginewire ring clean: {directory} is not a directory", file=sys.stderr)
            return 2
    found = clean(args.shm_dir or SHM_DIR, args.ipc_dir, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for item in found:
        print(f"{verb} {item.kind} {item.path}  (creator pid {item.creator.pid})")
    return 0
