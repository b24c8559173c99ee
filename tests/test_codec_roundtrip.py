"""Round trips of every message kind through the reference codec, with routing and identity."""

from __future__ import annotations

from typing import Any

import pytest

from enginewire.reference import codec as codec_module
from enginewire.reference import structs as S
from enginewire.reference.codec import Codec, Message
from enginewire.reference.errors import FramingError
from enginewire.spec import load


def _request(**extra: Any) -> Any:
    fields: dict[str, Any] = dict(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3],
        mm_features=None,
        sampling_params=S.SamplingParams(temperature=0.5, max_tokens=7, stop=["x"]),
        pooling_params=None,
        arrival_time=1.25,
        lora_request=S.LoRARequest("adapter", 3, "/tmp/a"),
        cache_salt=None,
        data_parallel_rank=None,
    )
    fields.update(extra)
    return S.EngineCoreRequest(**fields)


def _outputs(**extra: Any) -> Any:
    return S.EngineCoreOutputs(timestamp=2.5, **extra)


SAMPLES: dict[str, Any] = {
    "hello": {"status": "HELLO", "local": True, "headless": False},
    "init": S.EngineHandshakeMetadata(
        addresses=S.EngineZmqAddresses(inputs=["ipc:///tmp/i"], outputs=["ipc:///tmp/o"]),
        parallel_config={"data_parallel_size": 2, "data_parallel_master_ip": "10.0.0.1",
                         "_data_parallel_master_port_list": [1, 2]},
    ),
    "ready": {"status": "READY", "local": False, "headless": True, "coord_store_port": 4},
    "ready_response": S.EngineCoreReadyResponse(
        max_model_len=4096, num_gpu_blocks=10, block_size=16, dp_stats_address=None,
        dtype="float16", vllm_version="0.33.0", world_size=1, data_parallel_size=1,
        tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
        data_parallel_rank=0, max_num_seqs=8, max_num_batched_tokens=256,
        instance_id="e0", supports_lora=False, max_loras=0,
    ),
    "add": _request(),
    "abort": ["req-1", "req-2"],
    "utility": (0, (1 << 64) - 1, "get_supported_tasks", ("a", 1, None)),
    "outputs": _outputs(
        outputs=[
            S.EngineCoreOutput("req-1", [5, 6]),
            S.EngineCoreOutput(
                "req-2", [7], finish_reason=S.FinishReason.LENGTH, stop_reason="</s>",
                events=[S.EngineCoreEvent(S.EngineCoreEventType.QUEUED, 1.0)],
            ),
        ],
        finished_requests={"req-2"},
    ),
    "utility_reply": _outputs(
        utility_output=S.UtilityOutput(12, result=S.UtilityResult(None, ["generate"]))
    ),
    "engine_core_dead": None,
    "coordinator_subscribe": None,
    "coordinator_unsubscribe": None,
    "coordinator_ready": None,
    "start_dp_wave": (3, 1),
    "coordinator_outputs": _outputs(
        engine_index=1, wave_complete=2,
        scheduler_stats=S.SchedulerStats(num_running_reqs=2, kv_cache_usage=0.5),
    ),
    "stats_subscribe": None,
    "stats_unsubscribe": None,
    "stats_update": ([[1, 2, 0.5]], 4, True),
    "scale_elastic_ep": ("SCALE_ELASTIC_EP", 4),
}


def _bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def test_samples_cover_every_message_kind() -> None:
    assert set(SAMPLES) == set(Codec().message_kinds)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip(kind: str) -> None:
    value = SAMPLES[kind]
    frames = codec_module.encode(kind, value)
    assert codec_module.decode(kind, frames) == value
    assert _bytes(codec_module.encode(kind, codec_module.decode(kind, frames))) == _bytes(frames)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_fixed_frames_come_first(kind: str) -> None:
    layout = Codec().layout(kind)
    frames = _bytes(codec_module.encode(kind, SAMPLES[kind]))
    assert tuple(frames[: len(layout.prefix)]) == layout.prefix
    assert len(frames) == len(layout.prefix) + (0 if layout.payload is None else 1)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_decode_message_tells_kinds_apart(kind: str) -> None:
    codec = Codec()
    layout = codec.layout(kind)
    frames = codec.encode(kind, SAMPLES[kind])
    assert codec.decode_message(layout.channel, frames, sender=layout.sender) == Message(
        kind, SAMPLES[kind]
    )


