"""``enginewire check``: run the conformance suite against a target.

Exit status: 0 iff nothing unexpected happened (no unexpected failure, no unexpected pass, no
changed failure against the expected-failure list); 1 otherwise, and for ``--coverage`` when a
MUST clause has no check; 2 for a usage error (a target that cannot be loaded, a
``--target-cmd`` program that cannot start -- not found, not executable, exited before serving
anything --, a malformed expected-failure file).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from enginewire.cliargs import positive_float, text_file_problem, writable_file
from enginewire.conformance.framework.registry import SURFACES
from enginewire.spec.history.match import register_codec_matcher


def _match_codec(target: str, commands: Any, names: Any) -> int:
    from enginewire.conformance.release_match import run_codec_match

    return run_codec_match(target, commands, names)


register_codec_matcher(_match_codec)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="run the conformance suite against an implementation",
        description=(
            "Run the conformance checks against a target. Every check names the spec "
            "clause(s) it enforces; SHOULD and MAY checks run only with --strict. The last "
            "line of the output is 'N passed, M failed'."
        ),
    )
    parser.add_argument(
        "--target", default=None,
        help="reference (default), vllm, mutant:NAME, package.module:attr, or none (only "
             "--target-cmd surfaces)",
    )
    parser.add_argument(
        "--target-cmd", action="append", default=[], metavar="[SURFACE=]COMMAND",
        help="an external program for one surface; placeholders like {handshake} are filled "
             "in (see docs/conformance.md); may repeat",
    )
    parser.add_argument("--version", default=None, metavar="X",
                        help="vLLM release whose layouts the checks and the reference codec "
                             "follow (default: the spec's reference version; `enginewire spec "
                             "releases` lists them)")
    parser.add_argument("--surface", action="append", choices=SURFACES, default=[],
                        help="run only checks of this surface; may repeat")
    parser.add_argument("-k", "--select", action="append", default=[], metavar="GLOB",
                        help="run only checks whose ID matches this glob; may repeat")
    parser.add_argument("--strict", action="store_true",
                        help="also run checks of SHOULD and MAY clauses")
    parser.add_argument("--json", metavar="PATH", type=writable_file,
                        help="write the JSON report here")
    parser.add_argument("--junit", metavar="PATH", type=writable_file,
                        help="write a JUnit XML report here")
    parser.add_argument("--html", metavar="PATH", type=writable_file,
                        help="write a self-contained HTML report")
    parser.add_argument("--spec-site", metavar="URL",
                        help="in the HTML report, link each clause to its anchor on the site "
                             "`enginewire docs build` writes, at this URL or path relative to "
                             "the report (default: the Markdown pages docs/spec/*.md)")
    parser.add_argument("--markdown", metavar="PATH", type=writable_file,
                        help="write a Markdown page of the result for publishing (clauses "
                             "passed per surface, every failure with its reproduction)")
    parser.add_argument("--expected-failures", metavar="FILE",
                        help="checks the target is known to fail (one ID per line, "
                             "optional '# message prefix')")
    parser.add_argument("--update-expected", action="store_true",
                        help="rewrite --expected-failures FILE from this run")
    parser.add_argument("--coverage", action="store_true",
                        help="list clauses without a check (exit 1 if a MUST clause has none)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--timeout-scale", type=positive_float, default=1.0, metavar="X",
                        help="multiply every check's time limit by X (slow machines)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show tracebacks, skips and not-implemented reasons")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--vectors", action="append", default=[], metavar="DIR",
                        help="add the recorded frames under DIR (golden format, see "
                             "'enginewire vectors write') to the golden checks; may repeat")
    parser.set_defaults(handler=main)

    vectors = subparsers.add_parser(
        "vectors",
        help="write recorded frames as vectors for 'enginewire check --vectors'",
        description="Write frames captured elsewhere (hex, one frame per argument) as one "
                    "vector of the golden format: the kind, the release the frames claim, "
                    "and whether they must decode (the value is read back with the "
                    "reference decoder) or be rejected.",
    )
    vsub = vectors.add_subparsers(dest="vectors_command", required=True)
    write = vsub.add_parser("write", help="write one vector file")
    write.add_argument("frames", nargs="+", metavar="HEX", help="the frames, in order, as hex")
    write.add_argument("--kind", required=True,
                       help="a message kind (add, outputs, ...) or a struct name")
    write.add_argument("--name", required=True, help="the vector's name (its file name)")
    write.add_argument("--release", required=True,
                       help="the vLLM release the frames come from (e.g. 0.31.0)")
    write.add_argument("--expect", choices=("decode", "reject"), default="decode")
    write.add_argument("--clause", default=None,
                       help="for --expect reject: the clause a refusal must cite")
    write.add_argument("--description", default="recorded frames")
    write.add_argument("--threshold", type=int, default=None,
                       help="the writer's inline threshold (default: the spec's)")
    write.add_argument("--out", required=True, metavar="DIR", help="the vector directory")
    write.set_defaults(handler=write_vector_main)


def write_vector_main(args: argparse.Namespace) -> int:
    """``enginewire vectors write``: one vector file from captured frames."""
    from pathlib import Path

    from enginewire.conformance.oracle.golden import GoldenVector, write_vector
    from enginewire.conformance.oracle.values import neutral
    from enginewire.conformance.targets.reference import ReferenceCodec
    from enginewire.spec import load

    try:
        frames = tuple(bytes.fromhex(text) for text in args.frames)
    except ValueError as exc:
        print(f"enginewire vectors write: a frame is not hex: {exc}", file=sys.stderr)
        return 2
    spec = load()
    threshold = args.threshold or spec.inline_threshold()
    value = None
    if args.expect == "decode":
        try:
            value = neutral(ReferenceCodec(threshold).decode(args.kind, list(frames)))
        except Exception as exc:  # noqa: BLE001 - told to the user
            print(f"enginewire vectors write: the reference decoder refuses these frames as "
                  f"{args.kind}: {exc} (record them with --expect reject)", file=sys.stderr)
            return 1
    vector = GoldenVector(name=args.name, kind=args.kind, threshold=threshold,
                          description=args.description, vllm_version=args.release,
                          value=value, frames=frames, expect=args.expect, clause=args.clause)
    print(write_vector(vector, Path(args.out)))
    return 0


def main(args: argparse.Namespace) -> int:
    from enginewire.conformance.framework import reports
    from enginewire.conformance.framework.expected import ExpectedFailures, ExpectedFileError
    from enginewire.conformance.framework.registry import all_checks, select
    from enginewire.conformance.targets.contract import TargetError
    from enginewire.conformance.targets.resolve import load_target
    from enginewire.spec import load
    from enginewire.spec.loader import UnknownVersionError

    dotted = [pattern for pattern in args.select if "." in pattern]
    if dotted:
        print(f"enginewire check: -k {dotted[0]!r} can match no check: check IDs separate "
              f"their parts with '/' (try {dotted[0].replace('.', '/')!r}); dots are for "
              "clause IDs", file=sys.stderr)
        return 2
    try:
        spec = load(args.version)
    except UnknownVersionError as exc:
        print(f"enginewire check: {exc}", file=sys.stderr)
        return 2
    for directory in getattr(args, "vectors", []):
        from enginewire.conformance.checks.codec_golden import register_vectors

        try:
            register_vectors(directory)
        except (OSError, ValueError, KeyError) as exc:
            print(f"enginewire check: {exc}", file=sys.stderr)
            return 2
    checks = select(all_checks(), surfaces=args.surface, patterns=args.select)

    if args.list:
        for item in checks:
            level = item.level(spec)
            print(f"{item.id}  [{', '.join(item.clauses)}]  {level}  {item.description}")
        print(f"{len(checks)} checks")
        return 0

    if args.coverage:
        report = reports.coverage(spec, all_checks())
        print(reports.render_coverage(report, spec))
        return 1 if report["uncovered"]["MUST"] else 0

    if args.update_expected and not args.expected_failures:
        print("enginewire check: --update-expected needs --expected-failures FILE",
              file=sys.stderr)
        return 2
    if not checks:
        print("enginewire check: no check matches the --surface / -k selection",
              file=sys.stderr)
        return 2
    expected = None
    if args.expected_failures:
        problem = _expected_file_problem(args.expected_failures, args.update_expected)
        if problem:
            print(f"enginewire check: --expected-failures {problem}", file=sys.stderr)
            return 2
        try:
            expected = ExpectedFailures.load(args.expected_failures)
        except ExpectedFileError as exc:
            print(f"enginewire check: {exc}", file=sys.stderr)
            return 2

    target_text = args.target
    if target_text is None:
        target_text = "none" if args.target_cmd else "reference"
    from enginewire.conformance.framework.runner import run

    progress = reports.Progress(enabled=False if args.no_progress else None)
    try:
        # A target that cannot be loaded, or whose program cannot start once the run needs it.
        target = load_target(target_text, args.target_cmd, version=args.version)
        try:
            result = run(
                checks, target, spec,
                strict=args.strict,
                expected=expected,
                progress=progress,
                timeout_scale=args.timeout_scale,
            )
        finally:
            target.close()
    except TargetError as exc:
        if progress.enabled:
            sys.stderr.write("\r" + " " * 120 + "\r")  # the progress bar's line
        print(f"enginewire check: {exc}", file=sys.stderr)
        return 2

    if args.update_expected and expected is not None:
        rewritten = expected.updated(result)
        written = rewritten.write()
        rewritten.apply(result)
        print(f"enginewire check: wrote {len(rewritten.entries)} entries to {written}",
              file=sys.stderr)
    if args.json:
        reports.write_json(result, args.json)
    if args.junit:
        reports.write_junit(result, args.junit)
    if args.html:
        reports.write_html(result, args.html, spec_site=args.spec_site)
    if args.markdown:
        reports.write_markdown(result, args.markdown, spec, command=_command_line(args),
                               description=target.description)
    print(reports.render_terminal(result, verbose=args.verbose))
    return 0 if result.ok else 1


def _expected_file_problem(path_text: str, update: bool) -> str | None:
    """Why ``path_text`` cannot be read as an expected-failure list (None: it can). A missing
    file is fine only with --update-expected, which creates it."""
    from pathlib import Path

    path = Path(path_text)
    if not path.exists():
        if update and path.parent.is_dir():
            return None
        return f"{path_text} does not exist"
    return text_file_problem(path_text)


def _command_line(args: argparse.Namespace) -> str:
    """The ``enginewire check`` options that decide the result (for a generated page)."""
    parts = ["enginewire check"]
    if args.target:
        parts.append(f"--target {args.target}")
    parts += [f"--target-cmd '{c}'" for c in args.target_cmd]
    parts += [f"--surface {s}" for s in args.surface]
    parts += [f"-k '{k}'" for k in args.select]
    if args.strict:
        parts.append("--strict")
    if args.timeout_scale != 1.0:
        parts.append(f"--timeout-scale {args.timeout_scale:g}")
    if args.expected_failures:
        parts.append(f"--expected-failures {args.expected_failures}")
    parts.append(f"--markdown {args.markdown}")
    return " ".join(parts)
