"""ring/writer/chunk-framing compares every count and length prefix with the real buffers,
bounds-checked: it passes the reference and fails writers whose framing is wrong in ways a
lenient reader (slice by the prefix, unpickle) does not notice."""

from __future__ import annotations

import array
import struct
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginewire.conformance.framework.outcomes import FAILED, PASSED
from enginewire.conformance.framework.registry import all_checks, select
from enginewire.conformance.framework.runner import run
from enginewire.conformance.peers.ring_peer import (
    frame_chunk,
    framing_differences,
    parse_chunk,
    pickle_buffers,
    unpickle_buffers,
)
from enginewire.conformance.targets.contract import Target
from enginewire.fuzz.mutants.ring_mutants import (
    LengthPrefixOffByOne,
    LittleEndianLengths,
    MutantRing,
    _FramingQueue,
)
from enginewire.reference.ring.framing import HEADER_BYTES, IN_RING, LENGTH_BYTES, Buffer, nbytes
from enginewire.spec import load

CHECK = "ring/writer/chunk-framing"


def write_lengths_little_endian(write: Any, buffers: Sequence[Buffer], base: int = 0) -> int:
    """The spec's framing with a big-endian buffer count but little-endian length prefixes."""
    write(base, struct.pack(">BH", IN_RING, len(buffers)) + struct.pack("<I", nbytes(buffers[0])))
    offset = HEADER_BYTES + LENGTH_BYTES
    write(base + offset, buffers[0])
    offset += nbytes(buffers[0])
    for buffer in buffers[1:]:
        write(base + offset, struct.pack("<I", nbytes(buffer)))
        offset += LENGTH_BYTES
        write(base + offset, buffer)
        offset += nbytes(buffer)
    return offset


class LengthsOnlyLittleEndian(_FramingQueue):
    chunk_writer = staticmethod(write_lengths_little_endian)


def _verdict(queue_cls: type) -> Any:
    (item,) = select(all_checks(), patterns=[CHECK])
    target = Target(name="framing", ring=MutantRing(queue_cls=queue_cls))
    try:
        (result,) = run([item], target, load()).results
    finally:
        target.close()
    return result


def test_the_reference_writer_passes() -> None:
    from enginewire.reference.ring.queue import MessageQueue

    assert _verdict(MessageQueue).status == PASSED


@pytest.mark.parametrize(("queue_cls", "words"), [
    (LittleEndianLengths, "little-endian"),
    (LengthsOnlyLittleEndian, "runs past the end"),
    (LengthPrefixOffByOne, "the buffer is"),
])
def test_a_wrong_prefix_fails(queue_cls: type, words: str) -> None:
    result = _verdict(queue_cls)
    assert result.status == FAILED, result.first_line
    assert words in result.first_line


def test_a_lenient_reader_does_not_see_a_little_endian_length() -> None:
    """What the check used to do (slice by the prefix, unpickle) passes both broken chunks;
    framing_differences names each."""
    message = {"method": "execute_model", "args": [1, 2, 3]}
    buffers = pickle_buffers(message)
    for writer in (write_lengths_little_endian,
                   LengthPrefixOffByOne.chunk_writer):
        chunk = bytearray(4096)

        def write(at: int, data: Any, chunk: bytearray = chunk) -> None:
            chunk[at:at + len(bytes(data))] = bytes(data)

        writer(write, buffers)
        length = int.from_bytes(chunk[3:7], "big")
        assert unpickle_buffers([bytes(chunk[7:7 + length])]) == message  # lenient: passes
        assert framing_differences(chunk, [None]), writer


def test_framing_differences_walks_every_buffer() -> None:
    first, second = b"\x01" * 40, b"\x02" * 50
    main = pickle_buffers({"a": 1})[0]
    good = frame_chunk([main, first, second]) + bytes(16)
    assert framing_differences(good, [None, first, second]) == []
    assert parse_chunk(good, len(good)) == [main, first, second]
    wrong = bytearray(good)
    at = HEADER_BYTES + LENGTH_BYTES + len(main)
    wrong[at:at + LENGTH_BYTES] = (41).to_bytes(4, "big")
    problems = [w for _, w in framing_differences(wrong, [None, first, second])]
    assert problems == [f"buffer 1's length prefix (bytes {7 + len(main)}-{10 + len(main)}) "
                        "says 41 bytes; the buffer is 40 bytes"]
    short = good[:HEADER_BYTES + LENGTH_BYTES + len(main) + LENGTH_BYTES + 20]
    problems = [w for _, w in framing_differences(short, [None, first, second])]
    assert any("runs past the end" in p for p in problems)
    assert framing_differences(good, [None, first])[0][0] == "ring.framing.buffer-count"


def test_single_copy_copies_the_one_buffer_of_a_small_chunk_and_nothing_else() -> None:
    """single_copy == bytes(single_buffer(chunk)) for a one-buffer chunk within the limit, and
    None (the views' path decides) for every other chunk."""
    from enginewire.reference.ring.framing import (
        encode_chunk,
        encode_overflow,
        single_buffer,
        single_copy,
    )

    def chunk(data: bytes, size: int = 64) -> memoryview:
        return memoryview(bytearray(data.ljust(size, b"\xee")))

    for body in (b"", b"a", b"z" * 50):
        view = single_buffer(chunk(encode_chunk([body])))
        assert view is not None
        assert single_copy(chunk(encode_chunk([body])), 50) == bytes(view) == body
        view.release()
    assert single_copy(chunk(encode_chunk([b"z" * 50])), 49) is None  # over the limit
    assert single_copy(chunk(encode_chunk([b"a", b"b"])), 50) is None  # two buffers
    assert single_copy(chunk(encode_overflow()), 50) is None
    assert single_copy(chunk(encode_chunk([b"z" * 50]))[:56], 100) is None  # runs past
    assert single_copy(memoryview(bytearray(3)), 100) is None  # shorter than the head


_PIECES = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=300).map(bytearray),
    st.binary(max_size=300).map(memoryview),
    st.lists(st.integers(-2**31, 2**31 - 1), max_size=40).map(
        lambda values: array.array("i", values)),  # items wider than a byte
)


@given(st.lists(_PIECES, min_size=2, max_size=6))
def test_split_head_is_the_chunk_in_two_pieces(buffers: list[Any]) -> None:
    """split_head's head followed by its body (the last buffer, uncopied) is the chunk
    write_chunk frames: what try_publish writes for a message of several buffers."""
    from enginewire.reference.ring.framing import LEADING_BYTES_MAX, encode_chunk, split_head

    parts = split_head(buffers)
    leading = sum(nbytes(buffer) for buffer in buffers[:-1])
    if leading > LEADING_BYTES_MAX:
        assert parts is None
        return
    assert parts is not None
    head, body = parts
    assert body is buffers[-1]
    assert head + memoryview(body).cast("B").tobytes() == encode_chunk(buffers)


def test_split_head_leaves_one_buffer_and_large_leading_buffers_to_the_steps() -> None:
    from enginewire.reference.ring.framing import LEADING_BYTES_MAX, split_head

    assert split_head([b"only"]) is None  # one buffer: single_head's message
    assert split_head([]) is None
    assert split_head([b"x" * (LEADING_BYTES_MAX + 1), b"oob"]) is None
    assert split_head([b"x" * LEADING_BYTES_MAX, b"oob"]) is not None
    assert split_head([b"x" * (LEADING_BYTES_MAX // 2), b"y" * (LEADING_BYTES_MAX // 2 + 1),
                       b"oob"]) is None
