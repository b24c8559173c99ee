"""The struct layouts in the spec, and the msgspec behaviour the structs clauses rely on.

The layout tests pin the order and defaults of the four top-level payload structs as vLLM
0.33.0 declares them, through the exported spec. The behaviour tests build small msgspec
structs shaped like vLLM's and check that msgspec does what each clause says.
"""

from __future__ import annotations

import enum
import json
import subprocess
import sys
from typing import NamedTuple

import msgspec
import pytest
from msgspec import msgpack

from enginewire.spec import load
from enginewire.spec.schema import EnumSpec, StructSpec

# (name, default) in vLLM 0.33.0's declaration order; None = required.
ENGINE_CORE_REQUEST = [
    ("request_id", None), ("prompt_token_ids", None), ("mm_features", None),
    ("sampling_params", None), ("pooling_params", None), ("arrival_time", None),
    ("lora_request", None), ("cache_salt", None), ("data_parallel_rank", None),
    ("prompt_embeds", "null"), ("prompt_is_token_ids", "null"), ("client_index", "0"),
    ("current_wave", "0"), ("priority", "0"), ("trace_headers", "null"),
    ("resumable", "false"), ("external_req_id", "null"), ("reasoning_ended", "null"),
    ("reasoning_parser_kwargs", "null"), ("abort_immediately", "false"),
    ("session_id", "null"), ("kv_hints", "null"),
]
ENGINE_CORE_OUTPUT = [
    ("request_id", None), ("new_token_ids", None), ("new_logprobs", "null"),
    ("new_prompt_logprobs_tensors", "null"), ("pooling_output", "null"),
    ("finish_reason", "null"), ("stop_reason", "null"), ("events", "null"),
    ("kv_transfer_params", "null"), ("ec_transfer_params", "null"), ("trace_headers", "null"),
    ("prefill_stats", "null"), ("routed_experts", "null"), ("num_nans_in_logits", "0"),
    ("mm_cache_miss_hashes", "null"), ("new_sampling_mask", "null"),
    ("spec_decode_metrics", "null"), ("prompt_token_id_logprobs", "null"), ("error", "null"),
]
ENGINE_CORE_OUTPUTS = [
    ("engine_index", "0"), ("outputs", "factory:list"), ("scheduler_stats", "null"),
    ("timestamp", "0.0"), ("utility_output", "null"), ("finished_requests", "null"),
    ("wave_complete", "null"), ("start_wave", "null"), ("weight_version", "null"),
]
UTILITY_OUTPUT = [("call_id", None), ("failure_message", "null"), ("result", "null")]


