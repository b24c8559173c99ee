"""``explore()`` and ``replay()``: search a ring target's interleavings for violations.

::

    from enginewire.fuzz.explore import ReferenceTarget, RingConfig, explore

    result = explore(ReferenceTarget(), RingConfig(readers=2, chunks=2, messages=3),
                     model="sc")                           # every interleaving
    assert result.ok and result.complete
    result = explore(target, config, model="weak", random=1000, seed=7)   # PCT sampling
    for finding in result.findings:
        print(finding.format())                           # trace + replay string
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from enginewire.conformance.framework.memory_log import MemoryLog, Section, swimlane_page
from enginewire.fuzz.explore.execution import (
    Event,
    ExplorerError,
    Outcome,
    Simulator,
    Violation,
    World,
    outcome_of,
    run_forward,
)
from enginewire.fuzz.explore.model import AddressMap, MemoryModel
from enginewire.fuzz.explore.pairing import PAIRING_TITLES, PAIRINGS, PairedTarget, resolve_target
from enginewire.fuzz.explore.ring_targets import ReferenceTarget, RingTarget
from enginewire.fuzz.explore.schedule import RingConfig, Schedule
from enginewire.fuzz.explore.search import PctStrategy, ReplayStrategy, search
from enginewire.fuzz.explore.shrink import shortest_schedule
from enginewire.fuzz.explore.shrink import shrink as shrink_outcome
from enginewire.fuzz.explore.trace import (
    format_events,
    format_received,
    format_violation,
    memory_log,
)

CHECKS = ("all", "behavior")


@dataclass
class Finding:
    """One violation, shrunk, with its trace and the schedule that replays it."""

    violation: Violation
    schedule: Schedule
    events: list[Event]
    received: dict[str, list[bytes]]
    preemptions: int
    amap: AddressMap
    payloads: list[bytes]
    #: The PCT seed of the sampled run that found it (None for exhaustive search).
    seed: int | None = None
    #: The checks it was found with (``all`` or ``behavior``); replay with the same.
    check: str = "all"

    @property
    def steps(self) -> int:
        return self.violation.step

    def _heading(self) -> list[str]:
        schedule = self.schedule
        return [f"VIOLATION {format_violation(self.violation)}",
                f"trace ({schedule.target}, {schedule.model.value}, "
                f"{schedule.config.describe()}; {self.steps} steps, "
                f"{self.preemptions} preemption(s)):"]

    def _closing(self) -> list[str]:
        lines = ["what each reader saw (message numbers):"]
        lines += ["  " + line for line in format_received(self.payloads, self.received)]
        if self.seed is not None:
            lines.append(f"found by random schedule seed {self.seed}")
        check = "" if self.check == "all" else f"--check {self.check} "
        lines.append(f"replay: enginewire explore {check}--replay '{self.schedule}'")
        return lines

    def format(self) -> str:
        lines = self._heading()
        lines += ["  " + line for line in format_events(self.amap, self.events)]
        return "\n".join(lines + self._closing())

    def memory_log(self) -> MemoryLog:
        """The shrunk trace as a typed memory log (one process per writer/reader thread)."""
        return memory_log(self.amap, self.events, format_violation(self.violation))

    def section(self) -> Section:
        """This finding as a section of :func:`findings_html`'s page."""
        return (self._heading(), self.memory_log(), self._closing())


def findings_html(title: str, findings: Sequence[Finding]) -> str:
    """A self-contained page of violations: for each, what broke, the shrunk trace as a
    swimlane (one column per writer/reader thread, the steps in order, the conformance
    report's renderer), what each reader saw and the replay command."""
    return swimlane_page(title, [finding.section() for finding in findings])


