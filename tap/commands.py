"""``enginewire tap`` and ``enginewire replay`` (see docs/tap.md).

``tap`` forwards a live session (:mod:`.proxy`) and prints each message decoded and checked
(:mod:`.annotate`), optionally recording it (:mod:`.capture`); ``tap --read FILE`` does the same
offline from a recording, with any ``--version``, and ``--golden DIR`` writes its messages as
golden vectors. ``replay`` plays one side of a recording against a target (:mod:`.replay`).

Exit status: 0 when every message decoded without a violation (``replay``: and the target did
not diverge), 1 otherwise, 2 for bad arguments or an unknown release.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from enginewire.cliargs import positive_int

from .releases import DEFAULT_RELEASE


def register(subparsers: argparse._SubParsersAction) -> None:
    tap = subparsers.add_parser(
        "tap", help="forward a front end <-> engine session, decoding and checking every frame")
    source = tap.add_mutually_exclusive_group(required=True)
    source.add_argument("--handshake", metavar="ADDR",
                        help="the front end's handshake address (engines get the tap's)")
    source.add_argument("--input", metavar="ADDR", action="append",
                        help="the front end's input address, for engines given addresses "
                             "directly (repeatable, with as many --output)")
    source.add_argument("--read", metavar="FILE", help="decode a recording instead")
    tap.add_argument("--output", metavar="ADDR", action="append", default=[],
                     help="the front end's output address (with --input)")
    tap.add_argument("--listen", metavar="ADDR", default=None,
                     help="where the tap binds the handshake (default: a fresh address on "
                          "the front end's transport)")
    tap.add_argument("--listen-input", metavar="ADDR", action="append", default=[])
    tap.add_argument("--listen-output", metavar="ADDR", action="append", default=[])
    tap.add_argument("--version", default=DEFAULT_RELEASE,
                     help="the vLLM release whose layouts decode the frames, or 'auto': "
                          "the release an engine's ready response names (default: "
                          "%(default)s)")
    tap.add_argument("--json", action="store_true", help="print JSON lines")
    tap.add_argument("--record", metavar="FILE", help="write the session to a capture file")
    tap.add_argument("--golden", metavar="DIR",
                     help="with --read: write each decodable message as a golden vector")
    tap.add_argument("--max-behind", type=positive_int, default=None, metavar="N",
                     help="most captured messages waiting for the decoder; a message "
                          "captured while N wait is forwarded and recorded but not decoded "
                          "live (counted at exit, exit status 1; --read decodes the "
                          "recording) (default: 1024)")
    tap.add_argument("--duration", type=float, default=None,
                     help="stop after this many seconds (default: at SIGINT or SIGTERM)")
    tap.set_defaults(handler=cmd_tap)

    replay = subparsers.add_parser(
        "replay", help="play one side of a recording against a live target and compare")
    replay.add_argument("file", metavar="FILE", help="a capture file (enginewire tap --record)")
    replay.add_argument("--against", choices=("engine", "frontend"), required=True)
    replay.add_argument("--target", required=True,
                        help="'reference' (the reference engine core, with --against engine) "
                             "or a command with {handshake} {input} {output} {rank} in it")
    replay.add_argument("--version", default=DEFAULT_RELEASE)
    replay.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for each answer (default: %(default)s)")
    replay.set_defaults(handler=cmd_replay)


def _printer(json_lines: bool, out: IO[str]) -> Any:
    from .annotate import line, to_json

    form = to_json if json_lines else line

    def show(annotation: Any) -> None:
        out.write(form(annotation) + "\n")
        out.flush()

    return show


def cmd_tap(args: argparse.Namespace) -> int:
    from .releases import UnknownRelease

    try:
        if args.read:
            return _read(args)
        return _live(args)
    except UnknownRelease as exc:
        print(f"enginewire tap: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"enginewire tap: {exc}", file=sys.stderr)
        return 2


def _read(args: argparse.Namespace) -> int:
    from .annotate import Annotator
    from .capture import CaptureError, read

    annotator = Annotator(args.version)
    try:
        header, records = read(args.read)
    except (CaptureError, OSError) as exc:
        print(f"enginewire tap: {args.read}: {exc}", file=sys.stderr)
        return 2
    print(f"# {args.read}: recorded with release {header.release}, decoded with "
          f"{annotator.release}, {len(records)} messages", file=sys.stderr)
    show = _printer(args.json, sys.stdout)
    bad = 0
    annotations = []
    for record in records:
        annotation = annotator.annotate(record)
        annotations.append(annotation)
        bad += bool(annotation.violations)
        show(annotation)
    if args.golden:
        from .vectors import write_vectors

        paths = write_vectors(annotations, Path(args.golden), Path(args.read).stem)
        print(f"# wrote {len(paths)} golden vectors to {args.golden}", file=sys.stderr)
    return 1 if bad else 0


def _live(args: argparse.Namespace) -> int:
    from .annotate import Annotator
    from .capture import Header, Writer
    from .proxy import MAX_BEHIND, Tap, TapConfig

    if args.golden:
        raise ValueError("--golden works on a recording (with --read)")
    annotator = Annotator(args.version)
    config = TapConfig(
        listen_handshake=args.listen, upstream_handshake=args.handshake,
        listen_inputs=args.listen_input, upstream_inputs=args.input or [],
        listen_outputs=args.listen_output, upstream_outputs=args.output,
    )
    show = _printer(args.json, sys.stdout)
    handle = open(args.record, "wb") if args.record else None  # noqa: SIM115
    writer = Writer(handle, Header(annotator.release)) if handle else None
    counts = {"bad": 0}

    def observe(record: Any) -> None:
        try:
            annotation = annotator.annotate(record)
        except Exception as exc:  # never stop capturing over a message it cannot show
            counts["bad"] += 1
            print(f"# tap: could not decode a {record.channel} message from the "
                  f"{record.sender}: {exc!r}", file=sys.stderr)
            return
        counts["bad"] += bool(annotation.violations)
        show(annotation)

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Tap(config, observe, record=writer.write if writer else None,
                 max_behind=args.max_behind or MAX_BEHIND) as tap:
            if tap.handshake_address:
                print(f"# tap: engines use handshake address {tap.handshake_address}",
                      file=sys.stderr)
            for listen, upstream in zip(tap.input_addresses, config.upstream_inputs,
                                        strict=False):
                print(f"# tap: engines use input {listen} (front end's {upstream})",
                      file=sys.stderr)
            for listen, upstream in zip(tap.output_addresses, config.upstream_outputs,
                                        strict=False):
                print(f"# tap: engines use output {listen} (front end's {upstream})",
                      file=sys.stderr)
            sys.stderr.flush()
            tap.start()
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while not stop.wait(0.1):
                if tap.error is not None:
                    raise tap.error
                if deadline is not None and time.monotonic() > deadline:
                    break
        # Closed: every message forwarded was captured (and recorded) and observed or counted.
        print(f"# tap: {tap.forwarded} messages forwarded"
              + (f" and recorded to {args.record}" if args.record else "")
              + f", {tap.forwarded - tap.unobserved} decoded live, {tap.unobserved} not "
              f"(the decoder was {tap.max_behind} behind; at most {tap.most_behind} waited)",
              file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if handle is not None:
            handle.close()
    return 1 if counts["bad"] or tap.unobserved else 0


def cmd_replay(args: argparse.Namespace) -> int:
    from .capture import CaptureError, read
    from .releases import UnknownRelease
    from .replay import (
        command_target,
        reference_engine,
        replay_against_engine,
        replay_against_frontend,
    )

    try:
        _header, records = read(args.file)
    except (CaptureError, OSError) as exc:
        print(f"enginewire replay: {args.file}: {exc}", file=sys.stderr)
        return 2
    if args.target == "reference":
        if args.against != "engine":
            print("enginewire replay: --target reference is an engine (--against engine); "
                  "give a front end as a command", file=sys.stderr)
            return 2
        launch: Any = reference_engine
    else:
        launch = functools.partial(command_target, args.target,
                                   once=args.against == "frontend")
    run = replay_against_engine if args.against == "engine" else replay_against_frontend
    try:
        result = run(records, launch, release=args.version, timeout=args.timeout)
    except UnknownRelease as exc:
        print(f"enginewire replay: {exc}", file=sys.stderr)
        return 2
    from .annotate import line

    print(f"sent {result.sent} recorded messages, received {result.received}")
    for annotation in result.violations:
        print(line(annotation))
    if result.stopped:
        print(f"stopped early: {result.stopped}")
    if result.divergence is None:
        print("no divergence from the recording")
    else:
        print(result.divergence.describe())
    return 0 if result.ok else 1
