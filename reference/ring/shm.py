"""The real backing of a ring: one POSIX shared-memory segment (``/dev/shm/<name>``).

The process that creates the segment owns it and unlinks it when it closes
(clause ring.lifecycle.creator-unlinks). Processes that attach never register the segment with
``multiprocessing``'s resource tracker: a tracker that believes it owns the segment unlinks it
when the attaching process exits, under the feet of the writer and every other reader
(clause ring.lifecycle.attach-untracked).
"""

from __future__ import annotations

import gc
import inspect
import os
import platform
import secrets
import threading
import warnings
from collections.abc import Callable
from multiprocessing import resource_tracker, shared_memory
from typing import TYPE_CHECKING, cast

from ..errors import RingError
from ..processes import this_process
from .framing import Buffer
from .layout import RingLayout
from .liveness import segment_size

if TYPE_CHECKING:
    from .protocol import DirectAccess

#: One lock per process: where the compiled fence was not built, taking and releasing it is the
#: fence (CPython's lock is a semaphore or a pthread mutex), which is what vLLM's
#: ``memory_fence()`` relies on too. On x86 each of the two is a locked instruction, a full
#: barrier; on Arm the pair is an acquire followed by a release, which does not keep an
#: earlier store before a later load, so there a full fence needs the compiled one.
_FENCE_LOCK = threading.Lock()
# Bound once: every message costs each end of a ring at least one fence.
_fence_acquire = _FENCE_LOCK.acquire
_fence_release = _FENCE_LOCK.release

#: Serialises the temporary swap of ``resource_tracker.register`` on Pythons without ``track=``.
_ATTACH_LOCK = threading.Lock()

_HAS_TRACK_ARG = "track" in inspect.signature(shared_memory.SharedMemory.__init__).parameters


def _lock_fence() -> None:
    """The fence where the compiled one was not built: the lock taken and released."""
    _fence_acquire()
    _fence_release()


def _compiled_fence() -> Callable[[], None] | None:
    try:
        from ._express_flags import full_fence
    except ImportError:
        return None
    return full_fence


#: Full memory barrier between processes sharing memory: the processor's own fence in one C
#: call (``_express_flags.full_fence``: ``mfence`` on x86, ``dmb ish`` on Arm) where the
#: package was built with a C compiler, else the lock taken and released (see _FENCE_LOCK).
memory_fence: Callable[[], None] = _compiled_fence() or _lock_fence

_X86 = ("x86_64", "amd64", "i386", "i686")


def lock_fence_warning(machine: str, compiled: bool) -> str | None:
    """Why the ring's full fence may be too weak on ``machine`` (``platform.machine()``), or
    None: only where the compiled fence was not built and the machine is not x86, whose
    locked instructions are full barriers."""
    if compiled or machine.lower() in _X86:
        return None
    return (f"the ring's full fence on {machine} is a lock taken and released, an acquire "
            f"followed by a release, which need not keep an earlier store before a later "
            f"load (ring.writer.fence-after-written, ring.reader.fence-after-release): "
            f"install enginewire where a C compiler is found, so that its compiled fence "
            f"(reference/ring/_express_flags.c) is built")


_WEAK_FENCE = lock_fence_warning(platform.machine(), memory_fence is not _lock_fence)
if _WEAK_FENCE is not None:
    warnings.warn(_WEAK_FENCE, RuntimeWarning, stacklevel=2)

#: The acquire-release fence of this machine (clause ring.fence.acquire-release): None on x86,
#: whose TSO already keeps every order such a fence asks for (Intel SDM vol. 3A, "Memory
#: Ordering in P6 and More Recent Processor Families": loads are not reordered with other
#: loads, stores not with older loads or with other stores), so the ring calls nothing there;
#: the full barrier everywhere else.
acq_rel_fence: Callable[[], None] | None = (
    None if platform.machine().lower() in _X86 else memory_fence)


#: The name of every segment enginewire creates starts so (then the creator's tag).
SEGMENT_PREFIX = "ew-"


def _create_named(size: int) -> shared_memory.SharedMemory:
    """A new segment of ``size`` bytes (mode 0600) whose name carries this process's tag."""
    tag = this_process().tag
    while True:
        try:
            return shared_memory.SharedMemory(
                name=f"{SEGMENT_PREFIX}{tag}-{secrets.token_hex(6)}", create=True, size=size)
        except FileExistsError:
            continue


def attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Map the existing segment ``name`` without registering it with the resource tracker
    (clause ring.lifecycle.attach-untracked)."""
    if _HAS_TRACK_ARG:
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    with _ATTACH_LOCK:
        original = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = original


class ShmMemory:
    """A :class:`.protocol.RingMemory` over a shared-memory mapping.

    ``read`` returns zero-copy views: release them (or let them go) before the segment closes.
    ``load``, ``store``, ``fence`` and ``fence_acq_rel`` are the mapping's own item access,
    :func:`memory_fence` and :data:`acq_rel_fence`, bound once, so a flag access costs one C
    call; ``direct`` offers the mapping and the fence's lock to a queue end's express path
    (:attr:`.protocol.RingMemory.direct`, :mod:`.express`).
    """

    def __init__(self, buf: memoryview) -> None:
        self._bind(buf)

    def _bind(self, buf: memoryview) -> None:
        self.buf = buf
        self.load: Callable[[int], int] = buf.__getitem__
        self.store: Callable[[int, int], None] = buf.__setitem__
        self.fence: Callable[[], None] = memory_fence
        self.fence_acq_rel: Callable[[], None] | None = acq_rel_fence
        # The mapping itself, for the express path (RingMemory.direct); a subclass that
        # instruments the accesses offers none.
        self.direct: DirectAccess | None = (
            (buf, _fence_acquire, _fence_release) if type(self) is ShmMemory else None)

    def detach(self) -> None:
        """Forget the mapping (the segment is closing): later accesses fail with IndexError."""
        self._bind(memoryview(b""))

    def read(self, offset: int, length: int) -> memoryview:
        return self.buf[offset:offset + length]

    def write(self, offset: int, data: Buffer) -> None:
        if type(data) is bytes or type(data) is bytearray:
            self.buf[offset:offset + len(data)] = data
            return
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.buf[offset:offset + view.nbytes] = view

    def yield_(self) -> None:
        os.sched_yield()


class ShmSegment:
    """One shared-memory segment laid out as a ring. Use :meth:`create` or :meth:`attach`."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: RingLayout,
                 is_creator: bool) -> None:
        self._shm: shared_memory.SharedMemory | None = shm
        self.layout = layout
        self.is_creator = is_creator
        self.name: str = shm.name
        self._buf: memoryview | None = shm.buf
        self.memory = ShmMemory(cast(memoryview, shm.buf))

    @classmethod
    def create(cls, layout: RingLayout) -> ShmSegment:
        """Create a fresh segment with every flag 0 (clause ring.layout.flags-zero-at-creation),
        named after the calling process (``ew-p<pid>s<start>-<random>``, clause
        ring.liveness.creator-named) and followed by the liveness record (:mod:`.liveness`)."""
        shm = _create_named(segment_size(layout))
        try:
            segment = cls(shm, layout, is_creator=True)
            segment.memory.write(layout.metadata_offset, bytes(layout.metadata_bytes))
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        return segment

    @classmethod
    def attach(cls, name: str, layout: RingLayout) -> ShmSegment:
        """Map the existing segment ``name`` without registering it with the resource tracker.

        The segment may be larger than ``layout.total_size`` (page rounding), never smaller
        (clause ring.layout.segment).
        """
        try:
            shm = attach_untracked(name)
        except FileNotFoundError:
            raise RingError("ring.lifecycle.creator-unlinks",
                            "no shared-memory segment of that name (writer gone or other node)",
                            got=name) from None
        if shm.size < layout.total_size:
            shm.close()
            raise RingError("ring.layout.segment", "segment smaller than the layout needs",
                            expected=f">= {layout.total_size}", got=shm.size)
        return cls(shm, layout, is_creator=False)

    @property
    def closed(self) -> bool:
        return self._shm is None

    def close(self) -> None:
        """Unmap the segment; the creator also unlinks it. Idempotent.

        The unlink happens first, so the name is gone even if a stray view keeps the mapping.
        """
        shm = self._shm
        if shm is None:
            return
        self._shm = None
        if self.is_creator:
            try:
                shm.unlink()
            except FileNotFoundError:
                # Someone else removed it; stop the resource tracker from trying again at exit.
                resource_tracker.unregister(getattr(shm, "_name", "/" + shm.name),
                                            "shared_memory")
        self.memory.detach()
        self._buf = None
        try:
            shm.close()
        except BufferError:
            gc.collect()  # views held only by garbage cycles
            try:
                shm.close()
            except BufferError:
                pass  # a caller still holds a view: the mapping goes when it does

    def __enter__(self) -> ShmSegment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