@pytest.fixture(scope="module")
def exported() -> dict:
    """The spec as ``enginewire spec export`` prints it."""
    result = subprocess.run(
        [sys.executable, "-m", "enginewire", "spec", "export"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _layout(struct: dict) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for fld in struct["fields"]:
        if fld.get("required"):
            out.append((fld["name"], None))
        elif fld.get("default_factory"):
            out.append((fld["name"], "factory:" + fld["default_factory"]))
        else:
            out.append((fld["name"], fld["default"]))
    return out


@pytest.mark.parametrize(
    ("name", "expected", "omit_defaults"),
    [
        ("EngineCoreRequest", ENGINE_CORE_REQUEST, True),
        ("EngineCoreOutput", ENGINE_CORE_OUTPUT, True),
        ("EngineCoreOutputs", ENGINE_CORE_OUTPUTS, True),
        ("UtilityOutput", UTILITY_OUTPUT, False),
    ],
)
def test_export_holds_payload_layout(
    exported: dict, name: str, expected: list, omit_defaults: bool
) -> None:
    struct = exported["structs"][name]
    assert struct["encoding"] == "array"
    assert bool(struct.get("omit_defaults", False)) is omit_defaults
    assert _layout(struct) == expected


def test_every_referenced_type_is_in_the_spec() -> None:
    spec = load()
    from enginewire.spec import parse_type

    for struct in spec.structs.values():
        if isinstance(struct, StructSpec):
            for fld in struct.fields:
                assert parse_type(fld.type).names() <= set(spec.structs), (struct.name, fld.name)


def test_sampling_params_keeps_private_fields_in_order() -> None:
    names = [f.name for f in load().struct("SamplingParams").fields]
    private = [n for n in names if n.startswith("_")]
    assert private == ["_eos_token_id", "_all_stop_token_ids", "_watermarking_skipped",
                       "_bad_words_token_ids"]
    assert names.index("_all_stop_token_ids") < names.index("structured_outputs")
    assert load().struct("SamplingParams").encoding == "map"


def test_enums_carry_their_wire_values() -> None:
    spec = load()
    finish = spec.enum("FinishReason")
    assert [(m.name, m.value) for m in finish.members] == [
        ("STOP", 0), ("LENGTH", 1), ("ABORT", 2), ("ERROR", 3), ("REPETITION", 4)]
    assert isinstance(spec.structs["EngineCoreEventType"], EnumSpec)
    assert spec.enum("RequestOutputKind").wire == "int"
    assert spec.struct("PoolingParams").fields[-2].default == "2"  # RequestOutputKind.FINAL_ONLY


def test_utility_result_is_a_pair() -> None:
    result = load().struct("UtilityResult")
    assert result.encoding == "tuple"
    assert [(f.name, f.required) for f in result.fields] == [("type_info", True),
                                                            ("value", True)]


# --- msgspec behaviour behind the structs clauses ----------------------------------------


class Request(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    arrival_time: float
    client_index: int = 0
    session_id: str | None = None


class OlderRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    arrival_time: float


class Params(msgspec.Struct, omit_defaults=True):
    n: int = 1
    temperature: float = 1.0
    _all_stop_token_ids: set[int] = set()
    logit_bias: dict[int, float] | None = None


class Kind(enum.IntEnum):
    STOP = 0
    LENGTH = 1


class Source(enum.StrEnum):
    DEVICE = "device"


class Logprobs(NamedTuple):
    token_ids: list[int]
    ranks: list[int] | None = None


@pytest.fixture(scope="module")
def spec():
    return load()


def test_array_omit_defaults_still_writes_every_field(spec) -> None:
    spec.clause("structs.array.every-field-written")
    assert msgpack.decode(msgpack.encode(Request("r", 1.5))) == ["r", 1.5, 0, None]


def test_array_fields_travel_in_declaration_order(spec) -> None:
    spec.clause("structs.array.field-order")
    encoded = msgpack.encode(Request("r", 2.0, client_index=3, session_id="s"))
    assert msgpack.decode(encoded) == ["r", 2.0, 3, "s"]


def test_array_missing_trailing_fields_take_defaults(spec) -> None:
    spec.clause("structs.array.trailing-defaults")
    older = msgpack.encode(OlderRequest("r", 1.0))
    assert msgpack.decode(older, type=Request) == Request("r", 1.0, 0, None)


def test_array_missing_required_field_is_rejected(spec) -> None:
    spec.clause("structs.array.missing-required-rejected")
    with pytest.raises(msgspec.ValidationError, match="at least length 2"):
        msgpack.decode(msgpack.encode(["r"]), type=Request)


def test_array_extra_trailing_elements_are_ignored(spec) -> None:
    spec.clause("structs.array.extra-trailing-ignored")
    newer = msgpack.encode(Request("r", 1.0, client_index=4, session_id="s"))
    assert msgpack.decode(newer, type=OlderRequest) == OlderRequest("r", 1.0)


def test_inserted_field_shifts_later_fields_silently(spec) -> None:
    spec.clause("structs.array.append-only")

    class Receiver(msgspec.Struct, array_like=True):
        request_id: str
        cache_salt: str | None = None

    class SenderWithInsertedField(msgspec.Struct, array_like=True):
        request_id: str
        session_id: str | None = None  # inserted mid-struct instead of appended
        cache_salt: str | None = None

    sent = msgpack.encode(SenderWithInsertedField("r", session_id="sess", cache_salt="salt"))
    # The receiver reads the session id as the cache salt and drops the real salt: no error.
    assert msgpack.decode(sent, type=Receiver) == Receiver("r", cache_salt="sess")


def test_array_struct_sent_as_map_is_rejected(spec) -> None:
    spec.clause("structs.array.type-checked")
    with pytest.raises(msgspec.ValidationError, match="Expected `array`, got `object`"):
        msgpack.decode(msgpack.encode({"request_id": "r", "arrival_time": 1.0}), type=Request)


def test_map_omits_fields_at_default_and_keeps_private_ones(spec) -> None:
    spec.clause("structs.map.omit-defaults")
    spec.clause("structs.map.private-fields-travel")
    assert msgpack.decode(msgpack.encode(Params())) == {}
    encoded = msgpack.decode(msgpack.encode(Params(temperature=0.5, _all_stop_token_ids={2})))
    assert encoded == {"temperature": 0.5, "_all_stop_token_ids": [2]}


def test_map_absent_keys_default_and_unknown_keys_are_ignored(spec) -> None:
    spec.clause("structs.map.absent-key-default")
    spec.clause("structs.map.unknown-keys-ignored")
    decoded = msgpack.decode(msgpack.encode({"n": 2, "added_later": True}), type=Params)
    assert decoded == Params(n=2)


def test_namedtuple_rejects_extra_elements(spec) -> None:
    spec.clause("structs.tuple.array")
    spec.clause("structs.tuple.extra-elements-rejected")
    assert msgpack.decode(msgpack.encode(Logprobs([1]))) == [[1], None]
    assert msgpack.decode(msgpack.encode([[1]]), type=Logprobs) == Logprobs([1], None)
    with pytest.raises(msgspec.ValidationError, match="length 1 to 2, got 3"):
        msgpack.decode(msgpack.encode([[1], [0], "extra"]), type=Logprobs)


def test_enums_travel_as_values_and_unknown_values_are_rejected(spec) -> None:
    spec.clause("structs.enum.value")
    assert msgpack.encode([Kind.LENGTH, Source.DEVICE]) == msgpack.encode([1, "device"])

    class Output(msgspec.Struct, array_like=True):
        finish_reason: Kind | None = None

    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 4"):
        msgpack.decode(msgpack.encode([4]), type=Output)


def test_int_map_keys_stay_ints(spec) -> None:
    spec.clause("structs.enum.dict-keys")
    encoded = msgpack.encode(Params(logit_bias={5: 1.5}))
    assert encoded == msgpack.encode({"logit_bias": {5: 1.5}})
    assert msgpack.decode(encoded, type=Params).logit_bias == {5: 1.5}


def test_sets_travel_as_arrays(spec) -> None:
    spec.clause("structs.set.array")

    class Finished(msgspec.Struct, array_like=True):
        finished_requests: set[str] | None = None

    assert sorted(msgpack.decode(msgpack.encode(Finished({"a", "b"})))[0]) == ["a", "b"]
    decoded = msgpack.decode(msgpack.encode([["a", "a", "b"]]), type=Finished)
    assert decoded.finished_requests == {"a", "b"}


def test_floats_are_float64_and_ints_are_accepted(spec) -> None:
    spec.clause("structs.float.float64")
    assert msgpack.encode(1.5) == bytes.fromhex("cb3ff8000000000000")
    assert msgpack.decode(msgpack.encode(["r", 1]), type=OlderRequest).arrival_time == 1.0
    float32 = b"\x92\xa1r\xca\x3f\xc0\x00\x00"
    assert msgpack.decode(float32, type=OlderRequest).arrival_time == 1.5


def test_nil_for_non_optional_field_is_rejected(spec) -> None:
    spec.clause("structs.none.nil")
    with pytest.raises(msgspec.ValidationError, match="got `null`|got `None`"):
        msgpack.decode(msgpack.encode(["r", None]), type=OlderRequest)
