"""Hostile payloads against the reference codec: huge shapes and deep nesting end in a
ProtocolError naming the clause (tensors.shape-bounded, tensors.byte-length-matches-shape,
tensors.nested-tensors-depth, frames.nesting-depth), quickly and never as RecursionError."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from enginewire.reference import structs as S
from enginewire.reference.codec import Codec
from enginewire.reference.errors import ProtocolError, TensorError
from enginewire.reference.tensors import WireTensor
from enginewire.spec import load

TENSORS = load().surface("tensors")
FRAMES = load().surface("frames")
DEEP = 10_000


def _add_frames(shape: list[Any], data: bytes = b"\x00" * 8) -> list[bytes]:
    """An add message whose prompt_embeds tuple carries ``shape`` as given."""
    embeds = WireTensor("uint8", (len(data),), data)
    request = S.EngineCoreRequest(
        "r", None, None, S.SamplingParams(), None, 0.5, None, None, None, prompt_embeds=embeds
    )
    frames = [bytes(memoryview(f).cast("B")) for f in Codec(tensors="wire").encode("add", request)]
    raw = msgspec.msgpack.decode(frames[1], ext_hook=msgspec.msgpack.Ext)
    raw[9][1] = shape
    frames[1] = msgspec.msgpack.encode(raw)
    return frames


def test_limits_are_spec_data() -> None:
    assert TENSORS.limits["max_dims"] == 64
    assert TENSORS.limits["max_nested_tensors_depth"] >= 8
    assert FRAMES.limits["max_nesting_depth"] >= 64


def test_a_shape_of_huge_entries_fails_fast_with_the_length_clause() -> None:
    codec = Codec(tensors="wire")
    frames = _add_frames([2**63 - 1] * 8)
    with pytest.raises(TensorError) as caught:
        codec.decode("add", frames)
    assert caught.value.clause == "tensors.byte-length-matches-shape"
    assert "more than" in str(caught.value)


def test_a_shape_of_60000_entries_is_rejected_before_any_product() -> None:
    codec = Codec(tensors="wire")
    frames = _add_frames([2**63 - 1] * 60_000)
    started = time.perf_counter()
    with pytest.raises(TensorError) as caught:
        codec.decode("add", frames)
    assert caught.value.clause == "tensors.shape-bounded"
    # Not a timing assertion on performance: a stall of seconds would show as a test timeout.
    assert len(str(caught.value)) < 500
    del started


@pytest.mark.parametrize("dims", [64, 65])
def test_the_dims_limit_is_exact(dims: int) -> None:
    codec = Codec(tensors="wire")
    frames = _add_frames([1] * (dims - 1) + [8])
    if dims <= TENSORS.limits["max_dims"]:
        assert codec.decode("add", frames).prompt_embeds.shape == (1,) * (dims - 1) + (8,)
    else:
        with pytest.raises(TensorError, match="tensors.shape-bounded"):
            codec.decode("add", frames)


def test_a_wrong_length_still_names_the_length_clause() -> None:
    with pytest.raises(TensorError) as caught:
        Codec(tensors="wire").decode("add", _add_frames([3, 3]))
    assert caught.value.clause == "tensors.byte-length-matches-shape"
    assert caught.value.expected == 9


def _feature_frames(data_raw: Any) -> list[bytes]:
    element = S.MultiModalFieldElem(data=0, field=("batched", S.MultiModalBatchedField()))
    feature = S.MultiModalFeatureSpec(data={"x": element}, modality="image", identifier="i",
                                      mm_position=S.PlaceholderRange(offset=0, length=1))
    frames = Codec().encode("MultiModalFeatureSpec", feature)
    raw = msgspec.msgpack.decode(bytes(frames[0]))
    raw["data"]["x"]["data"] = data_raw
    return [msgspec.msgpack.encode(raw)]


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_nested_tensors_up_to_the_limit_decode() -> None:
    limit = TENSORS.limits["max_nested_tensors_depth"]
    got = Codec().decode("MultiModalFeatureSpec", _feature_frames(_nested(limit)))
    assert got.data["x"].data == _nested(limit)


@pytest.mark.parametrize("depth", [TENSORS.limits["max_nested_tensors_depth"] + 1, 500])
def test_nested_tensors_past_the_limit_name_the_depth_clause(depth: int) -> None:
    with pytest.raises(TensorError) as caught:
        Codec().decode("MultiModalFeatureSpec", _feature_frames(_nested(depth)))
    assert caught.value.clause == "tensors.nested-tensors-depth"


def test_encoding_too_deep_nested_tensors_names_the_depth_clause() -> None:
    limit = TENSORS.limits["max_nested_tensors_depth"]
    element = S.MultiModalFieldElem(data=_nested(limit + 1),
                                    field=("batched", S.MultiModalBatchedField()))
    feature = S.MultiModalFeatureSpec(data={"x": element}, modality="image", identifier="i",
                                      mm_position=S.PlaceholderRange(offset=0, length=1))
    with pytest.raises(TensorError, match="tensors.nested-tensors-depth"):
        Codec().encode("MultiModalFeatureSpec", feature)


def _deep_msgpack(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def test_a_10000_level_utility_argument_is_a_protocol_error() -> None:
    head = msgspec.msgpack.encode([0, 1, "m"])[:-0 or None]
    # [0, 1, "m", (deep,)]: a 4-array whose last element is a 1-tuple of the deep value.
    payload = b"\x94" + head[1:] + b"\x91" + _deep_msgpack(DEEP)
    with pytest.raises(ProtocolError) as caught:
        Codec().decode("utility", [b"\x03", payload])
    assert caught.value.clause == "frames.nesting-depth"


def test_the_nesting_limit_decodes() -> None:
    depth = FRAMES.limits["max_nesting_depth"]
    payload = msgspec.msgpack.encode([0, 1, "m", [_nested(depth - 2)]])
    assert Codec().decode("utility", [b"\x03", payload])[3][0] == _nested(depth - 2)


def test_encoding_a_10000_level_value_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError) as caught:
        Codec().encode("utility", (0, 1, "m", (_nested(DEEP),)))
    assert caught.value.clause == "frames.nesting-depth"


@pytest.mark.parametrize("kind", Codec().message_kinds)
def test_every_kind_rejects_deep_nesting_as_a_protocol_error(kind: str) -> None:
    codec = Codec()
    layout = codec.layout(kind)
    frames = [*layout.prefix, _deep_msgpack(DEEP)]
    try:
        codec.decode(kind, frames)
    except ProtocolError:
        pass
    except RecursionError:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"{kind}: RecursionError escaped the codec")


def test_start_dp_wave_with_nil_exclude_decodes() -> None:
    """The codec follows the spec's tuple[int, int | none] for START_DP_WAVE."""
    codec = Codec()
    frames = [*codec.layout("start_dp_wave").prefix, msgspec.msgpack.encode([1, None])]
    assert codec.decode("start_dp_wave", frames) == (1, None)


def test_the_engine_session_accepts_start_dp_wave_with_nil_exclude() -> None:
    from enginewire.reference.session import EngineSession

    session = EngineSession(0)
    session.start()
    session.receive_init({"addresses": {"inputs": ["ipc:///tmp/a"], "outputs": ["ipc:///tmp/b"]},
                          "parallel_config": {}})
    session.send_ready_response()
    session.send_ready()
    assert session.receive_request(b"\x02", (1, None)) == []


def test_a_front_end_that_cannot_bind_raises_the_bind_error() -> None:
    import zmq

    from enginewire.reference.frontend import ReferenceFrontend

    with pytest.raises(zmq.ZMQError, match="nonexistent-dir"):
        ReferenceFrontend(handshake_address="ipc:///nonexistent-dir/x")
