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
            "it when it fails on the mutant and passes on the reference), a short fuzz "
            "campaign (codec mutants) and a bounded schedule exploration (flag-protocol "
            "mutants; a violation the reference does not show kills it, and its trace is "
            "printed). Prints the kill matrix; exits 1 if any mutant survives."
        ),
    )
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


def main(args: argparse.Namespace) -> int:
    from enginewire.fuzz.mutants import MUTANTS
    from enginewire.fuzz.mutants.matrix import (
        BOUNDED,
        FULL,
        MutantResult,
        kill_matrix,
        render_matrix,
    )

    if args.list:
        for mutant in MUTANTS.values():
            print(f"{mutant.name:30} {mutant.surface:7} {mutant.broken} [{mutant.citation}]")
        return 0
    if args.bounded and args.full:
        print("enginewire mutants: --bounded and --full exclude each other", file=sys.stderr)
        return 2
    names = args.only or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        print(f"enginewire mutants: unknown mutant(s) {', '.join(unknown)}; known: "
              f"{', '.join(MUTANTS)}", file=sys.stderr)
        return 2
    budget, budget_name = (FULL, "full") if args.full else (BOUNDED, "bounded")

    def progress(result: MutantResult) -> None:
        seconds = sum(c.seconds for c in result.columns.values())
        print(f"  {result.mutant.name}: {'killed' if result.killed else 'SURVIVED'} "
              f"({seconds:.1f} s)", file=sys.stderr, flush=True)

    started = time.monotonic()
    print(f"enginewire mutants: {len(names)} mutant(s), "
          f"{budget_name} budget", file=sys.stderr)
    results = kill_matrix([MUTANTS[n] for n in names], budget=budget, progress=progress)
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
