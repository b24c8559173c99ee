"""Tensors and arrays through the reference codec: thresholds, dtypes, layouts, zero copy."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import msgspec
import numpy as np
import pytest

from enginewire.reference import structs as S
from enginewire.reference.codec import Codec
from enginewire.reference.tensors import TORCH_ITEMSIZE, TORCH_TO_NUMPY, WireTensor, vocabulary
from enginewire.spec import load

torch = pytest.importorskip("torch")

SURFACE = load().surface("tensors")


def _request(embeds: Any) -> Any:
    return S.EngineCoreRequest(
        "r", None, None, S.SamplingParams(), None, 0.5, None, None, None, prompt_embeds=embeds
    )


def _outputs(array: Any) -> Any:
    return S.EngineCoreOutputs(timestamp=1.0,
                               outputs=[S.EngineCoreOutput("r", [1], routed_experts=array)])


def _tensor_field(frames: list[Any]) -> Any:
    """The raw [dtype, shape, data] of prompt_embeds in an add message."""
    return msgspec.msgpack.decode(bytes(frames[1]), ext_hook=msgspec.msgpack.Ext)[9]


def _array_field(frames: list[Any]) -> Any:
    """The raw tuple of outputs[0].routed_experts in an outputs message."""
    raw = msgspec.msgpack.decode(bytes(frames[0]), ext_hook=msgspec.msgpack.Ext)
    return raw[1][0][12]


def _as_bytes(frame: Any) -> bytes:
    return bytes(memoryview(frame).cast("B"))


# --- the threshold ----------------------------------------------------------------------------


def test_spec_threshold_is_the_default() -> None:
    assert Codec().threshold == SURFACE.threshold_default == 256
    assert SURFACE.inline_comparison == "<"
    assert SURFACE.index_base == 1


@pytest.mark.parametrize(("nbytes", "inline"), [(255, True), (256, False), (257, False)])
def test_tensor_threshold_boundary(nbytes: int, inline: bool) -> None:
    tensor = torch.arange(nbytes, dtype=torch.int32).remainder(256).to(torch.uint8)
    frames = Codec().encode("add", _request(tensor))
    dtype, shape, data = _tensor_field(frames)
    assert (dtype, shape) == ("uint8", [nbytes])
    if inline:
        assert len(frames) == 2
        assert data == msgspec.msgpack.Ext(3, tensor.numpy().tobytes())
    else:
        assert len(frames) == 3
        assert data == 1
        assert _as_bytes(frames[2]) == tensor.numpy().tobytes()
    assert torch.equal(Codec().decode("add", frames).prompt_embeds, tensor)


@pytest.mark.parametrize(("nbytes", "inline"), [(255, True), (256, False), (257, False)])
def test_ndarray_threshold_boundary(nbytes: int, inline: bool) -> None:
    array = (np.arange(nbytes) % 256).astype(np.uint8)
    frames = Codec().encode("outputs", _outputs(array))
    dtype, shape, data = _array_field(frames)
    assert (dtype, shape) == ("|u1", [nbytes])
    assert len(frames) == (1 if inline else 2)
    assert data == (msgspec.msgpack.Ext(3, array.tobytes()) if inline else 1)
    np.testing.assert_array_equal(Codec().decode("outputs", frames).outputs[0].routed_experts,
                                  array)


def test_custom_threshold() -> None:
    array = np.zeros(4, dtype="<f8")
    assert len(Codec(threshold=32).encode("outputs", _outputs(array))) == 2
    assert len(Codec(threshold=33).encode("outputs", _outputs(array))) == 1


def test_decoder_accepts_both_forms_whatever_its_threshold() -> None:
    array = np.arange(64, dtype="<i8")
    inline = Codec(threshold=1 << 20).encode("outputs", _outputs(array))
    out_of_band = Codec(threshold=0).encode("outputs", _outputs(array))
    for frames in (inline, out_of_band):
        for codec in (Codec(threshold=0), Codec(threshold=1 << 20)):
            decoded = codec.decode("outputs", frames).outputs[0].routed_experts
            np.testing.assert_array_equal(decoded, array)


# --- 0-d and empty values ---------------------------------------------------------------------


def test_zero_dim_ndarray_always_inline() -> None:
    array = np.array(7, dtype="<i8")
    frames = Codec(threshold=0).encode("outputs", _outputs(array))
    assert len(frames) == 1
    assert _array_field(frames) == ["<i8", [], msgspec.msgpack.Ext(3, array.tobytes())]
    decoded = Codec().decode("outputs", frames).outputs[0].routed_experts
    assert decoded.shape == () and decoded == 7


def test_zero_dim_tensor_follows_the_threshold() -> None:
    tensor = torch.tensor(1.5)
    assert len(Codec().encode("add", _request(tensor))) == 2
    frames = Codec(threshold=0).encode("add", _request(tensor))
    assert len(frames) == 3
    assert _tensor_field(frames) == ["float32", [], 1]
    decoded = Codec().decode("add", frames).prompt_embeds
    assert decoded.shape == () and decoded.item() == 1.5


@pytest.mark.parametrize("threshold", [256, 0])
def test_empty_tensor(threshold: int) -> None:
    tensor = torch.zeros(0, 8, dtype=torch.float16)
    frames = Codec(threshold=threshold).encode("add", _request(tensor))
    assert len(frames) == (2 if threshold else 3)
    if not threshold:
        assert _as_bytes(frames[2]) == b""
    decoded = Codec().decode("add", frames).prompt_embeds
    assert decoded.shape == (0, 8) and decoded.dtype == torch.float16


@pytest.mark.parametrize("threshold", [256, 0])
def test_empty_ndarray(threshold: int) -> None:
    array = np.zeros((3, 0), dtype="<f4")
    frames = Codec(threshold=threshold).encode("outputs", _outputs(array))
    decoded = Codec().decode("outputs", frames).outputs[0].routed_experts
    assert decoded.shape == (3, 0) and decoded.dtype == np.dtype("<f4")


# --- layouts --------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [256, 0])
def test_non_contiguous_tensor_travels_in_c_order(threshold: int) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[:, ::2].t()
    assert not view.is_contiguous()
    codec = Codec(threshold=threshold)
    frames = codec.encode("add", _request(view))
    copy = codec.encode("add", _request(view.contiguous()))
    assert [_as_bytes(f) for f in frames] == [_as_bytes(f) for f in copy]
    assert torch.equal(codec.decode("add", frames).prompt_embeds, view)


@pytest.mark.parametrize("threshold", [256, 0])
def test_non_contiguous_ndarray_travels_in_c_order(threshold: int) -> None:
    view = np.arange(24, dtype="<i4").reshape(4, 6)[:, ::2].T
    codec = Codec(threshold=threshold)
    frames = codec.encode("outputs", _outputs(view))
    copy = codec.encode("outputs", _outputs(np.ascontiguousarray(view)))
    assert [_as_bytes(f) for f in frames] == [_as_bytes(f) for f in copy]
    np.testing.assert_array_equal(codec.decode("outputs", frames).outputs[0].routed_experts, view)


def test_fortran_order_ndarray() -> None:
    array = np.asfortranarray(np.arange(6, dtype="<i2").reshape(2, 3))
    frames = Codec().encode("outputs", _outputs(array))
    assert _array_field(frames)[2].data == np.ascontiguousarray(array).tobytes()


def test_tensor_that_requires_grad() -> None:
    tensor = torch.ones(3, requires_grad=True)
    decoded = Codec().decode("add", Codec().encode("add", _request(tensor))).prompt_embeds
    assert torch.equal(decoded, tensor.detach())


def test_bfloat16_round_trip() -> None:
    tensor = torch.linspace(-3, 3, 300).to(torch.bfloat16).reshape(3, 100)
    frames = Codec().encode("add", _request(tensor))
    assert _tensor_field(frames)[:2] == ["bfloat16", [3, 100]]
    decoded = Codec().decode("add", frames).prompt_embeds
    assert decoded.dtype == torch.bfloat16 and torch.equal(decoded, tensor)


# --- every dtype in the vocabulary --------------------------------------------------------------


def test_vocabulary_has_element_sizes() -> None:
    vocab = vocabulary()
    assert set(vocab.torch) == set(SURFACE.torch_dtypes) == set(TORCH_ITEMSIZE)
    for name, size in vocab.torch.items():
        dtype = getattr(torch, name)
        assert isinstance(dtype, torch.dtype)
        assert dtype.itemsize == size, name
    for text, size in vocab.numpy.items():
        assert np.dtype(text).str == text
        assert np.dtype(text).itemsize == size
        assert np.dtype(text).kind in "biufc"


def _random_bytes(count: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("name", SURFACE.torch_dtypes)
@pytest.mark.parametrize("threshold", [256, 0])
def test_every_torch_dtype(name: str, threshold: int) -> None:
    dtype = getattr(torch, name)
    shape = (3, 5)
    raw = _random_bytes(15 * dtype.itemsize, seed=len(name))
    if name == "bool":
        raw = bytes(b & 1 for b in raw)
    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(shape)
    codec = Codec(threshold=threshold)
    frames = codec.encode("add", _request(tensor))
    assert _tensor_field(frames)[:2] == [name, list(shape)]
    decoded = codec.decode("add", frames).prompt_embeds
    assert decoded.dtype == dtype and tuple(decoded.shape) == shape
    assert decoded.contiguous().view(torch.uint8).numpy().tobytes() == raw


@pytest.mark.parametrize("text", SURFACE.numpy_dtypes)
@pytest.mark.parametrize("threshold", [256, 0])
def test_every_numpy_dtype(text: str, threshold: int) -> None:
    dtype = np.dtype(text)
    raw = _random_bytes(6 * dtype.itemsize, seed=dtype.itemsize)
    if dtype.kind == "b":
        raw = bytes(b & 1 for b in raw)
    array = np.frombuffer(raw, dtype=dtype).reshape(2, 3)
    codec = Codec(threshold=threshold)
    frames = codec.encode("outputs", _outputs(array))
    assert _array_field(frames)[:2] == [text, [2, 3]]
    decoded = codec.decode("outputs", frames).outputs[0].routed_experts
    assert decoded.dtype.str == text and decoded.tobytes() == raw


# --- zero copy and copies -----------------------------------------------------------------------


def test_out_of_band_frame_is_a_view_of_the_array() -> None:
    array = np.zeros(100, dtype="<f8")
    frames = Codec().encode("outputs", _outputs(array))
    array[0] = 1.0
    assert np.frombuffer(frames[1], dtype="<f8")[0] == 1.0


def test_copy_option_sends_a_snapshot() -> None:
    array = np.zeros(100, dtype="<f8")
    frames = Codec(copy=True).encode("outputs", _outputs(array))
    array[0] = 1.0
    assert isinstance(frames[1], bytes)
    assert np.frombuffer(frames[1], dtype="<f8")[0] == 0.0


def test_decoded_out_of_band_values_are_views_of_the_frame() -> None:
    tensor = torch.zeros(100, dtype=torch.float32)
    frames = [bytearray(_as_bytes(f)) for f in Codec().encode("add", _request(tensor))]
    decoded = Codec().decode("add", frames).prompt_embeds
    frames[2][:4] = np.float32(2.5).tobytes()
    assert decoded[0].item() == 2.5

    array = np.zeros(100, dtype="<f8")
    frames = [bytearray(_as_bytes(f)) for f in Codec().encode("outputs", _outputs(array))]
    decoded_array = Codec().decode("outputs", frames).outputs[0].routed_experts
    frames[1][:8] = np.float64(4.0).tobytes()
    assert decoded_array[0] == 4.0


def test_copy_option_decodes_owned_values() -> None:
    tensor = torch.zeros(100, dtype=torch.float32)
    frames = [bytearray(_as_bytes(f)) for f in Codec().encode("add", _request(tensor))]
    decoded = Codec(copy=True).decode("add", frames).prompt_embeds
    frames[2][:4] = np.float32(2.5).tobytes()
    assert decoded[0].item() == 0.0


def test_inline_tensor_is_decoded_as_a_copy() -> None:
    tensor = torch.zeros(4, dtype=torch.float32)
    frames = [bytearray(_as_bytes(f)) for f in Codec().encode("add", _request(tensor))]
    decoded = Codec().decode("add", frames).prompt_embeds
    frames[1][frames[1].index(b"\xd8\x03") + 2] = 0x7F  # fixext 16, type 3
    assert decoded.sum().item() == 0.0


# --- without torch ------------------------------------------------------------------------------


def test_wire_tensors_encode_like_torch_tensors() -> None:
    tensor = torch.linspace(0, 1, 80, dtype=torch.float32).reshape(8, 10)
    wire = WireTensor("float32", (8, 10), tensor.numpy().tobytes())
    for threshold in (256, 0):
        codec = Codec(threshold=threshold)
        assert [_as_bytes(f) for f in codec.encode("add", _request(wire))] == [
            _as_bytes(f) for f in codec.encode("add", _request(tensor))
        ]
    decoded = Codec(tensors="wire").decode("add", Codec().encode("add", _request(tensor)))
    assert decoded.prompt_embeds == wire
    assert torch.equal(decoded.prompt_embeds.to_torch(), tensor)
    np.testing.assert_array_equal(decoded.prompt_embeds.to_numpy(), tensor.numpy())


# --- nested tensors (tensors.nested-tensors) -------------------------------------------------


def _feature(data: Any) -> Any:
    element = S.MultiModalFieldElem(data=data, field=("batched", S.MultiModalBatchedField()))
    return S.MultiModalFeatureSpec(data={"x": element}, modality="image", identifier="i",
                                   mm_position=S.PlaceholderRange(offset=0, length=1))


@pytest.mark.parametrize("mode", ["torch", "wire"])
def test_nested_tensors_round_trip_inline_and_out_of_band(mode: str) -> None:
    small = torch.arange(3, dtype=torch.int16)
    big = torch.arange(80, dtype=torch.float32)
    data = [small, [big, 2, [0.5, []]], big.reshape(8, 10)]
    codec = Codec(tensors=mode)
    frames = [_as_bytes(f) for f in codec.encode("MultiModalFeatureSpec", _feature(data))]
    assert len(frames) == 3  # the two 320-byte tensors go out of band, in order
    raw = msgspec.msgpack.decode(frames[0], ext_hook=msgspec.msgpack.Ext)["data"]["x"]["data"]
    assert raw[0][:2] == ["int16", [3]] and isinstance(raw[0][2], msgspec.msgpack.Ext)
    assert raw[1][0] == ["float32", [80], 1] and raw[2] == ["float32", [8, 10], 2]
    assert raw[1][1:] == [2, [0.5, []]]
    got = codec.decode("MultiModalFeatureSpec", frames).data["x"].data
    tensor_type = torch.Tensor if mode == "torch" else WireTensor
    assert isinstance(got[0], tensor_type) and isinstance(got[1][0], tensor_type)
    assert got[1][1:] == [2, [0.5, []]]
    as_torch = (lambda t: t) if mode == "torch" else (lambda t: t.to_torch())
    assert torch.equal(as_torch(got[2]), big.reshape(8, 10))
    again = [_as_bytes(f) for f in codec.encode("MultiModalFeatureSpec",
                                                 codec.decode("MultiModalFeatureSpec", frames))]
    assert again == frames


@pytest.mark.parametrize("data", [7, -1.5, None, []])
def test_nested_tensors_numbers_none_and_empty(data: Any) -> None:
    frames = Codec().encode("MultiModalFeatureSpec", _feature(data))
    assert len(frames) == 1
    assert Codec().decode("MultiModalFeatureSpec", frames).data["x"].data == data


def test_wire_tensor_numpy_twins() -> None:
    for name, text in TORCH_TO_NUMPY.items():
        assert getattr(torch, name).itemsize == np.dtype(text).itemsize
    with pytest.raises(ValueError):
        WireTensor("bfloat16", (1,), b"\x00\x00").to_numpy()


def test_codec_works_where_torch_cannot_be_imported() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # makes `import torch` fail
        import numpy as np
        from enginewire.reference import codec, structs as S
        from enginewire.reference.tensors import WireTensor
        c = codec.Codec()
        assert c.tensor_mode == "wire"
        embeds = WireTensor("bfloat16", (2, 200), bytes(800))
        request = S.EngineCoreRequest("r", None, None, S.SamplingParams(), None, 0.5, None,
                                      None, None, prompt_embeds=embeds)
        frames = c.encode("add", request)
        assert len(frames) == 3
        assert c.decode("add", frames).prompt_embeds == embeds
        out = S.EngineCoreOutputs(outputs=[S.EngineCoreOutput("r", [1],
                                  routed_experts=np.arange(100, dtype="<i4"))])
        assert c.decode("outputs", c.encode("outputs", out)).outputs[0].routed_experts[99] == 99
        assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("make", [
    lambda base: base,  # contiguous: a byte view of its own memory
    lambda base: base[8:40],  # contiguous, at an offset into its storage
    lambda base: base.t(),  # not contiguous
    lambda base: base.clone().requires_grad_(),  # numpy() refuses it
    lambda base: base.to(torch.bfloat16),  # no numpy twin
], ids=["contiguous", "offset", "transposed", "requires-grad", "bfloat16"])
def test_every_tensor_path_writes_the_bytes_of_the_c_order_tensor(make: Any) -> None:
    tensor = make(torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32))
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    dtype = str(tensor.dtype).removeprefix("torch.")
    expected = Codec().encode("add", _request(WireTensor(dtype, tuple(tensor.shape), flat)))
    got = Codec().encode("add", _request(tensor))
    assert [_as_bytes(f) for f in got] == [_as_bytes(f) for f in expected]
    assert memoryview(got[2]).format == "B" and memoryview(got[2]).ndim == 1


@pytest.mark.parametrize("make", [
    lambda: torch.arange(512, dtype=torch.float16).reshape(16, 32),     # the hook's own path
    lambda: torch.arange(512, dtype=torch.int64)[::2],                  # strided: the writer
    lambda: torch.arange(512, dtype=torch.bfloat16),                    # no numpy twin
    lambda: torch.arange(512, dtype=torch.float32).requires_grad_(),    # requires grad
    lambda: torch.arange(8, dtype=torch.float16),                       # inline
])
@pytest.mark.parametrize("copy", [False, True])
def test_encode_hook_writes_what_encode_tensor_writes(make: Any, copy: bool) -> None:
    """Every tensor the encoder's hook writes itself, and every one it hands on, travels as
    the tuple and bytes encode_tensor gives it."""
    from enginewire.reference.tensors import encode_tensor

    tensor = make()
    frames = Codec(copy=copy).encode("add", _request(tensor))
    aux: list[Any] = [b""]
    dtype, shape, data = encode_tensor(tensor, aux, threshold=SURFACE.threshold_default,
                                       copy=copy, vocab=vocabulary())
    got = _tensor_field(frames)
    assert got[:2] == [dtype, list(shape)]
    if isinstance(data, int):
        assert got[2] == data == 1 and bytes(frames[2]) == bytes(aux[1])
        assert len(frames) == 3
    else:
        assert bytes(got[2].data) == bytes(data.data) and len(frames) == 2


@pytest.mark.parametrize("make", [
    lambda: np.arange(256, dtype=np.int64).reshape(16, 16),             # the hook's own path
    lambda: np.arange(256, dtype=np.int64)[::2],                        # strided: the writer
    lambda: np.arange(4, dtype=np.int64),                               # inline
    lambda: np.zeros((0, 64), dtype=np.float32),                        # empty
])
def test_encode_hook_writes_what_encode_ndarray_writes(make: Any) -> None:
    from enginewire.reference.tensors import encode_ndarray

    array = make()
    frames = Codec().encode("outputs", _outputs(array))
    aux: list[Any] = [b""]
    dtype, shape, data = encode_ndarray(array, aux, threshold=SURFACE.threshold_default,
                                        copy=False, vocab=vocabulary())
    got = _array_field(frames)
    assert got[:2] == [dtype, list(shape)]
    if isinstance(data, int):
        assert got[2] == data and bytes(frames[1]) == bytes(aux[1])
    else:
        assert bytes(got[2].data) == bytes(data.data)
