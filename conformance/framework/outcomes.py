"""What a run decides: the verdict of each check and of the run as a whole.

:class:`CheckResult` is one check's verdict (a status of :data:`STATUSES`) and, when an
expected-failure list applies, its expectation (:data:`EXPECTED_FAILURE` or one of
:data:`UNEXPECTED`); :class:`RunResult` is every verdict of one run against one target.
:mod:`.runner` produces them, :mod:`.expected` classifies them, :mod:`.reports` renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from enginewire.conformance.framework.registry import SURFACES, Check, Reproduction

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"
NOT_IMPLEMENTED = "not_implemented"
#: A SHOULD or MAY check left out because ``--strict`` was not given.
NOT_RUN = "not_run"
#: The check needs a part of the protocol the target leaves out by design (``targets.MODES``,
#: e.g. the handshake channel of a front end given its engines' addresses): never a pass.
NOT_APPLICABLE = "not_applicable"
#: The check passed without calling the target (a fact of the spec, such as its own
#: append-only history): never counted as the target's pass.
SPEC_ONLY = "spec_only"
STATUSES = (PASSED, FAILED, SKIPPED, NOT_IMPLEMENTED, NOT_APPLICABLE, SPEC_ONLY, NOT_RUN)

#: ``CheckResult.expectation`` values (see :mod:`enginewire.conformance.framework.expected`).
EXPECTED_FAILURE = "expected_failure"
UNEXPECTED_FAILURE = "unexpected_failure"
UNEXPECTED_PASS = "unexpected_pass"
CHANGED_FAILURE = "changed_failure"
UNEXPECTED = (UNEXPECTED_FAILURE, UNEXPECTED_PASS, CHANGED_FAILURE)


@dataclass
class CheckResult:
    check: Check
    level: str
    status: str
    message: str = ""
    reproduction: Reproduction | None = None
    traceback: str | None = None
    duration_s: float = 0.0
    #: "" when no expected-failure list applies, else one of the expectation values above.
    expectation: str = ""
    #: The message prefix recorded in the expected-failure list, for "changed" reports.
    expected_message: str | None = None

    @property
    def first_line(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""

    @property
    def unexpected(self) -> bool:
        return self.expectation in UNEXPECTED


@dataclass
class RunResult:
    target: str
    spec_version: str
    strict: bool
    results: list[CheckResult]
    started: str
    duration_s: float
    expected_file: str | None = None
    #: IDs listed in the expected-failure file that no selected check has.
    unknown_expected: list[str] = field(default_factory=list)

    def count(self, status: str, surface: str | None = None) -> int:
        return sum(
            1
            for r in self.results
            if r.status == status and (surface is None or r.check.surface == surface)
        )

    def counts(self, surface: str | None = None) -> dict[str, int]:
        out = {status: self.count(status, surface) for status in STATUSES}
        picked = [r for r in self.results if surface is None or r.check.surface == surface]
        for name in (EXPECTED_FAILURE, *UNEXPECTED):
            out[name] = sum(1 for r in picked if r.expectation == name)
        return out

    @property
    def ok(self) -> bool:
        """True iff nothing unexpected happened (the exit status is 0 exactly then)."""
        return not any(r.unexpected for r in self.results)

    def surfaces(self) -> list[str]:
        present = {r.check.surface for r in self.results}
        return [s for s in SURFACES if s in present]
