"""The reference codec against vLLM 0.33.0's own encoders and decoders, both directions.

- vLLM's frames decode with the reference codec and re-encode to identical bytes;
- the reference's frames decode in vLLM's decoders to objects equal field by field;
- the vLLM deviations the spec records are still there (so the notes stay true).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1 import engine as vllm_engine  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, UtilityResult  # noqa: E402

from enginewire.conformance.oracle.golden import (  # noqa: E402
    as_sent,
    cases,
    from_json,
    reference_value,
    to_json,
    vllm_frames,
)
from enginewire.conformance.oracle.values import differences, neutral  # noqa: E402
from enginewire.conformance.targets.vllm.target import VllmCodec  # noqa: E402
from enginewire.reference import structs as S  # noqa: E402
from enginewire.reference.codec import Codec  # noqa: E402
from enginewire.spec import load  # noqa: E402

pytestmark = pytest.mark.vllm

CASES = {case.name: case for case in cases()}
SURFACE = load().surface("tensors")


def _bytes(frames: Any) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def _vllm_decode(kind: str, frames: list[bytes], threshold: int) -> Any:
    """Decode as vLLM's receiving end does for ``kind``."""
    if kind in ("stats_update", "scale_elastic_ep"):
        (frame,) = frames
        return msgspec.msgpack.decode(frame)
    if kind == "start_dp_wave":
        assert frames[0] == vllm_engine.EngineCoreRequestType.START_DP_WAVE.value
        return MsgpackDecoder().decode(frames[1:])
    struct = {"utility_reply": "EngineCoreOutputs", "coordinator_outputs": "EngineCoreOutputs"}
    return VllmCodec(threshold).decode(struct.get(kind, kind), frames)


# --- vLLM -> reference -> vLLM bytes --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_vllm_frames_decode_and_reencode_identically(name: str) -> None:
    case = CASES[name]
    frames, _ = vllm_frames(case.kind, case.value, case.threshold)
    codec = Codec(threshold=case.threshold)
    decoded = codec.decode(case.kind, frames)
    assert _bytes(codec.encode(case.kind, decoded)) == frames


# --- reference -> vLLM objects --------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_frames_decode_in_vllm(name: str) -> None:
    case = CASES[name]
    frames, original = vllm_frames(case.kind, case.value, case.threshold)
    codec = Codec(threshold=case.threshold)
    # The value as a golden vector records it (tensors as real tensors again).
    recorded = from_json(to_json(as_sent(original))) if original is not None else None
    value = reference_value(case.kind, recorded)
    mine = _bytes(codec.encode(case.kind, value))
    assert mine == frames
    if original is None:
        return
    decoded = _vllm_decode(case.kind, mine, case.threshold)
    assert differences(neutral(original), neutral(decoded)) == []


def _vllm_request() -> Any:
    params = SamplingParams(
        n=2, temperature=0.3, top_p=0.95, top_k=20, seed=7, max_tokens=100,
        stop=["###"], logprobs=2, logit_bias={11: 2.5}, presence_penalty=0.1,
    )
    return vllm_engine.EngineCoreRequest(
        request_id="req-real", prompt_token_ids=None, mm_features=None,
        sampling_params=params, pooling_params=None, arrival_time=1712345678.125,
        lora_request=LoRARequest("adapter", 5, "/models/adapter"), cache_salt="s",
        data_parallel_rank=0, prompt_embeds=torch.randn(6, 64, dtype=torch.float32),
        client_index=1, priority=3, trace_headers={"traceparent": "00-1-2-01"},
    )


def test_realistic_request_both_ways() -> None:
    request = _vllm_request()
    frames = _bytes(MsgpackEncoder().encode(request))
    assert len(frames) == 2
    codec = Codec()
    mine = codec.decode("EngineCoreRequest", frames)
    assert torch.equal(mine.prompt_embeds, request.prompt_embeds)
    assert mine.sampling_params.logit_bias == {11: 2.5}
    assert mine.lora_request.lora_path == "/models/adapter"
    assert _bytes(codec.encode("EngineCoreRequest", mine)) == frames
    back = MsgpackDecoder(vllm_engine.EngineCoreRequest).decode(
        _bytes(codec.encode("EngineCoreRequest", mine))
    )
    for field in msgspec.structs.fields(back):
        got, want = getattr(back, field.name), getattr(request, field.name)
        if isinstance(want, torch.Tensor):
            assert torch.equal(got, want)
        else:
            assert got == want, field.name


