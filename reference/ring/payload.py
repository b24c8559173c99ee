"""Payload codecs: how an object becomes the buffers of one ring message, and back.

A codec turns an object into ``[main, oob_1, ..., oob_n]`` (see :mod:`.framing`) and back.

- :class:`PickleCodec` produces the bytes vLLM's ``MessageQueue`` produces and reads what it
  writes: pickle protocol 5 with a ``buffer_callback`` that sends every ``PickleBuffer`` of
  1 MiB or more out of band (clause ring.payload.oob-threshold), and CPU tensors reduced to
  ``_rebuild_tensor(PickleBuffer(bytes), shape, dtype_name)`` the way vLLM reduces them
  (clause ring.payload.tensor-reducer). It never imports vLLM: vLLM's rebuild function is
  named in the stream through ``importlib.import_module`` and, when reading, both spellings are
  mapped to :func:`rebuild_tensor`. Numpy arrays are the one difference from vLLM's bytes:
  numpy's own reduction with the dtype spelled as a string (:func:`_array_reducer`), which
  every reader turns into the same array, at a third of the cost.
- :class:`MsgspecCodec` is a fast path between enginewire peers only: one msgpack buffer.

Unpickling runs code chosen by whoever wrote the bytes (clause ring.payload.trusted-only, vLLM
issue 29565). So :class:`PickleCodec` reads with an allow-list of globals by default
(:mod:`.allowlist`, clause ring.payload.pickle-allow-list): a stream naming any other global
raises :class:`~enginewire.reference.errors.UnsafePickleError` and runs nothing.
``PickleCodec(trusted=True)`` (codec name ``"pickle-trusted"``) opts into unpickling anything,
for processes that trust each other.
"""

from __future__ import annotations

import copyreg
import importlib
import io
import pickle
import pickletools
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from pickle import PickleBuffer
from types import SimpleNamespace
from typing import Any, Protocol, cast

import msgspec

from enginewire.spec import load

from ..errors import PayloadError, UnsafePickleError
from .allowlist import AllowList, guarded_getattr, guarded_import, spec_entries
from .framing import Buffer

#: PickleBuffers of at least this many bytes travel out of band.
OOB_THRESHOLD_BYTES = load().ring_constant("oob_threshold_bytes", int)
#: The module holding vLLM's tensor rebuild function.
VLLM_SHM_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
VLLM_REBUILD_NAME = "_rebuild_tensor"
#: A pickle stream naming vLLM's rebuild function (either spelling) contains these bytes.
_VLLM_MODULE_BYTES = VLLM_SHM_MODULE.encode()
#: The opcodes through which a pickle stream gets hold of a global (and so of anything it can
#: call): GLOBAL, INST, STACK_GLOBAL, EXT1, EXT2, EXT4. A stream none of whose bytes is one of
#: them builds plain data only (REDUCE, BUILD, OBJ and NEWOBJ need a callable or class from one).
_GLOBAL_OPCODES = (0x63, 0x69, 0x93, 0x82, 0x83, 0x84)


def _names_no_global(data: bytes) -> bool:
    """True when no byte of ``data`` is a global-loading opcode (one memchr per opcode: an
    int operand makes ``in`` search for one byte)."""
    return not (0x63 in data or 0x69 in data or 0x93 in data
                or 0x82 in data or 0x83 in data or 0x84 in data)
#: The opcodes a stream of plain data may hold. Left out: every opcode that loads a global or
#: needs a callable (GLOBAL, INST, STACK_GLOBAL, EXT*, REDUCE, BUILD, OBJ, NEWOBJ*, the
#: persistent ids) and the text opcodes of protocol 0, so the walk below gives up on them and
#: the allow-list decides.
_PLAIN_OPCODES = [
    op for op in pickletools.opcodes
    if op.name not in ("GLOBAL", "INST", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4", "REDUCE",
                       "BUILD", "OBJ", "NEWOBJ", "NEWOBJ_EX", "PERSID", "BINPERSID")
    and (op.arg is None or op.arg.n != pickletools.UP_TO_NEWLINE)]
#: pickletools' length-prefixed argument kinds -> (width of the length, signed).
_LENGTH_PREFIX = {pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
                  pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
                  pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
                  pickletools.TAKEN_FROM_ARGUMENT8U: (8, False)}
