"""Cross pairing: a target's writer with the reference readers, the reference writer with its
readers, its own pair; any ``ring.memory`` conformance target as an explorer target.

Each broken ring below is consistent with itself (its own readers get every message) but not
with the spec; the explorer reports it through a pairing with the reference, with the clause
of the deviation (a layout clause for a layout difference, not a flag clause).
"""

from __future__ import annotations

import struct
import textwrap
from pathlib import Path
from typing import Any

import pytest

import enginewire.fuzz.mutants  # noqa: F401 - registers the mutant:NAME target provider
from enginewire.fuzz.explore import (
    MemoryRingTarget,
    ReferenceTarget,
    RingConfig,
    cross_explore,
    explore,
    resolve_target,
)
from enginewire.fuzz.mutants import MUTANTS
from enginewire.fuzz.mutants.ring_mutants import MutantRing
from enginewire.reference.errors import RingError
from enginewire.reference.ring.framing import decode_chunk, write_chunk
from enginewire.reference.ring.layout import RingLayout
from enginewire.reference.ring.protocol import RingReader, RingWriter

SMALL = RingConfig(readers=1, chunks=2, messages=3)


def kinds_and_clauses(result: Any) -> set[tuple[str, str | None]]:
    return {(f.violation.kind, f.violation.clause) for f in result.findings}


# --- index modulo a different count ---------------------------------------------------------


class _ShortWrap:
    """Both ends advance modulo max_chunks - 1 (chunk max_chunks - 1 is never used)."""

    def commit(self) -> None:  # writer
        RingWriter.commit(self)  # type: ignore[arg-type]
        self.index = self.index % (self._max_chunks - 1)  # type: ignore[attr-defined]

    def release(self) -> None:  # reader
        RingReader.release(self)  # type: ignore[arg-type]
        self.index = self.index % (self._max_chunks - 1)  # type: ignore[attr-defined]


class ShortWrapWriter(RingWriter):
    commit = _ShortWrap.commit


class ShortWrapReader(RingReader):
    release = _ShortWrap.release


# --- metadata before data -------------------------------------------------------------------


class MetadataFirstLayout(RingLayout):
    """The metadata rows first, the data region after them."""

    @property
    def metadata_offset(self) -> int:
        return 0

    def chunk_offset(self, index: int) -> int:
        self._check_chunk(index)
        return self.metadata_bytes + index * self.max_chunk_bytes


def _metadata_first(layout: RingLayout) -> RingLayout:
    return MetadataFirstLayout(layout.n_reader, layout.max_chunk_bytes, layout.max_chunks)


class MetadataFirstWriter(RingWriter):
    def __init__(self, memory: Any, layout: RingLayout) -> None:
        super().__init__(memory, _metadata_first(layout))


class MetadataFirstReader(RingReader):
    def __init__(self, memory: Any, layout: RingLayout, rank: int) -> None:
        super().__init__(memory, _metadata_first(layout), rank)


# --- buffer count in one byte (framing both ends agree on) ---------------------------------


class OneByteCountRing(MutantRing):
    """Writer and readers frame chunks with a one-byte buffer count."""

    def __init__(self) -> None:
        from enginewire.fuzz.mutants.ring_mutants import OneByteBufferCount

        super().__init__(queue_cls=OneByteBufferCount)

    def memory_reader(self, memory: Any, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int, rank: int) -> Any:
        reader = RingReader(memory, RingLayout(n_reader, max_chunk_bytes, max_chunks), rank)

        class _Reader:
            def read(self) -> list[bytes] | None:
                if reader.try_acquire() is None:
                    return None
                try:
                    chunk = bytes(memory.read(reader.chunk_offset(), max_chunk_bytes))
                    _, count, length = struct.unpack_from(">BBI", chunk)
                    if count != 1:
                        raise RingError("ring.framing.buffer-count", "one buffer expected")
                    return [chunk[6:6 + length]]
                finally:
                    reader.release()

        return _Reader()


def surface_target(ring: Any, name: str) -> MemoryRingTarget:
    return MemoryRingTarget(ring, name)


def test_the_reference_passes_every_pairing_with_itself() -> None:
    cross = cross_explore(surface_target(MutantRing(), "memory-reference"), SMALL)
    assert not cross.findings, cross.summary()
    assert all(r.complete for r in cross.results.values())


