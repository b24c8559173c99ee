"""Tensors and arrays on the wire: the ``[dtype, shape, data]`` tuple of the tensors surface.

This module turns numpy arrays, CPU torch tensors and :class:`WireTensor` values into that tuple
and back. It knows nothing about frames or structs: the codec hands it the list of out-of-band
buffers it appends to (encoding) or reads from (decoding). torch is optional and imported only
when a torch tensor is met or asked for.

Contract:

- :func:`encode_value` returns the tuple for one value and appends its bytes to ``aux`` when the
  value goes out of band. ``aux[0]`` is the msgpack frame's placeholder, so the index written
  is ``len(aux)`` before the append (tensors.index-base-one).
- :func:`decode_value` validates a tuple as decoded from msgpack (an ``Ext(3)`` already turned
  into a ``memoryview`` by the codec's ext hook) and builds the value; every violation raises
  :class:`~enginewire.reference.errors.TensorError` carrying the clause it breaks.
- :func:`decode_nested_tensors` does the same for a ``nested_tensors`` position (numbers, tensor
  tuples and arrays of them); :func:`check_nested_tensors` vets such a value before encoding.
- The forms of earlier releases (the tensors surface's ``tensor_form``): :func:`numpy_view`
  gives a tensor's numpy view for the ``numpy`` form (vLLM 0.8.4: the tuple of that view, with
  numpy's dtype.str) and :func:`pickle_array` the payload of the ``pickle`` form's extension
  type (vLLM 0.7.3-0.8.3), which is also how those releases send an ndarray (the generic pickle
  extension type, tensors.ndarray-pickle-fallback); :func:`unpickle_array` reads such a
  payload back, resolving only what rebuilds a numpy array of a kind other than object and
  void, and :func:`tensor_from_array` builds the tensor (or :class:`WireTensor`) over an array.
"""

from __future__ import annotations

import math
import pickle
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import numpy as np

from enginewire.spec import load
from enginewire.spec.classes import NdarraySlot, TensorSlot

from .errors import FramingError, TensorError

#: msgpack extension type of inline tensor bytes (tensors surface, ext_codes).
RAW_VIEW_EXT: int = load().ext_code("raw_view")

#: Bytes per element of each torch dtype name; the names are checked against the spec's
#: ``torch_dtypes`` vocabulary when the vocabulary is loaded.
TORCH_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
}

#: torch dtype names with a numpy twin of the same bytes (little-endian, as torch stores them).
TORCH_TO_NUMPY: dict[str, str] = {
    "bool": "|b1",
    "uint8": "|u1",
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
}


#: numpy's dtype.str -> the torch dtype name of the same bytes.
NUMPY_TO_TORCH: dict[str, str] = {text: name for name, text in TORCH_TO_NUMPY.items()}


@dataclass(frozen=True)
class Vocabulary:
    """The dtype strings the spec allows, with the byte size of one element of each."""

    torch: dict[str, int]
    numpy: dict[str, int]
    #: Most entries a shape may have (tensors.shape-bounded, limit ``max_dims``).
    max_dims: int = 64
    #: Deepest nesting of a nested_tensors value (tensors.nested-tensors-depth).
    max_nested_depth: int = 32


_VOCABULARIES: dict[str, Vocabulary] = {}


def vocabulary(version: str | None = None) -> Vocabulary:
    """The tensors surface's dtype vocabularies for ``version`` (default: the reference)."""
    spec = load(version)
    found = _VOCABULARIES.get(spec.version)
    if found is None:
        surface = spec.surface("tensors")
        unknown = [name for name in surface.torch_dtypes if name not in TORCH_ITEMSIZE]
        if unknown:
            raise ValueError(f"no element size known for torch dtypes {unknown}")
        found = Vocabulary(
            torch={name: TORCH_ITEMSIZE[name] for name in surface.torch_dtypes},
            numpy={text: int(text[2:]) for text in surface.numpy_dtypes},
            max_dims=surface.limits.get("max_dims", Vocabulary.max_dims),
            max_nested_depth=surface.limits.get(
                "max_nested_tensors_depth", Vocabulary.max_nested_depth
            ),
        )
        _VOCABULARIES[spec.version] = found
    return found