def test_realistic_outputs_both_ways() -> None:
    outputs = vllm_engine.EngineCoreOutputs(
        engine_index=0,
        outputs=[
            vllm_engine.EngineCoreOutput("a", [1, 2]),
            vllm_engine.EngineCoreOutput(
                "b", [3], finish_reason=vllm_engine.FinishReason.STOP,
                pooling_output=torch.arange(100, dtype=torch.float32),
            ),
        ],
        scheduler_stats=None,
        timestamp=99.5,
        utility_output=vllm_engine.UtilityOutput(7, result=UtilityResult({"x": [1, 2]})),
        finished_requests={"b", "c", "d"},
    )
    frames = _bytes(MsgpackEncoder().encode(outputs))
    codec = Codec()
    mine = codec.decode("EngineCoreOutputs", frames)
    assert mine.finished_requests == {"b", "c", "d"}
    assert mine.utility_output.result == S.UtilityResult(None, {"x": [1, 2]})
    assert torch.equal(mine.outputs[1].pooling_output, outputs.outputs[1].pooling_output)
    back = MsgpackDecoder(vllm_engine.EngineCoreOutputs).decode(
        codec.encode("EngineCoreOutputs", mine)
    )
    assert back.utility_output.result.result == {"x": [1, 2]}
    assert back.finished_requests == {"b", "c", "d"}
    assert torch.equal(back.outputs[1].pooling_output, outputs.outputs[1].pooling_output)
    assert [o.request_id for o in back.outputs] == ["a", "b"]


def test_multimodal_request_both_ways() -> None:
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFeatureSpec,
        MultiModalFieldElem,
        MultiModalFlatField,
        MultiModalKwargsItem,
        MultiModalSharedField,
        PlaceholderRange,
    )

    item = MultiModalKwargsItem({
        "pixel_values": MultiModalFieldElem(data=torch.randn(2, 3),
                                            field=MultiModalBatchedField()),
        "embeds": MultiModalFieldElem(
            data=torch.arange(100, dtype=torch.float32),
            field=MultiModalFlatField(slices=[slice(0, 40), slice(40, 100)], dim=0)),
        "grid": MultiModalFieldElem(data=torch.ones(3), field=MultiModalSharedField(batch_size=2)),
    })
    feature = MultiModalFeatureSpec(data=item, modality="image", identifier="img-0",
                                    mm_position=PlaceholderRange(offset=3, length=4))
    request = vllm_engine.EngineCoreRequest(
        "r", [1, 2, 3, 4, 5, 6, 7], [feature], SamplingParams(max_tokens=3), None, 0.5,
        None, None, None)
    frames = _bytes(MsgpackEncoder().encode(request))
    assert len(frames) == 2
    codec = Codec()
    mine = codec.decode("EngineCoreRequest", frames)
    data = mine.mm_features[0].data
    assert data["embeds"].field == ("flat", S.MultiModalFlatField(
        slices=[slice(0, 40), slice(40, 100)], dim=0))
    assert data["grid"].field == ("shared", S.MultiModalSharedField(batch_size=2))
    assert data["pixel_values"].field == ("batched", S.MultiModalBatchedField())
    assert torch.equal(data["embeds"].data, torch.arange(100, dtype=torch.float32))
    again = _bytes(codec.encode("EngineCoreRequest", mine))
    assert again == frames
    back = MsgpackDecoder(vllm_engine.EngineCoreRequest).decode(again)
    elems = back.mm_features[0].data
    assert elems["embeds"].field == item["embeds"].field
    assert elems["grid"].field == item["grid"].field
    assert torch.equal(elems["pixel_values"].data, item["pixel_values"].data)


#: Nested tensors (tensors.nested-tensors) of a multimodal field: (case, data factory). The
#: tensors are 8 bytes (inline) or 256 and 400 bytes (out of band at the default threshold).
NESTED_TENSORS = {
    "inline": lambda: [torch.arange(2, dtype=torch.int32), [torch.ones(1), 3, -0.5], []],
    "out-of-band": lambda: [torch.zeros(256, dtype=torch.uint8),
                            [torch.arange(100, dtype=torch.float32)], 7],
    "mixed": lambda: [[torch.ones(2, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.int32)],
                      torch.tensor(1.5), (torch.arange(3),)],
    "number": lambda: 2.25,
    "cached (None)": lambda: None,
}


def _nested_request(data: Any) -> Any:
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFeatureSpec,
        MultiModalFieldElem,
        MultiModalKwargsItem,
        PlaceholderRange,
    )

    item = MultiModalKwargsItem({
        "image_sizes": MultiModalFieldElem(data=data, field=MultiModalBatchedField()),
    })
    feature = MultiModalFeatureSpec(data=item, modality="image", identifier="img-0",
                                    mm_position=PlaceholderRange(offset=1, length=2))
    return vllm_engine.EngineCoreRequest(
        "r", [1, 2, 3], [feature], SamplingParams(max_tokens=3), None, 0.5, None, None, None)


