"""The ``enginewire`` command line.

Each part of enginewire contributes its commands through a ``commands`` module with a
``register(subparsers)`` function; this file only assembles them.

Exit status: 0 success; 1 the thing checked failed; 2 a usage error (one line on stderr, see
:mod:`enginewire.cliargs`); 70 an internal error (a bug: one line naming the exception, the
traceback only with ``ENGINEWIRE_TRACEBACK=1``); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from .cliargs import EXIT_INTERNAL, Parser

#: Modules that add subcommands, in the order they appear in ``--help``.
COMMAND_MODULES = (
    "enginewire.spec.commands",
    "enginewire.reference.commands",
    "enginewire.reference.ring.commands",
    "enginewire.conformance.commands",
    "enginewire.conformance.interop",
    "enginewire.fuzz.commands",
    "enginewire.fuzz.soak",
    "enginewire.fuzz.explore.commands",
    "enginewire.fuzz.mutants.commands",
    "enginewire.bench.commands",
    "enginewire.tap.commands",
    "enginewire.docsite",
)

#: Modules that register ``--target PREFIX:NAME`` providers with
#: :func:`enginewire.conformance.targets.resolve.register_provider` when imported.
TARGET_PROVIDER_MODULES = ("enginewire.fuzz.mutants",)
#: Modules that add cells of whole topologies to ``enginewire interop`` with
#: :func:`enginewire.conformance.interop.register_topology_cell` when imported.
INTEROP_CELL_MODULES = ("enginewire.tap.vllm_dp",)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="enginewire",
        description="Wire specification and conformance suite for LLM engine IPC (vLLM V1).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in TARGET_PROVIDER_MODULES + INTEROP_CELL_MODULES + COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            continue
        if module_name in COMMAND_MODULES:
            module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        result = args.handler(args)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except RecursionError:
        # Last resort: every decoder bounds its depth, so this is a bug, not bad input.
        print(f"{parser.prog} {args.command}: internal error: RecursionError",
              file=sys.stderr)
        return EXIT_INTERNAL
    except Exception as exc:  # the last resort: every known failure is handled where it happens
        if os.environ.get("ENGINEWIRE_TRACEBACK"):
            traceback.print_exc()
        text = " ".join(str(exc).split())[:500]
        print(f"{parser.prog} {args.command}: internal error: {type(exc).__name__}: {text}",
              file=sys.stderr)
        return EXIT_INTERNAL
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