#: Indexed by opcode byte: None (not plain), the argument's byte count (0: none), or
#: ``(width, signed)`` of its length prefix.
_ARGUMENT: list[int | tuple[int, bool] | None] = [None] * 256
for _op in _PLAIN_OPCODES:
    _n = 0 if _op.arg is None else _op.arg.n
    _ARGUMENT[ord(_op.code)] = _n if _n >= 0 else _LENGTH_PREFIX[_n]
_STOP = ord(pickle.STOP)
#: The walk gives up after this many opcodes (a long stream of small items costs more to walk
#: in Python than the allow-listed unpickler costs).
WALK_OPCODES_MAX = 32


def _opcodes_no_global(data: bytes) -> bool:
    """True when ``data``'s opcodes, read as the unpickler reads them up to STOP, are all plain
    (:data:`_PLAIN_OPCODES`): then unpickling it builds plain data only and calls nothing.

    The byte scan :func:`_names_no_global` refuses a stream in which a global opcode's byte
    appears anywhere, also inside a binary argument (random bytes, an array's contents); this
    walk skips the arguments, so a stream of a few opcodes carrying binary data passes. False
    whenever it is unsure: an opcode outside the set, a negative length, the end of the data
    before STOP, more than :data:`WALK_OPCODES_MAX` opcodes.
    """
    position = 0
    end = len(data)
    arguments = _ARGUMENT
    for _ in range(WALK_OPCODES_MAX):
        if position >= end:
            return False
        code = data[position]
        if code == _STOP:
            return True
        argument = arguments[code]
        if argument is None:
            return False
        position += 1
        if type(argument) is int:
            position += argument
            continue
        width, signed = argument  # type: ignore[misc]
        length = int.from_bytes(data[position:position + width], "little", signed=signed)
        if length < 0:
            return False
        position += width + length
    return False


#: The opcodes that push one bytes, bytearray or str object, with the struct of their length
#: prefix (all unsigned: pickletools' uint1, uint4 and uint8 lengths).
_LEAF_OPCODES = tuple((code, struct.Struct(fmt)) for code, fmt in (
    (pickle.BYTEARRAY8, "<Q"), (pickle.BINBYTES, "<I"), (pickle.BINUNICODE, "<I"),
    (pickle.SHORT_BINBYTES, "<B"), (pickle.SHORT_BINUNICODE, "<B"), (pickle.BINBYTES8, "<Q"),
    (pickle.BINUNICODE8, "<Q")))
_FRAME_LENGTH = struct.Struct("<Q")
#: PROTO, version, FRAME and its length: the bytes before the first opcode of a frame.
_FRAMED_BYTES = 11
#: By stream length: the heads a leaf stream of that length starts with, ending in MEMOIZE,
#: STOP and in STOP alone (see :func:`_leaf_heads`).
_LEAF_HEADS: dict[int, tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}


def _leaf_heads(total: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """Every head ``PROTO v, FRAME total-11, opcode, length`` (v 4 or 5) of a stream of
    ``total`` bytes that holds one bytes, bytearray or str object: those whose object is
    followed by MEMOIZE and STOP, and those followed by STOP alone. The length follows from
    the total, so a stream that starts with one of them and ends so is exactly that object."""
    heads = _LEAF_HEADS.get(total)
    if heads is None:
        if len(_LEAF_HEADS) >= 4096:
            _LEAF_HEADS.clear()
        memoized_heads: list[bytes] = []
        plain_heads: list[bytes] = []
        frame = _FRAME_LENGTH.pack(max(0, total - _FRAMED_BYTES))
        for memoized, found in ((1, memoized_heads), (0, plain_heads)):
            for code, length in _LEAF_OPCODES:
                size = total - _FRAMED_BYTES - 1 - length.size - memoized - 1
                if 0 <= size < 1 << (8 * length.size):
                    for version in (5, 4):
                        found.append(pickle.PROTO + bytes((version,)) + pickle.FRAME + frame
                                     + code + length.pack(size))
        heads = _LEAF_HEADS[total] = (tuple(memoized_heads), tuple(plain_heads))
    return heads


_MEMOIZE_STOP = pickle.MEMOIZE + pickle.STOP


def leaf_stream(data: bytes) -> bool:
    """True when ``data`` is exactly ``PROTO v, FRAME n, <one bytes, bytearray or str opcode
    and its data>, [MEMOIZE], STOP``: the stream ``pickle.dumps`` makes of one such object
    (clause ring.payload.pickle-allow-list: it builds that object and calls nothing).

    The shape of the common small message recognised by comparing the stream's head with the
    heads a stream of its length can have (C comparisons, no loop in Python); False for any
    other stream (:func:`_opcodes_no_global` then decides).
    """
    memoized, plain = _LEAF_HEADS.get(len(data)) or _leaf_heads(len(data))
    return ((data.endswith(_MEMOIZE_STOP) and data.startswith(memoized))
            or (data.endswith(pickle.STOP) and data.startswith(plain)))


#: In-band streams up to this size are copied and searched for vLLM's module name, so that
#: the common stream is unpickled by ``pickle.loads``; longer ones are read in place.
SCAN_BYTES_MAX = 16 * 1024


class PayloadCodec(Protocol):
    """Turns objects into message buffers and back."""

    name: str

    def encode(self, obj: Any) -> list[Buffer]:
        """``[main, oob...]``; every item a C-contiguous bytes-like object."""
        ...

    def decode(self, main: Buffer, oob: Sequence[Buffer]) -> Any:
        """The object; ``oob`` are owned copies the result may keep."""
        ...


def rebuild_tensor(buf: Any, shape: tuple[int, ...], dtype_name: str) -> Any:
    """Rebuild a CPU tensor from its raw bytes (the counterpart of the tensor reducer).

    ``buf`` is whatever pickle hands over for the out-of-band or in-band buffer: a
    ``bytearray`` (owned, used as storage without a copy) or any other bytes-like object
    (copied, so the tensor is writable and outlives the ring slot or socket frame).
    """
    import torch

    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise PayloadError("ring.payload.tensor-reducer", "unknown torch dtype name",
                           expected="a torch dtype name such as 'float16'", got=dtype_name)
    raw = buf if isinstance(buf, bytearray) else bytearray(memoryview(buf).cast("B"))
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape)


