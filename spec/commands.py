"""``enginewire spec ...``: check, export, show, diff and render the spec."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from enginewire.cliargs import existing_dir, writable_dir

from .loader import DATA_DIR, REFERENCE_VLLM_VERSION, SpecError, UnknownVersionError, load
from .versions import VersionError, VersionRange, format_version, parse_version


def oldest_version() -> tuple[int, int, int]:
    """The oldest vLLM version a surface of the (reference) spec covers."""
    return min(VersionRange.parse(s.versions).low for s in load().surfaces.values())


def spec_version(text: str) -> str:
    """A well-formed vLLM version (whether the spec covers it is decided with its data)."""
    try:
        return format_version(parse_version(text))
    except VersionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _newest_named(spec: Any) -> tuple[int, int, int]:
    """The newest version the spec names: the reference version or a bound of a range."""
    newest = parse_version(REFERENCE_VLLM_VERSION)
    texts = [s.versions for s in spec.surfaces.values()]
    texts += [ref.clause.versions for ref in spec.clauses.values()]
    for item in spec.structs.values():
        texts.append(getattr(item, "versions", None))
        texts += [getattr(f, "versions", None) for f in getattr(item, "fields", ())]
        texts += [getattr(m, "versions", None) for m in getattr(item, "members", ())]
    for text in texts:
        if text:
            bounds = VersionRange.parse(text)
            newest = max(newest, bounds.low, bounds.high or bounds.low)
    return newest


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spec_parser = subparsers.add_parser("spec", help="check, export, show, diff or render the spec")
    spec_sub = spec_parser.add_subparsers(dest="spec_command", metavar="ACTION", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--version", default=REFERENCE_VLLM_VERSION, type=spec_version,
                            help="vLLM version to select (default: %(default)s)")
        parser.add_argument("--data-dir", type=existing_dir, default=None,
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
    docs.add_argument("--out", type=writable_dir, default="docs/spec",
                      help="output directory (default: %(default)s)")
    docs.add_argument("--check", action="store_true",
                      help="exit 1 if the pages on disk differ from a fresh rendering")
    docs.set_defaults(handler=cmd_docs)

    from .history.commands import register as register_history

    register_history(subparsers, spec_sub)


def _load(args: argparse.Namespace) -> Any:
    """The spec for ``args.version``, or the exit status after reporting why not: 1 for a
    spec data error, 2 for a version the spec does not cover (older than every surface, or
    newer than any version its data names)."""
    try:
        spec = load(args.version, args.data_dir)
    except UnknownVersionError as exc:
        print(f"enginewire spec: error: {exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(f"enginewire spec: error: {exc}", file=sys.stderr)
        return 1
    version = parse_version(args.version)
    oldest = min(VersionRange.parse(s.versions).low for s in spec.surfaces.values())
    newest = _newest_named(spec)
    if not oldest <= version <= newest:
        print(f"enginewire spec: error: unknown vLLM version {args.version}: the spec covers "
              f"{format_version(oldest)} to {format_version(newest)}", file=sys.stderr)
        return 2
    return spec


def cmd_check(args: argparse.Namespace) -> int:
    """Validate the spec files for ``--version``, then, where the data directory has a
    history (``history/releases.toml``), hold the files to it at every release
    (:func:`enginewire.spec.history.consistency.problems`: the request type table, the
    constants' ranges, the struct changes, ...); exit 1 naming each disagreement."""
    spec = _load(args)
    if isinstance(spec, int):
        return spec
    from .history import consistency
    from .history.wheels import RELEASES_FILE

    data_dir = Path(args.data_dir) if args.data_dir else DATA_DIR
    if (data_dir / RELEASES_FILE).exists():
        found = consistency.problems(data_dir)
        for problem in found:
            print(f"enginewire spec: error: {problem}", file=sys.stderr)
        if found:
            print(f"enginewire spec: {len(found)} disagreement(s) between the spec files and "
                  "their history", file=sys.stderr)
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
    if isinstance(spec, int):
        return spec
    json.dump(spec.to_builtins(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    spec = _load(args)
    if isinstance(spec, int):
        return spec
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
    if isinstance(spec, int):
        return spec
    return run_diff(spec, against=args.against)


def cmd_docs(args: argparse.Namespace) -> int:
    from .render import run_docs

    spec = _load(args)
    if isinstance(spec, int):
        return spec
    return run_docs(spec, out=Path(args.out), check=args.check)