@dataclass
class ExploreResult:
    """What a search did and found. ``complete``: every schedule of the mode was run (for
    ``exhaustive``: every interleaving; ``bounded``: every one within the preemption bound)."""

    target: str
    model: MemoryModel
    config: RingConfig
    mode: str
    bound: int | None
    #: Executions that ran to their end (search: ends of distinct paths; random: runs).
    executions: int
    #: Distinct states explored (search only).
    states: int
    #: Actions taken in all.
    transitions: int
    #: Times the target's thread code was run to learn what it does after a new history.
    code_runs: int
    complete: bool
    elapsed: float
    findings: list[Finding] = field(default_factory=list)
    #: Stopped because it reached ``max_states`` (not because of a violation).
    limited: bool = False
    #: The trace of the last execution (replay mode only).
    events: list[Event] = field(default_factory=list)
    #: The most actions of one execution the search reached (search only).
    depth: int = 0

    @property
    def ok(self) -> bool:
        """No violation found (which proves nothing when the search was cut short: see
        :attr:`verdict`)."""
        return not self.findings

    @property
    def inconclusive(self) -> bool:
        """The search stopped at its state limit without a violation: no verdict."""
        return self.limited and not self.findings

    @property
    def verdict(self) -> str:
        """``violation``, ``inconclusive`` (cut short at the state limit, nothing found: never a
        pass) or ``pass``."""
        if self.findings:
            return "violation"
        return "inconclusive" if self.inconclusive else "pass"

    def summary(self) -> str:
        if self.complete:
            ending = ""
        elif self.limited:
            ending = " (cut short at the state limit)"
        else:
            ending = " (stopped at the first violation)"
        if self.mode == "exhaustive":
            scope = ("every interleaving" if self.complete else "interleavings") + ending
        elif self.mode == "bounded":
            scope = (f"every interleaving with <= {self.bound} preemption(s)"
                     if self.complete else
                     f"interleavings with <= {self.bound} preemption(s)") + ending
        elif self.mode == "random":
            scope = "random (PCT) schedules" + ending
        else:
            scope = "replayed schedule"
        counts = (f"{self.states} states, {self.transitions} transitions, "
                  f"{self.executions} execution ends" if self.mode in ("exhaustive", "bounded")
                  else f"{self.executions} executions")
        if self.findings:
            verdict = (f"{len(self.findings)} violation(s): "
                       + ", ".join(f.violation.kind for f in self.findings))
        elif self.limited:
            verdict = (f"inconclusive at {self.states} states (coverage reached: "
                       f"{self.states} states, {self.transitions} transitions, "
                       f"{self.executions} execution ends, executions explored to a depth of "
                       f"{self.depth} actions; raise --max-states to search on)")
        else:
            verdict = "no violation"
        return (f"{self.target} {self.model.value} {self.config.spell()}: {scope} ({counts}, "
                f"{self.code_runs} code runs) in {self.elapsed:.1f} s: {verdict}")


def default_max_steps(config: RingConfig) -> int:
    """A bound on actions per execution well above what a correct ring needs."""
    return 200 + 60 * config.messages * (config.readers + 1)


class _Session:
    def __init__(self, target: RingTarget, config: RingConfig, model: MemoryModel, check: str,
                 max_steps: int | None) -> None:
        if check not in CHECKS:
            raise ValueError(f"check must be one of {', '.join(CHECKS)}, got {check!r}")
        self.check = check
        self.target = target
        self.config = config
        self.model = model
        if config.oob_buffers and not target.oob:
            raise ExplorerError(f"{target.name} sends every message as one buffer: it cannot be "
                             "explored with out-of-band buffers (+N)")
        self.sim = Simulator(layout=target.layout(config), model=model,
                             threads=target.threads(config), payloads=config.payloads(),
                             check_protocol=check == "all",
                             max_steps=max_steps or default_max_steps(config),
                             framing=target.framing, check_layout=target.spec_layout,
                             messages=config.messages_sent())

    def lenient(self, keys: Sequence[str]) -> Outcome:
        return run_forward(self.sim, ReplayStrategy(keys, strict=False))

    def finding(self, outcome: Outcome, *, shrink: bool, seed: int | None = None,
                bound: int | None = None) -> Finding:
        """Shrink (within the preemption ``bound`` the search had, if any), replay with a
        trace, and package one violating execution."""
        assert outcome.violation is not None
        if shrink and outcome.violation.kind != "no-termination":
            shorter = shortest_schedule(self.sim, outcome.violation.kind,
                                        max_depth=outcome.violation.step - 1,
                                        max_preemptions=bound)
            if shorter is not None:
                outcome = run_forward(self.sim, ReplayStrategy(shorter))
        if shrink:
            outcome = shrink_outcome(self.lenient, outcome, max_preemptions=bound)
        assert outcome.violation is not None
        keys = tuple(outcome.keys[:outcome.violation.step])
        final = run_forward(self.sim, ReplayStrategy(keys), recording=True)
        if final.violation is None or final.violation.kind != outcome.violation.kind:
            raise ExplorerError("replaying the violating schedule did not reproduce it: the "
                                "target's code does not behave the same way twice")
        sim = self.sim
        return Finding(final.violation, Schedule(self.target.name, self.model, self.config, keys),
                       final.events, final.received, final.preemptions, sim.amap,
                       sim.payloads, seed, self.check)


