"""The ``enginewire`` command line.

Each part of enginewire contributes its commands through a ``commands`` module with a
``register(subparsers)`` function; this file only assembles them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Modules that add subcommands, in the order they appear in ``--help``.
COMMAND_MODULES = (
    "enginewire.spec.commands",
    "enginewire.reference.commands",
    "enginewire.reference.ring.commands",
    "enginewire.conformance.commands",
    "enginewire.fuzz.commands",
    "enginewire.fuzz.explore.commands",
    "enginewire.fuzz.mutants.commands",
    "enginewire.bench.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enginewire",
        description="Wire specification and conformance suite for LLM engine IPC (vLLM V1).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.handler(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