class WireTensor:
    """A tensor as it travels, for programs without torch (or that want the raw bytes).

    ``dtype`` is a torch dtype name, ``shape`` the dimensions and ``data`` the C-order bytes
    (a read-only view of the received frame unless the codec copies). Encoding a WireTensor
    writes exactly the tuple a torch tensor with the same dtype, shape and bytes would.
    """

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype: str, shape: Sequence[int], data: bytes | bytearray | memoryview):
        self.dtype = dtype
        self.shape = tuple(shape)
        self.data = data

    @property
    def nbytes(self) -> int:
        return memoryview(self.data).nbytes

    def to_torch(self) -> Any:
        """A torch tensor with these bytes (a copy, so it is writable)."""
        torch = _torch()
        dtype = getattr(torch, self.dtype)
        if self.nbytes == 0:
            return torch.empty(self.shape, dtype=dtype)
        raw = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)
        return raw.view(dtype).view(self.shape)

    def to_numpy(self) -> np.ndarray:
        """A numpy array of the same values; only for dtypes numpy has (not bfloat16, float8)."""
        try:
            numpy_dtype = TORCH_TO_NUMPY[self.dtype]
        except KeyError:
            raise ValueError(f"numpy has no dtype for torch {self.dtype!r}") from None
        return np.frombuffer(self.data, dtype=numpy_dtype).reshape(self.shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WireTensor):
            return NotImplemented
        return (
            self.dtype == other.dtype
            and self.shape == other.shape
            and bytes(self.data) == bytes(other.data)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WireTensor(dtype={self.dtype!r}, shape={self.shape!r}, nbytes={self.nbytes})"


class TensorIpcHandle:
    """A tensor whose bytes travel beside the socket (vLLM's tensor IPC queue).

    Decoded only when the codec is told the side channel exists
    (tensors.ipc-handle-needs-side-channel); ``meta`` is the ``{sender_id, message_id,
    tensor_id}`` map exactly as received. (A plain class, not a dataclass: msgspec would write
    a dataclass as a map instead of asking the codec's hook for the tuple.)
    """

    __slots__ = ("dtype", "shape", "meta")

    def __init__(self, dtype: str, shape: Sequence[int], meta: dict[str, Any]) -> None:
        self.dtype = dtype
        self.shape = tuple(shape)
        self.meta = meta

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorIpcHandle):
            return NotImplemented
        return (self.dtype, self.shape, self.meta) == (other.dtype, other.shape, other.meta)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TensorIpcHandle(dtype={self.dtype!r}, shape={self.shape!r}, meta={self.meta!r})"


_TORCH: list[Any] = []


def _torch() -> Any:
    """The torch module, imported on first use (ImportError where it is not installed)."""
    if not _TORCH:
        import torch

        _TORCH.append(torch)
    return _TORCH[0]


#: torch's dtype objects by wire name and the wire name of each, for the names torch has;
#: filled on first use (:func:`_torch_dtypes`).
_TORCH_BY_NAME: dict[str, Any] = {}
_TORCH_NAMES: dict[Any, str] = {}


def _torch_dtypes() -> dict[Any, str]:
    """torch dtype -> wire name, the tables filled on first use; torch's tensor class is then
    admitted into tensor slots by type (one ``isinstance`` where the predicate took a module
    look-up)."""
    if not _TORCH_NAMES:
        torch = _torch()
        for name in TORCH_ITEMSIZE:
            if hasattr(torch, name):
                _TORCH_BY_NAME[name] = getattr(torch, name)
                _TORCH_NAMES[getattr(torch, name)] = name
        TensorSlot.admit(torch.Tensor)
    return _TORCH_NAMES


