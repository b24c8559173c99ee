"""Targets by extension: each reference surface changes one step by subclassing one public
class (``make_codec``, ``queue_class``, ``memory_writer_class``, ``engine_class``,
``frontend_class``), and the suite catches the change."""

from __future__ import annotations

from typing import Any

from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.targets.contract import Target
from enginewire.conformance.targets.reference import (
    ReferenceCodec,
    ReferenceEngines,
    ReferenceFrontends,
    ReferenceRing,
)
from enginewire.reference.codec import Codec
from enginewire.reference.engine import ReferenceEngine
from enginewire.reference.frontend import ReferenceFrontend
from enginewire.reference.ring import RingWriter
from enginewire.spec import load


def _verdict(target: Target, pattern: str) -> str:
    [result] = run(select(all_checks(), patterns=[pattern]), target, load(), strict=True).results
    return result.status


class HalfThresholdCodec(ReferenceCodec):
    def make_codec(self, threshold: int | None, insecure: bool) -> Any:
        return Codec(threshold=(threshold or 256) // 2, allow_insecure=insecure)


def test_codec_by_extension() -> None:
    check = "codec/tensor/inline-threshold-minus-one"
    assert _verdict(Target("ok", codec=ReferenceCodec()), check) == PASSED
    assert _verdict(Target("half", codec=HalfThresholdCodec()), check) == FAILED
    # with_threshold keeps the subclass: the configured codec is still the changed one.
    assert type(HalfThresholdCodec().with_threshold(16)) is HalfThresholdCodec


class NoFenceWriter(RingWriter):
    """Leaves out the fence between claiming a chunk and filling it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fence_acq_rel = None


class NoFenceRing(ReferenceRing):
    def memory_writer_class(self) -> Any:
        return NoFenceWriter


def test_ring_by_extension() -> None:
    ids = [c.id for c in select(all_checks(), patterns=["ring/memory/fence-after-claim"])]
    assert ids
    good = run(select(all_checks(), patterns=["ring/memory/fence-after-claim"]),
               Target("ok", ring=ReferenceRing()), load(), strict=True)
    assert {r.status for r in good.results} == {PASSED}
    bad = run(select(all_checks(), patterns=["ring/memory/fence-after-claim"]),
              Target("nofence", ring=NoFenceRing()), load(), strict=True)
    assert FAILED in {r.status for r in bad.results}


class SilentEngine(ReferenceEngine):
    """Answers a utility call for a method it lacks with nothing at all."""

    def _handle(self, frames: list[bytes]) -> None:
        if frames and bytes(frames[0]) == b"\x03":
            return
        super()._handle(frames)


class SilentEngines(ReferenceEngines):
    def engine_class(self) -> Any:
        return SilentEngine


def test_engine_by_extension() -> None:
    check = "engine/utility/unknown-method-fails"
    assert _verdict(Target("ok", engine=ReferenceEngines()), check) == PASSED
    assert _verdict(Target("silent", engine=SilentEngines()), check) == FAILED


class NoAbortFrontend(ReferenceFrontend):
    def abort(self, request_ids: list[str], engine_index: int = 0) -> None:
        return None


class NoAbortFrontends(ReferenceFrontends):
    def frontend_class(self) -> Any:
        return NoAbortFrontend


def test_frontend_by_extension() -> None:
    checks = select(all_checks(), patterns=["frontend/requests/abort-frames"])
    assert checks
    good = run(checks, Target("ok", frontend=ReferenceFrontends(ReferenceCodec())), load())
    assert {r.status for r in good.results} == {PASSED}
    bad = run(checks, Target("noabort", frontend=NoAbortFrontends(ReferenceCodec())), load())
    assert FAILED in {r.status for r in bad.results}
