"""Every rejection of the reference codec, each with the clause it cites."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from enginewire.reference import structs as S
from enginewire.reference.codec import Codec
from enginewire.reference.errors import FramingError, PayloadError, ProtocolError, TensorError
from enginewire.reference.tensors import TensorIpcHandle, WireTensor
from enginewire.spec import load

Ext = msgspec.msgpack.Ext
pack = msgspec.msgpack.encode

CODEC = Codec()
INSECURE = Codec(allow_insecure=True)


def _request(**extra: Any) -> Any:
    fields: dict[str, Any] = dict(
        request_id="r", prompt_token_ids=[1], mm_features=None,
        sampling_params=S.SamplingParams(), pooling_params=None, arrival_time=0.5,
        lora_request=None, cache_salt=None, data_parallel_rank=None,
    )
    fields.update(extra)
    return S.EngineCoreRequest(**fields)


def _outputs_with(array_field: Any) -> list[Any]:
    """Hand-built outputs frames whose single output's routed_experts is ``array_field``."""
    output = ["r", [1]] + [None] * 10 + [array_field]
    return [pack([0, [output], None, 1.0, None, None, None, None, None])]


def _request_with(tensor_field: Any) -> bytes:
    """Hand-built EngineCoreRequest msgpack whose prompt_embeds is ``tensor_field``."""
    return pack(["r", None, None, {}, None, 0.5, None, None, None, tensor_field])


RAW = np.arange(4, dtype="<i4").tobytes()


def _expect(error: type[ProtocolError], clause: str, call: Callable[[], Any]) -> ProtocolError:
    with pytest.raises(error) as raised:
        call()
    assert raised.value.clause == clause, raised.value
    assert f"[{clause}]" in str(raised.value)
    return raised.value


# --- framing ----------------------------------------------------------------------------------


def test_unknown_type_byte() -> None:
    frames = [b"\x07", pack(["r"])]
    _expect(FramingError, "request_types.unknown-byte-rejected",
            lambda: CODEC.decode_message("input", frames, sender="frontend"))


@pytest.mark.parametrize("byte", [b"\x04", b"\x05"])
def test_internal_sentinel_type_bytes(byte: bytes) -> None:
    _expect(FramingError, "request_types.sentinels-never-on-wire",
            lambda: CODEC.decode_message("input", [byte, pack([])], sender="frontend"))
    _expect(FramingError, "request_types.sentinels-never-on-wire",
            lambda: CODEC.decode("abort", [byte, pack([])]))


def test_type_byte_of_another_kind() -> None:
    _expect(FramingError, "request_types.unknown-byte-rejected",
            lambda: CODEC.decode("add", [b"\x01", pack(["r"])]))


def test_type_frame_longer_than_one_byte() -> None:
    _expect(FramingError, "request_types.one-byte-frame",
            lambda: CODEC.decode("abort", [b"\x01\x00", pack(["r"])]))
    _expect(FramingError, "request_types.one-byte-frame",
            lambda: CODEC.decode_message("input", [b"READY"], sender="frontend"))


def test_missing_msgpack_frame() -> None:
    _expect(FramingError, "frames.frame-count", lambda: CODEC.decode("abort", [b"\x01"]))
    _expect(FramingError, "frames.frame-count", lambda: CODEC.decode("abort", []))


def test_missing_out_of_band_frame() -> None:
    request = _request(prompt_embeds=WireTensor("uint8", [300], bytes(300)))
    frames = CODEC.encode("add", request)
    assert len(frames) == 3
    _expect(FramingError, "frames.oob-count-matches", lambda: CODEC.decode("add", frames[:2]))


def test_extra_frames() -> None:
    frames = [*CODEC.encode("add", _request()), b"unreferenced"]
    _expect(FramingError, "frames.oob-count-matches", lambda: CODEC.decode("add", frames))


def test_extra_frames_on_an_untyped_payload() -> None:
    frames = [*CODEC.encode("abort", ["r"]), b"x"]
    _expect(FramingError, "frames.untyped-payload-no-oob", lambda: CODEC.decode("abort", frames))


def test_engine_core_dead_with_extra_frames() -> None:
    _expect(FramingError, "frames.engine-core-dead-literal",
            lambda: CODEC.decode("engine_core_dead", [b"ENGINE_CORE_DEAD", b""]))
    _expect(FramingError, "frames.engine-core-dead-literal",
            lambda: CODEC.decode_message("output", [b"ENGINE_CORE_DEAD", b"x"]))


