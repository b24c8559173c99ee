"""``enginewire spec ...``: check, export, show, diff and render the spec."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from .loader import REFERENCE_VLLM_VERSION, Spec, SpecError, load


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spec_parser = subparsers.add_parser("spec", help="check, export, show, diff or render the spec")
    spec_sub = spec_parser.add_subparsers(dest="spec_command", metavar="ACTION", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--version", default=REFERENCE_VLLM_VERSION,
                            help="vLLM version to select (default: %(default)s)")
        parser.add_argument("--data-dir", type=Path, default=None,
                            help="read spec files from this directory instead of the package's")

    check = spec_sub.add_parser("check", help="validate every spec file")
    common(check)
    check.set_defaults(handler=cmd_check)

    export = spec_sub.add_parser("export", help="print the whole spec as one JSON document")
    common(export)
    export.set_defaults(handler=cmd_export)

    show = spec_sub.add_parser("show", help="print one clause")
    common(show)
    show.add_argument("clause_id")
    show.set_defaults(handler=cmd_show)

    diff = spec_sub.add_parser("diff", help="compare the spec with an installed implementation")
    common(diff)
    diff.add_argument("--against", default="vllm", choices=["vllm"],
                      help="implementation to compare with (default: %(default)s)")
    diff.set_defaults(handler=cmd_diff)

    docs = spec_sub.add_parser("docs", help="render the spec as Markdown pages")
    common(docs)
    docs.add_argument("--out", type=Path, default=Path("docs/spec"),
                      help="output directory (default: %(default)s)")
    docs.add_argument("--check", action="store_true",
                      help="exit 1 if the pages on disk differ from a fresh rendering")
    docs.set_defaults(handler=cmd_docs)


def _load(args: argparse.Namespace) -> Spec | None:
    try:
        return load(args.version, args.data_dir)
    except SpecError as exc:
        print(f"enginewire spec: error: {exc}", file=sys.stderr)
        return None


def cmd_check(args: argparse.Namespace) -> int:
    spec = _load(args)
    if spec is None:
        return 1
    n_fields = sum(len(s.fields) for s in spec.structs.values() if hasattr(s, "fields"))
    levels: dict[str, int] = {}
    for ref in spec.clauses.values():
        levels[ref.clause.level] = levels.get(ref.clause.level, 0) + 1
    counts = ", ".join(f"{levels[level]} {level}" for level in ("MUST", "SHOULD", "MAY")
                       if level in levels)
    print(
        f"spec ok for vLLM {spec.version}: {len(spec.surfaces)} surfaces, "
        f"{len(spec.clauses)} clauses ({counts}), {len(spec.structs)} structs and enums, "
        f"{n_fields} fields"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    spec = _load(args)
    if spec is None:
        return 1
    json.dump(spec.to_builtins(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    spec = _load(args)
    if spec is None:
        return 1
    ref = spec.clauses.get(args.clause_id)
    if ref is None:
        close = _similar_clause_ids(args.clause_id, list(spec.clauses))
        hint = f"; did you mean one of: {', '.join(close)}" if close else ""
        print(f"enginewire spec: no clause {args.clause_id!r}{hint}", file=sys.stderr)
        return 2
    clause = ref.clause
    print(f"{clause.id}  [{clause.level}]  ({ref.file})")
    print(f"  {clause.text}")
    print(f"  source: {clause.source} (vLLM {spec.version})")
    if clause.versions:
        print(f"  versions: {clause.versions}")
    if clause.rationale:
        print(f"  why: {clause.rationale}")
    if clause.vllm_deviation:
        print(f"  vLLM deviates: {clause.vllm_deviation}")
    return 0


def _similar_clause_ids(wanted: str, known: list[str], limit: int = 8) -> list[str]:
    """Clause IDs a mistyped ``wanted`` may have meant: close spellings first, then IDs that
    contain it, then the other IDs of the same surface."""
    close = difflib.get_close_matches(wanted, known, n=limit, cutoff=0.6)
    containing = sorted(c for c in known if wanted and wanted in c)
    surface = wanted.split(".", 1)[0] + "."
    same_surface = sorted(c for c in known if c.startswith(surface))
    return list(dict.fromkeys([*close, *containing, *same_surface]))[:limit]


def cmd_diff(args: argparse.Namespace) -> int:
    from .drift import run_diff

    spec = _load(args)
    if spec is None:
        return 1
    return run_diff(spec, against=args.against)


def cmd_docs(args: argparse.Namespace) -> int:
    from .render import run_docs

    spec = _load(args)
    if spec is None:
        return 1
    return run_docs(spec, out=args.out, check=args.check)
