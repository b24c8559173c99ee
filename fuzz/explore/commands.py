"""``enginewire explore``: schedule exploration of a shared-memory ring target.

Exit status: 0 when the search ran to its end and found no violation, 1 when it found one (or
a replayed schedule still violates), 2 for a usage error (unknown target, malformed or
diverging schedule), 3 (:data:`EXIT_INCONCLUSIVE`) when the search stopped at ``--max-states``
without finding one: "inconclusive at N states", never a pass.
See ``docs/explorer.md``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

DEFAULT_MAX_STATES = 2_000_000
#: Exit status of a search cut short at its state limit with no violation found.
EXIT_INCONCLUSIVE = 3


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explore",
        help="explore the interleavings of a shared-memory ring's writer and readers",
        description=(
            "Run a ring target's own writer and reader code over instrumented shared memory, "
            "interleaved only at memory accesses, and explore the interleavings: "
            "all of them (default), all within a preemption bound, or PCT random samples, "
            "under a sequentially consistent (sc), TSO-like (tso) or store-reordering (weak) "
            "memory model. Checks: the flag discipline of the ring's state machine, that every "
            "reader receives exactly the messages sent, in order, intact, no deadlock, "
            "termination. A violation prints a shrunk trace and a schedule that replays it."
        ),
    )
    parser.add_argument("--target", default="reference",
                        help="reference (default), vllm (acquire_write/acquire_read), "
                             "vllm-enqueue (enqueue/dequeue), vllm+fence-after-claim and "
                             "vllm+lock-fence (what-ifs of vllm: a fence after the writer's "
                             "claim; memory_fence as a lock that is no full fence), "
                             "WRITER>READERS (one target's "
                             "writer with another's readers), package.module:attr naming a "
                             "RingTarget, or any target 'enginewire check --target' takes "
                             "(mutant:NAME, package.module:attr) whose ring has the "
                             "ring.memory capability")
    parser.add_argument("--cross", action="store_true",
                        help="explore the target three ways: its writer with the reference "
                             "readers, the reference writer with its readers, its own pair; "
                             "report which pairing violates what")
    parser.add_argument("--readers", type=int, default=2, metavar="R",
                        help="local readers (default 2)")
    parser.add_argument("--chunks", type=int, default=2, metavar="C",
                        help="chunks in the ring (default 2)")
    parser.add_argument("--messages", type=int, default=3, metavar="M",
                        help="messages the writer sends (default 3)")
    parser.add_argument("--payload-bytes", type=int, default=2, metavar="B",
                        help="bytes per message (default 2)")
    parser.add_argument("--oob-buffers", type=int, default=0, metavar="N",
                        help="out-of-band buffers per message after its main buffer (the "
                             "ring's buffer lists; default 0); reference and ring.memory "
                             "targets")
    parser.add_argument("--memory", choices=("sc", "tso", "weak"), default="sc",
                        help="memory model (default sc)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--preemptions", type=int, default=None, metavar="K",
                      help="explore every schedule with at most K preemptions "
                           "(default: every schedule)")
    mode.add_argument("--random", type=int, default=None, metavar="N",
                      help="run N random PCT schedules instead")
    parser.add_argument("--seed", type=int, default=0,
                        help="first PCT seed (run i uses seed + i; default 0)")
    parser.add_argument("--pct-depth", type=int, default=3, metavar="D",
                        help="PCT bug depth: D - 1 priority change points (default 3)")
    parser.add_argument("--check", choices=("all", "behavior"), default="all",
                        help="all (default): flag discipline too; behavior: only what readers "
                             "receive, deadlock and termination")
    parser.add_argument("--keep-going", action="store_true",
                        help="search on after a violation; report the first of each kind")
    parser.add_argument("--max-states", type=int, default=DEFAULT_MAX_STATES, metavar="N",
                        help=f"stop a search after N states (default {DEFAULT_MAX_STATES}; "
                             "0: no limit); a search stopped there without a violation "
                             f"is inconclusive (exit status {EXIT_INCONCLUSIVE})")
    parser.add_argument("--max-steps", type=int, default=None, metavar="N",
                        help="actions per execution before it counts as not terminating")
    parser.add_argument("--no-shrink", action="store_true", help="print violations unshrunk")
    parser.add_argument("--no-reduction", action="store_true",
                        help="turn off sleep-set reduction (state caching stays)")
    parser.add_argument("--html", default=None, metavar="FILE",
                        help="also write the violations found (or the replayed trace) to FILE "
                             "as a self-contained HTML page: each trace as a swimlane, one "
                             "column per writer/reader thread, the steps in order")
    parser.add_argument("--replay", default=None, metavar="SCHEDULE",
                        help="replay one schedule TARGET/MODEL/CONFIG/CHOICES as printed with a "
                             "violation (the other configuration options are ignored)")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from enginewire.fuzz.explore.execution import ExplorerError
    from enginewire.fuzz.explore.explorer import explore, replay
    from enginewire.fuzz.explore.pairing import resolve_target
    from enginewire.fuzz.explore.schedule import RingConfig, Schedule
    from enginewire.fuzz.explore.trace import format_events

    def usage(message: str) -> int:
        print(f"enginewire explore: {message}", file=sys.stderr)
        return 2

    if args.replay is not None:
        try:
            schedule = Schedule.parse(args.replay)
            target = resolve_target(schedule.target)
            result = replay(schedule, target, check=args.check, max_steps=args.max_steps)
        except (ValueError, ImportError, AttributeError, ExplorerError) as exc:
            return usage(str(exc))
        if result.findings:
            print(result.findings[0].format())
            write_html(args.html, f"enginewire explore --replay: {schedule}",
                       result.findings[:1])
        else:
            from enginewire.fuzz.explore.model import AddressMap
            from enginewire.fuzz.explore.trace import memory_log

            amap = AddressMap(target.layout(schedule.config))
            print("\n".join(format_events(amap, result.events)))
            if args.html:
                from enginewire.conformance.framework.memory_log import swimlane_page

                page = swimlane_page(f"enginewire explore --replay: {schedule}", [
                    ([result.summary()], memory_log(amap, result.events), [])])
                _write(args.html, page)
        print(result.summary())
        return 1 if result.findings else 0

    try:
        config = RingConfig(args.readers, args.chunks, args.messages, args.payload_bytes,
                            args.oob_buffers)
        target = resolve_target(args.target)
    except (ValueError, ImportError, AttributeError) as exc:
        return usage(str(exc))
    for name in ("preemptions", "random", "pct_depth", "max_states", "max_steps"):
        value = getattr(args, name)
        if value is not None and value < 0:
            return usage(f"--{name.replace('_', '-')} must not be negative")
    if args.cross:
        from enginewire.fuzz.explore.explorer import cross_explore
        from enginewire.fuzz.explore.pairing import PAIRING_TITLES

        try:
            cross = cross_explore(target, config, model=args.memory,
                                  preemptions=args.preemptions, random=args.random,
                                  seed=args.seed, pct_depth=args.pct_depth, check=args.check,
                                  max_steps=args.max_steps, max_states=args.max_states or None,
                                  keep_going=args.keep_going, shrink=not args.no_shrink,
                                  reduce=not args.no_reduction)
        except ExplorerError as exc:
            print(f"enginewire explore: cannot run {target.name}: {exc}", file=sys.stderr)
            return 2
        write_html(args.html, f"enginewire explore --cross {target.name}",
                   [f for result in cross.results.values() for f in result.findings])
        for pairing, result in cross.results.items():
            print(f"== ({pairing}) {PAIRING_TITLES[pairing]}")
            for finding in result.findings:
                print(finding.format())
                print()
            print(result.summary())
            print()
        print(cross.summary())
        if cross.findings:
            return 1
        return EXIT_INCONCLUSIVE if cross.inconclusive else 0
    try:
        result = explore(target, config, model=args.memory, preemptions=args.preemptions,
                         random=args.random, seed=args.seed, pct_depth=args.pct_depth,
                         check=args.check, max_steps=args.max_steps,
                         max_states=args.max_states or None, keep_going=args.keep_going,
                         shrink=not args.no_shrink, reduce=not args.no_reduction)
    except ExplorerError as exc:
        print(f"enginewire explore: cannot run {target.name}: {exc}", file=sys.stderr)
        return 2
    for finding in result.findings:
        print(finding.format())
        print()
    write_html(args.html, f"enginewire explore {target.name}", result.findings)
    print(result.summary())
    return exit_status(result)


def write_html(path: str | None, title: str, findings: Any) -> None:
    """Write the page of ``findings`` to ``path`` (nothing when ``path`` is None; a page
    saying "no violation" when there is none)."""
    if not path:
        return
    from enginewire.fuzz.explore.explorer import findings_html

    page = findings_html(title if findings else f"{title}: no violation", findings)
    _write(path, page)


def _write(path: str, page: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    print(f"wrote {path}")


def exit_status(result: Any) -> int:
    """1 for a violation, :data:`EXIT_INCONCLUSIVE` for a search cut short at its state
    limit without one, 0 for a search that ran to its end clean."""
    if result.findings:
        return 1
    return EXIT_INCONCLUSIVE if result.inconclusive else 0
