"""``enginewire bench``: measure the ring, the codec and the peers against vLLM and baselines.

Exit status: 0 when the run completed (whatever the figures: targets are measured, never
asserted), 1 when some cell failed in every round, 2 for a usage error, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from typing import Any

from enginewire.bench.config import BENCHES, TRANSPORTS, BenchConfig
from enginewire.cliargs import non_negative_float, positive_int, writable_dir, writable_file


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure the ring, the codec and the peers against vLLM and raw baselines",
        description=(
            "Measure, in one run and alternating contenders round by round: ring messages/s, "
            "GB/s and latency; codec encode and decode time; ADD to first output over ipc:// "
            "and tcp://. Every figure is the median over rounds (with min and max) and "
            "stands as a ratio to vLLM (when installed) and to the ceiling (memcpy, raw "
            "msgspec, a bare ROUTER/DEALER round trip). See docs/bench.md."
        ),
    )
    parser.add_argument(
        "--target", action="append", default=[], metavar="T",
        help="implementation to measure: reference (default), vllm, mutant:NAME or "
             "package.module:attr, as for 'enginewire check'; may repeat or be "
             "comma-separated. vLLM is measured as the comparison whenever it is installed",
    )
    parser.add_argument("--quick", action="store_true",
                        help="a small grid and 3 rounds: about a minute")
    parser.add_argument("--json", metavar="PATH", type=writable_file,
                        help="write every figure as JSON here")
    parser.add_argument("--plot", metavar="DIR", type=writable_dir,
                        help="write PNG plots into DIR (matplotlib)")
    parser.add_argument("--markdown", metavar="PATH", type=writable_file,
                        help="write the command, the targets and the summary tables as "
                             "Markdown (for a README)")
    parser.add_argument("--bench", action="append", choices=BENCHES, default=[],
                        help="run only this bench; may repeat (default: all)")
    parser.add_argument("--payload", action="append", type=payload_size, default=[],
                        metavar="SIZE",
                        help="ring payload size (bytes, or with KiB/MiB: 1KiB); may repeat "
                             "(default: the grid's)")
    parser.add_argument("--readers", action="append", type=positive_int, default=[],
                        metavar="N", help="ring reader count; may repeat (default: the grid's)")
    parser.add_argument("--chunks", action="append", type=positive_int, default=[],
                        metavar="N", help="ring chunk count; may repeat (default: the grid's)")
    parser.add_argument("--rounds", type=positive_int, metavar="N",
                        help="rounds (default 7, quick 3)")
    parser.add_argument("--step-delay", type=non_negative_float, metavar="SECONDS",
                        help="peers: the reference engine's time per generation step "
                             "(default 0: as fast as it can)")
    parser.add_argument("--transport", action="append", choices=TRANSPORTS, default=[],
                        help="peers: measure over this transport only; may repeat "
                             "(default: ipc and tcp)")
    parser.add_argument("--no-vllm", action="store_true",
                        help="do not measure vLLM (no vs-vLLM ratios)")
    parser.add_argument("--summary", action="store_true",
                        help="print only the headline cases (base reader and chunk counts)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--from-json", metavar="PATH",
                        help="measure nothing: print (and --plot, --markdown) the results "
                             "saved in PATH by --json")
    parser.set_defaults(handler=main)


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (recorded with its figures)."""
    words = ["enginewire", "bench"]
    for target in args.target:
        words += ["--target", target]
    if args.quick:
        words.append("--quick")
    for bench in args.bench:
        words += ["--bench", bench]
    for size in args.payload:
        words += ["--payload", str(size)]
    for readers in args.readers:
        words += ["--readers", str(readers)]
    for chunks in args.chunks:
        words += ["--chunks", str(chunks)]
    if args.rounds is not None:
        words += ["--rounds", str(args.rounds)]
    if args.step_delay is not None:
        words += ["--step-delay", str(args.step_delay)]
    for transport in args.transport:
        words += ["--transport", transport]
    if args.no_vllm:
        words.append("--no-vllm")
    for option in ("plot", "json", "markdown"):
        value = getattr(args, option)
        if value:
            words += [f"--{option}", value]
    return shlex.join(words)


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The run's configuration from the parsed command line (ValueError if invalid)."""
    targets = tuple(dict.fromkeys(
        t.strip() for text in args.target for t in text.split(",") if t.strip()))
    overrides: dict[str, Any] = {"targets": targets or ("reference",),
                                 "include_vllm": not args.no_vllm}
    if args.bench:
        overrides["benches"] = tuple(b for b in BENCHES if b in args.bench)
    if args.rounds is not None:
        overrides["rounds"] = args.rounds
    if args.step_delay is not None:
        overrides["engine_step_delay"] = args.step_delay
    if args.transport:
        overrides["transports"] = tuple(t for t in TRANSPORTS if t in args.transport)
    if args.payload:
        overrides["payloads"] = tuple(dict.fromkeys(args.payload))
    if args.readers:
        readers = tuple(sorted(set(args.readers)))
        overrides["readers"] = readers
        overrides["latency_readers"] = readers
        overrides["base_readers"] = (BenchConfig.base_readers if BenchConfig.base_readers
                                     in readers else readers[0])
    if args.chunks:
        chunks = tuple(sorted(set(args.chunks)))
        overrides["chunks"] = chunks
        overrides["base_chunks"] = (BenchConfig.base_chunks if BenchConfig.base_chunks
                                    in chunks else chunks[0])
    config = BenchConfig.quick() if args.quick else BenchConfig.full()
    return replace(config, **overrides)


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "k": 1 << 10, "mib": 1 << 20, "m": 1 << 20}


