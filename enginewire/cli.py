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
from typing import Any

from .cliargs import EXIT_INTERNAL, Parser

#: Modules that add subcommands, in the order they appear in ``--help``, with the commands
#: each adds (tests/test_cli_errors.py holds the two together). A command line naming a command
#: imports that module only: a child process such as ``serve-engine`` or ``tap`` starts in
#: half the time. ``--help``, no command or an unknown one import them all.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "enginewire.spec.commands": ("spec", "compat"),
    "enginewire.reference.commands": ("serve-engine", "frontend", "stubs"),
    "enginewire.reference.ring.commands": ("ring",),
    "enginewire.conformance.commands": ("check", "vectors"),
    "enginewire.conformance.interop": ("interop",),
    "enginewire.fuzz.commands": ("fuzz",),
    "enginewire.fuzz.soak": ("soak",),
    "enginewire.fuzz.explore.commands": ("explore",),
    "enginewire.fuzz.mutants.commands": ("mutants",),
    "enginewire.bench.commands": ("bench",),
    "enginewire.tap.commands": ("tap", "replay"),
    "enginewire.docsite": ("docs",),
}

#: ``--target PREFIX:NAME`` providers: prefix -> (the module that registers it with
#: :func:`enginewire.conformance.targets.resolve.register_provider` when imported, its help
#: line). Imported the first time a target names the prefix.
TARGET_PROVIDERS = {
    "mutant": ("enginewire.fuzz.mutants", "mutant:NAME (enginewire.fuzz.mutants)"),
}
#: Command module -> the modules that extend its commands when imported (imported before it):
#: ``interop`` gets cells of whole topologies
#: (:func:`enginewire.conformance.interop.register_topology_cell`), ``spec match`` probes codec
#: targets through the conformance suite
#: (:func:`enginewire.spec.history.match.register_codec_matcher`).
EXTENDED_BY: dict[str, tuple[str, ...]] = {
    "enginewire.conformance.interop": ("enginewire.tap.vllm_dp",),
    "enginewire.spec.commands": ("enginewire.conformance.commands",),
}


def _command_modules(command: str | None) -> list[str]:
    """The modules that add ``command`` (all of them for None or a name none adds)."""
    for module_name, commands in COMMAND_MODULES.items():
        if command in commands:
            return [module_name]
    return list(COMMAND_MODULES)


def _import_present(module_name: str) -> Any:
    """The module, or None when it is not installed (an optional part of enginewire)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone when a module adds it."""
    from enginewire.conformance.targets.resolve import register_provider_module

    parser = Parser(
        prog="enginewire",
        description="Wire specification and conformance suite for LLM engine IPC (vLLM V1).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for prefix, (module_name, help_line) in TARGET_PROVIDERS.items():
        register_provider_module(prefix, module_name, help_line)
    command_modules = _command_modules(command)
    for module_name in command_modules:
        for extension in EXTENDED_BY.get(module_name, ()):
            _import_present(extension)
    for module_name in command_modules:
        module = _import_present(module_name)
        if module is not None:
            module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
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