class _VllmModuleRef:
    """Pickles as ``importlib.import_module(VLLM_SHM_MODULE)``."""


class _VllmRebuildRef:
    """Pickles as ``getattr(importlib.import_module(VLLM_SHM_MODULE), "_rebuild_tensor")``.

    Calling it (when a stream written here is read back without the mapping) rebuilds locally.
    """

    def __call__(self, buf: Any, shape: tuple[int, ...], dtype_name: str) -> Any:
        return rebuild_tensor(buf, shape, dtype_name)


_MODULE_REF = _VllmModuleRef()
_REBUILD_REF = _VllmRebuildRef()
_VLLM_SHIM = SimpleNamespace(**{VLLM_REBUILD_NAME: rebuild_tensor})


def _reduce_module_ref(_: _VllmModuleRef) -> tuple[Any, tuple[str]]:
    return importlib.import_module, (VLLM_SHM_MODULE,)


def _reduce_rebuild_ref(_: _VllmRebuildRef) -> tuple[Any, tuple[Any, str]]:
    return getattr, (_MODULE_REF, VLLM_REBUILD_NAME)


def _reduce_tensor(tensor: Any) -> tuple[Any, ...]:
    """vLLM's tensor reduction: dense CPU tensors without grad go out as raw bytes."""
    import torch

    if tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.requires_grad:
        try:
            raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
        except RuntimeError:
            pass  # tensors that cannot be viewed as bytes (conjugate bit ...): torch's own way
        else:
            dtype_name = str(tensor.dtype).removeprefix("torch.")
            return _REBUILD_REF, (PickleBuffer(raw), tuple(tensor.shape), dtype_name)
    return cast("tuple[Any, ...]", tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL))


#: How many dtypes an array reducer remembers the spelling of (then it starts again).
_SPELLINGS_MAX = 256