def payload_size(text: str) -> int:
    """A payload size: a byte count, or a number followed by KiB or MiB (``1KiB``)."""
    stripped = text.strip().lower()
    digits = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = _UNITS.get(stripped[len(digits):])
    if not digits.isdigit() or unit is None:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 1024, 1KiB or 1MiB, got {text!r}")
    return int(digits) * unit


def _unloadable_targets(targets: tuple[str, ...]) -> str | None:
    """Why one of the asked targets cannot be measured (None: all load), found before the
    run starts: an unknown target is an error, never a run of the others."""
    from enginewire.conformance.targets.contract import TargetError
    from enginewire.conformance.targets.resolve import load_target

    for text in targets:
        try:
            load_target(text).close()
        except (TargetError, ImportError) as exc:
            return f"target {text!r}: {exc}"
    return None


def main(args: argparse.Namespace) -> int:
    from enginewire.bench import plots, report, rounds

    if args.plot and not plots.available():
        print("enginewire bench: --plot needs matplotlib (pip install 'enginewire[bench]')",
              file=sys.stderr)
        return 2
    if args.from_json:
        try:
            results = report.read_json(args.from_json)
        except (OSError, ValueError, KeyError) as exc:
            print(f"enginewire bench: cannot read {args.from_json}: {exc}", file=sys.stderr)
            return 2
    else:
        try:
            config = config_from(args)
        except ValueError as exc:
            print(f"enginewire bench: {exc}", file=sys.stderr)
            return 2
        unknown = _unloadable_targets(config.targets)
        if unknown:
            print(f"enginewire bench: {unknown}", file=sys.stderr)
            return 2
        results = rounds.run(config, progress=not args.no_progress,
                             command=command_line(args))
    print(report.render(results, summary=args.summary))
    if args.json and not args.from_json:
        report.write_json(results, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.markdown:
        report.write_markdown(results, args.markdown, plot_dir=args.plot)
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.plot:
        for path in plots.write_plots(results, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    if any("interrupted" in note for note in results.notes):
        return 130
    if any(s.summary is None for s in results.series):
        return 1
    return 0