def test_engine_core_dead_with_other_bytes() -> None:
    _expect(FramingError, "frames.engine-core-dead-literal",
            lambda: CODEC.decode("engine_core_dead", [b"ENGINE_CORE_DEAD\x00"]))


def test_literal_message_with_extra_frames() -> None:
    _expect(FramingError, "frames.frame-count",
            lambda: CODEC.decode("coordinator_ready", [b"READY", b"x"]))
    _expect(FramingError, "frames.frame-count",
            lambda: CODEC.decode("coordinator_ready", [b"NOT READY"]))


def test_literal_message_takes_no_value() -> None:
    _expect(PayloadError, "frames.frame-count", lambda: CODEC.encode("engine_core_dead", b"x"))


def test_routed_frames_without_identity() -> None:
    _expect(FramingError, "frames.routed-identity-first", lambda: CODEC.decode_routed("abort", []))
    _expect(FramingError, "identity.width-two-bytes",
            lambda: CODEC.decode_routed("abort", [b"\x01", b"\x01", pack(["r"])]))


# --- payloads ---------------------------------------------------------------------------------


def test_struct_kind_without_frames() -> None:
    _expect(FramingError, "frames.frame-count", lambda: CODEC.decode("EngineCoreOutputs", []))


def test_handshake_map_must_be_a_dict_to_encode() -> None:
    _expect(PayloadError, "frames.payload-matches-type", lambda: CODEC.encode("hello", ["x"]))


def test_malformed_msgpack() -> None:
    _expect(PayloadError, "frames.payload-matches-type",
            lambda: CODEC.decode("abort", [b"\x01", b"\xc1"]))


def test_wrong_payload_type() -> None:
    _expect(PayloadError, "frames.payload-matches-type",
            lambda: CODEC.decode("abort", [b"\x01", pack("r")]))
    _expect(PayloadError, "frames.payload-matches-type",
            lambda: CODEC.decode("utility", [b"\x03", pack([0, 1, "m"])]))


def test_missing_required_field_of_an_array_struct() -> None:
    _expect(PayloadError, "structs.array.missing-required-rejected",
            lambda: CODEC.decode("add", [b"\x00", pack(["r", None, None])]))


def test_missing_required_field_of_a_map_struct() -> None:
    event = {"timestamp": 1.0}
    output = ["r", [1], None, None, None, None, None, [event]]
    frames = [pack([0, [output]])]
    _expect(PayloadError, "structs.map.absent-key-default",
            lambda: CODEC.decode("EngineCoreOutputs", frames))


def test_invalid_enum_value() -> None:
    output = ["r", [1], None, None, None, 9]
    _expect(PayloadError, "structs.enum.value",
            lambda: CODEC.decode("EngineCoreOutputs", [pack([0, [output]])]))


def test_tuple_struct_with_extra_elements() -> None:
    array = ["<i4", [1], Ext(3, b"\x01\x00\x00\x00")]
    logprobs = [array, array, array, None, "extra"]
    output = ["r", [1], logprobs]
    _expect(PayloadError, "structs.tuple.extra-elements-rejected",
            lambda: CODEC.decode("EngineCoreOutputs", [pack([0, [output]])]))


def test_tuple_struct_missing_a_required_element() -> None:
    array = ["<i4", [1], Ext(3, b"\x01\x00\x00\x00")]
    output = ["r", [1], [array, array]]
    _expect(PayloadError, "structs.tuple.array",
            lambda: CODEC.decode("EngineCoreOutputs", [pack([0, [output]])]))


# msgspec's ValidationError -> the clause, decided by what the spec declares at its path.
_REQUEST = ["r", None, None, {}, None, 0.5, None, None, None]


def _at(raw: list[Any], index: int, value: Any) -> list[Any]:
    changed = list(raw)
    changed[index] = value
    return changed


def _output_raw(**fields: Any) -> bytes:
    """EngineCoreOutputs with one output whose fields (by position) are overridden."""
    output: list[Any] = ["r", [1]] + [None] * 10
    for index, value in fields.items():
        output[int(index.removeprefix("f"))] = value
    return pack([0, [output]])


