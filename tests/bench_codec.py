"""Benchmarks: the reference codec against raw msgspec on a 256-output EngineCoreOutputs.

Run with ``pytest tests/bench_codec.py`` (pytest-benchmark). The codec adds frame handling,
hooks and validation on top of msgspec; these numbers show what that costs.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from enginewire.reference import structs as S
from enginewire.reference.codec import Codec

pytestmark = pytest.mark.slow


def _outputs() -> Any:
    return S.EngineCoreOutputs(
        timestamp=1.0,
        outputs=[
            S.EngineCoreOutput(
                f"req-{i}", [i, i + 1],
                finish_reason=S.FinishReason.STOP if i % 8 == 0 else None,
            )
            for i in range(256)
        ],
        finished_requests={"req-0"},
    )


@pytest.fixture(scope="module")
def outputs() -> Any:
    return _outputs()


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


def test_codec_encode(benchmark: Any, codec: Codec, outputs: Any) -> None:
    frames = benchmark(codec.encode, "outputs", outputs)
    assert len(frames) == 1


def test_raw_msgspec_encode(benchmark: Any, outputs: Any) -> None:
    encoder = msgspec.msgpack.Encoder()
    assert benchmark(encoder.encode, outputs)


def test_codec_decode(benchmark: Any, codec: Codec, outputs: Any) -> None:
    frames = codec.encode("outputs", outputs)
    assert len(benchmark(codec.decode, "outputs", frames).outputs) == 256


def test_raw_msgspec_decode(benchmark: Any, codec: Codec, outputs: Any) -> None:
    frame = codec.encode("outputs", outputs)[0]
    decoder = msgspec.msgpack.Decoder(S.EngineCoreOutputs)
    assert len(benchmark(decoder.decode, frame).outputs) == 256