def _as_lists(data: Any) -> Any:
    """Nested tensors as they come back: tuples become lists."""
    if isinstance(data, list | tuple):
        return [_as_lists(item) for item in data]
    return data


@pytest.mark.parametrize("case", sorted(NESTED_TENSORS))
def test_multimodal_nested_tensors_both_ways(case: str) -> None:
    data = NESTED_TENSORS[case]()
    request = _nested_request(data)
    frames = _bytes(MsgpackEncoder().encode(request))
    assert (len(frames) > 1) == (case in ("out-of-band", "mixed"))
    codec = Codec()
    mine = codec.decode("add", [vllm_engine.EngineCoreRequestType.ADD.value, *frames])
    got = mine.mm_features[0].data["image_sizes"].data
    # Tensors come back as tensors at every depth, not as [dtype, shape, data] arrays.
    assert differences(_as_lists(data), got) == []
    assert _bytes(codec.encode("add", mine))[1:] == frames
    back = MsgpackDecoder(vllm_engine.EngineCoreRequest).decode(
        _bytes(codec.encode("add", mine))[1:])
    assert differences(_as_lists(data), back.mm_features[0].data["image_sizes"].data) == []


def test_multimodal_item_with_a_list_holding_one_oob_tensor() -> None:
    """vLLM's frames for a list holding one 256-byte tensor (out of band) decode, where a
    list[any] type once left the index dangling (frames.oob-count-matches)."""
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFeatureSpec,
        MultiModalFieldElem,
        MultiModalKwargsItem,
        PlaceholderRange,
    )

    tensor = torch.zeros(256, dtype=torch.uint8)
    item = MultiModalKwargsItem({"x": MultiModalFieldElem(data=[tensor],
                                                          field=MultiModalBatchedField())})
    feature = MultiModalFeatureSpec(data=item, modality="image", identifier="i",
                                    mm_position=PlaceholderRange(offset=0, length=1))
    frames = _bytes(MsgpackEncoder().encode(feature))
    assert frames == [bytes.fromhex(
        "85a46461746181a17882a4646174619193a575696e743891cd010001a56669656c6492a762617463686564"
        "81ab6b6565705f6f6e5f637075c2a86d6f64616c697479a5696d616765aa6964656e746966696572a169ab"
        "6d6d5f706f736974696f6e83a66f666673657400a66c656e67746801a869735f656d626564c0a76d6d5f68"
        "617368c0"), bytes(256)]
    decoded = Codec().decode("MultiModalFeatureSpec", frames)
    (got,) = decoded.data["x"].data
    assert torch.equal(got, tensor)
    assert _bytes(Codec().encode("MultiModalFeatureSpec", decoded)) == frames


# --- tensors, every dtype, both thresholds ------------------------------------------------------


class _TensorHolder(msgspec.Struct, array_like=True):
    tensor: torch.Tensor


class _ArrayHolder(msgspec.Struct, array_like=True):
    array: np.ndarray


def _pooling_outputs(tensor: Any) -> Any:
    return S.EngineCoreOutputs(timestamp=1.0, outputs=[
        S.EngineCoreOutput("r", [], pooling_output=tensor)])


@pytest.mark.parametrize("name", SURFACE.torch_dtypes)
@pytest.mark.parametrize("threshold", [256, 0])
def test_every_torch_dtype_both_ways(name: str, threshold: int) -> None:
    dtype = getattr(torch, name)
    raw = bytes((i * 37 + 11) % 256 for i in range(12 * dtype.itemsize))
    if name == "bool":
        raw = bytes(b & 1 for b in raw)
    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(3, 4)
    codec = Codec(threshold=threshold)
    mine = codec.encode("EngineCoreOutputs", _pooling_outputs(tensor))
    theirs = MsgpackEncoder(size_threshold=threshold).encode(
        vllm_engine.EngineCoreOutputs(timestamp=1.0, outputs=[
            vllm_engine.EngineCoreOutput("r", [], pooling_output=tensor)]))
    assert _bytes(mine) == _bytes(theirs)
    decoded = MsgpackDecoder(vllm_engine.EngineCoreOutputs).decode(mine)
    pooled = decoded.outputs[0].pooling_output
    assert pooled.dtype == dtype
    assert torch.equal(pooled.view(torch.uint8), tensor.view(torch.uint8))
    back = codec.decode("EngineCoreOutputs", _bytes(theirs)).outputs[0].pooling_output
    assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))


