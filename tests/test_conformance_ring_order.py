"""The flag-order checks over a recording memory pass on the reference ring and catch a ring
that drops the fence after the claim, or loads the written flag before its own read flag."""

from __future__ import annotations

from typing import Any

import pytest

from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.targets.contract import Target
from enginewire.conformance.targets.reference import ReferenceRing
from enginewire.reference.ring import protocol
from enginewire.spec import load

CLAIM_FENCE = "ring/memory/fence-after-claim"
OWN_FLAG_FIRST = "ring/memory/reader-loads-own-flag-first"


def _status(check_id: str) -> Any:
    checks = select(all_checks(), patterns=[check_id])
    assert [c.id for c in checks] == [check_id]
    result = run(checks, Target(name="ring", ring=ReferenceRing()), load())
    (verdict,) = result.results
    return verdict


@pytest.mark.parametrize("check_id", [CLAIM_FENCE, OWN_FLAG_FIRST])
def test_the_reference_ring_passes(check_id: str) -> None:
    verdict = _status(check_id)
    assert verdict.status == PASSED, verdict.message


def test_a_writer_without_a_fence_after_the_claim_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def claim_without_fence(self: protocol.RingWriter) -> int | None:
        self.memory.fence()
        row = self._rows[self.index]
        if self.memory.load(row) and sum(self.memory.read(row + 1, self.layout.n_reader)) \
                != self.layout.n_reader:
            return None
        self.memory.store(row, 0)
        self._claimed = self.index
        return self.index

    monkeypatch.setattr(protocol.RingWriter, "try_acquire", claim_without_fence)
    verdict = _status(CLAIM_FENCE)
    assert verdict.status == FAILED
    assert "fence between written = 0" in verdict.message


def test_a_reader_loading_the_written_flag_first_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def written_first(self: protocol.RingReader) -> int | None:
        self.memory.fence()
        row = self._rows[self.index]
        if not self.memory.load(row) or self.memory.load(row + 1 + self.rank):
            return None
        self._held = self.index
        return self.index

    monkeypatch.setattr(protocol.RingReader, "try_acquire", written_first)
    verdict = _status(OWN_FLAG_FIRST)
    assert verdict.status == FAILED
    assert "read flag 1 before" in verdict.message