def test_index_modulo_another_count_is_reported_with_the_advance_modulo_clauses() -> None:
    ring = MutantRing(writer_cls=ShortWrapWriter, reader_cls=ShortWrapReader)
    own = explore(surface_target(ring, "short-wrap"), SMALL, check="behavior")
    # Its own readers get every message: without the index check only the pairings show it.
    assert {f.violation.kind for f in own.findings} <= {"index"}
    cross = cross_explore(surface_target(ring, "short-wrap"), SMALL, keep_going=True)
    writer = kinds_and_clauses(cross.results["writer"])
    readers = kinds_and_clauses(cross.results["readers"])
    assert ("index", "ring.writer.advance-modulo") in writer, cross.summary()
    assert ("index", "ring.reader.advance-modulo") in readers, cross.summary()


def test_metadata_before_data_is_reported_with_a_layout_clause_not_a_flag_clause() -> None:
    ring = MutantRing(writer_cls=MetadataFirstWriter, reader_cls=MetadataFirstReader)
    cross = cross_explore(surface_target(ring, "metadata-first"), SMALL, keep_going=True)
    for pairing in ("writer", "readers"):
        clauses = {clause for _, clause in kinds_and_clauses(cross.results[pairing])}
        assert clauses, cross.summary()
        assert all(clause is not None and clause.startswith("ring.layout.")
                   for clause in clauses), cross.summary()


def test_a_one_byte_buffer_count_is_reported_with_the_buffer_count_clause() -> None:
    cross = cross_explore(surface_target(OneByteCountRing(), "one-byte-count"), SMALL,
                          keep_going=True, check="behavior")
    assert ("framing", "ring.framing.buffer-count") in kinds_and_clauses(
        cross.results["writer"]), cross.summary()
    # The reference readers also reject what it publishes.
    assert cross.results["writer"].findings


def test_a_little_endian_length_prefix_writer_is_reported_by_the_framing_check() -> None:
    target = resolve_target("mutant:length-prefix-little-endian")
    result = explore(target, RingConfig(1, 1, 1))
    assert [f.violation.clause for f in result.findings] == ["ring.framing.buffer-count"]
    assert "little-endian" in result.findings[0].violation.message


def test_conformance_targets_and_pairs_resolve_by_the_check_syntax(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_ring_target.py").write_text(textwrap.dedent('''
        from enginewire.conformance.targets.reference import ReferenceRing

        class MyImplementation:
            ring = ReferenceRing()


        implementation = MyImplementation()
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = resolve_target("my_ring_target:implementation")
    assert isinstance(mine, MemoryRingTarget)
    assert explore(mine, RingConfig(1, 2, 2)).verdict == "pass"
    pair = resolve_target("mutant:flag-order>reference")
    result = explore(pair, RingConfig(1, 2, 2))
    assert result.findings[0].violation.clause == "ring.writer.read-flags-cleared-before-written"
    # The finding's schedule names the pair, which resolves again.
    assert str(result.findings[0].schedule).startswith("mutant:flag-order>reference/")
    with pytest.raises(ValueError, match="ring.memory"):
        resolve_target("mutant:type-bytes-swapped")


def test_write_chunk_and_decode_agree_for_the_reference() -> None:
    # The framing check's oracle is the reference's decoder: a chunk the reference frames
    # decodes to its buffers.
    chunk = bytearray(16)
    write_chunk(lambda offset, data: chunk.__setitem__(slice(offset, offset + len(data)), data),
                [b"ab"], base=0)
    assert [bytes(b) for b in decode_chunk(chunk).buffers] == [b"ab"]
    assert isinstance(ReferenceTarget().framing, str)


def test_a_reader_body_that_raises_must_still_release_the_chunk() -> None:
    config = RingConfig(readers=1, chunks=1, messages=2)
    honest = MemoryRingTarget(MutantRing(), "raising-body", body_raises=0)
    assert explore(honest, config).verdict == "pass"
    broken = MUTANTS["no-release-on-error"].explorer_target()
    assert broken.body_raises == 0
    result = explore(broken, config, keep_going=True)
    assert result.findings, result.summary()


def test_a_message_at_the_overflow_boundary_must_overflow() -> None:
    config = RingConfig(readers=1, chunks=2, messages=2)
    honest = MemoryRingTarget(MutantRing(), "boundary", overflow_boundary=True)
    assert explore(honest, config).verdict == "pass"
    broken = explore(MUTANTS["overflow-off-by-one"].explorer_target(), config)
    assert [(f.violation.kind, f.violation.clause) for f in broken.findings] == [
        ("framing", "ring.framing.within-chunk")]
