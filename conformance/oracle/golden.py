"""Golden vectors: the exact frames vLLM wrote for known inputs, committed as data.

Each file ``conformance/data/golden/<name>.json`` holds one vector::

    {
      "format": "enginewire-golden/1",
      "name": "add_prompt_embeds_257_bytes",
      "vllm_version": "0.33.0",
      "kind": "add",                      # a frames.toml message kind or a struct name
      "threshold": 256,                   # the encoder's inline threshold in bytes
      "description": "...",
      "value": {...},                     # the input, a neutral value as tagged JSON
      "frames": ["00", "dc0016..."],      # hex of every frame vLLM wrote, in order
      "expect": "decode"                  # optional: "decode" (default) or "reject"
    }

``vllm_version`` is the release the frames claim to come from. ``expect: "reject"`` marks
frames a decoder must refuse (``value`` is then null; an optional ``"clause"`` names the
clause the refusal must cite, when the decoder names one). Vectors of users' own
(``enginewire check --vectors DIR``, written by ``enginewire vectors write``) use the same
format; a vector whose release is not the spec's is checked for decoding only.

``value`` is the neutral value (:mod:`enginewire.conformance.oracle.values`) of the object vLLM
encoded, read back from vLLM's object after construction, so it shows exactly what went out.
JSON has no tensors, sets or non-string keys; they are tagged: ``{"$tensor": {"dtype",
"shape", "hex"}}`` (torch), ``{"$ndarray": {...}}`` (numpy), ``{"$set": [...]}``,
``{"$bytes": hex}``, ``{"$map": [[key, value], ...]}`` (a dict whose keys are not all strings),
``{"$slice": [start, stop, step]}`` and ``{"$float": "nan" | "inf" | "-inf"}``.

:func:`check_vector` is what the test suite runs, without vLLM: the reference codec must
write the vector's frames byte for byte from its value, and read the frames back to the value.
:func:`vllm_frames` (needs vLLM) makes the frames for ``scripts/make_golden_vectors.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from enginewire.conformance.oracle.values import (
    TensorValue,
    build,
    complete,
    differences,
    neutral,
    vllm_mm_factory,
)
from enginewire.spec import load

FORMAT = "enginewire-golden/1"
GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"


@dataclass(frozen=True)
class GoldenVector:
    """One golden vector as read from its file."""

    name: str
    kind: str
    threshold: int
    description: str
    vllm_version: str
    value: Any
    frames: tuple[bytes, ...]
    path: Path | None = None
    #: "decode" (the frames decode to ``value``) or "reject" (a decoder must refuse them).
    expect: str = "decode"
    #: For "reject": the clause a refusal that names one must name.
    clause: str | None = None


# --- tagged JSON --------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """A neutral value (tensors allowed) as tagged JSON data."""
    value = _tensor_values(neutral(value))
    return _encode_json(value)


def _tensor_values(value: Any) -> Any:
    """Replace any tensor-like object neutral() left alone (a WireTensor) by a TensorValue."""
    if isinstance(value, dict):
        return {k: _tensor_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensor_values(v) for v in value]
    from enginewire.reference.tensors import WireTensor

    if isinstance(value, WireTensor):
        return TensorValue(value.dtype, value.shape, bytes(value.data), "tensor")
    return value


def _encode_json(value: Any) -> Any:
    if isinstance(value, TensorValue):
        tag = "$tensor" if value.family == "tensor" else "$ndarray"
        return {tag: {"dtype": value.dtype, "shape": list(value.shape), "hex": value.data.hex()}}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, slice):
        return {"$slice": [value.start, value.stop, value.step]}
    if isinstance(value, (set, frozenset)):
        return {"$set": sorted((_encode_json(v) for v in value), key=repr)}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _encode_json(v) for k, v in value.items()}
        return {"$map": [[_encode_json(k), _encode_json(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_encode_json(v) for v in value]
    return value


def from_json(data: Any, *, tensors: str = "auto") -> Any:
    """Tagged JSON data back to a neutral value with real tensors and arrays.

    ``tensors``: ``"torch"`` builds torch tensors, ``"wire"`` WireTensors, ``"auto"`` torch
    when it is installed.
    """
    if tensors == "auto":
        import importlib.util

        tensors = "torch" if importlib.util.find_spec("torch") is not None else "wire"
    return _decode_json(data, tensors)


def _decode_json(data: Any, tensors: str) -> Any:
    if isinstance(data, list):
        return [_decode_json(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1:
        (tag, body), = data.items()
        if tag == "$tensor":
            return _make_tensor(body, tensors)
        if tag == "$ndarray":
            raw = bytes.fromhex(body["hex"])
            return np.frombuffer(raw, dtype=body["dtype"]).reshape(body["shape"]).copy()
        if tag == "$set":
            return {_decode_json(v, tensors) for v in body}
        if tag == "$bytes":
            return bytes.fromhex(body)
        if tag == "$slice":
            return slice(*body)
        if tag == "$float":
            return float(body)
        if tag == "$map":
            return {_decode_json(k, tensors): _decode_json(v, tensors) for k, v in body}
    return {k: _decode_json(v, tensors) for k, v in data.items()}


def _make_tensor(body: Mapping[str, Any], tensors: str) -> Any:
    from enginewire.reference.tensors import WireTensor

    wire = WireTensor(body["dtype"], body["shape"], bytes.fromhex(body["hex"]))
    return wire.to_torch() if tensors == "torch" else wire


def as_sent(obj: Any) -> Any:
    """The neutral value of ``obj`` with the fields msgspec leaves out of a map struct removed.

    msgspec's ``omit_defaults`` omits a field when its value *is* the default object (or is an
    empty container for a ``default_factory`` field), not when it equals the default: a float
    0.0 computed at run time is written even where the default is 0.0. Recording only the
    fields that travel lets a decoder rebuild an object that writes the same bytes.
    """
    import dataclasses
    import enum

    if obj is None or isinstance(obj, (bool, int, float, str, bytes, enum.Enum, slice)):
        return neutral(obj)
    factory = vllm_mm_factory(obj)
    if factory is not None:
        return [factory, {f.name: as_sent(getattr(obj, f.name)) for f in dataclasses.fields(obj)}]
    config = getattr(type(obj), "__struct_config__", None)
    if config is not None:
        fields = msgspec.structs.fields(obj)
        omit = config.omit_defaults and not config.array_like
        return {
            f.name: as_sent(getattr(obj, f.name))
            for f in fields
            if not (omit and _omitted(f, getattr(obj, f.name)))
        }
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {name: as_sent(getattr(obj, name)) for name in obj._fields}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_sent(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {neutral(k): as_sent(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_sent(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return {as_sent(v) for v in obj}
    return neutral(obj)


def _vllm_resolver(vllm: Any) -> Callable[[str], Any]:
    """:class:`~enginewire.conformance.targets.vllm.target.VllmCodec`'s classes, bridged where
    vLLM holds a multimodal item in classes of its own: the item map is a
    ``MultiModalKwargsItem`` and an element holds the field object, not ``[factory, field]``
    (vLLM's encoder writes the factory from the class)."""
    from vllm.multimodal.inputs import MultiModalKwargsItem

    def resolve(name: str) -> Any:
        cls = vllm._builder(name)
        if name == "MultiModalFieldElem":
            return lambda data, field: cls(data=data, field=field[1])
        if name == "MultiModalFeatureSpec":
            def feature(**kwargs: Any) -> Any:
                if kwargs.get("data") is not None:
                    kwargs["data"] = MultiModalKwargsItem(kwargs["data"])
                return cls(**kwargs)

            return feature
        return cls

    return resolve


def _omitted(field: Any, value: Any) -> bool:
    if field.default is not msgspec.NODEFAULT:
        return value is field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return isinstance(value, (list, dict, set, bytearray)) and not value
    return False


# --- files ----------------------------------------------------------------------------------


EXPECTS = ("decode", "reject")


def vector_to_json(vector: GoldenVector) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if vector.expect != "decode":
        extra["expect"] = vector.expect
    if vector.clause:
        extra["clause"] = vector.clause
    return {
        "format": FORMAT,
        "name": vector.name,
        "vllm_version": vector.vllm_version,
        "kind": vector.kind,
        "threshold": vector.threshold,
        "description": vector.description,
        "value": to_json(vector.value),
        "frames": [bytes(f).hex() for f in vector.frames],
        **extra,
    }


def write_vector(vector: GoldenVector, directory: Path = GOLDEN_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{vector.name}.json"
    path.write_text(json.dumps(vector_to_json(vector), indent=1) + "\n")
    return path


def load_vectors(directory: Path = GOLDEN_DIR, *, tensors: str = "auto") -> list[GoldenVector]:
    """Every vector under ``directory``, sorted by name."""
    vectors = []
    for path in sorted(directory.glob("*.json")):
        raw = json.loads(path.read_text())
        if raw.get("format") != FORMAT:
            raise ValueError(f"{path.name}: format is not {FORMAT!r}")
        expect = raw.get("expect", "decode")
        if expect not in EXPECTS:
            raise ValueError(f"{path.name}: expect must be one of {EXPECTS}, not {expect!r}")
        vectors.append(
            GoldenVector(
                name=raw["name"],
                kind=raw["kind"],
                threshold=raw["threshold"],
                description=raw["description"],
                vllm_version=raw["vllm_version"],
                value=from_json(raw["value"], tensors=tensors),
                frames=tuple(bytes.fromhex(f) for f in raw["frames"]),
                path=path,
                expect=expect,
                clause=raw.get("clause"),
            )
        )
    return vectors


# --- checking against the reference ---------------------------------------------------------


def payload_type(kind: str) -> str | None:
    """The type expression of a kind's msgpack frame (a struct name stands for itself)."""
    spec = load()
    for message in spec.surface("frames").messages:
        if message.kind == kind:
            for frame in message.frames:
                if frame.content == "msgpack":
                    return frame.payload
            return None
    if kind in spec.structs:
        return kind
    raise KeyError(f"unknown kind {kind!r}")


def reference_value(kind: str, value: Any) -> Any:
    """A neutral value as the reference codec's objects (its structs, tuples)."""
    from enginewire.reference import structs

    expression = payload_type(kind)
    if expression is None or value is None:
        return value
    built = structs.build()
    return build(value, expression, load(), lambda name: built.classes.get(name)
                 or built.enums.get(name))


def check_vector(vector: GoldenVector, codec: Any = None) -> list[str]:
    """Problems found reproducing ``vector`` with the reference codec (empty: it passes)."""
    from enginewire.reference.codec import Codec

    codec = codec or Codec(threshold=vector.threshold)
    problems: list[str] = []
    encoded = codec.encode(vector.kind, reference_value(vector.kind, vector.value))
    got = [bytes(memoryview(f).cast("B")) for f in encoded]
    if len(got) != len(vector.frames):
        problems.append(f"encode: {len(got)} frames, vLLM wrote {len(vector.frames)}")
    for index, (mine, theirs) in enumerate(zip(got, vector.frames, strict=False)):
        if mine != theirs:
            problems.append(f"encode: frame {index} differs: {mine.hex()} != {theirs.hex()}")
    decoded = codec.decode(vector.kind, list(vector.frames))
    expected = vector.value
    expression = payload_type(vector.kind)
    if expression is not None and expected is not None:
        expected = complete(expected, expression, load())
    for line in differences(_normal(expected), _normal(decoded)):
        problems.append(f"decode: {line}")
    return problems


def _normal(value: Any) -> Any:
    return _tensor_values(neutral(value))


# --- making vectors with vLLM ---------------------------------------------------------------


class _CapturingSocket:
    """Stands in for a zmq socket where vLLM's code sends: keeps the frames."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, frame: Any, *args: Any, **kwargs: Any) -> None:
        self.frames.append(bytes(frame))

    def send_multipart(self, frames: Sequence[Any], *args: Any, **kwargs: Any) -> None:
        self.frames.extend(bytes(memoryview(f).cast("B")) for f in frames)


#: Kinds vLLM writes with plain ``msgspec.msgpack.encode`` and no struct: (source of the call).
_PLAIN_KINDS = {
    "stats_update": "vllm/v1/engine/coordinator.py:286-288",
    "scale_elastic_ep": "vllm/v1/engine/core_client.py:2081-2083",
}

#: Literal single-frame kinds and where vLLM writes them.
_LITERALS: dict[str, Callable[[], bytes]] = {
    # vllm/v1/engine/core.py:1969 and vllm/v1/engine/core_client.py:1542
    "coordinator_subscribe": lambda: b"\x01",
    "stats_subscribe": lambda: b"\x01",
    # vllm/v1/engine/coordinator.py:254
    "coordinator_ready": lambda: b"READY",
    # written by ZMQ, not vLLM: what vLLM's XPUB receives when its XSUB subscriber goes
    # (vllm/v1/engine/coordinator.py:295-315 skips it)
    "coordinator_unsubscribe": lambda: _zmq_unsubscription(),
    "stats_unsubscribe": lambda: _zmq_unsubscription(),
}


def _zmq_unsubscription(timeout_ms: int = 5000) -> bytes:
    """The frame an XPUB made by vLLM's ``make_zmq_socket`` (XPUB_VERBOSE, as the
    coordinator's publishers) receives when the XSUB that subscribed as vLLM does (the single
    frame 0x01, vllm/v1/engine/core.py:1969) closes. Needs vllm and pyzmq."""
    import zmq
    from vllm.utils.network_utils import make_zmq_socket

    ctx = zmq.Context()
    try:
        publisher = make_zmq_socket(ctx, "inproc://enginewire-golden-unsubscribe", zmq.XPUB,
                                    bind=True, linger=0)
        subscriber = make_zmq_socket(ctx, "inproc://enginewire-golden-unsubscribe", zmq.XSUB,
                                     linger=0)
        try:
            subscriber.send(_LITERALS["coordinator_subscribe"]())
            frames: list[bytes] = []
            for step in ("subscription", "unsubscription"):
                if not publisher.poll(timeout_ms):
                    raise TimeoutError(f"the XPUB received no {step} in {timeout_ms} ms")
                frame = publisher.recv()
                assert isinstance(frame, bytes)  # a plain zmq.Context makes blocking sockets
                frames.append(frame)
                if step == "subscription":
                    subscriber.close()
            return frames[1]
        finally:
            subscriber.close()
            publisher.close()
    finally:
        ctx.term()


def vllm_frames(kind: str, value: Any, threshold: int) -> tuple[list[bytes], Any]:
    """The frames vLLM 0.33.0 writes for ``value`` (neutral) as ``kind``, and the object it
    encoded (so its neutral form can be recorded). Needs the vllm package."""
    import msgspec

    from enginewire.conformance.targets.vllm.target import VllmCodec

    if kind == "engine_core_dead":
        from vllm.v1.engine.core import EngineCoreProc

        return [EngineCoreProc.ENGINE_CORE_DEAD], None
    if kind in _LITERALS:
        return [_LITERALS[kind]()], None
    if kind == "start_dp_wave":
        from vllm.v1.engine.coordinator import DPCoordinatorProc

        socket = _CapturingSocket()
        DPCoordinatorProc._send_start_wave(socket, *value)  # type: ignore[arg-type]
        return socket.frames, tuple(value)
    if kind in _PLAIN_KINDS:
        obj = tuple(value)
        return [msgspec.msgpack.encode(obj)], obj
    vllm = VllmCodec(threshold)
    struct = {
        "outputs": "EngineCoreOutputs",
        "utility_reply": "EngineCoreOutputs",
        "coordinator_outputs": "EngineCoreOutputs",
    }
    target = struct.get(kind, kind)
    spec = load()
    resolve = _vllm_resolver(vllm)
    if target in spec.structs:
        obj = build(value, target, spec, resolve)
        return [bytes(memoryview(f).cast("B")) for f in vllm.encoder.encode(obj)], obj  # type: ignore[arg-type]
    from vllm.v1.engine import EngineCoreRequestType

    if kind == "add":
        obj = build(value, "EngineCoreRequest", spec, resolve)
        frames = [EngineCoreRequestType.ADD.value, *vllm.encoder.encode(obj)]
    elif kind in ("abort", "utility"):
        obj = tuple(value) if kind == "utility" else value
        request_type = EngineCoreRequestType.ABORT if kind == "abort" else (
            EngineCoreRequestType.UTILITY
        )
        frames = [request_type.value, *vllm.encoder.encode(obj)]
    elif kind in ("init", "ready_response"):
        name = "EngineHandshakeMetadata" if kind == "init" else "EngineCoreReadyResponse"
        obj = build(value, name, spec, resolve)
        frames = [msgspec.msgpack.encode(obj)]
    elif kind in ("hello", "ready"):
        obj = value
        frames = [msgspec.msgpack.encode(obj)]
    else:
        raise KeyError(f"no vLLM writer known for kind {kind!r}")
    return [bytes(memoryview(f).cast("B")) for f in frames], obj  # type: ignore[arg-type]


# --- the cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """An input to record: a kind, the encoder's threshold and a neutral value."""

    name: str
    kind: str
    description: str
    value: Any
    threshold: int = load().inline_threshold()


def cases() -> list[Case]:
    """Every golden case: each message kind, and the tensor boundary cases. Needs torch."""
    import torch

    def request(**extra: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "request_id": "req-0",
            "prompt_token_ids": [101, 2023, 2003],
            "mm_features": None,
            "sampling_params": {"max_tokens": 8},
            "pooling_params": None,
            "arrival_time": 1700000000.25,
            "lora_request": None,
            "cache_salt": None,
            "data_parallel_rank": None,
        }
        base.update(extra)
        return base

    def embeds(tensor: Any) -> dict[str, Any]:
        return request(prompt_token_ids=None, prompt_embeds=tensor)

    def outputs(*items: dict[str, Any], **extra: Any) -> dict[str, Any]:
        base: dict[str, Any] = {"engine_index": 0, "outputs": list(items), "timestamp": 4321.5}
        base.update(extra)
        return base

    def token(request_id: str, **extra: Any) -> dict[str, Any]:
        return {"request_id": request_id, "new_token_ids": [42], **extra}

    uint8 = torch.arange(257, dtype=torch.int32).remainder(256).to(torch.uint8)
    floats = torch.linspace(-1.0, 1.0, 400, dtype=torch.float32).reshape(4, 100)
    u1 = np.arange(257, dtype=np.uint16).astype(np.uint8)
    return [
        Case("hello", "hello", "HELLO from a local engine",
             {"status": "HELLO", "local": True, "headless": False}),
        Case("init", "init", "init answer with DP settings",
             {"addresses": {"inputs": ["ipc:///tmp/enginewire-in"],
                            "outputs": ["ipc:///tmp/enginewire-out"],
                            "coordinator_input": "tcp://10.0.0.1:5000",
                            "coordinator_output": "tcp://10.0.0.1:5001",
                            "frontend_stats_publish_address": None},
              "parallel_config": {"data_parallel_master_ip": "10.0.0.1",
                                  "data_parallel_master_port": 29500,
                                  "_data_parallel_master_port_list": [29501, 29502],
                                  "_coord_store_port": 0,
                                  "data_parallel_size": 2}}),
        Case("ready", "ready", "READY with the DP config hash",
             {"status": "READY", "local": True, "headless": False,
              "parallel_config_hash": "9f86d081884c7d65"}),
        Case("ready_response", "ready_response", "the engine's first input frame",
             {"max_model_len": 4096, "num_gpu_blocks": 1000, "block_size": 16,
              "dp_stats_address": None, "dtype": "bfloat16", "vllm_version": "0.33.0",
              "world_size": 1, "data_parallel_size": 1, "tensor_parallel_size": 1,
              "pipeline_parallel_size": 1, "decode_context_parallel_size": 1,
              "data_parallel_rank": 0, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
              "instance_id": "engine-0", "supports_lora": True, "max_loras": 4,
              "kv_cache_size_tokens": 16000, "kv_cache_max_concurrency": 3.90625}),
        Case("add_minimal", "add", "ADD with default sampling params but max_tokens",
             request()),
        Case("add_full", "add",
             "ADD with non-default sampling params, a LoRA request, trace headers, a salt",
             request(
                 request_id="req-full",
                 sampling_params={"n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
                                  "seed": 1234, "stop": ["</s>", "\n\n"], "stop_token_ids": [2],
                                  "max_tokens": 64, "logprobs": 5, "logit_bias": {50256: -100.0},
                                  "output_kind": 1, "bad_words": ["bad"],
                                  "skip_special_tokens": False},
                 lora_request={"lora_name": "sql-adapter", "lora_int_id": 7,
                               "lora_path": "/adapters/sql"},
                 cache_salt="salt-1", data_parallel_rank=1, client_index=2, current_wave=3,
                 priority=-1, trace_headers={"traceparent": "00-abc-def-01"},
                 external_req_id="user-req", session_id="session-9")),
        Case("add_pooling", "add", "ADD for a pooling model",
             request(request_id="req-pool", sampling_params=None,
                     pooling_params={"task": "embed", "dimensions": 256})),
        Case("add_prompt_embeds_oob", "add",
             "prompt_embeds float32 4x100 (1600 bytes, out of band)",
             embeds(floats)),
        Case("add_prompt_embeds_bfloat16", "add", "prompt_embeds bfloat16 2x8 (32 bytes, inline)",
             embeds(torch.linspace(-2, 2, 16).reshape(2, 8).to(torch.bfloat16))),
        Case("add_tensor_255_bytes", "add", "uint8 tensor of 255 bytes: inline (255 < 256)",
             embeds(uint8[:255].clone())),
        Case("add_tensor_256_bytes", "add", "uint8 tensor of 256 bytes: out of band (not < 256)",
             embeds(uint8[:256].clone())),
        Case("add_tensor_257_bytes", "add", "uint8 tensor of 257 bytes: out of band",
             embeds(uint8.clone())),
        Case("add_tensor_empty", "add", "float16 tensor of shape (0, 8): inline, no bytes",
             embeds(torch.zeros(0, 8, dtype=torch.float16))),
        Case("add_tensor_noncontiguous", "add",
             "transposed float32 80x4 view: sent as its C-order copy, out of band",
             embeds(floats.reshape(4, 100)[:, :80].t())),
        Case("add_tensor_0d_threshold_0", "add",
             "0-d float32 tensor with threshold 0: out of band (tensors have no 0-d rule)",
             embeds(torch.tensor(1.5, dtype=torch.float32)), threshold=0),
        Case("add_multimodal_nested_tensors", "add",
             "multimodal item whose data are nested tensors: a list with a 256-byte tensor (out "
             "of band), a list of a small tensor and numbers (inline), an empty list; a flat "
             "field of sizes and an item the engine caches (data nil)",
             request(request_id="req-mm", prompt_token_ids=[1, 2, 3, 4], mm_features=[{
                 "data": {
                     "pixel_values": {"data": [uint8[:256].clone(),
                                               [torch.arange(3, dtype=torch.int64), 2, 0.5],
                                               []],
                                      "field": ["batched", {"keep_on_cpu": False}]},
                     "image_sizes": {"data": torch.tensor([[4, 4]], dtype=torch.int32),
                                     "field": ["flat", {"keep_on_cpu": False,
                                                        "slices": [slice(0, 1, None)],
                                                        "dim": 0}]},
                     "cached": {"data": None, "field": ["shared", {"keep_on_cpu": False,
                                                                   "batch_size": 1}]},
                 },
                 "modality": "image", "identifier": "img-0",
                 "mm_position": {"offset": 1, "length": 2, "is_embed": None},
                 "mm_hash": "hash-0",
             }])),
        Case("abort", "abort", "ABORT two requests", ["req-1", "req-2"]),
        Case("utility", "utility", "UTILITY call with a 64-bit call id and no args",
             [0, (1 << 64) - 1, "get_supported_tasks", []]),
        Case("utility_args", "utility", "UTILITY call with scalar args",
             [1, 12345, "reset_prefix_cache", [True, "all", 3, 0.5, None]]),
        Case("outputs", "outputs", "two request outputs, one finished, with events",
             outputs(token("req-1", events=[{"type": 1, "timestamp": 10.5},
                                            {"type": 2, "timestamp": 10.75}]),
                     token("req-2", finish_reason=1, stop_reason="</s>",
                           kv_transfer_params={"remote_block_ids": [1, 2]}, num_nans_in_logits=0),
                     finished_requests={"req-2"})),
        Case("outputs_logprobs", "outputs", "new_logprobs as three ndarrays (inline)",
             outputs(token("req-1", new_logprobs={
                 "logprob_token_ids": np.array([[42, 7, 9]], dtype=np.int32),
                 "logprobs": np.array([[-0.25, -1.5, -3.0]], dtype=np.float32),
                 "sampled_token_ranks": np.array([1], dtype=np.int32),
                 "cu_num_generated_tokens": None}))),
        Case("outputs_ndarray_255_bytes", "outputs", "|u1 ndarray of 255 bytes: inline",
             outputs(token("req-1", routed_experts=u1[:255].copy()))),
        Case("outputs_ndarray_256_bytes", "outputs", "|u1 ndarray of 256 bytes: out of band",
             outputs(token("req-1", routed_experts=u1[:256].copy()))),
        Case("outputs_ndarray_257_bytes", "outputs", "|u1 ndarray of 257 bytes: out of band",
             outputs(token("req-1", routed_experts=u1.copy()))),
        Case("outputs_ndarray_0d_threshold_0", "outputs",
             "0-d <i8 ndarray with threshold 0: still inline (the ndarray 0-d rule)",
             outputs(token("req-1", routed_experts=np.array(7, dtype=np.int64))), threshold=0),
        Case("outputs_ndarray_big_endian", "outputs", ">i4 ndarray keeps its byte order",
             outputs(token("req-1", routed_experts=np.array([1, 2, 3], dtype=">i4")))),
        Case("outputs_pooling", "outputs",
             "pooling_output float32 256 values (1024 bytes, out of band) and a small tensor",
             outputs(token("req-1", new_token_ids=[],
                           pooling_output=torch.linspace(0, 1, 256, dtype=torch.float32),
                           prompt_token_id_logprobs=torch.tensor([[-0.5, -1.0]]),
                           finish_reason=0))),
        Case("utility_reply", "utility_reply", "a utility result",
             outputs(utility_output={"call_id": 12345, "result": {"type_info": None,
                                                                  "value": ["generate"]}})),
        Case("utility_reply_failure", "utility_reply", "a failed utility call",
             outputs(utility_output={"call_id": 7,
                                     "failure_message": "Call to nope method failed: no"})),
        Case("engine_core_dead", "engine_core_dead", "the fatal sentinel", None),
        Case("coordinator_subscribe", "coordinator_subscribe", "engine XSUB subscription", None),
        Case("coordinator_unsubscribe", "coordinator_unsubscribe",
             "engine XSUB unsubscription (written by ZMQ when the XSUB closes)", None),
        Case("coordinator_ready", "coordinator_ready", "coordinator READY broadcast", None),
        Case("start_dp_wave", "start_dp_wave", "start wave 3, engine 1 already runs it", [3, 1]),
        Case("coordinator_outputs", "coordinator_outputs", "stats and wave completion",
             outputs(engine_index=1, wave_complete=2, scheduler_stats={
                 "num_running_reqs": 3, "num_waiting_reqs": 1, "step_counter": 17,
                 "current_wave": 2, "kv_cache_usage": 0.25})),
        Case("stats_subscribe", "stats_subscribe", "front-end XSUB subscription", None),
        Case("stats_unsubscribe", "stats_unsubscribe",
             "front-end XSUB unsubscription (written by ZMQ when the XSUB closes)", None),
        Case("stats_update", "stats_update", "counts of two engines",
             [[[1, 3, 0.5], [0, 2, 0.25]], 4, True]),
        Case("stats_update_wave_only", "stats_update", "wave state only, counts nil",
             [None, 5, False]),
        Case("scale_elastic_ep", "scale_elastic_ep", "scale to 4 engines",
             ["SCALE_ELASTIC_EP", 4]),
    ]
