"""The codec bench: encode and decode time of two realistic payloads.

Workloads (neutral values, :mod:`enginewire.conformance.oracle.values`, built into each contender's
own classes with :func:`~enginewire.conformance.oracle.values.build` before any timing):

- ``engine_step``: the ``EngineCoreOutputs`` of one engine step with 256 running requests,
  every 16th with 512 new tokens (a prefill chunk or speculative burst), the others with one;
  every 64th finishes (``finish_reason`` STOP, listed in ``finished_requests``);
- ``prompt_embeds``: an ``EngineCoreRequest`` carrying a 64 KiB ``prompt_embeds`` tensor
  (float16, 32 x 1024), which travels as an out-of-band frame.

Contenders: ``reference`` (:class:`enginewire.reference.codec.Codec`, struct kinds), ``vllm``
(``MsgpackEncoder`` / ``MsgpackDecoder``), the ceiling ``msgspec`` (a bare
``msgspec.msgpack.Encoder`` / ``Decoder`` of the reference structs, with the smallest tensor
hook that can carry the tensor out of band), and any other target through its codec surface
(``encode(kind, neutral value)``, so its figures include building its own values).

Decoding starts from the frames the contender itself encoded, as a receiver gets them: the
msgpack frame as ``bytes``, out-of-band frames as ``bytearray``. A figure is the mean time of
one call over batches that last about ``codec_seconds`` in all, the contenders of a workload and
operation taking turns batch by batch (:func:`time_calls`).
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: workload -> the spec struct it is an instance of.
WORKLOADS: dict[str, str] = {"engine_step": "EngineCoreOutputs",
                             "prompt_embeds": "EngineCoreRequest"}
STEP_REQUESTS = 256
BURST_EVERY = 16
BURST_TOKENS = 512
FINISH_EVERY = 64
EMBEDS_SHAPE = (32, 1024)  # float16: 64 KiB
OPERATIONS = ("encode", "decode")


def engine_step_value() -> dict[str, Any]:
    """The neutral ``EngineCoreOutputs`` of the ``engine_step`` workload."""
    outputs = []
    finished = []
    for index in range(STEP_REQUESTS):
        request_id = f"cmpl-{index:08x}{'a5' * 12}-0"
        first = 1000 + 7 * index
        tokens = list(range(first, first + BURST_TOKENS)) if index % BURST_EVERY == 0 else [first]
        output: dict[str, Any] = {"request_id": request_id, "new_token_ids": tokens}
        if index % FINISH_EVERY == FINISH_EVERY - 1:
            output["finish_reason"] = 0  # STOP
            finished.append(request_id)
        outputs.append(output)
    return {"engine_index": 0, "outputs": outputs, "timestamp": 1_700_000_000.25,
            "finished_requests": finished}


def prompt_embeds_value() -> dict[str, Any]:
    """The neutral ``EngineCoreRequest`` of the ``prompt_embeds`` workload."""
    import torch

    generator = torch.Generator().manual_seed(0)
    embeds = torch.randn(EMBEDS_SHAPE, generator=generator).to(torch.float16)
    return {
        "request_id": "cmpl-embeds-0", "prompt_token_ids": None, "mm_features": None,
        "sampling_params": {"max_tokens": 256, "temperature": 0.7, "top_p": 0.95},
        "pooling_params": None, "arrival_time": 1_700_000_000.5, "lora_request": None,
        "cache_salt": None, "data_parallel_rank": None, "prompt_embeds": embeds,
    }


WORKLOAD_VALUES: dict[str, Callable[[], dict[str, Any]]] = {
    "engine_step": engine_step_value, "prompt_embeds": prompt_embeds_value}


def received(frames: Sequence[Any]) -> list[Any]:
    """Frames as a receiver holds them: ``bytes`` first, ``bytearray`` out-of-band frames."""
    owned: list[Any] = []
    for index, frame in enumerate(frames):
        raw = memoryview(getattr(frame, "buffer", frame)).cast("B")
        owned.append(bytes(raw) if index == 0 else bytearray(raw))
    return owned


@dataclass
class Operations:
    """The zero-argument encode and decode calls of one contender on one workload."""

    encode: Callable[[], Any]
    decode: Callable[[], Any]


def _spec() -> Any:
    from enginewire.spec import load

    return load()


def reference_operations() -> dict[str, Operations]:
    from enginewire.conformance.oracle.values import build
    from enginewire.reference.codec import Codec

    codec = Codec()
    structs = codec.structs

    def resolve(name: str) -> Any:
        return structs.classes.get(name) or structs.enums.get(name)

    found = {}
    for workload, kind in WORKLOADS.items():
        value = build(WORKLOAD_VALUES[workload](), kind, codec.spec, resolve)
        frames = received(codec.encode(kind, value))
        found[workload] = Operations(functools.partial(codec.encode, kind, value),
                                     functools.partial(codec.decode, kind, frames))
    return found


def vllm_operations() -> dict[str, Operations]:
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from enginewire.conformance.oracle.values import build, import_class

    spec = _spec()

    def resolve(name: str) -> Any:
        path = getattr(spec.structs.get(name), "vllm_class", None)
        return import_class(path) if path else None

    encoder = MsgpackEncoder()
    found = {}
    for workload, kind in WORKLOADS.items():
        value = build(WORKLOAD_VALUES[workload](), kind, spec, resolve)
        decoder = MsgpackDecoder(resolve(kind))
        frames = received(encoder.encode(value))
        found[workload] = Operations(functools.partial(encoder.encode, value),
                                     functools.partial(decoder.decode, frames))
    return found


def msgspec_operations() -> dict[str, Operations]:
    """Bare msgspec over the reference structs: the ceiling of any msgspec-based codec."""
    import msgspec
    import torch

    from enginewire.conformance.oracle.values import build
    from enginewire.reference import structs as S

    spec = _spec()

    def resolve(name: str) -> Any:
        return getattr(S, name, None)

    # The least a codec must do for a tensor: name its dtype and shape, send its memory as
    # an out-of-band frame, and view that frame as a tensor again.
    out_of_band: list[Any] = []

    def enc_hook(obj: Any) -> Any:
        out_of_band.append(obj.numpy().data)
        # Frame 0 is the msgpack frame: out-of-band frames count from 1.
        return (str(obj.dtype).removeprefix("torch."), list(obj.shape), len(out_of_band))

    incoming: list[Sequence[Any]] = [()]

    def dec_hook(kind: Any, obj: Any) -> Any:
        dtype, shape, index = obj
        frame = incoming[0][index]
        return torch.frombuffer(frame, dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)

    encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)

    def encode(value: Any) -> list[Any]:
        out_of_band.clear()
        return [encoder.encode(value), *out_of_band]

    def decode(decoder: Any, frames: Sequence[Any]) -> Any:
        incoming[0] = frames
        return decoder.decode(frames[0])

    found = {}
    for workload, kind in WORKLOADS.items():
        value = build(WORKLOAD_VALUES[workload](), kind, spec, resolve)
        decoder = msgspec.msgpack.Decoder(getattr(S, kind), dec_hook=dec_hook)
        frames = received(encode(value))
        if workload == "engine_step":
            # No tensor: the bare call, not even the frame list.
            operations = Operations(functools.partial(encoder.encode, value),
                                    functools.partial(decoder.decode, frames[0]))
        else:
            operations = Operations(functools.partial(encode, value),
                                    functools.partial(decode, decoder, frames))
        found[workload] = operations
    return found


def surface_operations(surface: Any) -> dict[str, Operations]:
    """Any codec surface of the conformance target contract (neutral values in)."""
    found = {}
    for workload, kind in WORKLOADS.items():
        value = WORKLOAD_VALUES[workload]()
        frames = received(surface.encode(kind, value))
        found[workload] = Operations(functools.partial(surface.encode, kind, value),
                                     functools.partial(surface.decode, kind, frames))
    return found


def time_call(call: Callable[[], Any], seconds: float) -> float:
    """Mean seconds of the calling thread's CPU time per call over a batch lasting about
    ``seconds`` (after one warm-up call and a calibration): :func:`time_calls` of one call in
    one burst."""
    return time_calls([call], seconds, 1)[0]


def time_calls(calls: Sequence[Callable[[], Any]], seconds: float, bursts: int,
               ) -> list[float]:
    """Mean seconds of the calling thread's CPU time per call of each of ``calls``, the calls
    taking turns in ``bursts`` bursts (A B C, C B A, A B C, ...) that together last about
    ``seconds`` per call. Each call is warmed up and calibrated first. Garbage collection
    stays on: its cost is part of decoding objects.

    CPU time, not wall time: a call is single-threaded work, and on a shared machine the wall
    clock also counts the time the scheduler gives other processes in the middle of a batch.
    Turns, not one batch each: what the machine does meanwhile (another process's cache
    traffic, a core's clock) then falls on every contender alike instead of on whichever one
    was timing then. An exception from a call propagates (the caller records the cell as
    missing)."""
    clock = time.thread_time
    batches = [_batch(call, seconds, clock) for call in calls]
    spent = [0.0] * len(calls)
    made = [0] * len(calls)
    gc.collect()
    for burst in range(bursts):
        order = range(len(calls)) if burst % 2 == 0 else reversed(range(len(calls)))
        for index in order:
            call = calls[index]
            count = max(1, batches[index] // bursts)
            start = clock()
            for _ in range(count):
                call()
            spent[index] += clock() - start
            made[index] += count
    return [total / count for total, count in zip(spent, made, strict=True)]


def _batch(call: Callable[[], Any], seconds: float, clock: Callable[[], float]) -> int:
    """How many calls of ``call`` last about ``seconds`` (after one warm-up call)."""
    call()
    count = 1
    while True:
        start = clock()
        for _ in range(count):
            call()
        elapsed = clock() - start
        if elapsed >= seconds / 10 or count >= 1 << 20:
            break
        count *= 4
    per_call = elapsed / count
    return max(1, int(seconds / per_call)) if per_call > 0 else count
