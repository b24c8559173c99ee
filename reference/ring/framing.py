"""Chunk framing, sans-IO: how a message's buffers sit inside one ring chunk.

A message is a list of buffers: buffer 0 is the main payload (a pickle stream in vLLM), every
further buffer is an out-of-band buffer. A chunk carries either the message itself or, when it
does not fit, only an overflow marker (the buffers then travel over the writer's XPUB socket)::

    in-ring : | 0x00 | count (2, big-endian) | len0 (4, BE) | buf0 | len1 (4, BE) | buf1 | ...
    overflow: | 0x01 | (rest of the chunk is stale and meaningless)

``count`` includes the main buffer. A message overflows when
``6 + sum(4 + len(oob)) + len(main) >= max_chunk_bytes``, which is exactly "the framed size
``7 + len(main) + sum(4 + len(oob))`` exceeds the chunk": a message whose framed size equals
``max_chunk_bytes`` still fits.

Spec: the ``framing`` table and the ``ring.framing.*`` clauses of ``spec/data/ring.toml``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from enginewire.spec import load

from ..errors import RingError

_SPEC = load()

#: Byte 0 of an in-ring chunk.
IN_RING = 0
#: Byte 0 of an overflow chunk.
OVERFLOW = 1
#: Overflow byte plus the 2-byte buffer count (ring.constants).
HEADER_BYTES: int = _SPEC.ring_constant("in_ring_header_bytes", int)
#: Width of the big-endian length in front of every buffer.
LENGTH_BYTES: int = _SPEC.ring_constant("buffer_length_bytes", int)
#: The base of vLLM's overflow test: 2 count bytes plus the main buffer's 4 length bytes.
OVERFLOW_BASE: int = _SPEC.ring_constant("overflow_total_base", int)
MAX_BUFFERS = 0xFFFF
MAX_BUFFER_BYTES = 0xFFFFFFFF

#: Any bytes-like object exposing a C-contiguous byte buffer.
Buffer = Any

_HEADER = struct.Struct(">BHI")  # overflow byte, count, length of buffer 0
#: Where buffer 0 starts in an in-ring chunk.
FIRST_DATA = _FIRST_DATA = HEADER_BYTES + LENGTH_BYTES
_LENGTH = struct.Struct(">I")
#: ``unpack_head(buffer, offset)``: (marker, count, length of buffer 0) of the chunk whose
#: first :data:`FIRST_DATA` bytes start at ``offset``.
unpack_head = _HEADER.unpack_from


def nbytes(buffer: Buffer) -> int:
    """Length in bytes of a bytes-like object (``len`` of a memoryview counts items)."""
    if isinstance(buffer, bytes | bytearray):
        return len(buffer)
    return memoryview(buffer).nbytes


def overflow_total(buffers: Sequence[Buffer]) -> int:
    """vLLM's ``total_bytes + len(main)``: ``6 + sum(4 + len(oob)) + len(main)``."""
    total = OVERFLOW_BASE + nbytes(buffers[0])
    for buffer in buffers[1:]:
        total += LENGTH_BYTES + nbytes(buffer)
    return total


def framed_size(buffers: Sequence[Buffer]) -> int:
    """Bytes an in-ring chunk needs for ``buffers``: ``3 + sum(4 + len(b))``."""
    return HEADER_BYTES + sum(LENGTH_BYTES + nbytes(b) for b in buffers)


def needs_overflow(buffers: Sequence[Buffer], max_chunk_bytes: int) -> bool:
    """True when the message must go over the XPUB socket (clause ring.framing.overflow-condition).

    The comparison is ``>=`` on vLLM's total, i.e. ``framed_size(buffers) > max_chunk_bytes``.
    """
    if len(buffers) == 1 and type(buffers[0]) is bytes:
        return OVERFLOW_BASE + len(buffers[0]) >= max_chunk_bytes
    if not buffers:
        raise RingError("ring.framing.buffer-count", "a message has at least its main buffer",
                        expected=">= 1 buffer", got=0)
    return overflow_total(buffers) >= max_chunk_bytes


#: single_head's results by length: a ring's messages tend to repeat their sizes, and a
#: dictionary hit costs less than packing (bounded: cleared when it grows past 4096 lengths).
_HEADS: dict[int, bytes] = {}