def explore(target: RingTarget | str, config: RingConfig | None = None, *,
            model: MemoryModel | str = MemoryModel.SC, preemptions: int | None = None,
            random: int | None = None, seed: int = 0, pct_depth: int = 3,
            check: str = "all", max_steps: int | None = None,
            max_states: int | None = None, keep_going: bool = False,
            shrink: bool = True, reduce: bool = True) -> ExploreResult:
    """Run ``target`` under many schedules and report violations.

    - ``random=None``: depth-first search; ``preemptions=None`` explores every interleaving,
      ``preemptions=K`` every one with at most K preemptions.
    - ``random=N``: N PCT schedules (seeds ``seed`` .. ``seed + N - 1``, ``pct_depth``).
    - ``check="behavior"`` checks only what readers receive, deadlock and termination, not
      the flag discipline.
    - ``keep_going``: search on after a violation, keeping the first of each kind.
    - ``max_states`` cuts the search short (``complete`` is then False).
    - ``reduce=False`` turns the sleep-set reduction of the unbounded search off.
    """
    if isinstance(target, str):
        target = resolve_target(target)
    config = config or RingConfig()
    model = MemoryModel.parse(model)
    started = time.monotonic()
    findings: list[Finding] = []
    kinds: set[str] = set()
    with target.installed():
        session = _Session(target, config, model, check, max_steps)
        sim = session.sim
        if random is not None:
            mode, bound, limited = "random", None, False
            horizon = session.lenient([]).steps
            executions = 0
            complete = True
            for offset in range(random):
                run_seed = seed + offset
                outcome = run_forward(sim, PctStrategy(run_seed, depth=pct_depth,
                                                       horizon=horizon))
                executions += 1
                violation = outcome.violation
                if violation is not None and violation.kind not in kinds:
                    kinds.add(violation.kind)
                    findings.append(session.finding(outcome, shrink=shrink, seed=run_seed))
                    if not keep_going:
                        complete = offset == random - 1
                        break
            states = transitions = depth = 0
        else:
            mode, bound = ("exhaustive", None) if preemptions is None else ("bounded",
                                                                            preemptions)
            found: list[Outcome] = []

            def on_violation(world: World, keys: list[str]) -> bool:
                violation = world.violation
                assert violation is not None
                if violation.kind in kinds:
                    return False
                kinds.add(violation.kind)
                found.append(outcome_of(world, keys))
                return not keep_going

            stats = search(sim, bound=bound, on_violation=on_violation, max_states=max_states,
                           reduce=reduce)
            findings = [session.finding(outcome, shrink=shrink, bound=bound) for outcome in found]
            executions, states, transitions = stats.ends, stats.states, stats.transitions
            complete, limited, depth = stats.complete, stats.limited, stats.depth
        runs = sim.runs
    return ExploreResult(target.name, model, config, mode, bound, executions, states,
                         transitions, runs, complete, time.monotonic() - started, findings,
                         limited=limited, depth=depth)


def replay(schedule: Schedule | str, target: RingTarget | None = None, *,
           check: str = "all", max_steps: int | None = None) -> ExploreResult:
    """Run one schedule exactly (strictly: a choice that is not enabled is an error).

    ``target`` defaults to resolving the schedule's target name; pass the object when the
    schedule was found on a target without a resolvable name (a variant made in code).
    """
    if isinstance(schedule, str):
        schedule = Schedule.parse(schedule)
    if target is None:
        target = resolve_target(schedule.target)
    started = time.monotonic()
    with target.installed():
        session = _Session(target, schedule.config, schedule.model, check, max_steps)
        sim = session.sim
        outcome = run_forward(sim, ReplayStrategy(schedule.keys), recording=True)
    findings = []
    if outcome.violation is not None:
        findings.append(Finding(outcome.violation, schedule, outcome.events, outcome.received,
                                outcome.preemptions, sim.amap, sim.payloads, check=check))
    return ExploreResult(target.name, schedule.model, schedule.config, "replay", None, 1, 0,
                         outcome.steps, sim.runs, True, time.monotonic() - started, findings,
                         events=outcome.events)


@dataclass
class CrossResult:
    """The result of each pairing (``writer``, ``readers``, ``own``) of one target."""

    target: str
    results: dict[str, Any]

    @property
    def findings(self) -> list[tuple[str, Any]]:
        return [(pairing, f) for pairing, r in self.results.items() for f in r.findings]

    @property
    def inconclusive(self) -> bool:
        return not self.findings and any(r.inconclusive for r in self.results.values())

    def summary(self) -> str:
        lines = [f"cross pairing of {self.target}:"]
        for pairing, result in self.results.items():
            if result.findings:
                what = "; ".join(f"{f.violation.kind} [{f.violation.clause or 'no clause'}]"
                                 for f in result.findings)
            else:
                what = ("inconclusive" if result.inconclusive else "no violation")
            lines.append(f"  ({pairing}) {PAIRING_TITLES[pairing]}: {what}")
        return "\n".join(lines)


def cross_explore(target: RingTarget | str, config: RingConfig | None = None, *,
                  pairings: tuple[str, ...] = PAIRINGS, **options: Any) -> CrossResult:
    """Explore ``target`` in each of ``pairings`` (see the module docstring); ``options``
    go to :func:`~enginewire.fuzz.explore.explorer.explore`."""
    if isinstance(target, str):
        target = resolve_target(target)
    reference = ReferenceTarget()
    made = {"writer": lambda: PairedTarget(target, reference),
            "readers": lambda: PairedTarget(reference, target),
            "own": lambda: target}
    results = {}
    for pairing in pairings:
        if pairing not in made:
            raise ValueError(f"unknown pairing {pairing!r}: expected one of "
                             f"{', '.join(PAIRINGS)}")
        results[pairing] = explore(made[pairing](), config, **options)
    return CrossResult(target.name, results)
