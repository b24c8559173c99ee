"""A subscriber's ZMQ unsubscription on the coordinator's channels (frames.unsubscribe-ignored).

When an XSUB goes, its XPUB receives the single frame 0x00; vLLM's DP coordinator skips it on
both publishers. The spec names it (``coordinator_unsubscribe``, ``stats_unsubscribe``): the
reference codec decodes it as that kind, the tap annotates it without a violation, the DP
records check needs no special case for it, and the codec check that tells it apart from the
subscription fails on a codec that confuses the two.
"""

from __future__ import annotations

from typing import Any

import pytest

from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.oracle.golden import load_vectors
from enginewire.conformance.targets.contract import Target
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.reference.codec import Codec
from enginewire.reference.errors import ProtocolError
from enginewire.spec import load
from enginewire.tap.annotate import Annotator
from enginewire.tap.capture import Record
from enginewire.tap.vllm_dp import check_records

CODEC = Codec()
#: channel -> (sender, subscription kind, unsubscription kind)
CHANNELS = {
    "coordinator_input": ("engine", "coordinator_subscribe", "coordinator_unsubscribe"),
    "stats_publish": ("frontend", "stats_subscribe", "stats_unsubscribe"),
}
CHECK = "codec/message/unsubscribe-told-apart"


def _frames(kind: str) -> list[bytes]:
    return [bytes(f) for f in CODEC.encode(kind, None)]


def test_the_unsubscription_is_the_frame_zmq_writes() -> None:
    """The golden vectors hold what an XPUB made by vLLM received when its XSUB closed."""
    vectors = {v.kind: v for v in load_vectors(tensors="wire")}
    for _sender, _sub, unsub in CHANNELS.values():
        assert list(vectors[unsub].frames) == _frames(unsub) == [bytes([0])]


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_the_unsubscription_decodes_as_its_kind(channel: str) -> None:
    sender, subscribe, unsubscribe = CHANNELS[channel]
    frames = _frames(unsubscribe)
    for who in (sender, None):
        message = CODEC.decode_message(channel, frames, sender=who)
        assert (message.kind, message.value) == (unsubscribe, None)
    assert CODEC.decode_message(channel, _frames(subscribe), sender=sender).kind == subscribe
    with pytest.raises(ProtocolError) as caught:
        CODEC.decode(subscribe, frames)
    assert caught.value.clause == "frames.frame-count"
    with pytest.raises(ProtocolError):
        CODEC.decode(unsubscribe, [*frames, b""])


def test_the_unsubscription_clause_is_in_the_spec() -> None:
    clause = load().clause("frames.unsubscribe-ignored")
    assert clause.level == "MUST" and "ignores" in clause.text


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_the_annotator_names_the_unsubscription_and_flags_nothing(channel: str) -> None:
    sender, _subscribe, unsubscribe = CHANNELS[channel]
    note = Annotator().annotate(Record(0, channel, sender, None, tuple(_frames(unsubscribe))))
    assert note.kind == unsubscribe and note.ok, note.violations


def test_check_records_reports_nothing_for_unsubscriptions() -> None:
    """The DP check decodes unsubscriptions like every other message: adding them to a run's
    records changes none of its findings; a malformed frame in their place does."""
    def problems(records: list[Record]) -> list[tuple[str, str]]:
        return sorted((p.clause, p.message) for p in check_records(records, 2, coordinated=True))

    base = [Record(0, "coordinator_input", "engine", None, tuple(_frames("coordinator_subscribe")))]
    leaving = [Record(0, channel, sender, None, tuple(_frames(unsub)))
               for channel, (sender, _sub, unsub) in CHANNELS.items()]
    assert problems(base + leaving) == problems(base)
    garbage = [Record(0, "stats_publish", "frontend", None, (bytes([0xc1]),))]
    assert problems(base + garbage) != problems(base)


class _SubscriptionReader(ReferenceCodec):
    """Reads the unsubscription as a subscription (one test of ``buffer in (01, 00)``)."""

    def decode(self, kind: str, frames: Any) -> Any:
        if kind.endswith("_subscribe") and [bytes(f) for f in frames] == [bytes([0])]:
            return None
        return super().decode(kind, frames)


class _PayloadReader(ReferenceCodec):
    """Has no unsubscription: refuses 0x00 as one (reads it as a payload, as the spec without
    the message did)."""

    def decode(self, kind: str, frames: Any) -> Any:
        if kind.endswith("_unsubscribe"):
            return super().decode("scale_elastic_ep", frames)
        return super().decode(kind, frames)


def _verdict(codec: Any) -> Any:
    checks = select(all_checks(), patterns=[CHECK])
    assert [c.id for c in checks] == [CHECK]
    [result] = run(checks, Target(name="codec", codec=codec), load()).results
    return result


def test_the_check_passes_on_the_reference() -> None:
    result = _verdict(ReferenceCodec())
    assert result.status == PASSED, result.message


@pytest.mark.parametrize("broken", [_SubscriptionReader, _PayloadReader])
def test_the_check_fails_on_a_codec_that_confuses_the_unsubscription(broken: type) -> None:
    result = _verdict(broken())
    assert result.status == FAILED, result.message