VALIDATION_CASES = [
    # (kind, msgpack frame, clause)
    ("LateChunkingParams", pack(["seven"]), "structs.array.type-checked"),
    ("LateChunkingParams", pack({"chunk_size": 7}), "structs.array.type-checked"),
    ("LateChunkingParams", pack("seven"), "structs.array.type-checked"),
    ("LateChunkingParams", pack(None), "structs.array.type-checked"),
    ("LateChunkingParams", pack([None]), "structs.none.nil"),
    ("EngineCoreRequest", pack("not-this-type"), "structs.array.type-checked"),
    ("EngineCoreRequest", pack(_at(_REQUEST, 0, None)), "structs.none.nil"),
    ("EngineCoreRequest", pack(_at(_REQUEST, 5, "late")), "structs.array.type-checked"),
    # A field of a map-encoded struct inside the array struct: the general clause.
    ("EngineCoreRequest", pack(_at(_REQUEST, 3, {"n": "two"})), "frames.payload-matches-type"),
    ("EngineCoreRequest", pack(_at(_REQUEST, 3, {"n": None})), "structs.none.nil"),
    # An element of a list field: the general clause; nil there: none.nil.
    ("EngineCoreRequest", pack(_at(_REQUEST, 1, [1, "x"])), "frames.payload-matches-type"),
    ("EngineCoreRequest", pack(_at(_REQUEST, 1, [1, None])), "structs.none.nil"),
    # A map value and a map key of the wrong type.
    ("SamplingParams", pack({"logit_bias": {1: "x"}}), "frames.payload-matches-type"),
    ("SamplingParams", pack({"logit_bias": {"1": 0.5}}), "frames.payload-matches-type"),
    # An array struct nested in an array struct, sent as a map or cut short.
    ("EngineCoreOutputs", pack([0, [], None, 0.0, {"call_id": 1}]), "structs.array.type-checked"),
    ("EngineCoreOutputs", pack([0, [], None, 0.0, []]),
     "structs.array.missing-required-rejected"),
    # Tuple structs: too short, too long, wrong type of a whole tuple in an array struct field.
    ("UtilityResult", pack([None]), "structs.tuple.array"),
    ("UtilityResult", pack([None, None, 0]), "structs.tuple.extra-elements-rejected"),
    ("UtilityResult", pack("x"), "frames.payload-matches-type"),
    ("EngineCoreOutputs", _output_raw(f2="x"), "structs.array.type-checked"),
    # A fixed-length tuple type that is no struct: the general clause.
    ("utility", pack([0, 1, "m"]), "frames.payload-matches-type"),
]


@pytest.mark.parametrize(("kind", "frame", "clause"), VALIDATION_CASES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(VALIDATION_CASES)])
def test_validation_errors_name_the_clause_of_the_declared_type(
    kind: str, frame: bytes, clause: str
) -> None:
    frames = [b"\x03", frame] if kind == "utility" else [frame]
    _expect(PayloadError, clause, lambda: CODEC.decode(kind, frames))


def test_utility_result_type_info_checked_in_every_kind_that_holds_one() -> None:
    result = pack([["builtins", "int"], 1])
    _expect(PayloadError, "structs.utility-result.type-info-insecure-only",
            lambda: CODEC.decode("UtilityResult", [result]))
    _expect(PayloadError, "structs.utility-result.type-info-insecure-only",
            lambda: CODEC.decode("UtilityOutput", [pack([1, None, [["builtins", "int"], 1]])]))
    assert INSECURE.decode("UtilityResult", [result]) == S.UtilityResult(["builtins", "int"], 1)
    _expect(PayloadError, "structs.utility-result.type-info-insecure-only",
            lambda: CODEC.encode("UtilityResult", S.UtilityResult(["builtins", "int"], 1)))


def _element(data: Any) -> dict[str, Any]:
    return {"data": data, "field": ["batched", {"keep_on_cpu": False}]}


@pytest.mark.parametrize("data", ["text", True, {"k": 1}, [1, "x"], [[None]], b"\x00",
                                  Ext(3, bytes(4))])
def test_nested_tensors_hold_only_tensors_numbers_and_arrays(data: Any) -> None:
    _expect(TensorError, "tensors.nested-tensors",
            lambda: CODEC.decode("MultiModalFieldElem", [pack(_element(data))]))


def test_nested_tensors_array_starting_with_a_string_is_a_tensor_tuple() -> None:
    decoded = CODEC.decode("MultiModalFieldElem", [pack(_element(["uint8", [2], 1])),
                                                   b"\x07\x09"])
    assert decoded.data.tolist() == [7, 9]
    _expect(TensorError, "tensors.tuple-layout",
            lambda: CODEC.decode("MultiModalFieldElem", [pack(_element(["uint8", [2]]))]))


