"""Ring layout arithmetic and chunk framing (sans-IO), against the spec's ring surface."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginewire.reference.errors import RingError
from enginewire.reference.ring.framing import (
    OVERFLOW,
    decode_chunk,
    encode_chunk,
    encode_overflow,
    framed_size,
    needs_overflow,
    overflow_total,
    write_chunk,
)
from enginewire.reference.ring.layout import RingLayout
from enginewire.spec import load
from enginewire.spec.formulas import FormulaTable

RING = load().surface("ring")


# --- layout -------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_reader", "max_chunk_bytes", "max_chunks"),
                         [(1, 16, 1), (2, 16, 3), (3, 4096, 10), (7, 100, 4)])
def test_layout_matches_the_spec_formulas(n_reader: int, max_chunk_bytes: int,
                                          max_chunks: int) -> None:
    layout = RingLayout(n_reader, max_chunk_bytes, max_chunks)
    params = {"n_reader": n_reader, "max_chunk_bytes": max_chunk_bytes, "max_chunks": max_chunks}
    table = FormulaTable(RING.layout, params)
    assert layout.total_size == table.value("total_bytes")
    assert layout.metadata_size == table.value("metadata_size")
    assert layout.data_offset == table.value("data_offset")
    assert layout.metadata_offset == table.value("metadata_offset")
    for chunk in range(max_chunks):
        assert layout.chunk_offset(chunk) == table.value("chunk_offset", {"chunk": chunk})
        assert layout.metadata_row_offset(chunk) == table.value(
            "chunk_metadata_offset", {"chunk": chunk})
        assert layout.written_flag_offset(chunk) == table.value("written_flag", {"chunk": chunk})
        for reader in range(n_reader):
            assert layout.read_flag_offset(chunk, reader) == table.value(
                "read_flag", {"chunk": chunk, "reader": reader})


def test_layout_is_vllms_for_the_defaults() -> None:
    layout = RingLayout(4, RING.constants["max_chunk_bytes_default"],
                        RING.constants["max_chunks_default"])
    assert layout.total_size == (24 * 1024 * 1024 + 1 + 4) * 10
    assert layout.metadata_offset == 24 * 1024 * 1024 * 10
    assert layout.read_flag_offset(9, 3) == layout.total_size - 1


def test_every_byte_belongs_to_exactly_one_region() -> None:
    layout = RingLayout(2, 16, 3)
    owner: dict[int, str] = {}
    for chunk in range(3):
        for offset in range(layout.chunk_offset(chunk), layout.chunk_offset(chunk) + 16):
            assert offset not in owner
            owner[offset] = f"data {chunk}"
        owner[layout.written_flag_offset(chunk)] = f"written {chunk}"
        for reader in range(2):
            assert layout.read_flag_offset(chunk, reader) not in owner
            owner[layout.read_flag_offset(chunk, reader)] = f"read {chunk} {reader}"
    assert sorted(owner) == list(range(layout.total_size))


def test_indices_advance_modulo_max_chunks() -> None:
    layout = RingLayout(1, 8, 3)
    assert [layout.next_index(i) for i in range(3)] == [1, 2, 0]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_layout_rejects_non_positive_or_non_integer_sizes(bad: object) -> None:
    with pytest.raises(RingError) as info:
        RingLayout(1, bad, 4)  # type: ignore[arg-type]
    assert info.value.clause == "ring.layout.segment"


def test_layout_rejects_out_of_range_indices() -> None:
    layout = RingLayout(2, 8, 3)
    with pytest.raises(RingError, match="chunk index"):
        layout.chunk_offset(3)
    with pytest.raises(RingError, match="reader index"):
        layout.read_flag_offset(0, 2)


def test_buffer_handle_round_trips_and_rejects_garbage() -> None:
    layout = RingLayout(2, 64, 5)
    assert RingLayout.from_buffer_handle(layout.buffer_handle("psm_x")) == (layout, "psm_x")
    for bad in [(1, 2, 3), "psm", (1, 2, 3, 4), None]:
        with pytest.raises(RingError) as info:
            RingLayout.from_buffer_handle(bad)  # type: ignore[arg-type]
        assert info.value.clause == "ring.handle.fields"


# --- framing: the overflow boundary -------------------------------------------------------


def test_overflow_total_is_vllms_formula() -> None:
    buffers = [b"m" * 10, b"a" * 3, b"b" * 5]
    assert overflow_total(buffers) == 6 + (3 + 4) + (5 + 4) + 10
    assert framed_size(buffers) == overflow_total(buffers) + 1 == len(encode_chunk(buffers))


@pytest.mark.parametrize("oob", [[], [b"x" * 11], [b"", b"y" * 5]])
@pytest.mark.parametrize(("delta", "overflows"), [(-1, False), (0, False), (1, True)])
def test_overflow_boundary_in_framed_size(oob: list[bytes], delta: int, overflows: bool) -> None:
    """A message whose framed size equals the chunk still fits; one byte more overflows."""
    max_chunk_bytes = 256
    fixed = framed_size([b"", *oob])
    buffers = [b"m" * (max_chunk_bytes - fixed + delta), *oob]
    assert framed_size(buffers) == max_chunk_bytes + delta
    assert needs_overflow(buffers, max_chunk_bytes) is overflows


@pytest.mark.parametrize(("delta", "overflows"), [(-1, False), (0, True), (1, True)])
def test_overflow_boundary_in_vllms_total(delta: int, overflows: bool) -> None:
    """vLLM compares ``6 + sum(4 + len(oob)) + len(main) >= max_chunk_bytes``."""
    max_chunk_bytes = 100
    buffers = [b"m" * (max_chunk_bytes - 6 - 8 + delta), b"o" * 4]
    assert overflow_total(buffers) == max_chunk_bytes + delta
    assert needs_overflow(buffers, max_chunk_bytes) is overflows


def test_message_of_exactly_one_chunk_round_trips() -> None:
    buffers = [b"m" * 50, b"o" * 30]
    chunk = encode_chunk(buffers)
    assert not needs_overflow(buffers, len(chunk))
    decoded = decode_chunk(bytearray(chunk))
    assert not decoded.overflow
    assert [bytes(b) for b in decoded.buffers] == buffers


def test_needs_overflow_requires_a_main_buffer() -> None:
    with pytest.raises(RingError) as info:
        needs_overflow([], 100)
    assert info.value.clause == "ring.framing.buffer-count"


# --- framing: encode and decode -----------------------------------------------------------


def test_chunk_bytes_are_exactly_the_documented_framing() -> None:
    chunk = encode_chunk([b"abc", b"", b"\x01\x02"])
    assert chunk == (b"\x00" + b"\x00\x03" + b"\x00\x00\x00\x03abc" + b"\x00\x00\x00\x00"
                     + b"\x00\x00\x00\x02\x01\x02")
    assert encode_overflow() == bytes([OVERFLOW])


def test_count_and_lengths_are_big_endian() -> None:
    buffers = [b"x" * 0x0102] + [b""] * 0x0101
    chunk = encode_chunk(buffers)
    assert chunk[1:3] == b"\x01\x02"
    assert chunk[3:7] == b"\x00\x00\x01\x02"


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=8), st.integers(0, 32))
def test_framing_round_trips(buffers: list[bytes], slack: int) -> None:
    chunk = bytearray(encode_chunk(buffers)) + b"\xee" * slack  # stale tail after the message
    decoded = decode_chunk(chunk)
    assert not decoded.overflow
    assert [bytes(b) for b in decoded.buffers] == buffers


def test_write_chunk_writes_through_the_callback_at_the_base_offset() -> None:
    memory = bytearray(64)

    def write(offset: int, data: object) -> None:
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        memory[offset:offset + view.nbytes] = view

    size = write_chunk(write, [b"hi", memoryview(b"there")], base=10)
    assert size == 3 + 4 + 2 + 4 + 5
    assert memory[:10] == bytes(10)
    assert [bytes(b) for b in decode_chunk(memory[10:10 + size]).buffers] == [b"hi", b"there"]


def test_overflow_chunk_ignores_the_stale_rest() -> None:
    stale = bytearray(encode_chunk([b"old message"]))
    stale[0] = OVERFLOW
    decoded = decode_chunk(stale)
    assert decoded.overflow and decoded.buffers == []


@pytest.mark.parametrize(
    ("chunk", "clause"),
    [
        (b"", "ring.framing.within-chunk"),
        (b"\x02\x00\x01\x00\x00\x00\x00", "ring.framing.overflow-byte"),
        (b"\xff", "ring.framing.overflow-byte"),
        (b"\x00\x00", "ring.framing.within-chunk"),
        (b"\x00\x00\x00" + b"\x00" * 8, "ring.framing.buffer-count"),
        (b"\x00\x00\x02\x00\x00\x00\x01a", "ring.framing.within-chunk"),  # count too high
        (b"\x00\x00\x01\x00\x00\x00\x05abc", "ring.framing.within-chunk"),  # length too long
        (b"\x00\x00\x01\x00\x00", "ring.framing.within-chunk"),  # length cut off
        (b"\x00\x00\x01\xff\xff\xff\xff" + b"a" * 16, "ring.framing.within-chunk"),
    ],
)
def test_malformed_chunks_raise_ring_error_with_the_clause(chunk: bytes, clause: str) -> None:
    with pytest.raises(RingError) as info:
        decode_chunk(chunk)
    assert info.value.clause == clause
    assert clause in str(info.value)


def test_encoding_rejects_counts_that_do_not_fit_two_bytes() -> None:
    with pytest.raises(RingError) as info:
        encode_chunk([b""] * 0x10000)
    assert info.value.clause == "ring.framing.buffer-count"
    with pytest.raises(RingError):
        encode_chunk([])


def test_framing_table_and_constants_agree_with_the_code() -> None:
    fields = {field.name: field for field in RING.framing}
    assert fields["overflow"].offset == "0" and fields["overflow"].size == "1"
    assert fields["buffer_count"].byteorder == "big" and fields["buffer_count"].size == "2"
    assert fields["length[k]"].byteorder == "big" and fields["length[k]"].size == "4"
    constants = RING.constants
    assert constants["overflow_total_base"] == overflow_total([b""])
    assert constants["in_ring_header_bytes"] + constants["buffer_length_bytes"] == framed_size(
        [b""])
