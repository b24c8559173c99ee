"""Properties of the reference codec over values and malformed frames drawn from the spec.

- round trip: ``decode(encode(x))`` equals ``x`` for every message kind and struct;
- agreement with vLLM (marked ``vllm``): vLLM's ``MsgpackEncoder`` writes the same bytes as the
  reference codec for the same value built from vLLM's classes;
- rejection: every :func:`~enginewire.fuzz.mutations.malformed` case raises a
  :class:`~enginewire.reference.errors.ProtocolError` naming the clause the case breaks;
- reach: the strategies produce the edge values they promise.

Examples per property come from the ``ci`` profile (``ENGINEWIRE_FUZZ_PROFILE=long`` for a
campaign, see :mod:`enginewire.fuzz.profiles`).

Where the reference codec names a less specific clause than the spec for a defect, the defect
goes into :data:`KNOWN_CODEC_GAPS` (empty today) and its minimal input into
:data:`GAP_EXAMPLES`. The rejection property accepts exactly those answers for exactly those
mutations, and ``test_known_codec_gap`` runs every example: a strict expected failure while
its gap is listed (once the codec names the right clause it passes unexpectedly and the entry
must go), a regression test after.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import Phase, assume, find, given, settings
from hypothesis import strategies as st

from enginewire.conformance.oracle.samples import CONTEXTUAL
from enginewire.fuzz.mutations import catalogue, malformed
from enginewire.fuzz.profiles import profile
from enginewire.fuzz.strategies import (
    INT_MAX,
    INT_MIN,
    RULES,
    Malformed,
    kinds,
    messages,
    same_value,
    values,
)
from enginewire.reference import codec
from enginewire.reference.errors import ProtocolError
from enginewire.reference.tensors import vocabulary
from enginewire.spec import load

PROFILE = profile()
CODEC = codec.default_codec()
KINDS = kinds()
MESSAGE_KINDS = set(CODEC.message_kinds)
PAYLOAD_KINDS = [k for k in KINDS if k not in MESSAGE_KINDS or CODEC.layout(k).payload]
ROUTED_KINDS = [k for k in CODEC.message_kinds if CODEC.layout(k).routed]
THRESHOLD = CODEC.threshold

#: (mutation, clause the spec names) -> the clauses the reference codec names instead
#: ("accepted": it decodes the frames). See the module docstring.
KNOWN_CODEC_GAPS: dict[tuple[str, str], frozenset[str]] = {}


def _frames(frames: list[Any]) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


@pytest.fixture(autouse=True)
def _quiet_torch() -> Any:
    # torch warns once per process about tensors over read-only frames (tensors.zero-copy-decode)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given (buffer|NumPy array) is not writable")
        yield


# --- round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@settings(parent=PROFILE)
@given(data=st.data())
def test_round_trip(kind: str, data: st.DataObject) -> None:
    value = data.draw(messages(kind), label=kind)
    frames = codec.encode(kind, value)
    decoded = codec.decode(kind, _frames(frames))
    assert same_value(decoded, value), (kind, value, decoded)


OTHER_CODECS = {
    "wire-threshold-0": codec.Codec(threshold=0, tensors="wire"),
    "threshold-1024": codec.Codec(threshold=1024),
}


@pytest.mark.parametrize("config", sorted(OTHER_CODECS))
@pytest.mark.parametrize("kind", ["add", "outputs", "LogprobsTensors", "LogprobsLists"])
@settings(parent=PROFILE)
@given(data=st.data())
def test_round_trip_other_codec_settings(config: str, kind: str, data: st.DataObject) -> None:
    other = OTHER_CODECS[config]
    value = data.draw(messages(kind, codec=other), label=kind)
    decoded = other.decode(kind, _frames(other.encode(kind, value)))
    assert same_value(decoded, value), (config, kind, value, decoded)


# --- agreement with vLLM ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_codec() -> Any:
    pytest.importorskip("vllm")
    from enginewire.conformance.targets.vllm.target import VllmCodec

    return VllmCodec()


def _check_vllm_bytes(kind: str, value: Any, vllm_codec: Any) -> None:
    from enginewire.conformance.targets.vllm.objects import to_vllm

    payload_type = CODEC.layout(kind).payload if kind in MESSAGE_KINDS else kind
    expected = _frames(codec.encode(kind, value))
    got = _frames(vllm_codec.encode(kind, to_vllm(value, payload_type)))
    assert got == expected, (kind, [f.hex() for f in expected], [f.hex() for f in got])


@pytest.mark.vllm
@pytest.mark.parametrize("kind", [k for k in PAYLOAD_KINDS if k in MESSAGE_KINDS])
@settings(parent=PROFILE)
@given(data=st.data())
def test_vllm_encodes_the_same_bytes(kind: str, data: st.DataObject, vllm_codec: Any) -> None:
    value = data.draw(messages(kind), label=kind)
    # An empty ready response is what engines before 0.33.0 send; vLLM 0.33.0 never does.
    assume(value is not None)
    _check_vllm_bytes(kind, value, vllm_codec)


#: Structs travel inside the messages above too; alone they get a third of the examples.
STRUCT_EXAMPLES = max(10, PROFILE.max_examples // 3)


@pytest.mark.vllm
@pytest.mark.parametrize("kind", [k for k in PAYLOAD_KINDS
                                  if k not in MESSAGE_KINDS and k not in CONTEXTUAL])
@settings(parent=PROFILE, max_examples=STRUCT_EXAMPLES)
@given(data=st.data())
def test_vllm_encodes_the_same_struct_bytes(kind: str, data: st.DataObject,
                                            vllm_codec: Any) -> None:
    _check_vllm_bytes(kind, data.draw(messages(kind), label=kind), vllm_codec)


# --- rejection ----------------------------------------------------------------------------------


def _check_rejected(case: Malformed, decode: Callable[[str, list[bytes]], Any]) -> None:
    gap = KNOWN_CODEC_GAPS.get((case.mutation, case.clause), frozenset())
    try:
        decode(case.kind, list(case.frames))
    except ProtocolError as exc:
        assert exc.clause in case.accepted or exc.clause in gap, (
            f"{exc.clause} instead of the case's clause\n{case.describe()}\n{exc}")
        return
    assert "accepted" in gap, f"decoded without an error:\n{case.describe()}"


@pytest.mark.parametrize("kind", KINDS)
@settings(parent=PROFILE)
@given(data=st.data())
def test_malformed_is_rejected_with_its_clause(kind: str, data: st.DataObject) -> None:
    case = data.draw(malformed(kind), label="case")
    assert case.mutation in catalogue()
    _check_rejected(case, codec.decode)


@pytest.mark.parametrize("kind", ROUTED_KINDS)
@settings(parent=PROFILE)
@given(data=st.data())
def test_routed_malformed_is_rejected_with_its_clause(kind: str, data: st.DataObject) -> None:
    case = data.draw(malformed(kind, routed=True), label="case")
    _check_rejected(case, codec.decode_routed)


#: Minimal inputs of the gaps found so far: (kind, frames, mutation, clause the spec names).
#: Those still listed in KNOWN_CODEC_GAPS are strict expected failures.
GAP_EXAMPLES = [
    ("LateChunkingParams", [msgspec.msgpack.encode(["seven"])], "wrong-type",
     "structs.array.type-checked"),
    ("LateChunkingParams", [msgspec.msgpack.encode({"chunk_size": 7})], "array-as-map",
     "structs.array.type-checked"),
    ("LateChunkingParams", [msgspec.msgpack.encode([None])], "nil-not-nullable",
     "structs.none.nil"),
    ("UtilityResult", [msgspec.msgpack.encode([None])], "missing-required",
     "structs.tuple.array"),
    ("UtilityResult", [msgspec.msgpack.encode([None, None, 0])], "tuple-extra",
     "structs.tuple.extra-elements-rejected"),
    ("UtilityResult", [msgspec.msgpack.encode([["builtins", "int"], 1])], "utility-type-info",
     "structs.utility-result.type-info-insecure-only"),
]


def _gap_example(kind: str, frames: list[bytes], mutation: str, clause: str) -> Any:
    known = (mutation, clause) in KNOWN_CODEC_GAPS
    marks = [pytest.mark.xfail(strict=True, reason="reference codec names a less specific "
                               "clause (see KNOWN_CODEC_GAPS); remove the entry once fixed")]
    return pytest.param(kind, frames, mutation, clause, marks=marks if known else [],
                        id=f"{kind}-{mutation}")


@pytest.mark.parametrize(("kind", "frames", "mutation", "clause"),
                         [_gap_example(*example) for example in GAP_EXAMPLES])
def test_known_codec_gap(kind: str, frames: list[bytes], mutation: str, clause: str) -> None:
    with pytest.raises(ProtocolError) as info:
        codec.decode(kind, frames)
    assert info.value.clause == clause


def test_catalogue_documents_every_mutation() -> None:
    import inspect
    import re

    from enginewire.fuzz import mutations

    produced = re.findall(r'(?:yield |append\(\()"([a-z]+(?:-[a-z]+)+)"',
                          inspect.getsource(mutations))
    assert sorted(set(produced)) == sorted(catalogue())


def test_rules_cite_existing_clauses() -> None:
    spec = load()
    for _, _, clause in RULES:
        spec.clause(clause)
    for mutation, clause in KNOWN_CODEC_GAPS:
        assert mutation in catalogue()
        spec.clause(clause)


# --- reach --------------------------------------------------------------------------------------


class _Drawn:
    """A drawn value with a repr that cannot fail: ``find`` prints the draw it found, and
    torch cannot print every tensor it can make (a 0-d ``float4_e2m1fn_x2`` raises). Made
    inside a composite strategy, not by ``.map``: Hypothesis prints a mapped value as the call
    that made it, the unprintable draw as its argument."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"<drawn {type(self.value).__name__}>"


