"""The writer's notification as an ordered event: a writer that notifies before setting the
written flag fails the ``ring.memory`` order check, the cross-process latency check and the
explorer (clause ring.notify.after-written-flag)."""

from __future__ import annotations

import enginewire.fuzz.mutants  # noqa: F401 - registers the mutant:NAME target provider
from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run_check
from enginewire.conformance.targets.resolve import load_target
from enginewire.fuzz.explore import RingConfig, explore, resolve_target
from enginewire.spec import load

ORDER = "ring/memory/notify-after-written-flag"
LATENCY = "ring/writer/notify-wakes-idle-reader"


def _status(target_name: str, check_id: str) -> str:
    (item,) = select(all_checks(), patterns=[check_id])
    target = load_target(target_name)
    try:
        return run_check(item, target, load()).status
    finally:
        target.close()


def test_the_notify_order_check_passes_the_reference_and_fails_notify_before_written() -> None:
    assert _status("reference", ORDER) == PASSED
    assert _status("mutant:notify-before-written", ORDER) == FAILED


def test_a_lone_message_after_idling_waits_for_the_recheck_behind_an_early_notify() -> None:
    assert _status("reference", LATENCY) == PASSED
    assert _status("mutant:notify-before-written", LATENCY) == FAILED


def test_the_explorer_orders_the_notify_after_the_visible_written_flag() -> None:
    for model in ("sc", "tso"):
        assert explore("reference", RingConfig(1, 2, 2), model=model).verdict == "pass"
        result = explore(resolve_target("mutant:notify-before-written"), RingConfig(1, 1, 1),
                         model=model)
        assert [(f.violation.kind, f.violation.clause) for f in result.findings] == [
            ("notify-before-written", "ring.notify.after-written-flag")]