#: ``cached_single_head(length)``: :func:`single_head`'s result for a length it has made
#: before, without a Python call; None for any other (then call :func:`single_head`).
cached_single_head: Callable[[int], bytes | None] = _HEADS.get


def single_head(length: int) -> bytes:
    """The first :data:`FIRST_DATA` bytes of an in-ring chunk holding one buffer of ``length``
    bytes (which follows them): what :func:`write_chunk` writes first for such a message."""
    head = _HEADS.get(length)
    if head is None:
        if len(_HEADS) >= 4096:
            _HEADS.clear()
        head = _HEADS[length] = _HEADER.pack(IN_RING, 1, length)
    return head


#: The most bytes :func:`split_head` copies into a head: the buffers in front of the last one
#: (a pickle stream in front of an array's out-of-band buffer) are joined to the framing so
#: that a message is written in two pieces; above this a join costs more than the writes.
LEADING_BYTES_MAX = 16 * 1024


def split_head(buffers: Sequence[Buffer]) -> tuple[bytes, Buffer] | None:
    """``(head, body)`` with ``head + body`` the in-ring chunk :func:`write_chunk` writes for a
    message of two or more buffers: the framing and every buffer but the last, joined, and the
    last buffer itself (uncopied). None where the buffers in front of the last hold more than
    :data:`LEADING_BYTES_MAX` bytes or the message cannot be framed (then
    :func:`write_chunk`, which says why). The caller checks :func:`needs_overflow` first.

    How a message with one large out-of-band buffer goes through the queue's one-call publish
    (``RingWriter.try_publish(head, body)``) like a one-buffer message.
    """
    count = len(buffers)
    if not 2 <= count <= MAX_BUFFERS:
        return None
    first = buffers[0]
    first_len = nbytes(first)
    pieces: list[Buffer] = [_HEADER.pack(IN_RING, count, first_len), first]
    leading = first_len
    for buffer in buffers[1:-1]:
        length = nbytes(buffer)
        leading += length
        pieces.append(_LENGTH.pack(length))
        pieces.append(buffer)
    if leading > LEADING_BYTES_MAX:
        return None
    body = buffers[-1]
    body_len = nbytes(body)
    if body_len > MAX_BUFFER_BYTES:
        return None
    pieces.append(_LENGTH.pack(body_len))
    return b"".join(pieces), body


def _check_encodable(buffers: Sequence[Buffer]) -> None:
    if not 1 <= len(buffers) <= MAX_BUFFERS:
        raise RingError("ring.framing.buffer-count",
                        "the buffer count (main buffer included) must fit in 2 bytes and be >= 1",
                        expected=f"1..{MAX_BUFFERS}", got=len(buffers))
    for index, buffer in enumerate(buffers):
        if nbytes(buffer) > MAX_BUFFER_BYTES:
            raise RingError("ring.framing.length-prefix",
                            f"buffer {index} is longer than a 4-byte length can say",
                            expected=f"<= {MAX_BUFFER_BYTES}", got=nbytes(buffer))


def write_chunk(write: Callable[[int, Buffer], None], buffers: Sequence[Buffer],
                base: int = 0) -> int:
    """Frame ``buffers`` as an in-ring chunk through ``write(offset, data)``; return its size.

    Offsets are ``base`` plus the position inside the chunk. The caller checks
    :func:`needs_overflow` first; this function does not know the chunk size.
    """
    if len(buffers) == 1 and type(buffers[0]) is bytes and len(buffers[0]) <= MAX_BUFFER_BYTES:
        # The common case, a pickle stream with nothing out of band.
        first = buffers[0]
        write(base, single_head(len(first)))
        write(base + _FIRST_DATA, first)
        return _FIRST_DATA + len(first)
    _check_encodable(buffers)
    first = buffers[0]
    first_len = nbytes(first)
    write(base, _HEADER.pack(IN_RING, len(buffers), first_len))
    offset = HEADER_BYTES + LENGTH_BYTES
    if first_len:
        write(base + offset, first)
    offset += first_len
    for buffer in buffers[1:]:
        length = nbytes(buffer)
        write(base + offset, _LENGTH.pack(length))
        offset += LENGTH_BYTES
        if length:
            write(base + offset, buffer)
        offset += length
    return offset


