"""Ring targets: the writer and reader code the explorer runs.

A :class:`RingTarget` says how big the ring is for a configuration (:meth:`RingTarget.layout`)
and runs one writer (:meth:`RingTarget.run_writer`) or one reader
(:meth:`RingTarget.run_reader`) to completion over the memory it is given. Everything that
code does to shared memory must go through that memory (or through the stand-ins a target
installs in :meth:`RingTarget.installed`), because its accesses are the explorer's
scheduling points.

:class:`ReferenceTarget` runs :class:`~enginewire.reference.ring.protocol.RingWriter` and
``RingReader`` with the framing of :mod:`enginewire.reference.ring.framing`, the way
:class:`~enginewire.reference.ring.queue.MessageQueue` drives them, minus the sockets. To
explore a variant, pass other writer or reader classes (a subclass overriding one step)::

    class FlagsAfterWritten(RingWriter):
        def commit(self): ...

    explore(ReferenceTarget(writer_cls=FlagsAfterWritten, name="flag-order"), RingConfig())
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any

from enginewire.fuzz.explore.execution import READER, WRITER, ThreadContext, ThreadSpec
from enginewire.fuzz.explore.schedule import RingConfig, received_form
from enginewire.reference.errors import RingError
from enginewire.reference.ring.framing import decode_chunk, framed_size, write_chunk
from enginewire.reference.ring.layout import RingLayout
from enginewire.reference.ring.protocol import RingReader, RingWriter


class RingTarget(abc.ABC):
    """A ring implementation the explorer can run; ``name`` appears in schedule strings."""

    name: str = "target"
    #: What a chunk the writer publishes must hold: None (raw bytes, unchecked), ``"valid"``
    #: (the spec's chunk framing) or ``"buffers"`` (that framing around exactly the
    #: message's payload); see :func:`~enginewire.fuzz.explore.execution.framing_problem`.
    framing: str | None = None
    #: Its accesses follow the spec's layout: flags by ``load``/``store`` in the metadata
    #: region, data by ``read``/``write`` inside one chunk (a violation is ``layout``, with
    #: the layout clause), and each end publishes or releases message k in chunk
    #: k % max_chunks (a violation is ``index``). False only for code that is not a ring
    #: (litmus tests).
    spec_layout: bool = True
    #: It sends and receives messages of several buffers (``context.messages``), so it can
    #: be explored with out-of-band buffers (``RingConfig.oob_buffers``).
    oob: bool = False

    @abc.abstractmethod
    def layout(self, config: RingConfig) -> RingLayout:
        """The ring's geometry for ``config`` (its chunks fit one message each)."""

    @abc.abstractmethod
    def run_writer(self, context: ThreadContext) -> None:
        """Send every message of ``context.payloads`` (with :attr:`oob`: the buffers of
        ``context.messages``), in order, then return."""

    @abc.abstractmethod
    def run_reader(self, context: ThreadContext) -> None:
        """As local reader ``context.rank``, receive ``len(context.payloads)`` messages,
        calling ``context.received(payload)`` for each, then return."""

    def installed(self) -> contextlib.AbstractContextManager[None]:
        """Stand-ins that must be in place while the target runs (none by default)."""
        return contextlib.nullcontext()

    def threads(self, config: RingConfig) -> list[ThreadSpec]:
        specs = [ThreadSpec("w", "writer", WRITER, None, self.run_writer)]
        specs += [ThreadSpec(f"r{rank}", f"reader r{rank}", READER, rank, self.run_reader)
                  for rank in range(config.readers)]
        return specs


class ReferenceTarget(RingTarget):
    """enginewire's reference ring (see the module docstring)."""

    framing = "buffers"
    oob = True

    def __init__(self, *, writer_cls: type[RingWriter] = RingWriter,
                 reader_cls: type[RingReader] = RingReader, name: str = "reference") -> None:
        self.writer_cls = writer_cls
        self.reader_cls = reader_cls
        self.name = name

    def layout(self, config: RingConfig) -> RingLayout:
        return RingLayout(config.readers, framed_size(config.message(0)), config.chunks)

    def run_writer(self, context: ThreadContext) -> None:
        memory = context.memory
        writer = self.writer_cls(memory, context.layout)  # type: ignore[arg-type]
        for buffers in context.messages:
            while writer.try_acquire() is None:
                memory.yield_()
            write_chunk(memory.write, buffers, base=writer.chunk_offset())
            writer.commit()
            memory.notify()

    def run_reader(self, context: ThreadContext) -> None:
        memory = context.memory
        assert context.rank is not None
        reader = self.reader_cls(memory, context.layout, context.rank)  # type: ignore[arg-type]
        for _ in context.payloads:
            while reader.try_acquire() is None:
                memory.yield_()
            try:
                chunk = memory.read(reader.chunk_offset(), context.layout.max_chunk_bytes)
                decoded = decode_chunk(chunk)
                if decoded.overflow:
                    raise RingError("ring.framing.overflow-byte",
                                    "an overflow marker where the writer wrote in-ring data",
                                    expected=0, got=1)
                context.received(received_form([bytes(b) for b in decoded.buffers]))
            finally:
                reader.release()


