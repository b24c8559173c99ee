"""Run the default checks against mutants and collect the kill matrix.

Three columns, each run only where it applies to the mutant:

- ``conformance``: the mutant's relevant conformance checks, SHOULD checks included (as
  ``enginewire check --strict`` runs them), at the budget's timeout scale. A check kills the
  mutant when it fails on the mutant and passes on the reference at the same scale (a check
  the reference fails too says nothing about the mutant).
- ``fuzz``: a short malformed-input campaign against a codec mutant's decoder; any finding
  kills it.
- ``encoder``: a short differential campaign against a codec mutant's encoder
  (:func:`enginewire.fuzz.differential.fuzz_encoder`: its bytes against the spec oracle's on
  spec-generated values); any finding kills it.
- ``explorer``: a bounded schedule exploration of a flag-protocol mutant's writer and reader
  code. It kills the mutant with a violation of a kind the reference does not show under the
  same configuration, memory model and bound; the shrunk trace is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from enginewire.fuzz.mutants import Mutant

FUZZ_SEED = 0
COLUMNS = ("conformance", "fuzz", "encoder", "explorer")


@dataclass(frozen=True)
class Budget:
    """How hard each column tries. :data:`BOUNDED` fits CI; :data:`FULL` digs deeper."""

    #: Fuzz cases per kind.
    fuzz_examples: int
    #: Differential encoder cases per kind.
    encoder_examples: int
    #: Extra codec kinds fuzzed beyond each mutant's own.
    fuzz_extra_kinds: tuple[str, ...]
    #: Explorer preemption bound and state limit (the ring size is the mutant's own).
    preemptions: int
    max_states: int
    #: The conformance column's timeout scale (``--timeout-scale``), the reference baseline's
    #: too: a check that kills by waiting out a deadline (lost-notification's 20 s) waits
    #: this fraction of it, and a kill still needs the reference to pass at the same scale.
    timeout_scale: float = 1.0


BOUNDED = Budget(fuzz_examples=10, encoder_examples=10, fuzz_extra_kinds=(), preemptions=2,
                 max_states=20_000, timeout_scale=0.5)
FULL = Budget(fuzz_examples=100, encoder_examples=100,
              fuzz_extra_kinds=("abort", "utility", "outputs", "EngineCoreRequest",
                                "EngineCoreOutput", "EngineCoreOutputs"),
              preemptions=3, max_states=500_000)


@dataclass
class Column:
    """One column's verdict for one mutant: not run (``ran`` False), or the kills it found."""

    ran: bool = False
    kills: list[str] = field(default_factory=list)
    #: A trace or failure text per kill, for the report.
    details: list[str] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""

    @property
    def killed(self) -> bool:
        return bool(self.kills)

    def cell(self) -> str:
        if not self.ran:
            return "-"
        if not self.kills:
            return "survived" + (f" ({self.note})" if self.note else "")
        shown = ", ".join(self.kills[:3])
        more = len(self.kills) - 3
        return "KILLED: " + shown + (f" (+{more})" if more > 0 else "")


@dataclass
class MutantResult:
    mutant: Mutant
    columns: dict[str, Column]

    @property
    def killed(self) -> bool:
        return any(c.killed for c in self.columns.values())

    @property
    def kills(self) -> int:
        """How many independent checks kill it: each failing conformance check, the fuzz
        campaign (one, however many findings), the differential encoder campaign (one) and
        the explorer (one)."""
        columns = self.columns
        return (len(columns["conformance"].kills) + int(columns["fuzz"].killed)
                + int(columns["encoder"].killed) + int(columns["explorer"].killed))

    def to_builtins(self) -> dict[str, Any]:
        return {
            "name": self.mutant.name, "surface": self.mutant.surface,
            "broken": self.mutant.broken, "citation": self.mutant.citation,
            "killed": self.killed, "kills": self.kills,
            "columns": {name: {"ran": c.ran, "kills": c.kills, "details": c.details,
                               "seconds": round(c.seconds, 2), "note": c.note}
                        for name, c in self.columns.items()},
        }


class _Baselines:
    """Reference verdicts, computed once each: conformance checks and explorer kinds."""

    def __init__(self, spec: Any, budget: Budget) -> None:
        from enginewire.conformance.targets.reference import reference_target

        self.spec = spec
        self.budget = budget
        self.target = reference_target()
        self._checks: dict[str, str] = {}
        self._kinds: dict[tuple[str, tuple[int, int, int]], set[str]] = {}

    def check_status(self, item: Any) -> str:
        from enginewire.conformance.framework.runner import run_check

        if item.id not in self._checks:
            self._checks[item.id] = run_check(item, self.target, self.spec, strict=True,
                                              timeout_scale=self.budget.timeout_scale).status
        return self._checks[item.id]

    def explorer_kinds(self, model: str, config: tuple[int, int, int]) -> set[str]:
        """Violation kinds the reference itself shows under ``model`` and ``config``."""
        key = (model, config)
        if key not in self._kinds:
            from enginewire.fuzz.explore.ring_targets import ReferenceTarget

            result = _explore(ReferenceTarget(), model, config, self.budget)
            self._kinds[key] = {f.violation.kind for f in result.findings}
        return self._kinds[key]

    def close(self) -> None:
        self.target.close()