@pytest.mark.parametrize("text", SURFACE.numpy_dtypes)
@pytest.mark.parametrize("threshold", [256, 0])
def test_every_numpy_dtype_both_ways(text: str, threshold: int) -> None:
    dtype = np.dtype(text)
    raw = bytes((i * 53 + 7) % 256 for i in range(6 * dtype.itemsize))
    if dtype.kind == "b":
        raw = bytes(b & 1 for b in raw)
    array = np.frombuffer(raw, dtype=dtype).reshape(3, 2)
    holder = vllm_engine.EngineCoreOutputs(timestamp=1.0, outputs=[
        vllm_engine.EngineCoreOutput("r", [1], routed_experts=array)])
    theirs = _bytes(MsgpackEncoder(size_threshold=threshold).encode(holder))
    codec = Codec(threshold=threshold)
    decoded = codec.decode("EngineCoreOutputs", theirs)
    assert decoded.outputs[0].routed_experts.dtype.str == text
    assert _bytes(codec.encode("EngineCoreOutputs", decoded)) == theirs


@pytest.mark.parametrize("threshold", [256, 0])
def test_non_contiguous_tensor_matches_vllm(threshold: int) -> None:
    view = torch.arange(200, dtype=torch.float32).reshape(10, 20)[:, ::3].t()
    assert not view.is_contiguous()
    theirs = MsgpackEncoder(size_threshold=threshold).encode(
        vllm_engine.EngineCoreOutputs(timestamp=1.0, outputs=[
            vllm_engine.EngineCoreOutput("r", [], pooling_output=view)]))
    mine = Codec(threshold=threshold).encode("EngineCoreOutputs", _pooling_outputs(view))
    assert _bytes(mine) == _bytes(theirs)


# --- the deviations the spec records ------------------------------------------------------------


RAW = np.arange(4, dtype="<i4").tobytes()
pack = msgspec.msgpack.encode


def _vllm_tensor(raw_tuple: list[Any], *frames: bytes) -> Any:
    return MsgpackDecoder(_TensorHolder).decode([pack([raw_tuple]), *frames]).tensor


def _vllm_array(raw_tuple: list[Any], *frames: bytes) -> Any:
    return MsgpackDecoder(_ArrayHolder).decode([pack([raw_tuple]), *frames]).array


def test_vllm_takes_a_negative_index_as_another_frame() -> None:
    """tensors.index-in-range: vLLM reads frame -1 (the last one)."""
    other = np.arange(4, 8, dtype="<i4").tobytes()
    got = _vllm_array(["<i4", [4], -1], RAW, other)
    assert got.tolist() == [4, 5, 6, 7]


def test_vllm_takes_index_zero_as_the_msgpack_frame() -> None:
    """tensors.index-in-range: index 0 is the msgpack frame itself."""
    payload = pack([["|u1", [9], 0]])
    assert len(payload) == 9
    got = MsgpackDecoder(_ArrayHolder).decode([payload]).array
    assert got.tobytes() == payload


def test_vllm_infers_a_minus_one_dimension() -> None:
    """tensors.shape-non-negative."""
    ext = msgspec.msgpack.Ext(3, RAW)
    assert _vllm_array(["<i4", [-1], ext]).shape == (4,)
    assert tuple(_vllm_tensor(["int32", [2, -1], ext]).shape) == (2, 2)


def test_vllm_accepts_dtype_aliases_and_bin_data() -> None:
    """tensors.torch-dtype-name, tensors.numpy-dtype-str, tensors.data-form."""
    ext = msgspec.msgpack.Ext(3, RAW)
    assert _vllm_tensor(["float", [4], ext]).dtype == torch.float32
    assert _vllm_array(["int32", [4], ext]).dtype == np.int32
    assert _vllm_array(["<i4", [4], RAW]).tolist() == [0, 1, 2, 3]
    assert _vllm_array(["<i4", [4], True], RAW).tolist() == [0, 1, 2, 3]


def test_vllm_ignores_unreferenced_frames() -> None:
    """frames.oob-count-matches."""
    ext = msgspec.msgpack.Ext(3, RAW)
    assert _vllm_array(["<i4", [4], ext], b"unreferenced").tolist() == [0, 1, 2, 3]


def test_vllm_sends_arrays_outside_the_vocabulary() -> None:
    """tensors.numpy-dtype-str: vLLM encodes unicode and datetime arrays."""
    frames = MsgpackEncoder().encode(_ArrayHolder(np.array(["ab"])))
    assert msgspec.msgpack.decode(frames[0])[0][0] == "<U2"


def test_vllm_omits_only_identical_defaults() -> None:
    """A computed float equal to a default travels; the default object itself does not."""
    computed = float("0.0")
    default = msgspec.msgpack.decode(msgspec.msgpack.encode(SamplingParams()))
    explicit = msgspec.msgpack.decode(
        msgspec.msgpack.encode(SamplingParams(presence_penalty=computed))
    )
    assert "presence_penalty" not in default
    assert explicit["presence_penalty"] == 0.0