def _array_reducer(numpy: Any) -> Callable[[Any], tuple[Any, ...]] | None:
    """The ring pickler's reducer for numpy arrays: numpy's own reduction under protocol 5
    (``numpy._core.numeric._frombuffer(PickleBuffer(array), dtype, shape, order)``, so large
    arrays go out of band) with the dtype spelled as its ``dtype.str`` (``'<f4'``), as vLLM
    spells a tensor's dtype by its name; None where this numpy reduces arrays another way.

    Pickling the dtype object is most of the cost of pickling an array: a global, a call and
    a state tuple, rebuilt by ``dtype.__setstate__`` on the other end, some 5 µs per message
    either side. ``frombuffer`` takes the string and makes the equal dtype, so any reader,
    vLLM's ``pickle.loads`` included, rebuilds the same array (tests/test_ring_interop.py).
    Arrays numpy would not hand over as a buffer (not contiguous, a subclass, objects,
    datetimes), and dtypes whose string does not make them again (structured, with metadata),
    get numpy's own reduction.
    """
    rebuild = numpy.ones(1).__reduce_ex__(pickle.HIGHEST_PROTOCOL)[0]
    if getattr(rebuild, "__name__", None) != "_frombuffer":
        return None
    make_dtype, empty = numpy.dtype, numpy.empty
    #: id(dtype) -> (dtype, its spelling or None); the dtype is kept so that its id is not
    #: reused while the entry lives.
    spellings: dict[int, tuple[Any, str | None]] = {}

    def spelling(dtype: Any) -> str | None:
        if dtype.names is not None or dtype.subdtype is not None or dtype.metadata is not None:
            return None
        try:
            again = make_dtype(dtype.str)
            # numpy's own choice for the dtype (objects, datetimes and empty items are not
            # handed over as a buffer)
            numpys = empty(1, dtype).__reduce_ex__(pickle.HIGHEST_PROTOCOL)[0]
        except (TypeError, ValueError):
            return None
        if numpys is not rebuild or type(again) is not type(dtype) or again != dtype:
            return None
        return cast(str, dtype.str)

    def reduce_array(array: Any) -> tuple[Any, ...]:
        dtype = array.dtype
        known = spellings.get(id(dtype))
        if known is None or known[0] is not dtype:
            if len(spellings) >= _SPELLINGS_MAX:
                spellings.clear()
            known = spellings[id(dtype)] = (dtype, spelling(dtype))
        name = known[1]
        flags = array.flags
        if name is not None:
            if flags.c_contiguous:
                return rebuild, (PickleBuffer(array), name, array.shape, "C")
            if flags.f_contiguous:
                return rebuild, (PickleBuffer(array), name, array.shape, "F")
        return cast("tuple[Any, ...]", array.__reduce_ex__(pickle.HIGHEST_PROTOCOL))

    return reduce_array


def _import_module_mapped(name: str) -> Any:
    if name == VLLM_SHM_MODULE:
        return _VLLM_SHIM
    return importlib.import_module(name)


class _RingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == VLLM_SHM_MODULE and name == VLLM_REBUILD_NAME:
            return rebuild_tensor
        if module == "importlib" and name == "import_module":
            return _import_module_mapped
        return super().find_class(module, name)


def _load_storage_weights_only(data: bytes) -> Any:
    """``torch.storage._load_from_bytes`` through torch's own allow-list (weights_only)."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _safe_allow_list() -> AllowList:
    special = {
        ("torch.storage", "_load_from_bytes"): _load_storage_weights_only,
        (VLLM_SHM_MODULE, VLLM_REBUILD_NAME): rebuild_tensor,
        ("importlib", "import_module"): guarded_import({VLLM_SHM_MODULE: _VLLM_SHIM}),
        ("builtins", "getattr"): guarded_getattr({id(_VLLM_SHIM): frozenset({VLLM_REBUILD_NAME})}),
    }
    return AllowList(spec_entries(), special)


_SAFE: AllowList | None = None


def safe_allow_list() -> AllowList:
    """The allow-list of the spec, with the stand-ins for vLLM's tensor rebuild (shared)."""
    global _SAFE
    if _SAFE is None:
        _SAFE = _safe_allow_list()
    return _SAFE


