"""Placement power: the inline/out-of-band checks catch a codec that counts elements, and a
``with_threshold`` that hands back a reference codec."""

from __future__ import annotations

from typing import Any

import pytest

from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.targets.contract import Target
from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.spec import load

PATTERNS = ["codec/*float32-threshold-*", "codec/tensor/with-threshold-default-identical",
            "codec/*/inline-threshold-*"]


def _itemsize(value: Any) -> int:
    sizes = [1]
    if isinstance(value, dict):
        for item in value.values():
            sizes.append(_itemsize(item))
    elif hasattr(value, "element_size"):
        sizes.append(value.element_size())
    elif hasattr(value, "itemsize"):
        sizes.append(value.itemsize)
    return max(sizes)


class CountsElements:
    """Places a tensor inline iff its *element count* is below the threshold."""

    def __init__(self, threshold: int = 256) -> None:
        self.threshold = threshold

    def with_threshold(self, threshold: int) -> CountsElements:
        return CountsElements(threshold)

    def encode(self, kind: str, value: Any) -> Any:
        return ReferenceCodec(self.threshold * _itemsize(value)).encode(kind, value)

    def decode(self, kind: str, frames: Any) -> Any:
        return ReferenceCodec(self.threshold).decode(kind, frames)


class HandsBackReference(CountsElements):
    def with_threshold(self, threshold: int) -> Any:
        return ReferenceCodec(threshold)


@pytest.fixture(scope="module")
def checks() -> list[Any]:
    return select(all_checks(), patterns=PATTERNS)


def _verdicts(codec: Any, checks: list[Any]) -> dict[str, str]:
    result = run(checks, Target("t", codec=codec), load(), strict=True)
    return {r.check.id: r.status for r in result.results}


def test_reference_passes(checks: list[Any]) -> None:
    assert set(_verdicts(ReferenceCodec(), checks).values()) == {PASSED}


def test_element_counting_codec_fails(checks: list[Any]) -> None:
    verdicts = _verdicts(CountsElements(), checks)
    assert verdicts["codec/tensor/float32-threshold-exact"] == FAILED
    assert verdicts["codec/ndarray/float32-threshold-exact"] == FAILED
    assert verdicts["codec/tensor/request-float32-threshold-exact"] == FAILED
    # The one-byte checks alone could not tell.
    assert verdicts["codec/tensor/inline-threshold-exact"] == PASSED


def test_with_threshold_returning_a_reference_codec_fails(checks: list[Any]) -> None:
    verdicts = _verdicts(HandsBackReference(), checks)
    assert verdicts["codec/tensor/with-threshold-default-identical"] == FAILED