def test_type_bytes_follow_the_request_types_table() -> None:
    spec = load()
    codec = Codec()
    for request_type in spec.surface("request_types").types:
        if request_type.message is None:
            continue
        frames = codec.encode(request_type.message, SAMPLES[request_type.message])
        assert bytes(frames[0]) == bytes([request_type.byte])


def test_engine_core_dead_is_the_literal_frame() -> None:
    assert codec_module.encode("engine_core_dead", None) == [b"ENGINE_CORE_DEAD"]


def test_ready_response_empty_frame_is_none() -> None:
    assert codec_module.decode("ready_response", [b""]) is None
    assert codec_module.encode("ready_response", None) == [b""]


def test_struct_kind_is_the_payload_only() -> None:
    request = _request()
    assert _bytes(codec_module.encode("EngineCoreRequest", request)) == _bytes(
        codec_module.encode("add", request)
    )[1:]
    assert codec_module.decode("EngineCoreRequest", codec_module.encode("EngineCoreRequest",
                                                                        request)) == request


def test_array_struct_writes_every_field() -> None:
    import msgspec

    raw = msgspec.msgpack.decode(bytes(codec_module.encode("EngineCoreRequest", _request())[0]))
    assert len(raw) == len(load().struct("EngineCoreRequest").fields)


def test_identity_examples_from_the_spec() -> None:
    for example in load().surface("identity").examples:
        assert codec_module.encode_identity(example.rank).hex() == example.hex
        assert codec_module.decode_identity(bytes.fromhex(example.hex)) == example.rank


@pytest.mark.parametrize("rank", [-1, 1 << 16, True])
def test_identity_out_of_range(rank: Any) -> None:
    with pytest.raises(FramingError) as raised:
        codec_module.encode_identity(rank)
    assert raised.value.clause == "identity.width-two-bytes"


@pytest.mark.parametrize("frame", [b"\x03", b"\x03\x00\x00", b""])
def test_identity_of_the_wrong_width(frame: bytes) -> None:
    with pytest.raises(FramingError) as raised:
        codec_module.decode_identity(frame)
    assert raised.value.clause == "identity.width-two-bytes"


def test_routed_frames() -> None:
    frames = codec_module.encode_routed("abort", ["r"], 3)
    assert bytes(frames[0]) == b"\x03\x00"
    assert codec_module.decode_routed("abort", frames) == (3, ["r"])


def test_routed_frames_refuse_unrouted_kinds() -> None:
    with pytest.raises(KeyError):
        codec_module.encode_routed("outputs", SAMPLES["outputs"], 0)


class _ZmqLikeFrame:
    """What pyzmq's recv_multipart(copy=False) returns: the bytes behind ``.buffer``."""

    def __init__(self, data: bytes) -> None:
        self.buffer = memoryview(data)


def test_frames_with_a_buffer_attribute() -> None:
    frames = [_ZmqLikeFrame(bytes(f)) for f in codec_module.encode("add", SAMPLES["add"])]
    assert codec_module.decode("add", frames) == SAMPLES["add"]
    assert codec_module.decode_message("input", frames, sender="frontend").kind == "add"


def test_module_functions_take_codec_options() -> None:
    import numpy as np

    value = _outputs(outputs=[S.EngineCoreOutput("r", [1], routed_experts=np.zeros(2, "<i8"))])
    assert len(codec_module.encode("outputs", value)) == 1
    assert len(codec_module.encode("outputs", value, threshold=0)) == 2


def test_message_payloads_table() -> None:
    assert codec_module.MESSAGE_PAYLOADS["add"] == "EngineCoreRequest"
    assert codec_module.MESSAGE_PAYLOADS["engine_core_dead"] is None
    assert set(codec_module.MESSAGE_PAYLOADS) == set(SAMPLES)


def test_large_call_id_is_msgpack_uint64() -> None:
    frames = codec_module.encode("utility", (0, (1 << 64) - 1, "m", ()))
    assert b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff" in bytes(frames[1])


def test_frames_channels_and_senders_exist_in_transport() -> None:
    spec = load()
    channels = {c.name: {end.role for end in c.ends} for c in spec.surface("transport").channels}
    for message in spec.surface("frames").messages:
        assert message.channel in channels, message.kind
        assert message.sender in channels[message.channel], message.kind
