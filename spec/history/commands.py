"""``enginewire spec history|releases|match`` and ``enginewire compat``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..versions import VersionError, parse_version
from .wheels import (
    WheelError,
    default_wheel_dir,
    ensure_wheels,
    normal_version,
    read_releases,
    read_skipped,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             spec_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..loader import DATA_DIR

    history = spec_sub.add_parser(
        "history", help="derive every struct's version ranges from released vLLM wheels")
    history.add_argument("--wheel-dir", type=Path, default=None,
                         help="wheel cache (default: $ENGINEWIRE_WHEEL_DIR or "
                              "~/.cache/enginewire/wheels)")
    history.add_argument("--data-dir", type=Path, default=DATA_DIR,
                         help="spec data directory to write (default: the package's)")
    history.add_argument("--releases", default=None,
                         help="comma-separated releases to derive from (default: the ones in "
                              "history/releases.toml)")
    history.add_argument("--offline", action="store_true",
                         help="use cached wheels only, never run pip download")
    history.add_argument("--no-extract-cache", action="store_true",
                         help="read every wheel again, ignoring the extraction kept beside it")
    history.set_defaults(handler=cmd_history)

    releases = spec_sub.add_parser("releases", help="list the releases the spec knows")
    releases.add_argument("--data-dir", type=Path, default=DATA_DIR)
    releases.set_defaults(handler=cmd_releases)

    match = spec_sub.add_parser(
        "match", help="which releases a module of msgspec structs matches, struct by struct")
    match.add_argument("target", help="a module of msgspec structs (pkg.module), compared by "
                       "declared layout; or a codec target as `enginewire check --target` takes "
                       "it (reference, vllm, none, pkg.module:attr), probed by encoding every "
                       "release's samples")
    match.add_argument("--target-cmd", action="append", default=[], metavar="CMD",
                       help="an external codec program, as for `enginewire check` (repeatable)")
    match.add_argument("--struct", action="append", default=[], metavar="NAME",
                       help="only this struct (repeatable; default: every struct)")
    match.add_argument("--data-dir", type=Path, default=None)
    match.set_defaults(handler=cmd_match)

    compat = subparsers.add_parser(
        "compat", help="what a front end at release A and an engine at release B make of "
                       "each other's messages")
    compat.add_argument("frontend", nargs="?", help="front end's vLLM release (A)")
    compat.add_argument("engine", nargs="?", help="engine's vLLM release (B)")
    compat.add_argument("--matrix", action="store_true",
                        help="every pair of derived releases: table, JSON and heatmaps")
    compat.add_argument("--out", type=Path, default=Path("docs/compat"),
                        help="output directory of --matrix (default: %(default)s)")
    compat.add_argument("--no-confirm", action="store_true",
                        help="predict only; skip the encode/decode confirmation")
    compat.add_argument("--json", action="store_true", help="print the report as JSON")
    compat.add_argument("--real-wheels", action="store_true",
                        help="also encode/decode the add and outputs messages with the wheels' "
                             "own classes (slow: minutes; a wheel that does not import is "
                             "skipped with the reason)")
    compat.set_defaults(handler=cmd_compat)


def cmd_history(args: argparse.Namespace) -> int:
    from .derive import derive

    data_dir: Path = args.data_dir
    if args.releases:
        try:
            versions = [normal_version(v) for v in args.releases.split(",") if v.strip()]
        except VersionError as exc:
            print(f"enginewire spec history: error: {exc}", file=sys.stderr)
            return 2
    else:
        versions = sorted([*read_releases(data_dir), *read_skipped(data_dir)],
                          key=parse_version)
        if not versions:
            print("enginewire spec history: error: no history/releases.toml; name the releases "
                  "with --releases", file=sys.stderr)
            return 2
    wheel_dir = args.wheel_dir or default_wheel_dir()
    started = time.perf_counter()
    try:
        wheels = ensure_wheels(versions, wheel_dir, offline=args.offline,
                               log=lambda m: print(m, file=sys.stderr))
    except WheelError as exc:
        print(f"enginewire spec history: error: {exc}", file=sys.stderr)
        return 1
    histories = derive(data_dir, wheels, log=lambda m: print(m, file=sys.stderr),
                       use_cache=not args.no_extract_cache)
    problems = [h for h in histories if h.problem]
    for history in problems:
        print(f"warning: {history.name}: {history.problem}", file=sys.stderr)
    derived = read_releases(data_dir)
    print(f"history derived from {len(derived)} releases ({derived[0]} to {derived[-1]}) into "
          f"{data_dir} in {time.perf_counter() - started:.1f} s; {len(problems)} structs with "
          "problems")
    return 0


def cmd_releases(args: argparse.Namespace) -> int:
    for version in read_releases(args.data_dir):
        print(version)
    return 0


def cmd_match(args: argparse.Namespace) -> int:
    from .match import run_match

    return run_match(args.target, args.data_dir, args.target_cmd, args.struct)


def cmd_compat(args: argparse.Namespace) -> int:
    from ..loader import DATA_DIR
    from .compat import run_compat
    from .compat_matrix import write_matrix

    known = read_releases(DATA_DIR)
    if args.matrix:
        return write_matrix(known, args.out, confirm=not args.no_confirm)
    if not args.frontend or not args.engine:
        print("enginewire compat: error: give releases A and B, or --matrix", file=sys.stderr)
        return 2
    for version in (args.frontend, args.engine):
        try:
            ok = parse_version(version) in {parse_version(v) for v in known}
        except VersionError:
            ok = False
        if not ok:
            print(f"enginewire compat: error: vLLM {version} is not a release the spec was "
                  f"derived from ({known[0]} to {known[-1]})", file=sys.stderr)
            return 2
    status = run_compat(normal_version(args.frontend), normal_version(args.engine),
                        confirm=not args.no_confirm, as_json=args.json)
    if args.real_wheels:
        from .compat import real_wheel_check

        real_wheel_check(normal_version(args.frontend), normal_version(args.engine))
    return status
