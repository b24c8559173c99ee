"""Where every byte of the ring lives: pure arithmetic, no memory, no I/O.

One shared-memory segment holds ``max_chunks`` chunks of ``max_chunk_bytes`` data each, followed
by one metadata row per chunk. A metadata row is ``1 + n_reader`` one-byte flags: the written
flag, then one read flag per local reader::

    offset 0                                   metadata_offset
    | chunk 0 | chunk 1 | ... | chunk N-1      | row 0 | row 1 | ... | row N-1 |
    |<-- max_chunks * max_chunk_bytes -->      |<-- max_chunks * (1 + n_reader) -->|

    row i: | written | read[0] | read[1] | ... | read[n_reader-1] |

Spec: the ``layout`` table and the ``ring.layout.*`` clauses of ``spec/data/ring.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RingError


@dataclass(frozen=True)
class RingLayout:
    """The geometry of one ring, the three numbers of the ring's buffer handle.

    ``n_reader`` counts the *local* readers only (those that read the shared memory); readers
    on other nodes never touch the segment.
    """

    n_reader: int
    max_chunk_bytes: int
    max_chunks: int

    def __post_init__(self) -> None:
        for name in ("n_reader", "max_chunk_bytes", "max_chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RingError(
                    "ring.layout.segment",
                    f"{name} must be a positive integer",
                    expected=">= 1",
                    got=value,
                )

    @property
    def metadata_size(self) -> int:
        """Bytes in one metadata row: the written flag plus one read flag per reader."""
        return 1 + self.n_reader

    @property
    def data_offset(self) -> int:
        """Offset of chunk 0's data: the data region starts the segment."""
        return 0

    @property
    def data_size(self) -> int:
        return self.max_chunks * self.max_chunk_bytes

    @property
    def metadata_offset(self) -> int:
        """Offset of metadata row 0, right after the data region."""
        return self.data_offset + self.data_size

    @property
    def metadata_bytes(self) -> int:
        return self.max_chunks * self.metadata_size

    @property
    def total_size(self) -> int:
        """Bytes the segment must hold: ``(max_chunk_bytes + 1 + n_reader) * max_chunks``."""
        return (self.max_chunk_bytes + self.metadata_size) * self.max_chunks

    def _check_chunk(self, index: int) -> None:
        if not 0 <= index < self.max_chunks:
            raise RingError(
                "ring.layout.data-region",
                "chunk index out of range",
                expected=f"0..{self.max_chunks - 1}",
                got=index,
            )

    def chunk_offset(self, index: int) -> int:
        """Offset of chunk ``index``'s data: ``data_offset + index * max_chunk_bytes``."""
        self._check_chunk(index)
        return self.data_offset + index * self.max_chunk_bytes

    def metadata_row_offset(self, index: int) -> int:
        """Offset of chunk ``index``'s metadata row.

        ``metadata_offset + index * (1 + n_reader)``.
        """
        self._check_chunk(index)
        return self.metadata_offset + index * self.metadata_size

    def written_flag_offset(self, index: int) -> int:
        """Offset of chunk ``index``'s written flag: byte 0 of its metadata row."""
        return self.metadata_row_offset(index)

    def read_flag_offset(self, index: int, reader: int) -> int:
        """Offset of local reader ``reader``'s read flag on chunk ``index``.

        Byte ``1 + reader`` of the chunk's metadata row.
        """
        if not 0 <= reader < self.n_reader:
            raise RingError(
                "ring.layout.metadata-region",
                "reader index out of range",
                expected=f"0..{self.n_reader - 1}",
                got=reader,
            )
        return self.metadata_row_offset(index) + 1 + reader

    def next_index(self, index: int) -> int:
        """The chunk after ``index``: indices advance modulo ``max_chunks``."""
        return (index + 1) % self.max_chunks

    def buffer_handle(self, shm_name: str) -> tuple[int, int, int, str]:
        """The ``(n_reader, max_chunk_bytes, max_chunks, shm_name)`` tuple a handle carries."""
        return (self.n_reader, self.max_chunk_bytes, self.max_chunks, shm_name)

    @classmethod
    def from_buffer_handle(cls, handle: tuple[int, int, int, str]) -> tuple[RingLayout, str]:
        """Split a handle's ``buffer_handle`` tuple into a layout and the segment name."""
        try:
            n_reader, max_chunk_bytes, max_chunks, name = handle
        except (TypeError, ValueError):
            raise RingError(
                "ring.handle.fields",
                "buffer_handle must be (n_reader, max_chunk_bytes, max_chunks, shm_name)",
                got=handle,
            ) from None
        if not isinstance(name, str) or not name:
            raise RingError("ring.handle.fields", "shm_name must be a non-empty str", got=name)
        return cls(n_reader, max_chunk_bytes, max_chunks), name