def test_encoder_refuses_nested_tensors_of_other_types() -> None:
    field = ("batched", S.MultiModalBatchedField())
    for data in (np.zeros(2), "text", True, [1, {"k": 1}]):
        element = S.MultiModalFieldElem(data=data, field=field)
        _expect(TensorError, "tensors.nested-tensors",
                lambda e=element: CODEC.encode("MultiModalFieldElem", e))


@pytest.mark.parametrize("factory", ["flat_from_sizes", "build_elems", "batched"])
def test_multimodal_field_factory(factory: str) -> None:
    field = {"keep_on_cpu": False, "slices": [[0, 2, None]], "dim": 0}
    element = {"data": ["float32", [2], Ext(3, bytes(8))], "field": [factory, field]}
    feature = {"data": {"pixel_values": element}, "modality": "image", "identifier": "i",
               "mm_position": {"offset": 0, "length": 2}}
    raw = pack(["r", [1, 2], [feature], {}, None, 0.5, None, None, None])
    _expect(PayloadError, "structs.mm-item.known-factories-only",
            lambda: CODEC.decode("add", [b"\x00", raw]))
    element["field"][0] = "flat"
    assert CODEC.decode("add", [b"\x00", pack(["r", [1, 2], [feature], {}, None, 0.5, None,
                                                 None, None])]).mm_features[0].modality == "image"


def test_encode_refuses_a_value_of_the_wrong_type() -> None:
    _expect(PayloadError, "frames.payload-matches-type", lambda: CODEC.encode("add", "r"))
    _expect(PayloadError, "frames.payload-matches-type", lambda: CODEC.encode("abort", "r"))
    _expect(PayloadError, "frames.payload-matches-type",
            lambda: CODEC.encode("EngineCoreOutputs", {"outputs": []}))


def test_exclusive_params() -> None:
    _expect(PayloadError, "structs.exclusive-params",
            lambda: CODEC.encode("add", _request(sampling_params=None)))
    both = _request(pooling_params=S.PoolingParams())
    _expect(PayloadError, "structs.exclusive-params", lambda: CODEC.encode("add", both))
    raw = pack(["r", None, None, None, None, 0.5, None, None, None])
    _expect(PayloadError, "structs.exclusive-params", lambda: CODEC.decode("add", [b"\x00", raw]))


def test_outputs_and_utility_replies_are_different_kinds() -> None:
    reply = S.EngineCoreOutputs(utility_output=S.UtilityOutput(1, failure_message="no"))
    _expect(PayloadError, "frames.utility-reply", lambda: CODEC.encode("outputs", reply))
    _expect(PayloadError, "frames.utility-reply",
            lambda: CODEC.encode("utility_reply", S.EngineCoreOutputs()))
    mixed = S.EngineCoreOutputs(outputs=[S.EngineCoreOutput("r", [1])],
                                utility_output=S.UtilityOutput(1))
    _expect(PayloadError, "frames.utility-reply", lambda: CODEC.encode("utility_reply", mixed))


def test_coordinator_outputs_carry_no_request_outputs() -> None:
    value = S.EngineCoreOutputs(outputs=[S.EngineCoreOutput("r", [1])])
    _expect(PayloadError, "frames.coordinator-outputs-single-frame",
            lambda: CODEC.encode("coordinator_outputs", value))


@pytest.mark.parametrize(
    "value",
    [
        {"local": True, "headless": False},
        {"status": "READY", "local": True, "headless": False},
        {"status": "HELLO", "local": "yes", "headless": False},
    ],
)
def test_handshake_map_keys(value: Any) -> None:
    _expect(PayloadError, "handshake.message-keys", lambda: CODEC.decode("hello", [pack(value)]))


def test_handshake_message_is_a_map() -> None:
    _expect(PayloadError, "frames.payload-matches-type",
            lambda: CODEC.decode("hello", [pack(["HELLO"])]))


def test_utility_result_type_info_needs_opt_in() -> None:
    result = S.UtilityResult(["builtins", "int"], 3)
    reply = S.EngineCoreOutputs(utility_output=S.UtilityOutput(1, result=result))
    _expect(PayloadError, "structs.utility-result.type-info-insecure-only",
            lambda: CODEC.encode("utility_reply", reply))
    frames = INSECURE.encode("utility_reply", reply)
    _expect(PayloadError, "structs.utility-result.type-info-insecure-only",
            lambda: CODEC.decode("utility_reply", frames))
    assert INSECURE.decode("utility_reply", frames) == reply


