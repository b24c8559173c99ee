"""The properties the explorer checks while an execution runs.

Flag discipline (:class:`FlagDiscipline`) is checked every time a store becomes visible to the
other threads (at once under ``sc``, when it drains under ``tso``/``weak``), on the memory all
threads share. It is the ring's state machine (``states`` in ``spec/data/ring.toml``: chunk
metadata is always not-written ``0...``, written ``10..0``, partly-read, or read-by-all ``11..1``)
read as rules about who may change which flag in which state (ring.state.four-states):

- every flag is 0 or 1 (ring.state.flag-values);
- only the writer stores the written flag; it sets it to 0 (claims the chunk) only when the
  chunk is not-written or read-by-all (ring.writer.wait-writable), and to 1 only when every
  read flag is 0 and the chunk's data is visible (ring.writer.read-flags-cleared-before-written,
  ring.writer.fence-before-written);
- the writer stores read flags (to 0) and chunk data only while the chunk's written flag is 0
  (ring.writer.read-flags-cleared-before-written, ring.writer.clear-written-before-fill);
- a reader stores only its own read flag, only to 1, only while the chunk is written
  (ring.reader.only-own-flag, ring.reader.readable-iff).

End-to-end properties (what each reader received) are checked by :func:`describe_receipt`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from enginewire.fuzz.explore.model import AddressMap, Place, Region
from enginewire.reference.errors import RingError
from enginewire.reference.ring.protocol import ChunkState, classify

WRITER = "writer"

#: (kind, clause, message)
Finding = tuple[str, str, str]


def hex_bytes(data: bytes, limit: int = 16) -> str:
    text = " ".join(f"{b:02x}" for b in data[:limit])
    return text + (" ..." if len(data) > limit else "")


class FlagDiscipline:
    """Checks one store as it becomes visible; see the module docstring for the rules."""

    KINDS = frozenset({
        "flag-value", "foreign-flag", "reader-writes", "writer-sets-read-flag",
        "reader-clears-flag", "release-unpublished", "claim-unread", "publish-with-read-flags",
        "publish-before-data", "clear-while-published", "clear-before-claim", "fill-published",
        "fill-before-claim", "out-of-chunk",
    })

    def __init__(self, amap: AddressMap) -> None:
        self.amap = amap

    def check(self, memory: bytearray, role: str, rank: int | None, lo: int, data: bytes, *,
              pending: Sequence[tuple[int, bytes]]) -> Finding | None:
        """The rule a store of ``data`` at ``lo`` by a ``role`` thread breaks, if any.

        ``memory`` is the shared memory before the store; ``pending`` are the storing thread's
        older stores still in its store buffer (they were issued before this one but are not
        visible yet: only possible under ``weak``).
        """
        amap = self.amap
        hi = lo + len(data)
        first = amap.place(lo)
        if first.region is Region.DATA:
            last = amap.place(hi - 1)
            if last.region is not Region.DATA or last.chunk != first.chunk:
                return ("out-of-chunk", "ring.framing.within-chunk",
                        f"{_who(role, rank)} stores past the end of chunk {first.chunk}: "
                        f"{amap.describe(lo, hi)}")
            if role != WRITER:
                return ("reader-writes", "ring.reader.only-own-flag",
                        f"{_who(role, rank)} stores into {amap.describe(lo, hi)}")
            chunk = first.chunk
            if memory[amap.written_flag(chunk)] != 1:
                return None
            where = amap.describe(lo, hi)
            if self._pending_flag(pending, amap.written_flag(chunk), 0):
                return ("fill-before-claim", "ring.writer.clear-written-before-fill",
                        f"{where} became visible while chunk {chunk} is still published "
                        "(written flag = 1): the writer's claim (written flag = 0) is still in "
                        "its store buffer, no fence between the claim and the fill")
            return ("fill-published", "ring.writer.clear-written-before-fill",
                    f"the writer stores into {where} while chunk {chunk} is published "
                    "(written flag = 1)")
        row_lo, row_hi = amap.row(first.chunk)
        row = bytearray(memory[row_lo:row_hi])
        for offset, value in zip(range(lo, hi), data, strict=True):
            place = amap.place(offset)
            if place.chunk != first.chunk or place.region is Region.DATA:
                return ("out-of-chunk", "ring.layout.metadata-region",
                        f"{_who(role, rank)} stores across metadata rows: "
                        f"{amap.describe(lo, hi)}")
            found = self._check_flag(row, row_lo, place, offset, value, role, rank, pending)
            if found is not None:
                return found
            row[offset - row_lo] = value
        return None

    def _check_flag(self, row: bytearray, row_lo: int, place: Place, offset: int, value: int,
                    role: str, rank: int | None,
                    pending: Sequence[tuple[int, bytes]]) -> Finding | None:
        amap = self.amap
        chunk = place.chunk
        written = row[0]
        reads = row[1:]

        def name() -> str:
            return amap.describe(offset, offset + 1)

        def flags() -> str:
            return " ".join(str(b) for b in reads)

        if value not in (0, 1):
            return ("flag-value", "ring.state.flag-values",
                    f"{_who(role, rank)} stores {value} into {name()}; a flag is 0 or 1")
        if place.region is Region.WRITTEN_FLAG:
            if role != WRITER:
                return ("foreign-flag", "ring.reader.only-own-flag",
                        f"{_who(role, rank)} stores {value} into {name()}")
            if value == 1:
                data_lo = amap.layout.chunk_offset(chunk)
                data_hi = data_lo + amap.chunk_bytes
                if pending and any(p_lo < data_hi and data_lo < p_lo + len(p_data)
                                   for p_lo, p_data in pending):
                    return ("publish-before-data", "ring.writer.fence-before-written",
                            f"{name()} = 1 became visible before the chunk's data: the writer's "
                            "data stores are still in its store buffer, no fence between the "
                            "data and the written flag")
                if any(reads):
                    if any(self._pending_flag(pending, row_lo + 1 + r, 0)
                           for r in range(len(reads))):
                        detail = ("the writer's read-flag clears are still in its store "
                                  "buffer, no fence between them and the written flag")
                    else:
                        detail = "the writer sets the written flag before clearing them"
                    return ("publish-with-read-flags",
                            "ring.writer.read-flags-cleared-before-written",
                            f"{name()} = 1 became visible while read flags are {flags()}: "
                            f"{detail}; chunk {chunk} looks read by readers that never read "
                            "this message")
            elif written == 1 and not all(reads):
                return ("claim-unread", "ring.writer.wait-writable",
                        f"the writer claims chunk {chunk} ({name()} = 0) while its read flags "
                        f"are {flags()}: not every reader has read it")
            return None
        if role == WRITER:
            if value != 0:
                return ("writer-sets-read-flag", "ring.state.flag-values",
                        f"the writer stores 1 into {name()}")
            if written != 1:
                return None
            if self._pending_flag(pending, row_lo, 0):
                return ("clear-before-claim", "ring.writer.clear-written-before-fill",
                        f"{name()} = 0 became visible while chunk {chunk} is still published: "
                        "the writer's claim (written flag = 0) is still in its store buffer, no "
                        "fence after the claim; readers see the chunk as newly written while "
                        "it holds old data")
            return ("clear-while-published", "ring.writer.read-flags-cleared-before-written",
                    f"the writer's clear of {name()} became visible while chunk {chunk} is "
                    "published (written flag = 1): the read flags must be cleared, and "
                    "visible, before the written flag is set")
        if place.index != rank:
            return ("foreign-flag", "ring.reader.only-own-flag",
                    f"{_who(role, rank)} stores {value} into {name()}")
        if value != 1:
            return ("reader-clears-flag", "ring.reader.only-own-flag",
                    f"{_who(role, rank)} stores 0 into its own read flag ({name()})")
        if written == 0:
            return ("release-unpublished", "ring.reader.readable-iff",
                    f"{_who(role, rank)} marks chunk {chunk} read while it is not published "
                    "(written flag = 0)")
        return None

    def transition(self, memory: bytearray, lo: int, data: bytes) -> str:
        """``chunk 0: NOT_WRITTEN -> WRITTEN`` when the store changes a chunk's state."""
        place = self.amap.place(lo)
        if place.region is Region.DATA:
            return ""
        row_lo, row_hi = self.amap.row(place.chunk)
        before = bytes(memory[row_lo:row_hi])
        after = bytearray(before)
        after[lo - row_lo:lo - row_lo + len(data)] = data
        old, new = _state_name(before), _state_name(bytes(after))
        return f"chunk {place.chunk}: {old} -> {new}" if old != new else ""

    @staticmethod
    def _pending_flag(pending: Sequence[tuple[int, bytes]], offset: int, value: int) -> bool:
        return any(p_lo <= offset < p_lo + len(p_data) and p_data[offset - p_lo] == value
                   for p_lo, p_data in pending)