def is_torch_tensor(value: object) -> bool:
    """True for a torch tensor, without importing torch when it is not loaded yet."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def torch_available() -> bool:
    try:
        _torch()
    except ImportError:
        return False
    return True


# --- encoding --------------------------------------------------------------------------------


def _place(
    data: memoryview | bytes, aux: list[Any], inline: bool, copy: bool
) -> msgspec.msgpack.Ext | int:
    if copy and not isinstance(data, bytes):
        data = bytes(data)
    if inline:
        return msgspec.msgpack.Ext(RAW_VIEW_EXT, data)
    aux.append(data)
    return len(aux) - 1


def encode_ndarray(
    array: np.ndarray, aux: list[Any], *, threshold: int, copy: bool, vocab: Vocabulary
) -> tuple[str, tuple[int, ...], Any]:
    """The tuple for a numpy array (tensors.ndarray-inline-below-threshold)."""
    if array.dtype.kind in ("O", "V"):
        raise TensorError(
            "tensors.no-object-arrays",
            "an object or void ndarray cannot travel as a tensor tuple",
            got=array.dtype.str,
        )
    dtype = array.dtype.str
    if dtype not in vocab.numpy:
        raise TensorError(
            "tensors.numpy-dtype-str",
            "ndarray dtype outside the numpy_dtypes vocabulary",
            expected=sorted(vocab.numpy),
            got=dtype,
        )
    if array.flags.c_contiguous and array.size:
        data = array.data.cast("B")  # the array's own memory, as bytes
    else:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    inline = array.ndim == 0 or array.nbytes < threshold
    return dtype, array.shape, _place(data, aux, inline, copy)


def encode_tensor(
    tensor: Any, aux: list[Any], *, threshold: int, copy: bool, vocab: Vocabulary
) -> tuple[str, tuple[int, ...], Any]:
    """The tuple for a torch tensor (tensors.tensor-inline-below-threshold).

    A contiguous CPU tensor of a dtype numpy shares travels as a byte view of its own memory
    (one ``numpy()`` call); any other goes through ``detach().cpu().contiguous()`` and a
    ``uint8`` view. Both write the same bytes."""
    dtype = (_TORCH_NAMES or _torch_dtypes()).get(tensor.dtype)
    if dtype is None or dtype not in vocab.torch:
        raise TensorError(
            "tensors.torch-dtype-name",
            "tensor dtype outside the torch_dtypes vocabulary",
            expected=sorted(vocab.torch),
            got=dtype or str(tensor.dtype).removeprefix("torch."),
        )
    # torch.Size is a tuple: msgspec writes it as the array it is.
    shape = tensor.shape
    if dtype in TORCH_TO_NUMPY:
        try:
            # Raises for a tensor off the CPU, one that requires grad or carries a conjugate
            # or negative bit, and (the cast) for a non-contiguous or zero-size one: those
            # take the general path.
            data = tensor.numpy().data.cast("B")
        except (RuntimeError, TypeError):
            pass
        else:
            if copy or data.nbytes < threshold:
                return dtype, shape, _place(data, aux, data.nbytes < threshold, copy)
            aux.append(data)
            return dtype, shape, len(aux) - 1
    inline = tensor.is_cpu and tensor.nbytes < threshold
    flat = tensor.detach().cpu().contiguous().reshape(-1).view(_torch().uint8)
    return dtype, shape, _place(flat.numpy().data, aux, inline, copy)


class EncodeScratch:
    """What one encode call in progress shares with its msgspec hook: ``aux``, the list of
    out-of-band buffers (``aux[0]`` the msgpack frame's placeholder), None between calls."""

    __slots__ = ("aux",)

    def __init__(self) -> None:
        self.aux: list[Any] | None = None


def encode_hook(
    scratch: EncodeScratch,
    *,
    threshold: int,
    copy: bool,
    vocab: Vocabulary,
    other: Callable[[Any, list[Any]], Any],
) -> Callable[[Any], Any]:
    """The msgspec ``enc_hook`` of one encoder: the tuple of a tensor or array, any other value
    handed to ``other(value, aux)``.

    The common out-of-band value is written in the hook itself, with no further Python call:
    a contiguous CPU torch tensor of a vocabulary dtype that numpy shares, or a C-contiguous
    ndarray of a vocabulary dtype, of at least ``threshold`` bytes, without ``copy``. Its data
    is a byte view of the value's own memory, exactly what :func:`encode_tensor` and
    :func:`encode_ndarray` write for it; every other tensor or array (inline, bfloat16,
    float8, strided, off the CPU, requiring grad, ``copy``) goes to ``other``, which writes
    it with those functions. Raises RuntimeError when called outside an encode call
    (``scratch.aux`` None).
    """
    # torch dtype -> wire name for the vocabulary's dtypes numpy shares, filled (and torch's
    # tensor class learnt) the first time a torch tensor comes: torch is never imported here.
    tensor_names: dict[Any, str] = {}
    tensor_class: type | None = None
    array_dtypes = frozenset(vocab.numpy)
    ndarray = np.ndarray

    def hook(value: Any) -> Any:
        nonlocal tensor_class
        aux = scratch.aux
        if aux is None:
            raise RuntimeError("enc_hook outside an encode call")
        kind = type(value)
        if kind is tensor_class:
            name = tensor_names.get(value.dtype)
            if name is not None and not copy:
                try:
                    # Raises for a tensor off the CPU, one that requires grad or carries a
                    # conjugate or negative bit, and (the cast) for a strided or empty one.
                    array = value.numpy()
                    data = array.data.cast("B")
                except (RuntimeError, TypeError):
                    pass
                else:
                    if data.nbytes >= threshold:
                        aux.append(data)
                        return name, array.shape, len(aux) - 1
        elif kind is ndarray:
            nbytes = value.nbytes
            if (nbytes and nbytes >= threshold and not copy and value.ndim
                    and value.flags.c_contiguous and value.dtype.str in array_dtypes):
                aux.append(value.data.cast("B"))
                return value.dtype.str, value.shape, len(aux) - 1
        elif tensor_class is None and is_torch_tensor(value):
            torch_names = _TORCH_NAMES or _torch_dtypes()
            tensor_names.update((dtype, name) for dtype, name in torch_names.items()
                                if name in vocab.torch and name in TORCH_TO_NUMPY)
            tensor_class = _torch().Tensor
        return other(value, aux)

    return hook


def encode_wire_tensor(
    tensor: WireTensor, aux: list[Any], *, threshold: int, copy: bool, vocab: Vocabulary
) -> tuple[str, tuple[int, ...], Any]:
    """The tuple for a :class:`WireTensor`, validated like a decoded one."""
    itemsize = vocab.torch.get(tensor.dtype)
    if itemsize is None:
        raise TensorError(
            "tensors.torch-dtype-name",
            "tensor dtype outside the torch_dtypes vocabulary",
            expected=sorted(vocab.torch),
            got=tensor.dtype,
        )
    data = memoryview(tensor.data).cast("B")
    _check_shape(tensor.shape, vocab.max_dims)
    _check_length(tensor.shape, itemsize, data.nbytes)
    return tensor.dtype, tensor.shape, _place(data, aux, data.nbytes < threshold, copy)


# --- decoding --------------------------------------------------------------------------------

TensorKind = Literal["tensor", "ndarray"]
TensorMode = Literal["torch", "wire"]


def _check_shape(shape: object, max_dims: int = Vocabulary.max_dims) -> tuple[int, ...]:
    """``shape`` as a tuple after the tensors.shape-non-negative and tensors.shape-bounded
    checks; the entry count is checked first, before anything is copied."""
    if not isinstance(shape, (list, tuple)):
        raise TensorError(
            "tensors.shape-non-negative", "shape is not an array", got=type(shape).__name__
        )
    if len(shape) > max_dims:
        raise TensorError(
            "tensors.shape-bounded",
            f"a shape has at most {max_dims} entries",
            expected=max_dims,
            got=len(shape),
        )
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise TensorError(
                "tensors.shape-non-negative",
                "shape entries are non-negative integers",
                got=_short(dim),
            )
    return tuple(shape)


def _short(value: object) -> str:
    """``repr(value)`` cut to a readable length (an error message never renders a huge int)."""
    if type(value) is int and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_length(shape: tuple[int, ...], itemsize: int, nbytes: int) -> None:
    """Raise tensors.byte-length-matches-shape unless product(shape) * itemsize == nbytes.

    Linear in the length of ``shape`` and never builds a number much larger than ``nbytes``
    (or 2**64 for a small ``nbytes``, so the error still gives a modest product exactly): the
    product stops growing once it passes that cap (tensors.shape-bounded)."""
    if len(shape) <= Vocabulary.max_dims and math.prod(shape) * itemsize == nbytes:
        # At most max_dims factors of at most 64 bits each: one C call for the common case.
        return
    cap = max(nbytes, 1 << 64)
    if 0 in shape:
        expected: int | str = 0
    else:
        product = itemsize
        for dim in shape:
            product *= dim
            if product > cap:
                break
        expected = product if product <= cap else f"more than {cap}"
    if nbytes != expected:
        raise TensorError(
            "tensors.byte-length-matches-shape",
            f"data length does not match a shape of {len(shape)} entries"
            f" x {itemsize}-byte elements",
            expected=expected,
            got=nbytes,
        )


def decode_value(
    raw: object,
    kind: TensorKind,
    frames: Sequence[Any],
    used: set[int],
    *,
    mode: TensorMode,
    copy: bool,
    vocab: Vocabulary,
    ipc_handles: bool,
) -> Any:
    """Build a tensor (``kind="tensor"``) or ndarray from a decoded ``[dtype, shape, data]``.

    ``frames`` are the payload's frames (frame 0 is the msgpack frame), ``used`` collects the
    out-of-band indexes already taken. ``mode`` picks torch tensors or :class:`WireTensor`.
    """
    if not isinstance(raw, list) or len(raw) != 3:
        raise TensorError(
            "tensors.tuple-layout",
            "a tensor travels as the array [dtype, shape, data]",
            got=raw if not isinstance(raw, list) else f"array of {len(raw)}",
        )
    dtype, shape_raw, data = raw
    table = vocab.torch if kind == "tensor" else vocab.numpy
    itemsize = table.get(dtype) if isinstance(dtype, str) else None
    if itemsize is None:
        raise TensorError(
            "tensors.torch-dtype-name" if kind == "tensor" else "tensors.numpy-dtype-str",
            f"{kind} dtype outside the vocabulary",
            expected=sorted(table),
            got=dtype,
        )
    shape = _check_shape(shape_raw, vocab.max_dims)
    inline = True
    if type(data) is memoryview:
        buffer = data
    elif type(data) is int:
        if data < 1:
            raise TensorError(
                "tensors.index-in-range", "out-of-band indexes start at 1", got=data
            )
        if data >= len(frames):
            raise FramingError(
                "frames.oob-count-matches",
                f"the payload names out-of-band frame {data} but has {len(frames) - 1}",
                expected=data + 1,
                got=len(frames),
            )
        if data in used:
            raise TensorError("tensors.index-used-once", "two values name one frame", got=data)
        used.add(data)
        frame = frames[data]
        buffer = memoryview(getattr(frame, "buffer", frame))
        if buffer.format != "B" or buffer.ndim != 1:
            buffer = buffer.cast("B")
        inline = False
    elif isinstance(data, dict) and kind == "tensor":
        if not ipc_handles:
            raise TensorError(
                "tensors.ipc-handle-needs-side-channel",
                "tensor IPC handle received but no tensor IPC queue is configured",
                got=data,
            )
        return TensorIpcHandle(dtype, shape, data)
    else:
        raise TensorError(
            "tensors.data-form",
            "data is an Ext(3) raw view or a positive integer index",
            got=type(data).__name__,
        )
    _check_length(shape, itemsize, buffer.nbytes)
    if kind == "ndarray":
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        return array.copy() if copy else array
    if mode == "wire":
        return WireTensor(dtype, shape, bytes(buffer) if copy else buffer)
    return _build_torch(dtype, shape, buffer, clone=copy or inline)


def decode_nested_tensors(
    raw: object,
    frames: Sequence[Any],
    used: set[int],
    *,
    mode: TensorMode,
    copy: bool,
    vocab: Vocabulary,
    ipc_handles: bool,
) -> Any:
    """Build nested tensors (tensors.nested-tensors) from their decoded msgpack form.

    A number stays a number, an array whose first element is a string is a tensor tuple
    (:func:`decode_value`), any other array a list of nested tensors; anything else raises
    :class:`TensorError`, and so does nesting deeper than the vocabulary's
    ``max_nested_depth`` (tensors.nested-tensors-depth). Works without recursion on the input's
    depth.
    """

    def leaf(item: object) -> Any:
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            return item
        if isinstance(item, list) and item and isinstance(item[0], str):
            return decode_value(item, "tensor", frames, used, mode=mode, copy=copy, vocab=vocab,
                                ipc_handles=ipc_handles)
        raise TensorError(
            "tensors.nested-tensors",
            "nested tensors hold tensor tuples, ints, floats and arrays of them",
            got=type(item).__name__,
        )

    if not isinstance(raw, list) or (raw and isinstance(raw[0], str)):
        return leaf(raw)
    root: list[Any] = []
    # Each entry: the input array, the position reached in it, the output list being built.
    stack: list[tuple[list[Any], int, list[Any]]] = [(raw, 0, root)]
    while stack:
        items, index, out = stack.pop()
        while index < len(items):
            item = items[index]
            index += 1
            if isinstance(item, list) and not (item and isinstance(item[0], str)):
                if len(stack) + 1 >= vocab.max_nested_depth:
                    _too_deep(vocab.max_nested_depth)
                child: list[Any] = []
                out.append(child)
                stack.append((items, index, out))
                items, index, out = item, 0, child
                continue
            out.append(leaf(item))
    return root


def _too_deep(limit: int) -> None:
    raise TensorError(
        "tensors.nested-tensors-depth",
        f"nested tensors nest at most {limit} arrays deep",
        expected=limit,
        got=f"more than {limit}",
    )


def check_nested_tensors(value: object, max_depth: int = Vocabulary.max_nested_depth) -> None:
    """Raise :class:`TensorError` unless ``value`` can travel as nested tensors: a torch
    tensor, :class:`WireTensor` or :class:`TensorIpcHandle`, an int or float (not a bool), or a
    list or tuple of nested tensors, nested at most ``max_depth`` deep."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple)):
            if depth + 1 > max_depth:
                _too_deep(max_depth)
            stack.extend((child, depth + 1) for child in item)
            continue
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            continue
        if isinstance(item, (WireTensor, TensorIpcHandle)) or is_torch_tensor(item):
            continue
        raise TensorError(
            "tensors.nested-tensors",
            "nested tensors hold tensors, ints, floats and lists of them",
            got=type(item).__name__,
        )


def _build_torch(dtype: str, shape: tuple[int, ...], buffer: memoryview, *, clone: bool) -> Any:
    """A tensor over ``buffer`` (over a copy of it with ``clone``): through a numpy view where
    numpy has the dtype (one C call into torch), else a ``uint8`` tensor viewed as ``dtype``."""
    torch = _torch()
    if not _TORCH_NAMES:
        _torch_dtypes()
    torch_dtype = _TORCH_BY_NAME.get(dtype) or getattr(torch, dtype)
    if buffer.nbytes == 0:
        return torch.empty(shape, dtype=torch_dtype)
    # A bytearray copy is writable, so torch neither warns nor shares the frame's memory.
    source = bytearray(buffer) if clone else buffer
    numpy_dtype = TORCH_TO_NUMPY.get(dtype)
    if numpy_dtype is not None:
        return torch.from_numpy(np.frombuffer(source, dtype=numpy_dtype).reshape(shape))
    return torch.frombuffer(source, dtype=torch.uint8).view(torch_dtype).view(shape)


# The spec's struct classes accept in a tensor position what this codec builds there (torch's
# tensor class is admitted by type too once torch is in use: _torch_dtypes).
TensorSlot.admit(WireTensor, TensorIpcHandle, predicate=is_torch_tensor)
NdarraySlot.admit(np.ndarray)


# --- the forms of earlier releases -----------------------------------------------------------


def numpy_view(tensor: Any, clause: str) -> np.ndarray:
    """The numpy view of a tensor (``tensor.numpy()``, a CPU copy for one off the CPU), as
    the ``numpy`` and ``pickle`` forms send it; a dtype numpy lacks raises ``clause``."""
    if isinstance(tensor, WireTensor):
        try:
            return tensor.to_numpy()
        except ValueError:
            dtype: str | None = tensor.dtype
    else:
        dtype = (_TORCH_NAMES or _torch_dtypes()).get(tensor.dtype)
        if dtype in TORCH_TO_NUMPY:
            return np.asarray(tensor.detach().cpu().numpy())
    raise TensorError(clause, "this release sends a tensor through its numpy view, and numpy "
                      "has no such dtype", expected=sorted(TORCH_TO_NUMPY),
                      got=dtype or str(getattr(tensor, "dtype", "")))


def pickle_array(array: np.ndarray) -> bytes:
    """The payload of the ``pickle`` form's extension type (a tensor's numpy view, or an
    ndarray in the pickle fallback): one pickle stream of ``array`` (the default protocol, as
    vLLM's ``pickle.dumps``)."""
    return pickle.dumps(array)


#: (module, name) an array's pickle stream may name: numpy's ndarray and dtype and the
#: functions its ``__reduce_ex__`` rebuilds an array with (numpy 1 and numpy 2 module paths).
_ARRAY_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    # Protocol 2 writes bytes as _codecs.encode(text, "latin1"), which only encodes a string.
    ("_codecs", "encode"),
})