def _reach(strategy: st.SearchStrategy[Any], predicate: Callable[[Any], bool]) -> Any:
    """Some draw of ``strategy`` satisfying ``predicate`` (fails the test if none in 2000)."""
    @st.composite
    def drawn(draw: st.DrawFn) -> _Drawn:
        return _Drawn(draw(strategy))

    return find(drawn(), lambda found: predicate(found.value), settings=settings(
        max_examples=2000, database=None, phases=[Phase.generate], deadline=None,
        suppress_health_check=list(PROFILE.suppress_health_check))).value


def _nbytes(tensor: Any) -> int:
    return int(tensor.nbytes)


def _dtype(tensor: Any) -> str:
    return tensor.dtype.str if isinstance(tensor, np.ndarray) else str(tensor.dtype).split(".")[-1]


@pytest.mark.parametrize("bound", [INT_MIN, INT_MAX])
def test_reaches_integer_bounds(bound: int) -> None:
    found = _reach(messages("PlaceholderRange"), lambda v: v.offset == bound)
    frames = _frames(codec.encode("PlaceholderRange", found))
    assert codec.decode("PlaceholderRange", frames).offset == bound


def test_reaches_special_floats_text_empty_and_none() -> None:
    _reach(messages("EngineCoreEvent"), lambda v: math.isnan(v.timestamp))
    _reach(messages("EngineCoreEvent"), lambda v: v.timestamp == -math.inf)
    _reach(messages("abort"), lambda ids: any(not s.isascii() for s in ids))
    _reach(messages("KvHintsEnvelope"), lambda v: v.actions == [])
    _reach(messages("add"), lambda v: v.prompt_token_ids is None)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_reaches_the_inline_threshold(delta: int) -> None:
    found = _reach(values("tensor"), lambda t: _nbytes(t) == THRESHOLD + delta)
    frames = codec.encode("EngineCoreOutput", codec.default_codec().structs.classes[
        "EngineCoreOutput"](request_id="r", new_token_ids=[], pooling_output=found))
    assert len(frames) == (1 if delta < 0 else 2)