def _who(role: str, rank: int | None) -> str:
    return "the writer" if role == WRITER else f"reader r{rank}"


@functools.cache
def spec_state_names() -> dict[ChunkState, str]:
    """Each chunk state's name in the ``states`` table of the ring spec (matched by pattern)."""
    from enginewire.spec import load

    by_pattern = {state.pattern: state.name for state in load().surface("ring").states}
    # A ChunkState's value is its pattern (protocol.py builds the enum from the spec).
    return {state: by_pattern.get(str(state.value), state.name.lower().replace("_", "-"))
            for state in ChunkState}


def _state_name(row: bytes) -> str:
    try:
        return spec_state_names()[classify(row)]
    except RingError:
        return "invalid"


def describe_receipt(payloads: Sequence[bytes], index: int, payload: bytes
                     ) -> tuple[str | None, str]:
    """Classify the ``index``-th message a reader received: ``(None, note)`` when it is the
    message the writer sent ``index``-th, else ``(kind, note)`` with kind ``stale`` (an earlier
    message again), ``skipped`` (a later one: messages were lost), ``extra`` (more messages
    than were sent) or ``torn`` (bytes the writer never sent as one message)."""
    shown = f"({hex_bytes(payload)})"
    if index < len(payloads) and payload == payloads[index]:
        return None, f"message {index} {shown}"
    if index >= len(payloads):
        return "extra", f"a message {shown} after all {len(payloads)} were received"
    if payload in payloads:
        other = payloads.index(payload)
        if other < index:
            return "stale", (f"message {other} {shown} again where message {index} was due "
                             "(stale chunk data or a duplicate)")
        return "skipped", (f"message {other} {shown} where message {index} was due "
                           f"(message {index} lost)")
    return "torn", (f"{shown}, which the writer never sent, where message {index} "
                    f"({hex_bytes(payloads[index])}) was due (torn or stale chunk data)")
