"""What a bench run measures and for how long: :class:`BenchConfig` and its two presets."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace
from typing import Any

from enginewire.spec import load

_SPEC = load()

KIB = 1 << 10
MIB = 1 << 20

#: The benches, in the order they run.
BENCHES = ("ring", "codec", "peers", "textbook", "explorer")
#: The transports of the peers bench.
TRANSPORTS = ("ipc", "tcp")


@dataclass(frozen=True)
class BenchConfig:
    """One run's grid, repetitions and time bounds (seconds unless named otherwise).

    The ring grid is either the full product of ``payloads`` x ``readers`` x ``chunks``
    (``grid="product"``) or a star around ``base_readers`` and ``base_chunks``
    (``grid="star"``): every payload with every reader count at ``base_chunks``, plus every
    payload with every chunk count at ``base_readers``.
    """

    targets: tuple[str, ...] = ("reference",)
    benches: tuple[str, ...] = BENCHES
    #: Compare with vLLM when it is importable (its figures are the ``vs vLLM`` column).
    include_vllm: bool = True
    rounds: int = 7
    # --- ring ---
    payloads: tuple[int, ...] = (64, KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB)
    readers: tuple[int, ...] = (1, 2, 3, 4)
    chunks: tuple[int, ...] = (4, 10, 16)
    grid: str = "star"
    base_readers: int = 2
    #: vLLM's MessageQueue defaults (ring.constants): every payload of the grid fits in a chunk.
    base_chunks: int = _SPEC.ring_constant("max_chunks_default", int)
    chunk_bytes: int = _SPEC.ring_constant("max_chunk_bytes_default", int)
    #: Timed part of one throughput cell, after ``warmup_seconds`` of warm-up (which also
    #: writes every chunk at least once).
    cell_seconds: float = 0.25
    warmup_seconds: float = 0.03
    #: The timed part of a throughput cell is split into this many bursts per contender, the
    #: contenders of the cell taking turns burst by burst (see ``rounds.Run._interleaved``).
    ring_bursts: int = 4
    #: Upper bound on the messages of one cell (tiny payloads on a fast machine).
    max_messages: int = 200_000
    latency_payload: int = KIB
    latency_readers: tuple[int, ...] = (1, 2)
    latency_messages: int = 200
    #: Gap between two latency messages: the "low rate".
    latency_interval: float = 0.005
    # --- codec ---
    codec_seconds: float = 0.2
    #: The contenders of a codec cell take turns in this many bursts of ``codec_seconds /
    #: codec_bursts`` each (see ``codec_bench.time_calls``).
    codec_bursts: int = 10
    # --- peers ---
    transports: tuple[str, ...] = TRANSPORTS
    round_trips: int = 200
    #: The reference engine's seconds between generation steps in the peers sessions (0: as
    #: fast as it can; a realistic step time shows the tap's cost against a working engine).
    engine_step_delay: float = 0.0
    # --- textbook contenders ---
    #: Message size of the bulk transfers (pipe, Unix socket, shared memory) and their length.
    textbook_bytes: int = MIB
    textbook_seconds: float = 0.2
    # --- explorer ---
    #: readers x chunks x messages of the searches.
    explorer_ring: tuple[int, int, int] = (2, 2, 3)
    #: None: exhaustive searches (their time is a figure); a number cuts each search short.
    explorer_max_states: int | None = None
    #: Also run the previous release's explorer (see :mod:`.explorer_bench`).
    explorer_previous: bool = True
    # --- bounds ---
    #: Longest any single wait may take (a reader attaching, one enqueue, a report).
    timeout: float = 20.0

    @classmethod
    def full(cls, **overrides: Any) -> BenchConfig:
        """The default run: the whole grid, 7 rounds (about 11 minutes on 2 cores, two of them
        the explorer's exhaustive searches)."""
        return replace(cls(), **overrides)

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """A small grid, 3 rounds: about a minute."""
        return replace(cls(
            rounds=3,
            # 1 MiB: the smallest payload with bandwidth figures (GB/s, zero-copy and raw reads).
            payloads=(64, KIB, 64 * KIB, MIB),
            readers=(1, 2),
            chunks=(10,),
            cell_seconds=0.08,
            warmup_seconds=0.02,
            latency_readers=(1,),
            latency_messages=60,
            latency_interval=0.003,
            codec_seconds=0.05,
            round_trips=60,
            textbook_seconds=0.01,
            explorer_max_states=500,
            explorer_previous=False,
        ), **overrides)

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.ring_bursts < 1:
            raise ValueError(f"ring_bursts must be >= 1, got {self.ring_bursts}")
        if self.codec_bursts < 1:
            raise ValueError(f"codec_bursts must be >= 1, got {self.codec_bursts}")
        unknown = set(self.benches) - set(BENCHES)
        if unknown:
            raise ValueError(f"unknown bench(es) {sorted(unknown)}: use {', '.join(BENCHES)}")
        if self.grid not in ("star", "product"):
            raise ValueError(f"grid must be 'star' or 'product', got {self.grid!r}")
        if any(p < 16 for p in self.payloads) or self.latency_payload < 16:
            raise ValueError("payloads carry a 16-byte header: 16 bytes at least")
        if any(p > self.chunk_bytes - 4096 for p in self.payloads):
            raise ValueError(f"every payload must fit one chunk of {self.chunk_bytes} bytes")
        if any(r < 1 for r in (*self.readers, *self.latency_readers)):
            raise ValueError("reader counts must be >= 1")
        if any(c < 2 for c in self.chunks):
            raise ValueError("chunk counts must be >= 2")
        if self.engine_step_delay < 0:
            raise ValueError(f"engine_step_delay must be >= 0, got {self.engine_step_delay}")
        bad = set(self.transports) - set(TRANSPORTS)
        if bad:
            raise ValueError(f"unknown transport(s) {sorted(bad)}: use ipc, tcp")

    def ring_cases(self) -> list[tuple[int, int, int]]:
        """``(payload_bytes, readers, chunks)`` of every throughput cell, payload-major."""
        if self.grid == "product":
            return list(itertools.product(self.payloads, self.readers, self.chunks))
        base_readers = self.base_readers if self.base_readers in self.readers else self.readers[0]
        base_chunks = self.base_chunks if self.base_chunks in self.chunks else self.chunks[0]
        cases: dict[tuple[int, int, int], None] = {}
        for payload in self.payloads:
            for readers in self.readers:
                cases[(payload, readers, base_chunks)] = None
            for chunks in self.chunks:
                cases[(payload, base_readers, chunks)] = None
        return list(cases)

    def max_readers(self) -> int:
        needed = []
        if "ring" in self.benches:
            needed = [*self.readers, *self.latency_readers]
        return max(needed, default=0)

    def to_builtins(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in asdict(self).items()}