class _ArrayUnpickler(pickle.Unpickler):
    """Resolves only the globals of :data:`_ARRAY_GLOBALS`: a stream that names anything else
    (the way a pickle runs code) fails before any of it runs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ARRAY_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} does not rebuild an array")
        return super().find_class(module, name)


def unpickle_array(data: memoryview | bytes, clause: str = "tensors.pickle-form",
                   what: str = "the tensor extension's payload") -> np.ndarray:
    """The numpy array a ``pickle`` form payload holds (``clause``: tensors.pickle-form for a
    tensor, tensors.ndarray-pickle-fallback for an ndarray); anything else (another global,
    another type, an object or void array, a broken stream) raises :class:`TensorError`
    naming ``clause`` and ``what`` the payload was."""
    import io

    try:
        value = _ArrayUnpickler(io.BytesIO(bytes(data))).load()
    except Exception as exc:  # noqa: BLE001 - every failure of the stream is one rejection
        raise TensorError(clause, f"{what} is not a pickle stream of a numpy array",
                          got=f"{type(exc).__name__}: {exc}"[:200]) from None
    if type(value) is not np.ndarray:
        raise TensorError(clause, f"{what} is not a numpy array", got=type(value).__name__)
    if value.dtype.kind in ("O", "V"):
        raise TensorError(clause, f"{what} is an object or void array, not wire data",
                          got=value.dtype.str)
    return value


def tensor_from_array(array: np.ndarray, mode: TensorMode, clause: str) -> Any:
    """The tensor (``mode`` ``torch``) or :class:`WireTensor` over ``array``'s C-order bytes
    (a copy: the tensor owns its memory); an array whose dtype torch lacks raises ``clause``."""
    name = NUMPY_TO_TORCH.get(array.dtype.str)
    if name is None:
        raise TensorError(clause, "torch has no dtype for this numpy dtype",
                          expected=sorted(NUMPY_TO_TORCH), got=array.dtype.str)
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one.)
    array = array if array.flags.c_contiguous else array.copy(order="C")
    if mode == "wire":
        return WireTensor(name, array.shape, array.tobytes())
    return _torch().from_numpy(array.copy())
