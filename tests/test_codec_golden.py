"""The reference codec reproduces vLLM's golden frames byte for byte (no vLLM needed).

The vectors under ``conformance/data/golden`` were written by ``scripts/make_golden_vectors.py``
with vLLM 0.33.0's own encoders.
"""

from __future__ import annotations

import pytest

from enginewire.conformance.oracle.golden import GOLDEN_DIR, check_vector, load_vectors
from enginewire.reference.codec import Codec

VECTORS = {vector.name: vector for vector in load_vectors()}


def test_vectors_are_committed() -> None:
    assert GOLDEN_DIR.is_dir()
    assert len(VECTORS) >= 30


def test_every_message_kind_has_a_vector() -> None:
    kinds = {vector.kind for vector in VECTORS.values()}
    assert set(Codec().message_kinds) <= kinds


def test_tensor_boundary_cases_have_vectors() -> None:
    for name in (
        "add_tensor_255_bytes", "add_tensor_256_bytes", "add_tensor_257_bytes",
        "add_tensor_empty", "add_tensor_noncontiguous", "add_tensor_0d_threshold_0",
        "add_prompt_embeds_bfloat16", "outputs_ndarray_255_bytes", "outputs_ndarray_256_bytes",
        "outputs_ndarray_257_bytes", "outputs_ndarray_0d_threshold_0",
    ):
        assert name in VECTORS
    assert len(VECTORS["add_tensor_255_bytes"].frames) == 2
    assert len(VECTORS["add_tensor_256_bytes"].frames) == 3
    assert len(VECTORS["add_tensor_0d_threshold_0"].frames) == 3
    assert len(VECTORS["outputs_ndarray_0d_threshold_0"].frames) == 1


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_reference_reproduces_vector(name: str) -> None:
    assert check_vector(VECTORS[name]) == []


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_reference_reproduces_vector_without_torch_tensors(name: str) -> None:
    vector = next(v for v in load_vectors(tensors="wire") if v.name == name)
    assert check_vector(vector, Codec(threshold=vector.threshold, tensors="wire")) == []


def test_a_changed_byte_is_caught() -> None:
    vector = VECTORS["abort"]
    frames = list(vector.frames)
    frames[1] = frames[1][:-1] + b"3"
    tampered = type(vector)(**{**vector.__dict__, "frames": tuple(frames)})
    assert check_vector(tampered)