def encode_chunk(buffers: Sequence[Buffer]) -> bytes:
    """The in-ring chunk bytes for ``buffers`` (without the chunk's unused tail)."""
    out = bytearray(framed_size(buffers))

    def put(offset: int, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        out[offset:offset + view.nbytes] = view

    write_chunk(put, buffers)
    return bytes(out)


def encode_overflow() -> bytes:
    """The only meaningful byte of an overflow chunk."""
    return bytes((OVERFLOW,))


class DecodedChunk(NamedTuple):
    """A chunk read back: ``overflow`` or the message's buffers (views into the chunk)."""

    overflow: bool
    buffers: list[memoryview]


def single_buffer(chunk: memoryview) -> memoryview | None:
    """The one buffer of an in-ring chunk that holds exactly one (a zero-copy view: release it
    before the chunk), or None for any other chunk, for :func:`decode_chunk` to parse.

    The common case of the ring, parsed without building a :class:`DecodedChunk`. ``chunk``
    must be a one-dimensional memoryview of bytes (format ``B``).
    """
    if chunk.nbytes >= _FIRST_DATA:
        marker, count, length = _HEADER.unpack_from(chunk)
        if marker == IN_RING and count == 1 and _FIRST_DATA + length <= chunk.nbytes:
            return chunk[_FIRST_DATA:_FIRST_DATA + length]
    return None


def single_copy(chunk: memoryview, limit: int) -> bytes | None:
    """A copy of the one buffer of an in-ring chunk that holds exactly one of at most ``limit``
    bytes; None for any other chunk (then :func:`single_buffer` or :func:`decode_chunk`).

    The small common message in one copy and no view to release: a reader that must copy the
    stream before checking it (the allow-list, clause ring.payload.pickle-allow-list) copies it
    here. ``chunk`` as for :func:`single_buffer`.
    """
    if chunk.nbytes >= _FIRST_DATA:
        marker, count, length = _HEADER.unpack_from(chunk)
        end = _FIRST_DATA + length
        if marker == IN_RING and count == 1 and length <= limit and end <= chunk.nbytes:
            return chunk[_FIRST_DATA:end].tobytes()  # the slice dies with the statement
    return None


def decode_chunk(chunk: Buffer) -> DecodedChunk:
    """Parse one chunk. Buffers are zero-copy views into ``chunk``: copy them before release.

    Raises :class:`RingError` when byte 0 is neither 0 nor 1, when the count is 0, or when the
    count or a length runs past the end of the chunk.
    """
    view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    size = view.nbytes
    if size < 1:
        raise RingError("ring.framing.within-chunk", "empty chunk", expected=">= 1 byte", got=0)
    marker = view[0]
    if marker == OVERFLOW:
        return DecodedChunk(True, [])
    if marker != IN_RING:
        raise RingError("ring.framing.overflow-byte", "byte 0 of a chunk must be 0 or 1",
                        expected="0 or 1", got=marker)
    if size < HEADER_BYTES:
        raise RingError("ring.framing.within-chunk", "the buffer count runs past the chunk",
                        expected=f">= {HEADER_BYTES} bytes", got=size)
    count = int.from_bytes(view[1:HEADER_BYTES], "big")
    if count == 0:
        raise RingError("ring.framing.buffer-count",
                        "the buffer count includes the main buffer, so it is at least 1",
                        expected=">= 1", got=0)
    buffers: list[memoryview] = []
    offset = HEADER_BYTES
    try:
        for index in range(count):
            data_start = offset + LENGTH_BYTES
            if data_start > size:
                raise RingError("ring.framing.within-chunk",
                                f"the length of buffer {index} of {count} runs past the chunk",
                                expected=f"<= {size}", got=data_start)
            (length,) = _LENGTH.unpack_from(view, offset)
            end = data_start + length
            if end > size:
                raise RingError("ring.framing.within-chunk",
                                f"buffer {index} of {count} runs past the chunk",
                                expected=f"end <= {size}", got=end)
            buffers.append(view[data_start:end])
            offset = end
    except RingError:
        # A traceback keeps this frame alive: views left in it would pin shared memory.
        for buffer in buffers:
            buffer.release()
        buffers.clear()
        raise
    return DecodedChunk(False, buffers)