def _explore(target: Any, model: str, config: tuple[int, int, int], budget: Budget) -> Any:
    """A bounded search that reports the first violation of each kind (shrunk)."""
    from enginewire.fuzz.explore import RingConfig, explore

    return explore(target, RingConfig(*config), model=model, preemptions=budget.preemptions,
                   max_states=budget.max_states, keep_going=True)


def run_conformance(mutant: Mutant, baselines: _Baselines) -> Column:
    from enginewire.conformance.framework.outcomes import FAILED, PASSED
    from enginewire.conformance.framework.registry import all_checks, select
    from enginewire.conformance.framework.runner import run_check

    column = Column(ran=True)
    started = time.monotonic()
    checks = select(all_checks(), surfaces=[mutant.surface], patterns=list(mutant.conformance))
    target = mutant()
    try:
        for item in checks:
            result = run_check(item, target, baselines.spec, strict=True,
                               timeout_scale=baselines.budget.timeout_scale)
            if result.status != FAILED:
                continue
            if baselines.check_status(item) != PASSED:
                continue
            column.kills.append(item.id)
            column.details.append(f"{item.id}: {result.first_line}")
    finally:
        target.close()
    column.seconds = time.monotonic() - started
    return column


def run_fuzz(mutant: Mutant, budget: Budget) -> Column:
    from enginewire.fuzz import campaigns

    column = Column(ran=True)
    started = time.monotonic()
    target = mutant()
    try:
        campaign = campaigns.CodecCampaign(target_name=f"mutant-{mutant.name}",
                                        max_examples=budget.fuzz_examples, seed=FUZZ_SEED,
                                        database=None, shrink_seconds=0.0)
        kinds = list(dict.fromkeys((*mutant.fuzz_kinds, *budget.fuzz_extra_kinds)))
        report = campaigns.fuzz_codec(target.codec.decode, kinds, campaign)
    finally:
        target.close()
    for finding in report.findings:
        column.kills.append(f"{finding.kind}/{finding.mutation}:{finding.problem}")
        column.details.append(finding.render(len(column.details) + 1))
    if not report.findings and report.notes:
        column.note = f"{len(report.notes)} kind(s) skipped: valid frames do not decode"
    column.seconds = time.monotonic() - started
    return column


def run_encoder(mutant: Mutant, budget: Budget) -> Column:
    from enginewire.fuzz.differential import EncoderCampaign, fuzz_encoder

    column = Column(ran=True)
    started = time.monotonic()
    target = mutant()
    try:
        kinds = list(dict.fromkeys((*mutant.fuzz_kinds, *budget.fuzz_extra_kinds)))
        report = fuzz_encoder(target.codec.encode, kinds,
                              EncoderCampaign(max_examples=budget.encoder_examples,
                                              seed=FUZZ_SEED))
    finally:
        target.close()
    for finding in report.findings:
        column.kills.append(f"{finding.kind}/{finding.problem} [{finding.expected[0]}] "
                            f"{finding.got}")
        column.details.append(finding.render(len(column.details) + 1))
    if not report.findings and report.notes:
        column.note = "; ".join(report.notes)
    column.seconds = time.monotonic() - started
    return column


def run_explorer(mutant: Mutant, baselines: _Baselines) -> Column:
    column = Column(ran=True)
    started = time.monotonic()
    known = baselines.explorer_kinds(mutant.explorer_model, mutant.explorer_config)
    result = _explore(mutant.explorer_target(), mutant.explorer_model, mutant.explorer_config,
                      baselines.budget)
    for finding in result.findings:
        if finding.violation.kind in known:
            continue
        column.kills.append(f"{finding.violation.kind} ({finding.steps} steps)")
        column.details.append(finding.format())
    if not column.kills:
        column.note = result.summary()
    column.seconds = time.monotonic() - started
    return column


def kill_matrix(mutants: Sequence[Mutant], *, budget: Budget = BOUNDED,
                progress: Callable[[MutantResult], None] | None = None) -> list[MutantResult]:
    """Run every applicable column against every mutant, in order."""
    from enginewire.spec import load

    baselines = _Baselines(load(), budget)
    results = []
    try:
        for mutant in mutants:
            columns = {name: Column() for name in COLUMNS}
            if mutant.conformance:
                columns["conformance"] = run_conformance(mutant, baselines)
            if mutant.fuzz_kinds:
                columns["fuzz"] = run_fuzz(mutant, budget)
                columns["encoder"] = run_encoder(mutant, budget)
            if mutant.explorable:
                columns["explorer"] = run_explorer(mutant, baselines)
            result = MutantResult(mutant, columns)
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        baselines.close()
    return results


def render_matrix(results: Sequence[MutantResult]) -> str:
    """The kill matrix as a fixed-width table, one row per mutant."""
    rows: list[tuple[str, ...]] = [("mutant", *COLUMNS, "kills", "verdict")]
    for result in results:
        rows.append((result.mutant.name,
                     *(result.columns[c].cell() for c in COLUMNS), str(result.kills),
                     "killed" if result.killed else "SURVIVED"))
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(len(rows[0]))]

    def line(row: Sequence[str]) -> str:
        cells = [(text if len(text) <= widths[i] else text[:widths[i] - 3] + "...")
                 .ljust(widths[i]) for i, text in enumerate(row)]
        return "  ".join(cells).rstrip()

    out = [line(rows[0]), line(["-" * w for w in widths])]
    out += [line(r) for r in rows[1:]]
    return "\n".join(out)