class MemoryRingTarget(RingTarget):
    """A ring surface with ``memory_writer``/``memory_reader`` (capability ``ring.memory``).

    The writer sends each message's buffers (``write(buffers)``: one buffer, or the main
    buffer and its out-of-band buffers with ``RingConfig.oob_buffers``, the buffer list the
    ring's enqueue frames), yielding while it returns False; each reader calls ``read()``
    (yielding while it returns None) and must get those buffers back. Chunks are the spec's:
    ``framed_size`` of one message, so every chunk the writer publishes must hold exactly
    the spec's framing of its message.
    """

    framing = "buffers"
    oob = True

    def __init__(self, ring: Any, name: str, *, body_raises: int | None = None,
                 overflow_boundary: bool = False) -> None:
        for attribute in ("memory_writer", "memory_reader"):
            if not callable(getattr(ring, attribute, None)):
                raise ValueError(f"{name}: its ring surface has no {attribute}() (capability "
                                 "ring.memory), so the explorer cannot run it")
        self.ring = ring
        self.name = name
        #: Each reader's body raises while it holds message ``body_raises`` (its reader's
        #: ``read(consume=...)`` calls ``consume(buffers)`` before releasing the chunk): the
        #: reader must still release it (ring.reader.release-on-error). None: never.
        self.body_raises = body_raises
        #: Chunks one byte smaller than a message's framing: every message sits at the
        #: overflow boundary (ring.framing.overflow-condition: 6 + len(main) >= max_chunk_bytes)
        #: and must overflow. Its bytes travel over the XPUB socket, outside the explorer: a
        #: reader that finds the overflow marker (``read()`` returns ``[]``) counts the
        #: message due as received.
        self.overflow_boundary = overflow_boundary

    def layout(self, config: RingConfig) -> RingLayout:
        chunk_bytes = framed_size(config.message(0)) - (1 if self.overflow_boundary else 0)
        return RingLayout(config.readers, chunk_bytes, config.chunks)

    def run_writer(self, context: ThreadContext) -> None:
        layout, memory = context.layout, context.memory
        writer = self.ring.memory_writer(memory, n_reader=layout.n_reader,
                                         max_chunk_bytes=layout.max_chunk_bytes,
                                         max_chunks=layout.max_chunks)
        for buffers in context.messages:
            while not writer.write(list(buffers)):
                memory.yield_()

    def run_reader(self, context: ThreadContext) -> None:
        layout, memory = context.layout, context.memory
        reader = self.ring.memory_reader(memory, n_reader=layout.n_reader,
                                         max_chunk_bytes=layout.max_chunk_bytes,
                                         max_chunks=layout.max_chunks, rank=context.rank)
        for number in range(len(context.payloads)):
            if number == self.body_raises:
                self._read_raising(reader, context)
                continue
            while (buffers := reader.read()) is None:
                _wait(reader, memory)
            if not buffers and self.overflow_boundary:
                buffers = context.messages[number]  # the overflow marker: over the XPUB
            sent = len(context.messages[number])
            if len(buffers) != sent:
                raise RingError("ring.framing.buffer-count",
                                "the reader returned another number of buffers than the "
                                "writer sent", expected=sent, got=len(buffers))
            context.received(received_form([bytes(b) for b in buffers]))

    @staticmethod
    def _read_raising(reader: Any, context: ThreadContext) -> None:
        """Read one message with a body that raises while the chunk is held."""

        def consume(buffers: list[bytes]) -> None:
            context.received(received_form([bytes(b) for b in buffers]))
            raise _BodyRaised

        while True:
            try:
                buffers = reader.read(consume=consume)
            except _BodyRaised:
                return
            if buffers is None:
                _wait(reader, context.memory)
                continue
            # The reader swallowed the body's exception; the message still counts.
            if buffers:
                context.received(received_form([bytes(b) for b in buffers]))
            return


def _wait(reader: Any, memory: Any) -> None:
    """After a read that found nothing: the reader's own ``wait()`` (how it waits:
    ``memory.yield_()`` to recheck the flags, ``memory.wait_notify()`` to sleep until a
    notification), else ``memory.yield_()``."""
    wait = getattr(reader, "wait", None)
    if callable(wait):
        wait()
    else:
        memory.yield_()


class _BodyRaised(Exception):
    """What a reader body raises on purpose while it holds a chunk (MemoryRingTarget)."""