class _SafeUnpickler(pickle.Unpickler):
    """Resolves globals through an allow-list only: :func:`_safe_load` sets the instance's
    ``find_class`` (a Python ``__init__`` would cost a frame per message); without it, every
    global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError("ring.payload.pickle-allow-list", "no allow-list was given",
                                expected="a global of the allow-list", got=f"{module}.{name}")


def _safe_load(file: Any, oob: Sequence[Buffer], allow: AllowList) -> Any:
    """Unpickle from ``file`` resolving globals through ``allow`` only."""
    unpickler = _SafeUnpickler(file, buffers=oob)
    unpickler.find_class = allow.find_class  # type: ignore[method-assign]
    return unpickler.load()


def _loads_a_global_first(data: bytes) -> bool:
    """True when a framed stream's first opcodes are two memoized short strings and
    STACK_GLOBAL: what a protocol 4 or 5 pickler writes first for an object it reduces
    through a global (an instance of a class, an array). Such a stream loads a global, so
    the checks for streams that load none (:func:`leaf_stream`, :func:`_names_no_global`,
    :func:`_opcodes_no_global`) would all fail: the allow-list decides at once.

    False for any other stream (the checks then run): a shortcut, never a verdict on safety.
    """
    at = _FRAMED_BYTES
    if len(data) < at + 8 or data[0] != 0x80 or data[2] != 0x95 or data[at] != 0x8C:
        return False
    at += 2 + data[at + 1]
    if data[at:at + 2] != b"\x94\x8c" or at + 3 >= len(data):
        return False
    at += 3 + data[at + 2]
    return data[at:at + 2] == b"\x94\x93"


class _ViewReader:
    """A read-only file over a buffer, for :class:`pickle.Unpickler`: ``readinto`` lets the
    unpickler copy a large in-band buffer straight from the slot into its final object."""

    __slots__ = ("_view", "_pos")

    def __init__(self, buffer: Buffer) -> None:
        view = memoryview(buffer)
        self._view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        start = self._pos
        end = len(self._view) if size < 0 else min(start + size, len(self._view))
        self._pos = end
        return self._view[start:end].tobytes()

    def readinto(self, target: Buffer) -> int:
        out = memoryview(target).cast("B")
        start = self._pos
        count = min(len(out), len(self._view) - start)
        out[:count] = self._view[start:start + count]
        self._pos = start + count
        return count

    def readline(self) -> bytes:
        rest = self._view[self._pos:].tobytes()  # text opcodes only (protocols 0 and 1)
        end = rest.find(b"\n")
        line = rest if end < 0 else rest[:end + 1]
        self._pos += len(line)
        return line


class _Output(list):  # type: ignore[type-arg]
    """The file a pickler writes one message to: the pieces it wrote, in order."""

    write = list.append


class _Pickling:
    """One thread's pickler, kept from message to message: building a ``Pickler`` and its
    dispatch table costs several times more than pickling a small message.

    The table is copyreg's as it was when this object was made, plus the tensor reducers when
    torch is imported; :meth:`current` says whether either has changed since.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.output = _Output()
        #: The message's buffers while a message is being pickled (None: the pickler is free).
        self.buffers: list[Buffer] | None = None
        self.copyreg_seen = dict(copyreg.dispatch_table)
        self.torch = sys.modules.get("torch")
        self.numpy = sys.modules.get("numpy")
        table = dict(self.copyreg_seen)
        if self.torch is not None:
            table[self.torch.Tensor] = _reduce_tensor
            table[_VllmRebuildRef] = _reduce_rebuild_ref
            table[_VllmModuleRef] = _reduce_module_ref
        if self.numpy is not None and self.numpy.ndarray not in table:
            reduce_array = _array_reducer(self.numpy)
            if reduce_array is not None:
                table[self.numpy.ndarray] = reduce_array
        self.pickler = pickle.Pickler(self.output, protocol=pickle.HIGHEST_PROTOCOL,
                                      buffer_callback=self.out_of_band)
        self.pickler.dispatch_table = table
        self.dump = self.pickler.dump
        self.clear_memo = self.pickler.clear_memo

    def current(self) -> bool:
        modules = sys.modules
        return (modules.get("torch") is self.torch and modules.get("numpy") is self.numpy
                and copyreg.dispatch_table == self.copyreg_seen)

    def out_of_band(self, buffer: PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < self.threshold:
            return True  # serialise in band
        self.buffers.append(raw)  # type: ignore[union-attr]
        return False


#: Objects that pickle as one opcode and its argument, with no reducer, no out-of-band buffer
#: and nothing inside them that could have either (bytes and bytearray are written in band by
#: every pickler: only a ``PickleBuffer`` reaches ``buffer_callback``).
PLAIN_LEAF_TYPES = frozenset({bytes, bytearray, str, int, float, bool, type(None)})
_dumps = pickle.dumps


class PickleCodec:
    """vLLM-compatible pickle payloads (protocol 5, out-of-band buffers >= ``oob_threshold``).

    Decoding resolves only the globals of the spec's allow-list unless ``trusted`` is set
    (clause ring.payload.pickle-allow-list).
    """

    name = "pickle"

    def __init__(self, oob_threshold: int = OOB_THRESHOLD_BYTES, *,
                 trusted: bool = False) -> None:
        self.oob_threshold = oob_threshold
        self.trusted = trusted
        self._allow = None if trusted else safe_allow_list()
        self._local = threading.local()

    def encode(self, obj: Any) -> list[Buffer]:
        if type(obj) in PLAIN_LEAF_TYPES:
            # Nothing in it can reach the dispatch table or the buffer callback: pickle.dumps
            # writes the bytes the kept pickler would (tests/test_ring_queue.py compares them)
            # without its per-message bookkeeping.
            return [_dumps(obj, pickle.HIGHEST_PROTOCOL)]
        local = self._local
        pickling = getattr(local, "pickling", None)
        if pickling is None or not pickling.current():
            pickling = local.pickling = _Pickling(self.oob_threshold)
        elif pickling.buffers is not None:
            pickling = _Pickling(self.oob_threshold)  # a reducer pickling a message itself
        pickling.buffers = buffers = [b""]
        output = pickling.output
        try:
            pickling.dump(obj)
            buffers[0] = output[0] if len(output) == 1 else b"".join(output)
        except RecursionError:
            local.pickling = None
            raise PayloadError("ring.payload.codec", "the object nests too deep to pickle",
                               got=type(obj).__name__) from None
        except BaseException:
            local.pickling = None  # start the next message from a fresh pickler
            raise
        finally:
            output.clear()
            pickling.clear_memo()  # the memo would keep the message's objects alive
            pickling.buffers = None
        return buffers

    def decode(self, main: Buffer, oob: Sequence[Buffer]) -> Any:
        allow = self._allow
        if allow is not None:
            if type(main) is bytes:
                data = main
            elif (main.nbytes if type(main) is memoryview
                  else memoryview(main).nbytes) <= SCAN_BYTES_MAX:
                data = bytes(main)
            else:
                return _safe_load(_ViewReader(main), oob, allow)
            if (not _loads_a_global_first(data)
                    and (leaf_stream(data) or _names_no_global(data)
                         or _opcodes_no_global(data))):
                # One bytes or str object, or no opcode that loads a global: nothing in the
                # stream can be called, so the C unpickler's fast path is as safe as the
                # allow-list. The checks read a private copy: the writer cannot change what
                # was checked before it is unpickled.
                return pickle.loads(data, buffers=oob) if oob else pickle.loads(data)
            return _safe_load(io.BytesIO(data), oob, allow)
        if type(main) is bytes:
            data = main
        elif type(main) is memoryview and main.nbytes <= SCAN_BYTES_MAX:
            data = main.tobytes()
        elif memoryview(main).nbytes <= SCAN_BYTES_MAX:
            data = bytes(main)
        else:
            # Copying a large stream to search it costs more than unpickling it with the
            # mapping: unpickle from the buffer itself.
            return _RingUnpickler(_ViewReader(main), buffers=oob).load()
        if data.find(_VLLM_MODULE_BYTES) < 0:  # find: faster than `in` for this needle
            return pickle.loads(data, buffers=oob) if oob else pickle.loads(data)
        # Only streams that name vLLM's tensor rebuild need the mapping (and its slower path).
        with io.BytesIO(data) as stream:
            return _RingUnpickler(stream, buffers=oob).load()


class MsgspecCodec:
    """One msgpack buffer per message (msgspec): fast, for enginewire peers only.

    ``type`` is the type the decoder validates against (default: any msgpack value).
    """

    name = "msgspec"

    def __init__(self, type: Any = Any) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(type)

    def encode(self, obj: Any) -> list[Buffer]:
        try:
            return [self._encoder.encode(obj)]
        except RecursionError:
            raise PayloadError("ring.payload.codec", "the object nests too deep to encode",
                               got=type(obj).__name__) from None

    def decode(self, main: Buffer, oob: Sequence[Buffer]) -> Any:
        if oob:
            raise PayloadError("ring.payload.codec", "the msgspec codec uses one buffer",
                               expected=1, got=1 + len(oob))
        try:
            return self._decoder.decode(main)
        except msgspec.DecodeError as exc:
            raise PayloadError("ring.payload.codec", f"not a msgpack payload: {exc}") from None
        except RecursionError:
            raise PayloadError("ring.payload.codec", "the payload nests too deep to decode"
                               ) from None


def get_codec(codec: str | PayloadCodec) -> PayloadCodec:
    """A codec instance from a name (``"pickle"``, ``"msgspec"``) or the instance itself."""
    if isinstance(codec, str):
        if codec == "pickle":
            return PickleCodec()
        if codec == "pickle-trusted":
            return PickleCodec(trusted=True)
        if codec == "msgspec":
            return MsgspecCodec()
        raise PayloadError("ring.payload.codec", "unknown codec name",
                           expected="'pickle', 'pickle-trusted' or 'msgspec'", got=codec)
    return codec