def test_reaches_0d_empty_and_non_contiguous() -> None:
    _reach(values("tensor"), lambda t: tuple(t.shape) == ())
    _reach(values("ndarray"), lambda a: a.shape == ())
    _reach(values("tensor"), lambda t: 0 in tuple(t.shape) and len(t.shape) > 1)
    _reach(values("ndarray"), lambda a: not a.flags.c_contiguous)


def test_reaches_every_dtype() -> None:
    vocab = vocabulary()
    torch_seen: set[str] = set()
    numpy_seen: set[str] = set()

    def collect(seen: set[str], total: int) -> Callable[[Any], bool]:
        def record(t: Any) -> bool:
            seen.add(_dtype(t))
            return len(seen) == total
        return record

    _reach(values("tensor"), collect(torch_seen, len(vocab.torch)))
    _reach(values("ndarray"), collect(numpy_seen, len(vocab.numpy)))
    assert torch_seen == set(vocab.torch)
    assert numpy_seen == set(vocab.numpy)


def test_reaches_nested_tensors() -> None:
    def deep_big_tensor(data: Any) -> bool:
        return isinstance(data, list) and any(
            isinstance(item, list) and any(hasattr(t, "nbytes") and _nbytes(t) >= THRESHOLD
                                           for t in item)
            for item in data)

    _reach(values("nested_tensors"), deep_big_tensor)
    _reach(values("nested_tensors"), lambda d: isinstance(d, float) and math.isnan(d))
    _reach(values("nested_tensors"), lambda d: d == [])


def test_reaches_out_of_band_frames_in_messages() -> None:
    _reach(messages("add"), lambda v: len(codec.encode("add", v)) > 2)