def test_object_without_wire_form() -> None:
    _expect(PayloadError, "structs.no-implicit-pickle",
            lambda: CODEC.encode("utility", (0, 1, "m", (object(),))))


def test_out_of_band_data_in_an_untyped_payload() -> None:
    big = np.zeros(100, dtype="<f8")
    _expect(PayloadError, "frames.untyped-payload-no-oob",
            lambda: CODEC.encode("utility", (0, 1, "m", (big,))))
    small = np.zeros(2, dtype="<f8")
    assert len(CODEC.encode("utility", (0, 1, "m", (small,)))) == 2


# --- extension types --------------------------------------------------------------------------


@pytest.mark.parametrize("code", [1, 2])
def test_pickle_extension_types_need_opt_in(code: int) -> None:
    frames = [b"\x03", pack([0, 1, "m", [Ext(code, pickle.dumps({"a": 1}))]])]
    _expect(TensorError, "tensors.ext-pickle-opt-in", lambda: CODEC.decode("utility", frames))
    assert INSECURE.decode("utility", frames) == (0, 1, "m", ({"a": 1},))


def test_unknown_extension_type() -> None:
    frames = [b"\x03", pack([0, 1, "m", [Ext(9, b"x")]])]
    _expect(TensorError, "tensors.ext-codes-known", lambda: CODEC.decode("utility", frames))
    _expect(TensorError, "tensors.ext-codes-known", lambda: INSECURE.decode("utility", frames))


def test_insecure_codec_pickles_what_msgpack_cannot_carry() -> None:
    value = (0, 1, "m", (complex(1, 2),))
    frames = INSECURE.encode("utility", value)
    raw = msgspec.msgpack.decode(bytes(frames[1]), ext_hook=lambda code, data: code)
    assert raw[3] == [1]
    assert INSECURE.decode("utility", frames) == value


def test_insecure_codec_sends_functions_with_cloudpickle() -> None:
    pytest.importorskip("cloudpickle")
    frames = INSECURE.encode("utility", (0, 1, "m", (_module_function,)))
    raw = msgspec.msgpack.decode(bytes(frames[1]), ext_hook=lambda code, data: code)
    assert raw[3] == [2]
    assert INSECURE.decode("utility", frames)[3][0](2) == 4


def _module_function(x: int) -> int:
    return x * 2


# --- tensor tuples ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "frames_after", "error", "clause"),
    [
        (0, [], TensorError, "tensors.index-in-range"),
        (-1, [RAW], TensorError, "tensors.index-in-range"),
        (2, [RAW], FramingError, "frames.oob-count-matches"),
        (True, [RAW], TensorError, "tensors.data-form"),
        (RAW, [], TensorError, "tensors.data-form"),
        ("data", [], TensorError, "tensors.data-form"),
    ],
)
def test_data_position(data: Any, frames_after: list[bytes], error: type, clause: str) -> None:
    frames = [b"\x00", _request_with(["int32", [4], data]), *frames_after]
    _expect(error, clause, lambda: CODEC.decode("add", frames))


def test_index_used_twice() -> None:
    logprobs = [["<i4", [1], 1], ["<i4", [1], 1], ["<i4", [1], 2]]
    outputs = pack([0, [["r", [1], logprobs]]])
    _expect(TensorError, "tensors.index-used-once",
            lambda: CODEC.decode("EngineCoreOutputs", [outputs, RAW[:4], RAW[:4]]))


@pytest.mark.parametrize("dtype", ["half", "float", "torch.float32", "qint8", "uint4", 5])
def test_torch_dtype_outside_vocabulary(dtype: Any) -> None:
    frames = [b"\x00", _request_with([dtype, [4], Ext(3, RAW)])]
    _expect(TensorError, "tensors.torch-dtype-name", lambda: CODEC.decode("add", frames))


@pytest.mark.parametrize("dtype", ["int32", "f", "<U1", "|O", "<M8[ns]", "float32", "=i4"])
def test_numpy_dtype_outside_vocabulary(dtype: str) -> None:
    _expect(TensorError, "tensors.numpy-dtype-str",
            lambda: CODEC.decode("EngineCoreOutputs", _outputs_with([dtype, [4], Ext(3, RAW)])))


