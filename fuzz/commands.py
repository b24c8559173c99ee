"""``enginewire fuzz``: malformed-input fuzzing of a target's decoders and engine.

Exit status: 0 when the campaign found nothing, 1 when it has findings, 2 for a usage error
(a target that cannot be loaded, a surface the target lacks, Hypothesis not installed).
See ``docs/fuzzing.md`` for long campaigns and scaling out.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from enginewire.cliargs import non_negative_float, positive_float, writable_dir

SURFACE_CHOICES = ("codec", "encoder", "engine")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "fuzz",
        help="malformed-input fuzzing of a target's decoders and engine",
        description=(
            "Feed near-valid frames that break one spec rule each to a target. Codec surface: "
            "every case must decode or raise an error naming the clause it breaks (a wrong "
            "clause, an exception without a clause, or a hang is a finding). Encoder: the "
            "target's codec.encode on spec-generated valid values must write the bytes the "
            "spec's oracle writes (a difference names the struct, path and clause). Engine: "
            "after each batch of malformed input messages a valid ADD must still be served. "
            "Findings are shrunk and kept in the example database, so they replay first on "
            "the next run. The last line is 'N cases, M findings'."
        ),
    )
    parser.add_argument("--target", default="reference",
                        help="reference (default), vllm, mutant:NAME or package.module:attr")
    parser.add_argument("--surface", action="append", choices=SURFACE_CHOICES, default=[],
                        help="surface to fuzz (default: codec): codec (malformed input to "
                             "the decoder), encoder (differential: the encoder against the "
                             "spec oracle), engine; may repeat")
    parser.add_argument("--kind", action="append", default=[], metavar="KIND",
                        help="codec surface: only this message kind or struct; may repeat")
    parser.add_argument("--max-examples", type=int, default=None, metavar="N",
                        help="cases per kind (codec, default 100) or batches (engine, "
                             "default 20)")
    parser.add_argument("--seed", type=int, default=None,
                        help="Hypothesis seed, for a reproducible campaign")
    parser.add_argument("--database", default=None, type=writable_dir, metavar="DIR",
                        help="example database directory (default .hypothesis/enginewire-fuzz)")
    parser.add_argument("--no-database", action="store_true",
                        help="keep no example database (nothing replays)")
    parser.add_argument("--timeout", type=positive_float, default=None, metavar="S",
                        help="seconds per decode (codec, default 2) or per served ADD "
                             "(engine, default 10)")
    parser.add_argument("--shrink-seconds", type=non_negative_float, default=5.0, metavar="S",
                        help="codec: seconds spent shrinking each finding (default 5; 0: "
                             "report the smallest case the campaign saw)")
    parser.add_argument("--strict", action="store_true",
                        help="codec: a malformed case that decodes is a finding too")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per kind")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        print("enginewire fuzz: needs Hypothesis (pip install 'enginewire[fuzz]')",
              file=sys.stderr)
        return 2
    from enginewire.conformance.targets.contract import TargetError
    from enginewire.conformance.targets.resolve import load_target
    from enginewire.fuzz.campaigns import (
        DEFAULT_CASE_TIMEOUT,
        DEFAULT_DATABASE,
        CodecCampaign,
        EngineCampaign,
        Report,
        fuzz_codec,
        fuzz_engine,
        open_database,
    )
    from enginewire.fuzz.strategies import kinds

    if args.max_examples is not None and args.max_examples < 1:
        print("enginewire fuzz: --max-examples must be at least 1", file=sys.stderr)
        return 2
    known = set(kinds())
    unknown = [k for k in args.kind if k not in known]
    if unknown:
        print(f"enginewire fuzz: unknown kind(s) {', '.join(unknown)}; known: "
              f"{', '.join(kinds())}", file=sys.stderr)
        return 2
    try:
        target = load_target(args.target)
    except TargetError as exc:
        print(f"enginewire fuzz: {exc}", file=sys.stderr)
        return 2
    surfaces = args.surface or ["codec"]
    missing = [s for s in surfaces
               if getattr(target, "codec" if s == "encoder" else s, None) is None]
    if missing:
        print(f"enginewire fuzz: target {target.name!r} does not implement "
              f"{', '.join(missing)} (it has: {', '.join(target.implemented()) or 'nothing'})",
              file=sys.stderr)
        target.close()
        return 2

    database = None if args.no_database else open_database(args.database or DEFAULT_DATABASE)
    progress = (lambda line: print(line, file=sys.stderr)) if args.verbose else None
    report = Report()
    print(f"enginewire fuzz: target {target.name}, surface(s) {', '.join(surfaces)}"
          + (f", seed {args.seed}" if args.seed is not None else ""), file=sys.stderr)
    try:
        if "codec" in surfaces:
            campaign = CodecCampaign(
                target_name=_slug(target.name),
                max_examples=args.max_examples or 100,
                seed=args.seed,
                database=database,
                timeout=args.timeout or DEFAULT_CASE_TIMEOUT,
                strict=args.strict,
                shrink_seconds=args.shrink_seconds,
                progress=progress,
            )
            codec = target.codec
            report.merge(fuzz_codec(codec.decode, args.kind or kinds(), campaign))
        if "encoder" in surfaces:
            from enginewire.fuzz.differential import (
                EncoderCampaign,
                encoder_kinds,
                fuzz_encoder,
            )

            codec = target.codec
            chosen = args.kind or encoder_kinds(codec)
            report.merge(fuzz_encoder(codec.encode, chosen, EncoderCampaign(
                max_examples=args.max_examples or 100, seed=args.seed, progress=progress)))
        if "engine" in surfaces:
            engine_campaign = EngineCampaign(
                target_name=_slug(target.name),
                max_examples=args.max_examples or 20,
                seed=args.seed,
                database=database,
                timeout=args.timeout or 10.0,
                progress=progress,
            )
            report.merge(fuzz_engine(target.engine, engine_campaign))
    finally:
        target.close()
    print(report.render())
    return 1 if report.findings else 0


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
