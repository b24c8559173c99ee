"""Messages of several buffers in the explorer (``RingConfig.oob_buffers``): the ring's buffer
lists, framed with a count and a length prefix per buffer. Every published chunk is compared
buffer by buffer with the message, and every reader must get the same buffers back."""

from __future__ import annotations

from typing import Any

import pytest

import enginewire.fuzz.mutants  # noqa: F401 - registers the mutant:NAME target provider
from enginewire.fuzz.explore import (
    MemoryRingTarget,
    ReferenceTarget,
    RingConfig,
    cross_explore,
    explore,
    replay,
)
from enginewire.fuzz.explore.execution import ExplorerError
from enginewire.fuzz.explore.schedule import received_form
from enginewire.fuzz.mutants import MUTANTS
from enginewire.fuzz.mutants.ring_mutants import MutantRing
from enginewire.reference.ring.framing import write_chunk
from enginewire.reference.ring.queue import MessageQueue

OOB = RingConfig(readers=1, chunks=2, messages=2, oob_buffers=2)


def test_a_message_is_its_payload_then_buffers_of_other_lengths() -> None:
    config = RingConfig(readers=1, chunks=1, messages=2, oob_buffers=2)
    assert config.message(1) == [b"\x02\x02", b"\x82" * 3, b"\x82" * 4]
    assert config.payloads()[1] == received_form(config.message(1))
    assert config.spell() == "1x1x2+2"
    assert RingConfig.parse("1x1x2+2") == config
    assert RingConfig.parse("2x2x3x4+1") == RingConfig(2, 2, 3, 4, 1)
    assert RingConfig(oob_buffers=0).payloads() == RingConfig().payloads()
    with pytest.raises(ValueError, match="oob_buffers"):
        RingConfig(oob_buffers=-1)


@pytest.mark.parametrize("model", ["sc", "tso", "weak"])
def test_the_reference_ring_passes_with_out_of_band_buffers(model: str) -> None:
    assert explore(ReferenceTarget(), OOB, model=model).verdict == "pass"
    assert explore(MemoryRingTarget(MutantRing(), "memory-reference"), OOB,
                   model=model).verdict == "pass"


class _Reversed(MessageQueue):
    """Frames a message's buffers last first."""

    @staticmethod
    def chunk_writer(write: Any, buffers: Any, base: int = 0) -> int:
        return write_chunk(write, list(reversed(buffers)), base)


class ReversedBuffersRing(MutantRing):
    """A writer that frames the buffers last first and readers that turn them round again:
    consistent with itself, and with the spec for every one-buffer message."""

    def __init__(self) -> None:
        super().__init__(queue_cls=_Reversed)

    def memory_reader(self, memory: Any, **sizes: Any) -> Any:
        inner = super().memory_reader(memory, **sizes)

        class _Reader:
            def read(self, consume: Any = None) -> list[bytes] | None:
                if consume is not None:
                    return inner.read(consume=lambda b: consume(list(reversed(b))))
                got = inner.read()
                return None if got is None else list(reversed(got))

        return _Reader()


def test_a_buffer_order_its_ends_agree_on_shows_only_with_out_of_band_buffers() -> None:
    target = MemoryRingTarget(ReversedBuffersRing(), "reversed-buffers")
    one = cross_explore(target, RingConfig(readers=1, chunks=2, messages=2))
    assert one.findings == [], one.summary()
    cross = cross_explore(target, OOB, keep_going=True)
    found = {pairing: {(f.violation.kind, f.violation.clause) for f in r.findings}
             for pairing, r in cross.results.items()}
    assert ("framing", "ring.framing.length-prefix") in found["writer"], cross.summary()
    assert ("framing", "ring.framing.length-prefix") in found["own"], cross.summary()
    assert {kind for kind, _ in found["readers"]} & {"torn", "stale", "skipped"}, cross.summary()


def test_a_length_prefix_off_by_one_is_named() -> None:
    result = explore(MUTANTS["length-prefix-off-by-one"].explorer_target(), OOB)
    (finding,) = result.findings
    assert (finding.violation.kind, finding.violation.clause) == (
        "framing", "ring.framing.length-prefix")
    again = replay(str(finding.schedule), MUTANTS["length-prefix-off-by-one"].explorer_target())
    assert [f.violation.kind for f in again.findings] == ["framing"]
    assert "+2/" in str(finding.schedule)


class _OneBuffer(ReferenceTarget):
    oob = False


def test_a_target_without_buffer_lists_is_refused() -> None:
    with pytest.raises(ExplorerError, match="one buffer"):
        explore(_OneBuffer(), RingConfig(readers=1, chunks=1, messages=1, oob_buffers=1))
