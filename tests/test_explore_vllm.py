"""The schedule explorer driving vLLM's own ``MessageQueue`` ring code."""

from __future__ import annotations

import pytest

from enginewire.fuzz.explore import RingConfig, explore, replay

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")
shm_broadcast = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")

LAPPING = [RingConfig(2, 1, 2), RingConfig(1, 2, 3)]


@pytest.mark.parametrize("model", ["sc", "tso"])
@pytest.mark.parametrize("config", LAPPING, ids=RingConfig.spell)
def test_vllm_acquire_write_and_read_pass_every_sc_and_tso_interleaving(
        model: str, config: RingConfig) -> None:
    result = explore("vllm", config, model=model)
    assert result.complete
    assert result.ok, "\n\n".join(f.format() for f in result.findings)


@pytest.mark.parametrize("config", [RingConfig(1, 1, 2), RingConfig(1, 2, 3)],
                         ids=RingConfig.spell)
def test_vllm_enqueue_and_dequeue_pass_every_sc_interleaving(config: RingConfig) -> None:
    result = explore("vllm-enqueue", config, model="sc")
    assert result.complete
    assert result.ok, "\n\n".join(f.format() for f in result.findings)


def test_vllm_under_store_reordering_hands_a_reader_an_old_message() -> None:
    config = RingConfig(1, 1, 2)
    readers = explore("vllm", config, model="weak", check="behavior")
    assert [f.violation.kind for f in readers.findings] == ["stale"]
    finding = readers.findings[0]
    assert "message 0 (01 01) again where message 1 was due" in finding.violation.message
    assert "--check behavior --replay" in finding.format()
    again = replay(str(finding.schedule), check="behavior")
    assert again.findings[0].violation == finding.violation
    flags = explore("vllm", config, model="weak", keep_going=True)
    assert {f.violation.kind: f.violation.clause for f in flags.findings} == {
        "fill-before-claim": "ring.writer.clear-written-before-fill",
        "clear-before-claim": "ring.writer.clear-written-before-fill",
    }


@pytest.mark.parametrize("config", [RingConfig(1, 1, 2), RingConfig(1, 2, 3)],
                         ids=RingConfig.spell)
def test_one_fence_after_the_claim_removes_the_weak_findings(config: RingConfig) -> None:
    from enginewire.fuzz.explore.vllm_ring import VllmTarget

    result = explore(VllmTarget(fence_after_claim=True), config, model="weak", keep_going=True)
    assert result.complete
    assert result.ok, "\n\n".join(f.format() for f in result.findings)


@pytest.mark.parametrize("config", [RingConfig(2, 1, 2), RingConfig(1, 2, 3),
                                    RingConfig(2, 2, 2)], ids=RingConfig.spell)
def test_vllm_needs_no_fence_between_a_store_and_a_later_load(config: RingConfig) -> None:
    """vLLM's ``memory_fence`` is a lock taken and released, which on Arm leaves at the least
    an earlier store and a later load unordered. Under tso, where that is the only reordering,
    the what-if leaves its fences ordering nothing: vLLM's ring still passes every interleaving
    (tests/test_explore_models.py shows tso finding what such a fence lets through)."""
    from enginewire.fuzz.explore.vllm_ring import VllmTarget

    lock = explore(VllmTarget(lock_fence=True), config, model="tso")
    assert lock.complete
    assert lock.ok, "\n\n".join(f.format() for f in lock.findings)
    # The what-if took effect: with full fences the stores drain at each fence, so fewer
    # interleavings reach the same states.
    assert lock.states != explore("vllm", config, model="tso").states


def test_the_what_ifs_are_targets_by_name_and_their_findings_replay() -> None:
    config = RingConfig(1, 1, 2)
    assert explore("vllm+fence-after-claim", config, model="weak").ok
    # Under weak the explorer runs the lock's acquire-release fence as a full one: vLLM's
    # missing fence after the claim (finding 011) shows as it does without the what-if.
    found = explore("vllm+lock-fence", config, model="weak", check="behavior")
    [finding] = found.findings
    assert str(finding.schedule).startswith("vllm+lock-fence/weak/1x1x2/")
    assert replay(str(finding.schedule), check="behavior").findings[0].violation == \
        finding.violation


def test_the_trace_is_vllms_own_access_order() -> None:
    # vLLM's writer sums the read flags before it loads the written flag, its reader loads
    # its own read flag first; the reference does both the other way round.
    events = replay("vllm/sc/1x1x1/").events
    accesses = [(e.actor, e.kind, e.lo, e.hi) for e in events if e.step is not None]
    written, read_flag = 2, 3  # one reader, one 2-byte chunk: row (written, r0) at 2-3
    assert accesses[:2] == [("writer", "read", read_flag, read_flag + 1),
                            ("writer", "load", written, written + 1)]
    reader = [a for a in accesses if a[0] == "reader r0"]
    assert reader[:2] == [("reader r0", "load", read_flag, read_flag + 1),
                          ("reader r0", "load", written, written + 1)]


def test_the_stand_ins_are_removed_afterwards() -> None:
    fence, yield_ = shm_broadcast.memory_fence, shm_broadcast.sched_yield
    explore("vllm", RingConfig(1, 1, 1), model="tso")
    assert shm_broadcast.memory_fence is fence
    assert shm_broadcast.sched_yield is yield_
