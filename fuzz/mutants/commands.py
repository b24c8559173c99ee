"""``enginewire mutants``: run the default checks against every mutant; print the kill matrix.

Exit status: 0 when every mutant selected is killed, 1 when one survives, 2 for a usage error
(an unknown mutant name). See ``docs/mutants.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from enginewire.cliargs import writable_file


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mutants",
        help="run the checks against deliberately broken targets and print the kill matrix",
        description=(
            "Each mutant is the reference with one thing broken, modelled on a real failure. "
            "Against each, run what applies: its relevant conformance checks (a check kills "
            "it when it fails on the mutant and passes on the reference; SHOULD checks "
            "included), a short fuzz campaign of the decoder and a differential campaign of "
            "the encoder against the spec oracle (codec mutants) and a bounded schedule "
            "exploration (ring mutants; "
            "a violation the reference does not show kills it, and its trace is "
            "printed). Prints the kill matrix; exits 1 if any mutant survives."
        ),
    )
    parser.add_argument("--catalogue", default=None, metavar="PKG.MOD:ATTR",
                        help="run your own mutants instead of the built-in catalogue: ATTR is "
                             "a dict of name -> enginewire.fuzz.mutants.Mutant, an iterable "
                             "of Mutant, or a function returning either")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="run only these mutants")
    parser.add_argument("--json", default=None, type=writable_file, metavar="PATH",
                        help="also write the matrix, with every killing check's message and "
                             "trace, as JSON")
    parser.add_argument("--bounded", action="store_true",
                        help="CI budget (the default): 10 fuzz cases per kind, the explorer "
                             "bounded to 2 preemptions and 20000 states")
    parser.add_argument("--full", action="store_true",
                        help="a deeper run: 100 fuzz cases over more kinds, 3 preemptions")
    parser.add_argument("--list", action="store_true", help="list the catalogue and exit")
    parser.set_defaults(handler=main)


def load_catalogue(text: str) -> dict[str, Any]:
    """``package.module:attr`` to a catalogue (name -> :class:`Mutant`); raises ValueError
    saying what was expected and what came."""
    import importlib

    from enginewire.fuzz.mutants import Mutant

    module_name, sep, attr = text.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--catalogue {text!r}: expected package.module:attr")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--catalogue {text}: {exc}") from None
    if callable(found) and not isinstance(found, Mutant):
        found = found()
    items = list(found.values()) if isinstance(found, dict) else list(found)
    bad = [type(item).__name__ for item in items if not isinstance(item, Mutant)]
    if bad or not items:
        raise ValueError(f"--catalogue {text}: expected a non-empty dict or iterable of "
                         f"enginewire.fuzz.mutants.Mutant, got {', '.join(bad) or 'nothing'}")
    return {mutant.name: mutant for mutant in items}


def main(args: argparse.Namespace) -> int:
    from enginewire.fuzz.mutants import MUTANTS
    from enginewire.fuzz.mutants.matrix import (
        BOUNDED,
        FULL,
        MutantResult,
        kill_matrix,
        render_matrix,
    )

    catalogue: dict[str, Any] = MUTANTS
    if args.catalogue is not None:
        try:
            catalogue = load_catalogue(args.catalogue)
        except ValueError as exc:
            print(f"enginewire mutants: {exc}", file=sys.stderr)
            return 2
    if args.list:
        for mutant in catalogue.values():
            print(f"{mutant.name:30} {mutant.surface:7} {mutant.broken} [{mutant.citation}]")
        return 0
    if args.bounded and args.full:
        print("enginewire mutants: --bounded and --full exclude each other", file=sys.stderr)
        return 2
    names = args.only or list(catalogue)
    unknown = [n for n in names if n not in catalogue]
    if unknown:
        print(f"enginewire mutants: unknown mutant(s) {', '.join(unknown)}; known: "
              f"{', '.join(catalogue)}", file=sys.stderr)
        return 2
    budget, budget_name = (FULL, "full") if args.full else (BOUNDED, "bounded")

    def progress(result: MutantResult) -> None:
        seconds = sum(c.seconds for c in result.columns.values())
        print(f"  {result.mutant.name}: {'killed' if result.killed else 'SURVIVED'} "
              f"({seconds:.1f} s)", file=sys.stderr, flush=True)

    started = time.monotonic()
    print(f"enginewire mutants: {len(names)} mutant(s), "
          f"{budget_name} budget", file=sys.stderr)
    results = kill_matrix([catalogue[n] for n in names], budget=budget, progress=progress)
    elapsed = time.monotonic() - started

    for result in results:
        explorer = result.columns["explorer"]
        if explorer.killed:
            print(f"explorer kills {result.mutant.name} ({result.mutant.citation}):")
            print(explorer.details[0])
            print()
    print(render_matrix(results))
    survivors = [r.mutant.name for r in results if not r.killed]
    print(f"{len(results) - len(survivors)} of {len(results)} mutants killed in {elapsed:.0f} s"
          + (f"; SURVIVED: {', '.join(survivors)}" if survivors else ""))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"budget": budget_name,
                       "seconds": round(elapsed, 1),
                       "mutants": [r.to_builtins() for r in results]}, out, indent=2)
    return 1 if survivors else 0
