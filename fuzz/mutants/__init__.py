"""The mutant catalogue: deliberately broken variants of the reference, one change each.

Every mutant is modelled on a real failure and cites it. ``MUTANTS`` maps a name to a
:class:`Mutant`; calling one returns a conformance
:class:`~enginewire.conformance.targets.contract.Target` (so ``enginewire check --target
mutant:NAME`` works), and a flag-protocol mutant also gives the schedule explorer a ring target
(:meth:`Mutant.explorer_target`). ``enginewire mutants`` runs the checks that apply to each and
prints which of them kill it (:mod:`.matrix`).

Modules: :mod:`.codec_mutants`, :mod:`.ring_mutants`, :mod:`.peer_mutants` (the broken
surfaces), :mod:`.matrix` (the kill matrix). Importing this package registers the ``mutant``
target provider (:func:`enginewire.conformance.targets.resolve.register_provider`).
See ``docs/mutants.md``.

This package may import ``enginewire.spec``, ``enginewire.reference``,
``enginewire.conformance`` and the rest of ``enginewire.fuzz``, never bench or the command line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from enginewire.conformance.targets.contract import Target, TargetError
from enginewire.conformance.targets.resolve import register_provider
from enginewire.fuzz.mutants import codec_mutants as codec
from enginewire.fuzz.mutants import peer_mutants as peers
from enginewire.fuzz.mutants import ring_mutants as ring


@dataclass(frozen=True)
class Mutant:
    """One broken variant.

    ``surface``: the conformance surface it breaks; ``conformance``: glob patterns of the
    checks run against it (the relevant ones, not the whole suite); ``fuzz_kinds``: codec
    kinds the fuzz campaign feeds its decoder and the differential campaign its encoder
    (empty: no campaigns); ``writer_cls``/``reader_cls`` and
    ``explorer_model``/``explorer_config``: the flag-protocol classes the explorer runs, the
    memory model and the ring size to run them under (no classes: no explorer run).
    """

    name: str
    broken: str
    citation: str
    surface: str
    make_surface: Callable[[], Any]
    conformance: tuple[str, ...] = ()
    fuzz_kinds: tuple[str, ...] = ()
    writer_cls: type | None = None
    reader_cls: type | None = None
    explorer_model: str = "sc"
    #: The explorer's ring: (readers, chunks, messages).
    explorer_config: tuple[int, int, int] = (1, 2, 2)
    #: The explorer runs the surface's ``ring.memory`` ends (its writer frames chunks as the
    #: mutant does) rather than flag-protocol classes.
    explorer_memory: bool = False
    #: The explorer's readers raise while they hold this message (None: never).
    explorer_body_raises: int | None = None
    #: The explorer sends every message at the overflow boundary.
    explorer_boundary: bool = False

    def __call__(self) -> Target:
        return Target(name=f"mutant:{self.name}", description=self.broken,
                      **{self.surface: self.make_surface()})

    @property
    def explorable(self) -> bool:
        return self.writer_cls is not None or self.reader_cls is not None or self.explorer_memory

    def explorer_target(self) -> Any:
        """The explorer's ring target running this mutant's writer and reader classes (or its
        surface's ``ring.memory`` ends, for ``explorer_memory``)."""
        from enginewire.fuzz.explore.ring_targets import MemoryRingTarget, ReferenceTarget

        if self.explorer_memory:
            return MemoryRingTarget(self.make_surface(), f"mutant:{self.name}",
                                    body_raises=self.explorer_body_raises,
                                    overflow_boundary=self.explorer_boundary)
        from enginewire.reference.ring.protocol import RingReader, RingWriter

        return ReferenceTarget(writer_cls=self.writer_cls or RingWriter,
                               reader_cls=self.reader_cls or RingReader,
                               name=f"enginewire.fuzz.mutants:EXPLORER.{self.name}")


#: Codec kinds the fuzz campaign feeds a codec mutant (the input message every engine decodes).
FUZZ_KINDS = ("add",)
CODEC_CHECKS = ("codec/*",)
#: The ring checks that run the queue over real shared memory, not the instrumented
#: ``ring/memory/*`` ones: on x86 they cannot see a missing fence or a reordered flag store,
#: which is why the explorer is the check for those two mutants.
REAL_MEMORY_RING_CHECKS = ("ring/writer/*", "ring/reader/*", "ring/pair/*")
#: Those and the ``ring/memory/*`` checks, which log the order of every store and fence of the
#: target's own ring code: they see the flag order and the fences the real-memory ones cannot.
RING_CHECKS = (*REAL_MEMORY_RING_CHECKS, "ring/memory/*")
FRAMING_CHECKS = ("ring/writer/chunk-framing", "ring/writer/exact-fit-stays-in-ring",
                  "ring/writer/one-byte-*", "ring/writer/overflow-message")


def _ring(**classes: Any) -> Callable[[], Any]:
    return lambda: ring.MutantRing(**classes)


def _engine(engine_cls: type) -> Callable[[], Any]:
    return lambda: peers.MutantEngines(engine_cls)


_CATALOGUE = [
    # --- codec ---------------------------------------------------------------------------
    Mutant("inline-threshold-inclusive",
           "a tensor of exactly the inline threshold stays inline (<= for <)",
           "vllm/v1/serial_utils.py MsgpackEncoder._encode_tensor (strict <)",
           "codec", codec.InclusiveInlineThreshold, CODEC_CHECKS, FUZZ_KINDS),
    Mutant("type-bytes-swapped", "ADD and ABORT trade request-type bytes",
           "EngineCoreRequestType, vllm/v1/engine/__init__.py",
           "codec", codec.SwappedTypeBytes, CODEC_CHECKS, FUZZ_KINDS),
    Mutant("field-inserted-mid-struct",
           "EngineCoreRequest gains a field in the middle of its array",
           "vLLM PR 48048", "codec", codec.FieldInsertedMidStruct, CODEC_CHECKS, FUZZ_KINDS),
    Mutant("struct-fields-swapped",
           "EngineCoreRequest's prompt_token_ids and mm_features trade places",
           "vLLM PR 48048 (field order drift between ends)",
           "codec", codec.SwappedStructFields, CODEC_CHECKS, FUZZ_KINDS),
    Mutant("negative-buffer-index", "a negative out-of-band index is read Python-style",
           "vLLM issue 53217 (out-of-band buffers aliasing)",
           "codec", codec.AcceptsNegativeBufferIndex, CODEC_CHECKS, FUZZ_KINDS),
    Mutant("pickle-without-opt-in", "pickle extension values decode without the opt-in",
           "vLLM issue 29565 (pickle is a code-execution surface)",
           "codec", codec.PickleWithoutOptIn, CODEC_CHECKS, FUZZ_KINDS),
    Mutant("untyped-decode-errors", "malformed frames raise ValueError without a clause",
           "vllm/v1/engine/core.py process_input_sockets (undiagnosed decode failures)",
           "codec", codec.UntypedDecodeErrors, CODEC_CHECKS, FUZZ_KINDS),
    Mutant("floats-as-float32", "floats that float32 holds exactly are written as float32",
           "structs.float.float64; msgpack-python use_single_float (vLLM's msgspec writes cb)",
           "codec", codec.FloatsAsFloat32, CODEC_CHECKS, FUZZ_KINDS),
    # --- ring: flag protocol -------------------------------------------------------------
    Mutant("flag-order", "the written flag is set before the read flags are cleared",
           "vLLM issues 27858, 29389 (weak ordering)",
           "ring", _ring(writer_cls=ring.WrittenBeforeReadFlagsCleared), RING_CHECKS,
           writer_cls=ring.WrittenBeforeReadFlagsCleared, explorer_model="sc"),
    Mutant("missing-fence", "no fence between the chunk's data and the written flag",
           "vLLM PR 30407 (fences)",
           "ring", _ring(writer_cls=ring.NoFenceBeforeWritten), RING_CHECKS,
           writer_cls=ring.NoFenceBeforeWritten, explorer_model="weak"),
    Mutant("reuses-partly-read-chunk", "the writer reuses a chunk only some readers have read",
           "vLLM issue 27858; shm_broadcast.py acquire_write (read_count == n_reader)",
           "ring", _ring(writer_cls=ring.ReusesPartlyReadChunk),
           ("ring/writer/waits-for-every-reader", "ring/memory/*"),
           writer_cls=ring.ReusesPartlyReadChunk, explorer_model="sc", explorer_config=(2, 2, 3)),
    Mutant("marks-read-before-copy", "the reader marks the chunk read before copying it",
           "vLLM issues 53217 (aliasing a released slot), 45224 (release after the read)",
           "ring", _ring(reader_cls=ring.MarksReadBeforeCopy), ("ring/memory/*",),
           reader_cls=ring.MarksReadBeforeCopy, explorer_model="sc", explorer_config=(2, 2, 3)),
    # --- ring: framing and waiting -------------------------------------------------------
    Mutant("overflow-off-by-one", "the overflow test is > where vLLM has >=",
           "shm_broadcast.py enqueue (total_bytes + len >= max_chunk_bytes)",
           "ring", _ring(queue_cls=ring.OverflowOffByOne), FRAMING_CHECKS,
           explorer_memory=True, explorer_boundary=True),
    Mutant("length-prefix-little-endian", "buffer count and lengths written little-endian",
           "shm_broadcast.py enqueue (to_bytes(4, 'big'))",
           "ring", _ring(queue_cls=ring.LittleEndianLengths), FRAMING_CHECKS,
           explorer_memory=True),
    Mutant("length-prefix-off-by-one", "every length prefix is one more than its buffer",
           "shm_broadcast.py enqueue (len(buf).to_bytes(4, 'big'), the buffer's own length)",
           "ring", _ring(queue_cls=ring.LengthPrefixOffByOne), FRAMING_CHECKS,
           explorer_memory=True),
    Mutant("buffer-count-one-byte", "the buffer count is one byte instead of two",
           "shm_broadcast.py enqueue (len(buffers).to_bytes(2, 'big'))",
           "ring", _ring(queue_cls=ring.OneByteBufferCount), FRAMING_CHECKS,
           explorer_memory=True),
    Mutant("lost-notification", "a waiting reader trusts notifications and never rechecks",
           "vLLM issue 45224 (lost notifications)",
           "ring", _ring(queue_cls=ring.NoRecheckAfterNotification),
           ("ring/reader/finds-write-without-notification",),
           explorer_memory=True, explorer_config=(1, 1, 2)),
    Mutant("notify-before-written",
           "the notification is sent before the written flag is set",
           "shm_broadcast.py enqueue (notify at line 975, after acquire_write's written flag)",
           "ring", _ring(queue_cls=ring.NotifiesBeforeWritten),
           ("ring/memory/notify-after-written-flag", "ring/writer/notify-wakes-idle-reader"),
           explorer_memory=True),
    Mutant("no-release-on-error", "the read flag is not set when decoding raises",
           "vLLM issue 45224 (read slot released in finally)",
           "ring", _ring(queue_cls=ring.NoReleaseOnError),
           ("ring/reader/release-on-error",),
           explorer_memory=True, explorer_body_raises=0, explorer_config=(1, 1, 2)),
    # --- peers ---------------------------------------------------------------------------
    Mutant("identity-big-endian", "the engine's routing identity is big-endian",
           "vLLM issue 23247 (identity confusion on reconnect); core.py to_bytes(2, 'little')",
           "engine", _engine(peers.BigEndianIdentity), ("engine/identity/*",)),
    Mutant("frame-buffer-reused", "an output frame buffer is reused while zmq still sends it",
           "vLLM issues 15207, 17203, PR 50053",
           "engine", _engine(peers.ReusedFrameBuffer),
           ("engine/serve/*", "engine/utility/*")),
]

#: name -> mutant (each callable: returns a fresh conformance target).
MUTANTS: dict[str, Mutant] = {m.name: m for m in _CATALOGUE}


def mutant_target(name: str) -> Target:
    """The conformance target of mutant ``name`` (the ``mutant:NAME`` target provider)."""
    mutant = MUTANTS.get(name)
    if mutant is None:
        known = ", ".join(sorted(MUTANTS))
        raise TargetError(f"mutant:{name}: no such mutant (known: {known})")
    return mutant()


# Importing the catalogue makes ``--target mutant:NAME`` resolve (the suite itself never
# imports this layer; the ``enginewire`` command line imports this package).
register_provider("mutant", mutant_target, "mutant:NAME (enginewire.fuzz.mutants)")


class _ExplorerTargets:
    """Attribute NAME is the explorer ring target of flag-protocol mutant NAME, so the
    schedules the explorer prints replay with ``enginewire explore --replay`` (their target is
    ``enginewire.fuzz.mutants:EXPLORER.NAME``)."""

    def __getattr__(self, name: str) -> Any:
        mutant = MUTANTS.get(name)
        if mutant is None or not mutant.explorable:
            raise AttributeError(f"no flag-protocol mutant {name!r}")
        return mutant.explorer_target()


EXPLORER = _ExplorerTargets()

__all__ = ["EXPLORER", "MUTANTS", "Mutant", "mutant_target"]
