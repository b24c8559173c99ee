"""Run checks against a target, each under its own time limit, and collect the verdicts.

Every check runs in a worker thread joined with the check's time limit: a target that hangs
turns into a failure ("timed out after N s"), the check's clean-up callbacks then close its
sockets and stop its processes, and the run goes on. Checks run one at a time, in registry
order, so a report is reproducible.

A verdict rests on evidence (:func:`_weigh`): before the clean-ups of a check that failed or
timed out, the target's probes (:func:`~enginewire.conformance.framework.evidence.
probe_while_waiting`: a running engine's ``alive``) are asked once more, so a target that
refused (``NotImplementedError``) is NOT IMPLEMENTED, not FAILED, whichever wait of the
check ran out.

A target whose program cannot start (``contract.TargetStartError``: not found, not executable,
exited before serving anything) gets no verdicts: :func:`run_check` and :func:`run` raise it
after the check's clean-up, whatever the check made of it, as loading the target would have.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from enginewire.conformance.framework import evidence as _evidence
from enginewire.conformance.framework.context import CheckContext
from enginewire.conformance.framework.expected import ExpectedFailures
from enginewire.conformance.framework.outcomes import (
    FAILED,
    NOT_APPLICABLE,
    NOT_IMPLEMENTED,
    NOT_RUN,
    PASSED,
    SKIPPED,
    SPEC_ONLY,
    CheckResult,
    RunResult,
)
from enginewire.conformance.framework.registry import (
    Check,
    CheckFailure,
    CheckSkip,
    NotImplementedSurface,
    NotInRelease,
)
from enginewire.conformance.targets.contract import MODES, OutsideRole, Target, TargetError

ProgressCallback = Callable[[int, int, Check, "CheckResult | None"], None]


def run_check(
    item: Check,
    target: Target,
    spec: Any,
    *,
    strict: bool = False,
    timeout_scale: float = 1.0,
    options: dict[str, Any] | None = None,
) -> CheckResult:
    """Run one check and return its verdict; never raises for anything the check does, except
    a target that fails to start (a :class:`TargetError`: the module doc)."""
    level = item.level(spec)
    if level != "MUST" and not strict:
        return CheckResult(item, level, NOT_RUN, f"{level} check: runs with --strict")
    for needed in (item.surface, *item.requires):
        if not target.has(needed):
            return CheckResult(
                item, level, NOT_IMPLEMENTED,
                f"target {target.name!r} does not implement {needed}",
            )
    for needed in item.requires:
        if needed in MODES and not target.applies(needed):
            return CheckResult(
                item, level, NOT_APPLICABLE,
                f"target {target.name!r} works without {needed} by design",
            )
    surface = getattr(target, item.surface)
    prepare = getattr(surface, "prepare", None)
    if prepare is not None:
        # Once-only set-up of a surface (idempotent), outside every check's time limit.
        try:
            prepare()
        except NotImplementedError:
            pass  # no set-up to make: the check itself finds out what the surface implements
        except TargetError:
            raise
        except Exception as exc:  # noqa: BLE001 - the check cannot run: its verdict
            return CheckResult(item, level, FAILED,
                               f"the target's {item.surface} surface failed to prepare: "
                               f"{type(exc).__name__}: {exc}",
                               traceback=traceback.format_exc())
    limit = item.timeout * timeout_scale
    ctx = CheckContext(spec=spec, target=target, timeout=limit, strict=strict, options=options,
                       scale=timeout_scale)
    record = _evidence.begin()
    if item.surface == "codec":
        try:
            surface = _evidence.GuardedCodec(surface, record, spec)
        except TargetError:
            _evidence.end()
            raise
    verdict: dict[str, Any] = {}

    def body() -> None:
        try:
            item.func(surface, ctx)
            verdict.update(status=PASSED)
        except CheckFailure as exc:
            verdict.update(status=FAILED, message=exc.message, reproduction=exc.reproduction,
                           cause=exc)
        except CheckSkip as exc:
            verdict.update(status=SKIPPED, message=str(exc))
        except NotInRelease as exc:
            verdict.update(status=NOT_APPLICABLE, message=f"not in this release: {exc}")
        except NotImplementedSurface as exc:
            verdict.update(status=NOT_IMPLEMENTED, message=str(exc))
        except BaseException as exc:  # noqa: BLE001 - any escape from a check is its verdict
            clause = getattr(exc, "clause", None)
            where = f" [{clause}]" if clause else ""
            verdict.update(
                status=FAILED,
                message=f"{type(exc).__name__}{where}: {exc}".strip(),
                traceback=traceback.format_exc(),
                cause=exc,
            )

    started = time.monotonic()
    worker = threading.Thread(target=body, name=f"check {item.id}", daemon=True)
    worker.start()
    worker.join(limit)
    hung = worker.is_alive()
    if hung or verdict.get("status") == FAILED:
        # Before the clean-ups stop the target's peers: a failure that a refusal explains
        # (a running engine's alive() says it has no code for it) is NOT IMPLEMENTED, also
        # where the check waited without looking (evidence.refused).
        _evidence.refused()
    # Asked before the clean-up, which stops the check's programs.
    failed_to_start = _evidence.start_failure()
    ctx.close()
    if hung:
        worker.join(1.0)
    duration = time.monotonic() - started
    if failed_to_start is not None:
        _evidence.end()
        raise failed_to_start
    if hung:
        result = CheckResult(
            item, level, FAILED,
            f"timed out after {limit:g} s: the target did not answer in time",
            duration_s=duration,
        )
    else:
        result = CheckResult(
            item, level,
            verdict.get("status", FAILED),
            verdict.get("message", ""),
            verdict.get("reproduction"),
            verdict.get("traceback"),
            duration,
        )
    _evidence.end()
    if ctx.cleanup_errors and result.status == PASSED:
        result.status = FAILED
        result.message = "clean-up failed: " + "; ".join(ctx.cleanup_errors)
    return _weigh(result, item, record, verdict.get("cause"))


def _weigh(result: CheckResult, item: Check, record: _evidence.Evidence,
           cause: BaseException | None) -> CheckResult:
    """No verdict without evidence: a check that needed an operation outside the codec's
    role is NOT APPLICABLE, one the target has no code for NOT IMPLEMENTED (whatever the
    check made of the ``NotImplementedError``), and a codec check that passed without calling
    the target SPEC ONLY."""
    if result.status not in (PASSED, FAILED):
        return result
    missing = _evidence.not_implemented_cause(cause)
    absent = _evidence.not_in_release_cause(cause)
    if absent is not None:
        result.status = NOT_APPLICABLE
        result.message = f"not in this release: {absent}"
        result.reproduction = None
    elif record.outside_role or isinstance(missing, OutsideRole):
        what = record.outside_role or [str(missing)]
        result.status = NOT_APPLICABLE
        result.message = "outside the codec's role: " + "; ".join(what)
        result.reproduction = None
    elif record.not_implemented or missing is not None:
        what = record.not_implemented or [f"{type(missing).__name__}: {missing}"]
        result.status = NOT_IMPLEMENTED
        result.message = "the target does not implement " + "; ".join(what)
        result.reproduction = None
    elif result.status == PASSED and item.surface == "codec" and record.calls == 0:
        result.status = SPEC_ONLY
        result.message = "passed without consulting the target: a fact of the spec itself"
    return result


def run(
    checks: Sequence[Check],
    target: Target,
    spec: Any,
    *,
    strict: bool = False,
    expected: ExpectedFailures | None = None,
    progress: ProgressCallback | None = None,
    timeout_scale: float = 1.0,
    options: dict[str, Any] | None = None,
) -> RunResult:
    """Run ``checks`` in order against ``target`` and apply the expected-failure list."""
    started_wall = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    results: list[CheckResult] = []
    for index, item in enumerate(checks):
        if progress is not None:
            progress(index, len(checks), item, None)
        result = run_check(
            item, target, spec, strict=strict, timeout_scale=timeout_scale, options=options
        )
        results.append(result)
        if progress is not None:
            progress(index + 1, len(checks), item, result)
    run_result = RunResult(
        target=target.name,
        spec_version=spec.version,
        strict=strict,
        results=results,
        started=started_wall,
        duration_s=time.monotonic() - started,
    )
    (expected or ExpectedFailures()).apply(run_result)
    return run_result
