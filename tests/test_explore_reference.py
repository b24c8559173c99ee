"""The schedule explorer on enginewire's reference ring and on broken variants of it.

Variants are subclasses of the reference writer or reader that change one step; the explorer
takes them through ``ReferenceTarget(writer_cls=..., reader_cls=...)``.
"""

from __future__ import annotations

import time

import pytest

from enginewire.fuzz.explore import (
    ReferenceTarget,
    RingConfig,
    Schedule,
    ScheduleError,
    explore,
    replay,
)
from enginewire.reference.ring.protocol import RingWriter


class FlagsAfterWrittenWriter(RingWriter):
    """Mutant: sets the written flag before it clears the read flags."""

    def commit(self) -> None:
        index = self._claimed
        assert index is not None
        memory, row = self.memory, self._rows[index]
        memory.fence()
        memory.store(row, 1)
        memory.fence()
        for reader in range(self.layout.n_reader):
            memory.store(row + 1 + reader, 0)
        memory.fence()
        self._claimed = None
        self.index = (index + 1) % self.layout.max_chunks


class NoFenceBeforeWrittenWriter(RingWriter):
    """Mutant: no fence between the data (and cleared read flags) and the written flag."""

    def commit(self) -> None:
        index = self._claimed
        assert index is not None
        memory, row = self.memory, self._rows[index]
        for reader in range(self.layout.n_reader):
            memory.store(row + 1 + reader, 0)
        memory.store(row, 1)
        memory.fence()
        self._claimed = None
        self.index = (index + 1) % self.layout.max_chunks


FLAG_ORDER = ReferenceTarget(writer_cls=FlagsAfterWrittenWriter, name="flag-order")
NO_FENCE = ReferenceTarget(writer_cls=NoFenceBeforeWrittenWriter, name="no-fence-before-written")

#: Configurations that reuse a chunk (the second lap is where claims and clears race).
LAPPING = [RingConfig(2, 1, 2), RingConfig(1, 2, 3)]


@pytest.mark.parametrize("config", LAPPING + [RingConfig(2, 2, 2)], ids=RingConfig.spell)
def test_reference_ring_passes_every_sc_interleaving(config: RingConfig) -> None:
    # A RingReader that loads the written flag before its own read flag fails here
    # (release-unpublished): see "Findings" in docs/explorer.md.
    result = explore(ReferenceTarget(), config, model="sc")
    assert result.complete
    assert result.ok, "\n\n".join(f.format() for f in result.findings)


@pytest.mark.parametrize("model", ["sc", "tso"])
@pytest.mark.parametrize("config", LAPPING, ids=RingConfig.spell)
def test_reference_readers_get_every_message_under_sc_and_tso(model: str,
                                                              config: RingConfig) -> None:
    result = explore(ReferenceTarget(), config, model=model, check="behavior")
    assert result.complete
    assert result.ok, "\n\n".join(f.format() for f in result.findings)


@pytest.mark.parametrize("model", ["sc", "tso", "weak"])
@pytest.mark.parametrize("config", LAPPING, ids=RingConfig.spell)
def test_reference_ring_passes_every_model(model: str, config: RingConfig) -> None:
    """The reference reader loads its own flag first and its writer fences after the claim."""
    result = explore(ReferenceTarget(), config, model=model)
    assert result.complete
    assert result.ok, "\n\n".join(f.format() for f in result.findings)


def test_written_before_read_flags_cleared_is_found_with_a_short_trace() -> None:
    result = explore(FLAG_ORDER, RingConfig(2, 2, 3), model="sc")
    assert len(result.findings) == 1
    finding = result.findings[0]
    assert finding.violation.clause == "ring.writer.read-flags-cleared-before-written"
    assert finding.steps <= 12
    numbered = [e for e in finding.events if e.step is not None]
    assert len(numbered) == finding.steps
    text = finding.format()
    assert "chunk 0 written flag = 1" in text
    assert "chunk 0 read flag r0 = 0" in text
    assert f"--replay '{finding.schedule}'" in text


@pytest.mark.parametrize("config", [RingConfig(1, 1, 1), RingConfig(2, 2, 2)],
                         ids=RingConfig.spell)
def test_missing_fence_before_written_shows_only_under_weak(config: RingConfig) -> None:
    # Without a chunk used twice, the reference itself passes every model here.
    for model in ("sc", "tso", "weak"):
        assert explore(ReferenceTarget(), config, model=model).ok, model
    # TSO keeps a thread's stores in order, so the data is visible before the written flag
    # even without the fence; only store reordering (weak) breaks it.
    assert explore(NO_FENCE, config, model="sc").ok
    assert explore(NO_FENCE, config, model="tso").ok
    # Under weak the written flag 1 can become visible before the data (and before the read
    # flags are cleared, which on a first lap changes no value but breaks the discipline).
    weak = explore(NO_FENCE, config, model="weak", keep_going=True)
    clauses = {f.violation.kind: f.violation.clause for f in weak.findings}
    assert clauses == {"publish-before-data": "ring.writer.fence-before-written",
                       "clear-while-published": "ring.writer.read-flags-cleared-before-written"}
    readers = explore(NO_FENCE, config, model="weak", check="behavior")
    assert [f.violation.kind for f in readers.findings] == ["torn"]


def test_a_printed_schedule_replays_the_violation() -> None:
    for target, config, model in ((FLAG_ORDER, RingConfig(2, 2, 3), "sc"),
                                  (NO_FENCE, RingConfig(1, 1, 2), "weak")):
        finding = explore(target, config, model=model).findings[0]
        text = str(finding.schedule)
        assert Schedule.parse(text) == finding.schedule
        again = replay(text, target)
        assert len(again.findings) == 1
        assert again.findings[0].violation == finding.violation
        assert [(e.step, e.kind, e.lo, e.value) for e in again.events] == \
            [(e.step, e.kind, e.lo, e.value) for e in finding.events]


def test_a_schedule_that_does_not_fit_the_target_is_refused() -> None:
    with pytest.raises(ScheduleError, match="step 2: 'r1' is not enabled"):
        replay("reference/sc/1x1x1/w,r1", ReferenceTarget())


def test_random_schedules_find_the_weak_bug_and_replay_by_seed() -> None:
    first = explore(NO_FENCE, RingConfig(1, 1, 1), model="weak", random=300, seed=11)
    assert first.findings and first.findings[0].seed is not None
    seed = first.findings[0].seed
    again = explore(NO_FENCE, RingConfig(1, 1, 1), model="weak", random=1, seed=seed)
    assert str(again.findings[0].schedule) == str(first.findings[0].schedule)
    assert explore(ReferenceTarget(), RingConfig(2, 2, 2), model="weak", random=100).ok


def test_a_preemption_bound_limits_the_search_and_the_trace() -> None:
    sizes = [explore(ReferenceTarget(), RingConfig(2, 2, 2), preemptions=k).states
             for k in (0, 1, 2)]
    assert sizes[0] < sizes[1] < sizes[2]
    bounded = explore(NO_FENCE, RingConfig(1, 1, 2), model="weak", preemptions=1)
    assert bounded.findings
    assert all(f.preemptions <= 1 for f in bounded.findings)


@pytest.mark.slow
def test_reference_ring_2x2x3_every_sc_interleaving() -> None:
    started = time.monotonic()
    result = explore(ReferenceTarget(), RingConfig(2, 2, 3), model="sc")
    elapsed = time.monotonic() - started
    print(f"\n{result.summary()} (wall {elapsed:.1f} s)")
    assert result.complete
    assert result.ok, "\n\n".join(f.format() for f in result.findings)