@pytest.mark.parametrize("shape", [[-1], [2, -1], [4.0], [True, 4], "4", None])
def test_shape_entries(shape: Any) -> None:
    _expect(TensorError, "tensors.shape-non-negative",
            lambda: CODEC.decode("EngineCoreOutputs", _outputs_with(["<i4", shape, Ext(3, RAW)])))


@pytest.mark.parametrize("shape", [[5], [3], [2, 3], [], [0]])
def test_shape_not_matching_byte_length(shape: list[int]) -> None:
    _expect(TensorError, "tensors.byte-length-matches-shape",
            lambda: CODEC.decode("EngineCoreOutputs", _outputs_with(["<i4", shape, Ext(3, RAW)])))
    frames = [b"\x00", _request_with(["int32", shape, Ext(3, RAW)])]
    _expect(TensorError, "tensors.byte-length-matches-shape", lambda: CODEC.decode("add", frames))


@pytest.mark.parametrize("raw", [["<i4", [4]], ["<i4", [4], Ext(3, RAW), 1], "<i4", {"d": 1}])
def test_tuple_layout(raw: Any) -> None:
    _expect(TensorError, "tensors.tuple-layout",
            lambda: CODEC.decode("EngineCoreOutputs", _outputs_with(raw)))


def test_tensor_ipc_handle_needs_side_channel() -> None:
    meta = {"sender_id": "ab", "message_id": 1, "tensor_id": 0}
    frames = [b"\x00", _request_with(["float32", [2, 2], meta])]
    _expect(TensorError, "tensors.ipc-handle-needs-side-channel",
            lambda: CODEC.decode("add", frames))
    with_ipc = Codec(ipc_handles=True)
    handle = with_ipc.decode("add", frames).prompt_embeds
    assert handle == TensorIpcHandle("float32", (2, 2), meta)
    again = with_ipc.encode("add", with_ipc.decode("add", frames))
    assert len(again) == 2
    assert with_ipc.decode("add", again).prompt_embeds == handle
    request = _request(prompt_embeds=handle)
    _expect(TensorError, "tensors.ipc-handle-needs-side-channel",
            lambda: CODEC.encode("add", request))


def test_encoder_refuses_object_arrays() -> None:
    output = S.EngineCoreOutput("r", [1], routed_experts=np.array([object()], dtype=object))
    _expect(TensorError, "tensors.no-object-arrays",
            lambda: CODEC.encode("outputs", S.EngineCoreOutputs(outputs=[output])))


@pytest.mark.parametrize("array", [np.array(["a"]), np.array([1], dtype="<M8[ns]"),
                                   np.array([1.0], dtype=np.longdouble)])
def test_encoder_refuses_dtypes_outside_vocabulary(array: np.ndarray) -> None:
    output = S.EngineCoreOutput("r", [1], routed_experts=array)
    _expect(TensorError, "tensors.numpy-dtype-str",
            lambda: CODEC.encode("outputs", S.EngineCoreOutputs(outputs=[output])))


def test_encoder_refuses_a_wire_tensor_of_the_wrong_length() -> None:
    request = _request(prompt_embeds=WireTensor("float32", [3], bytes(8)))
    _expect(TensorError, "tensors.byte-length-matches-shape", lambda: CODEC.encode("add", request))
    request = _request(prompt_embeds=WireTensor("float8", [3], bytes(3)))
    _expect(TensorError, "tensors.torch-dtype-name", lambda: CODEC.encode("add", request))


# --- every cited clause exists -------------------------------------------------------------


def test_every_clause_the_codec_cites_is_in_the_spec() -> None:
    """Every clause the codec cites is in the spec of some derived release (the clauses of an
    earlier release's tensor form are not in the newest)."""
    from enginewire.spec.history.wheels import read_releases
    from enginewire.spec.loader import DATA_DIR

    known = {c for version in read_releases(DATA_DIR) for c in load(version).clauses}
    root = Path(__file__).resolve().parents[1] / "reference"
    cited: set[str] = set()
    pattern = re.compile(r'"((?:frames|tensors|structs|request_types|identity|handshake)'
                         r'\.[a-z0-9_.-]+)"')
    for name in ("codec.py", "tensors.py", "structs.py"):
        cited |= set(pattern.findall((root / name).read_text()))
    assert len(cited) > 25
    missing = sorted(c for c in cited if c not in known)
    assert not missing, missing
