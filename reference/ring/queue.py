"""``MessageQueue``: the broadcast queue built on the ring, compatible with vLLM's.

One writer broadcasts every message to ``n_reader`` readers:

- *local* readers (same node) read the shared-memory ring (:mod:`.protocol` over
  :mod:`.shm`); a message too large for a chunk leaves an overflow marker in the ring and
  travels as one multipart message over the writer's local XPUB socket (ipc);
- after every ring write the writer publishes ``b"\\x00"`` on a PUB socket (SNDHWM 1) so that
  readers blocked on their SUB socket (CONFLATE) wake up;
- *remote* readers (other nodes) never touch the ring: every message goes to them as one
  multipart message over a TCP XPUB socket.

The :class:`Handle` has the fields, in the order, of vLLM's ``Handle``, so a vLLM reader can
attach to a queue made here and :meth:`MessageQueue.create_from_handle` accepts a vLLM handle.
With the default pickle codec the bytes in the ring are the bytes vLLM writes.

Writer::

    with MessageQueue(n_reader=2, n_local_reader=2) as mq:
        handle = mq.export_handle()        # give it to the readers (pickle, pipe, ...)
        mq.wait_until_ready(timeout=30)
        mq.enqueue({"step": 1}, timeout=5)

Reader (another process)::

    with MessageQueue.create_from_handle(handle, rank=0) as mq:
        mq.wait_until_ready(timeout=30)
        obj = mq.dequeue(timeout=5)

Spec: ``spec/data/ring.toml``.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import zmq
from zmq.backend import Socket as BackendSocket

from enginewire.spec import load

from ..addresses import bind_ipc, ensure_ipc_dir, ipc_address, remove_ipc_file
from ..errors import ProtocolTimeout, RingError
from .express import ExpressDequeue, ExpressEnqueue, reader_express, writer_express
from .framing import (
    MAX_BUFFER_BYTES,
    OVERFLOW_BASE,
    Buffer,
    cached_single_head,
    decode_chunk,
    nbytes,
    needs_overflow,
    single_buffer,
    single_head,
    split_head,
    write_chunk,
)
from .layout import RingLayout
from .liveness import BLOCKING, RUNNING, LivenessRecord
from .payload import SCAN_BYTES_MAX, PayloadCodec, get_codec
from .protocol import RingReader, RingWriter
from .shm import ShmMemory, ShmSegment, memory_fence
from .wait import DEFAULT_POLICY, Backoff, WaitPolicy, spin, spin_yield

_SPEC = load()
#: What a wait's check returns once it succeeds (a chunk index, a message, a flag).
_Found = TypeVar("_Found")
#: How long a wait lasts when the caller names no timeout (clause ring.liveness.finite-wait,
#: ring.constants default_timeout_s); ``timeout=None`` waits forever, and still notices a dead
#: peer.
DEFAULT_TIMEOUT_S = _SPEC.ring_constant("default_timeout_s", float)
#: vLLM's ``MessageQueue`` defaults (ring.constants).
MAX_CHUNK_BYTES_DEFAULT = _SPEC.ring_constant("max_chunk_bytes_default", int)
MAX_CHUNKS_DEFAULT = _SPEC.ring_constant("max_chunks_default", int)
#: A busy reader drains its notify socket at least this often (libzmq queues a command per
#: notification until the socket is polled).
NOTIFY_POLL_INTERVAL_S = _SPEC.ring_constant("notify_poll_interval_s", float)
NOTIFY_MESSAGE = bytes.fromhex(_SPEC.ring_constant("notify_message_hex", str))
READY_MESSAGE = _SPEC.ring_constant("ready_message", str).encode()
#: The first byte of an XPUB subscription message (0 unsubscribes).
SUBSCRIBE_BYTE = bytes.fromhex(_SPEC.ring_constant("subscribe_message_hex", str))[0]


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False  # a host name: zmq resolves it, or fails to bind


def _release_view(view: memoryview) -> None:
    """Let go of a view into the segment now: a traceback or a late garbage collection would
    otherwise keep it, and the segment cannot be unmapped while one exists."""
    try:
        view.release()
    except BufferError:
        pass  # a codec kept a buffer of it: the mapping lives until that object goes


def _never() -> bool:
    return False


def _release_views(views: list[memoryview]) -> None:
    for view in views:
        _release_view(view)


class QueueClosed(RuntimeError):
    """The queue was shut down (:meth:`MessageQueue.shutdown`) or closed while waiting."""


@dataclass
class Handle:
    """What a reader needs to attach; vLLM's ``Handle`` field for field.

    ``buffer_handle`` is ``(n_reader, max_chunk_bytes, max_chunks, shm_name)`` with
    ``n_reader`` the number of local readers. A rank in ``local_reader_ranks`` reads the ring
    as local reader ``local_reader_ranks.index(rank)``; any other rank is a remote reader.
    """

    local_reader_ranks: list[int] = field(default_factory=list)
    buffer_handle: tuple[int, int, int, str] | None = None
    local_subscribe_addr: str | None = None
    local_notify_addr: str | None = None
    remote_subscribe_addr: str | None = None
    remote_addr_ipv6: bool = False
    tensor_arena_handle: tuple[int, int, int, str] | None = None

    @classmethod
    def from_any(cls, handle: Any) -> Handle:
        """A :class:`Handle` from any object with the same attributes (e.g. vLLM's)."""
        if isinstance(handle, cls):
            return handle
        try:
            return cls(
                local_reader_ranks=list(handle.local_reader_ranks),
                buffer_handle=(tuple(handle.buffer_handle)
                               if handle.buffer_handle is not None else None),
                local_subscribe_addr=handle.local_subscribe_addr,
                local_notify_addr=handle.local_notify_addr,
                remote_subscribe_addr=handle.remote_subscribe_addr,
                remote_addr_ipv6=bool(handle.remote_addr_ipv6),
                tensor_arena_handle=getattr(handle, "tensor_arena_handle", None),
            )
        except AttributeError as exc:
            raise RingError("ring.handle.fields", f"not a message queue handle: {exc}",
                            got=type(handle).__name__) from None


class _Resources:
    """Everything a queue must release, kept apart from the queue so a finalizer can run it."""

    def __init__(self) -> None:
        self.context: zmq.Context[Any] | None = None
        self.sockets: list[zmq.Socket[Any]] = []
        self.segment: ShmSegment | None = None
        self.bound_ipc: list[str] = []
        self.views: list[memoryview] = []
        self.liveness: LivenessRecord | None = None
        self._lock = threading.Lock()
        self.closed = False

    def socket(self, kind: int) -> zmq.Socket[Any]:
        if self.context is None:
            self.context = zmq.Context()
        sock = self.context.socket(kind)
        self.sockets.append(sock)
        return sock

    def bind_ipc(self, sock: zmq.Socket[Any], base_dir: str | None) -> str:
        if base_dir is not None:
            ensure_ipc_dir(base_dir)
        address = ipc_address(base_dir)
        self.bound_ipc.append(address)
        bind_ipc(sock, address)
        return address

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            for sock in self.sockets:
                sock.close(linger=0)
            if self.context is not None:
                self.context.term()
        finally:
            # Whatever zmq did, the files and the segment go (clause ring.lifecycle.*).
            if self.liveness is not None:
                self.liveness.leave()
            for address in self.bound_ipc:
                remove_ipc_file(address)
            _release_views(self.views)
            if self.segment is not None:
                self.segment.close()


class MessageQueue:
    """One writer, ``n_reader`` readers; see the module docstring.

    The constructor makes the writer end; :meth:`create_from_handle` makes a reader end.
    ``codec`` is ``"pickle"`` (vLLM-compatible), ``"msgspec"`` (enginewire peers only) or a
    :class:`.payload.PayloadCodec`. ``connect_ip`` is the address remote readers connect to
    (default ``127.0.0.1``; give the node's address when readers run elsewhere). ``ipc_dir``
    holds the ipc socket files (default: the temp dir).
    """

    # Every attribute, declared once; ``_init_common`` gives each its reader/writer-neutral
    # value and the constructors fill in those of their end.
    codec: PayloadCodec
    wait_policy: WaitPolicy
    handle: Handle
    is_writer: bool
    is_local_reader: bool
    is_remote_reader: bool
    local_reader_rank: int
    n_local_reader: int
    n_remote_reader: int
    layout: RingLayout | None
    _resources: _Resources
    _finalizer: weakref.finalize[[], MessageQueue]
    _writer: RingWriter | None
    _reader: RingReader | None
    _chunk_bytes: int
    _chunk_views: list[memoryview]
    _local_socket: zmq.Socket[Any] | None
    _notify_socket: zmq.Socket[Any] | None
    _notify: Callable[[], None] | None
    _remote_socket: zmq.Socket[Any] | None
    _cancel_send: zmq.Socket[Any] | None
    _cancel_recv: zmq.Socket[Any] | None
    _poller: zmq.Poller | None
    _shutting_down: bool
    _pending_overflow: int
    #: The views :meth:`dequeue_views` returned last, whose chunk this end still holds.
    _held_views: list[memoryview] | None
    _last_notify_drain: float
    #: The writer's test that every local reader keeps checking the flags without blocking
    #: (ring.notify.waiting-state): a notification is skipped while it holds.
    _readers_running: Callable[[], bool]
    #: A reader end in a wait that announced it may block (its state byte is BLOCKING).
    _blocking: bool
    #: A writer end with local readers and no remote one, open, whose class keeps this
    #: class's :meth:`enqueue_buffers` (a subclass that replaces it gets it called):
    #: :meth:`enqueue` may publish a one-buffer message itself. (The flag-protocol objects are
    #: looked up per message, never bound here: a mutant harness swaps them after
    #: construction.)
    _publish_directly: bool
    #: The end's express path (:mod:`.express`), where it has one.
    _express_enqueue: ExpressEnqueue | None
    _express_dequeue: ExpressDequeue | None

    def __init__(
        self,
        n_reader: int,
        n_local_reader: int,
        local_reader_ranks: list[int] | None = None,
        max_chunk_bytes: int = MAX_CHUNK_BYTES_DEFAULT,
        max_chunks: int = MAX_CHUNKS_DEFAULT,
        connect_ip: str | None = None,
        *,
        codec: str | PayloadCodec = "pickle",
        wait: WaitPolicy = DEFAULT_POLICY,
        ipc_dir: str | None = None,
    ) -> None:
        if not 0 <= n_local_reader <= n_reader:
            raise RingError("ring.handle.fields", "0 <= n_local_reader <= n_reader",
                            expected=f"0..{n_reader}", got=n_local_reader)
        if local_reader_ranks is None:
            local_reader_ranks = list(range(n_local_reader))
        elif len(local_reader_ranks) != n_local_reader:
            raise RingError("ring.handle.local-reader-rank",
                            "one rank per local reader in local_reader_ranks",
                            expected=n_local_reader, got=len(local_reader_ranks))
        self._init_common(codec, wait)
        self.is_writer = True
        self.n_local_reader = n_local_reader
        self.n_remote_reader = n_reader - n_local_reader
        res = self._resources
        try:
            buffer_handle = local_subscribe = local_notify = None
            if n_local_reader > 0:
                self.layout = RingLayout(n_local_reader, max_chunk_bytes, max_chunks)
                res.segment = ShmSegment.create(self.layout)
                res.liveness = LivenessRecord.create(res.segment.memory.buf, self.layout)
                self._readers_running = res.liveness.readers_running
                self._writer = RingWriter(res.segment.memory, self.layout)
                self._chunk_bytes = max_chunk_bytes
                buffer_handle = self.layout.buffer_handle(res.segment.name)
                self._local_socket = res.socket(zmq.XPUB)
                self._local_socket.setsockopt(zmq.XPUB_VERBOSE, 1)
                local_subscribe = res.bind_ipc(self._local_socket, ipc_dir)
                self._notify_socket = res.socket(zmq.PUB)
                self._notify_socket.setsockopt(zmq.SNDHWM, 1)
                local_notify = res.bind_ipc(self._notify_socket, ipc_dir)
                # pyzmq's Python-level send (routing ids, groups, frames) costs more than the
                # send itself: the notification goes through the compiled method directly.
                self._notify = functools.partial(BackendSocket.send, self._notify_socket,
                                                 NOTIFY_MESSAGE, zmq.NOBLOCK)
            remote_subscribe = None
            remote_ipv6 = False
            if self.n_remote_reader > 0:
                host = connect_ip or "127.0.0.1"
                self._remote_socket = res.socket(zmq.XPUB)
                self._remote_socket.setsockopt(zmq.XPUB_VERBOSE, 1)
                if _is_ipv6(host):
                    self._remote_socket.setsockopt(zmq.IPV6, 1)
                    remote_ipv6 = True
                    host = f"[{host}]"
                self._remote_socket.bind(f"tcp://{host}:0")
                endpoint = self._remote_socket.getsockopt_string(zmq.LAST_ENDPOINT)
                remote_subscribe = f"tcp://{host}:{endpoint.rsplit(':', 1)[1]}"
            self.handle = Handle(
                local_reader_ranks=list(local_reader_ranks),
                buffer_handle=buffer_handle,
                local_subscribe_addr=local_subscribe,
                local_notify_addr=local_notify,
                remote_subscribe_addr=remote_subscribe,
                remote_addr_ipv6=remote_ipv6,
                tensor_arena_handle=None,
            )
            self._publish_directly = (
                self._writer is not None and self._remote_socket is None
                and type(self).enqueue_buffers is MessageQueue.enqueue_buffers)
            if self._publish_directly and self._writer is not None and self._notify is not None:
                self._express_enqueue = writer_express(self._writer, self.codec, wait)
        except BaseException:
            res.close()
            raise

    def _init_common(self, codec: str | PayloadCodec, wait: WaitPolicy) -> None:
        self.codec = get_codec(codec)
        self.wait_policy = wait
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self.is_writer = False
        self.is_local_reader = False
        self.is_remote_reader = False
        self.local_reader_rank = -1
        self.n_local_reader = 0
        self.n_remote_reader = 0
        self.layout = None
        self._writer = None
        self._reader = None
        self._chunk_bytes = 0
        self._chunk_views = []
        self._local_socket = None
        self._notify_socket = None
        self._notify = None
        self._remote_socket = None
        self._cancel_send = None
        self._cancel_recv = None
        self._poller = None
        self._shutting_down = False
        self._pending_overflow = 0
        self._held_views = None
        self._last_notify_drain = time.monotonic()
        self._readers_running = _never
        self._blocking = False
        self._publish_directly = False
        self._express_enqueue = None
        self._express_dequeue = None

    @classmethod
    def create_from_handle(cls, handle: Any, rank: int, *,
                           codec: str | PayloadCodec = "pickle",
                           wait: WaitPolicy = DEFAULT_POLICY) -> MessageQueue:
        """The reader end for ``rank``: local if ``rank`` is in ``handle.local_reader_ranks``,
        remote otherwise. ``handle`` may be a vLLM ``Handle``."""
        handle = Handle.from_any(handle)
        if handle.tensor_arena_handle is not None:
            raise RingError("ring.payload.tensor-arena",
                            "this reader does not implement vLLM's shared-memory tensor arena",
                            expected=None, got=handle.tensor_arena_handle)
        self = cls.__new__(cls)
        self._init_common(codec, wait)
        self.handle = handle
        res = self._resources
        try:
            if rank in handle.local_reader_ranks:
                if handle.buffer_handle is None or handle.local_subscribe_addr is None \
                        or handle.local_notify_addr is None:
                    raise RingError("ring.handle.fields",
                                    "a local reader needs buffer_handle and both ipc addresses",
                                    got=handle)
                self.is_local_reader = True
                self.local_reader_rank = handle.local_reader_ranks.index(rank)
                self.layout, shm_name = RingLayout.from_buffer_handle(handle.buffer_handle)
                res.segment = ShmSegment.attach(shm_name, self.layout)
                res.liveness = LivenessRecord.attach(res.segment.memory.buf, self.layout,
                                                     self.local_reader_rank)
                self._reader = RingReader(res.segment.memory, self.layout,
                                          self.local_reader_rank)
                self._chunk_bytes = self.layout.max_chunk_bytes
                if type(self)._dequeue_rest is MessageQueue._dequeue_rest:
                    self._express_dequeue = reader_express(self._reader, self.codec, wait,
                                                           NOTIFY_POLL_INTERVAL_S)
                # One view per chunk for the queue's life: a message costs no view of its own.
                res.views = self._chunk_views = [
                    res.segment.memory.read(self.layout.chunk_offset(index), self._chunk_bytes)
                    for index in range(self.layout.max_chunks)]
                self._local_socket = res.socket(zmq.SUB)
                self._local_socket.setsockopt(zmq.SUBSCRIBE, b"")
                self._local_socket.connect(handle.local_subscribe_addr)
                self._notify_socket = res.socket(zmq.SUB)
                self._notify_socket.setsockopt(zmq.CONFLATE, 1)
                self._notify_socket.setsockopt(zmq.SUBSCRIBE, b"")
                self._notify_socket.connect(handle.local_notify_addr)
                cancel_address = f"inproc://enginewire-cancel-{id(self):x}-{time.monotonic_ns()}"
                cancel_recv = res.socket(zmq.PAIR)
                cancel_recv.bind(cancel_address)
                self._cancel_send = res.socket(zmq.PAIR)
                self._cancel_send.connect(cancel_address)
                self._poller = zmq.Poller()
                self._poller.register(self._notify_socket, zmq.POLLIN)
                self._poller.register(cancel_recv, zmq.POLLIN)
                self._cancel_recv = cancel_recv
            else:
                if handle.remote_subscribe_addr is None:
                    raise RingError("ring.handle.local-reader-rank",
                                    "rank is not a local reader and the queue has no remote "
                                    "address", got=rank)
                self.is_remote_reader = True
                self._remote_socket = res.socket(zmq.SUB)
                self._remote_socket.setsockopt(zmq.SUBSCRIBE, b"")
                if handle.remote_addr_ipv6:
                    self._remote_socket.setsockopt(zmq.IPV6, 1)
                self._remote_socket.connect(handle.remote_subscribe_addr)
        except BaseException:
            res.close()
            raise
        return self

    # --- lifecycle -------------------------------------------------------------------------

    def export_handle(self) -> Handle:
        return self.handle

    def wait_until_ready(self, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        """The start-up barrier every end calls once (clauses ring.ready.*).

        The writer waits for one subscription message per reader on each XPUB socket, then
        publishes ``b"READY"``; a reader waits for that ``b"READY"``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.is_writer:
            for sock, count in ((self._local_socket, self.n_local_reader),
                                (self._remote_socket, self.n_remote_reader)):
                if sock is None or count == 0:
                    continue
                seen = 0
                while seen < count:
                    message = self._recv_ready_part(sock, deadline, "subscriptions")
                    if message[:1] == bytes((SUBSCRIBE_BYTE,)):
                        seen += 1
                sock.send(READY_MESSAGE)
        else:
            sock = self._local_socket if self.is_local_reader else self._remote_socket
            assert sock is not None
            message = self._recv_ready_part(sock, deadline, "READY")
            if message != READY_MESSAGE:
                raise RingError("ring.ready.reader-receives-ready",
                                "the first message on the subscribe socket must be READY",
                                expected=READY_MESSAGE, got=message[:32])

    def _recv_ready_part(self, sock: zmq.Socket[Any], deadline: float | None, what: str) -> bytes:
        liveness = self._resources.liveness
        step = self.wait_policy.liveness_check_s
        while True:
            left = math.inf if deadline is None else deadline - time.monotonic()
            if sock.poll(max(0, int(min(left, step) * 1000))):
                return sock.recv()
            if liveness is not None:
                if self.is_writer:
                    liveness.check_readers()
                else:
                    liveness.check_writer()
            if self._shutting_down:
                raise QueueClosed("the queue was shut down")
            if deadline is not None and time.monotonic() >= deadline:
                raise ProtocolTimeout("ring.ready.subscriptions",
                                      f"timed out waiting for {what}",
                                      expected="every reader connected", got="timeout")

    def shutdown(self) -> None:
        """Make a reader waiting in another thread of this process raise QueueClosed: a local
        reader at once (clause ring.reader.cancel), a remote one at its next poll."""
        self._shutting_down = True
        if self._cancel_send is not None and not self._resources.closed:
            self._cancel_send.send(b"\x00")

    def close(self) -> None:
        """Close sockets, remove ipc files, unmap the segment (the creator unlinks it)."""
        self._shutting_down = True
        # enqueue_buffers and the general dequeue raise what a closed end raises
        self._publish_directly = False
        self._express_enqueue = self._express_dequeue = None
        held, self._held_views = self._held_views, None
        if held is not None:
            _release_views(held)
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._resources.closed

    @property
    def memory(self) -> ShmMemory | None:
        """The ring's memory (offsets as in :attr:`layout`); None without local readers."""
        segment = self._resources.segment
        return segment.memory if segment is not None else None

    @property
    def ring_writer(self) -> RingWriter | None:
        """The flag-protocol writer of the writer end (None on reader ends)."""
        return self._writer

    @property
    def ring_reader(self) -> RingReader | None:
        """The flag-protocol reader of a local reader end (None elsewhere)."""
        return self._reader

    def __enter__(self) -> MessageQueue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- writer ----------------------------------------------------------------------------

    def enqueue(self, obj: Any, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Encode ``obj`` with the codec and broadcast it (:meth:`enqueue_buffers`)."""
        express = self._express_enqueue
        if express is not None:
            # The common message in one call (reference/ring/express.py), which hands anything
            # else back to enqueue_buffers.
            express(self, obj, timeout)
            return
        self.enqueue_buffers(self.codec.encode(obj), timeout)

    def enqueue_buffers(self, buffers: Sequence[Buffer],
                        timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Broadcast one message given as ``[main, oob...]``.

        Waits (at most ``timeout`` seconds, default :data:`DEFAULT_TIMEOUT_S`, None: forever)
        for the next chunk to be free, raising :class:`ProtocolTimeout` (a ``TimeoutError``)
        when it is not, and :class:`~enginewire.reference.errors.RingPeerDead` when a local
        reader it waits for died (clause ring.liveness.peer-dead).
        """
        # One local binding each: the writer, its overflow socket and its notification exist
        # together (all or none), so one test narrows them all.
        writer = self._writer
        local_socket = self._local_socket
        notify = self._notify
        if writer is None or local_socket is None or notify is None or self._resources.closed:
            if not self.is_writer:
                raise RingError("ring.writer.single-writer", "only the writer end can enqueue")
            if self._resources.closed:
                raise QueueClosed("the queue is closed")
        else:
            # The common messages (one buffer, or a small pickle stream in front of one large
            # out-of-band buffer, that fit) in one protocol call per attempt: the memory
            # events of the steps below (RingWriter.try_publish), the chunk's bytes in two
            # writes.
            parts: tuple[Buffer, Buffer] | None = None
            if len(buffers) == 1:
                first = buffers[0]
                size = len(first) if type(first) is bytes else nbytes(first)
                if OVERFLOW_BASE + size < self._chunk_bytes and 0 < size <= MAX_BUFFER_BYTES:
                    parts = cached_single_head(size) or single_head(size), first
                overflow = parts is None and needs_overflow(buffers, self._chunk_bytes)
            else:
                overflow = needs_overflow(buffers, self._chunk_bytes)
                if not overflow:
                    parts = split_head(buffers)
            if parts is not None:
                head, body = parts
                notify_readers = writer.try_publish(head, body)
                if notify_readers is None:
                    notify_readers = self._wait_to_publish(writer.try_publish, head, body,
                                                           timeout)
                if notify_readers and not self._readers_running():
                    notify()
                if self._remote_socket is not None:
                    self._send_multipart(self._remote_socket, buffers)
                return
            if writer.try_acquire() is None:
                self._wait_for_chunk(writer, timeout)
            try:
                if overflow:
                    writer.memory.store(writer.chunk_offset(), 1)
                else:
                    write_chunk(writer.memory.write, buffers, writer.chunk_offset())
            except BaseException:
                writer.abandon()
                raise
            writer.commit()
            if overflow:
                self._send_multipart(local_socket, buffers)
            if not writer.readers_behind() and not self._readers_running():
                notify()
        # The writer has a remote socket exactly when it has remote readers.
        remote_socket = self._remote_socket
        if remote_socket is not None:
            self._send_multipart(remote_socket, buffers)

    def _wait_to_publish(self, publish: Callable[[Buffer, Buffer], bool | None],
                         head: Buffer, body: Buffer, timeout: float | None,
                         started: float | None = None) -> bool:
        """After one ``publish`` (``RingWriter.try_publish``) found the chunk not free: wait for
        it by the same call, which changes nothing until the chunk is free (no claim, no step
        path per message); whether the readers need a notification. ``started``: when the
        caller's wait began (default now), from which ``timeout`` counts."""
        return bool(self._wait_for_free_chunk(functools.partial(publish, head, body), timeout,
                                              started))

    def _publish_after_miss(self, writer: RingWriter, head: Buffer, body: Buffer,
                            timeout: float | None, started: float | None = None) -> None:
        """The express enqueue found the chunk not free after its first turns, which began at
        ``started``: wait for it by the steps (``RingWriter.try_publish``) until ``timeout``
        after that, then send the notification the flags call for."""
        notify_readers = self._wait_to_publish(writer.try_publish, head, body, timeout, started)
        notify = self._notify
        if notify_readers and notify is not None and not self._readers_running():
            notify()

    @staticmethod
    def _send_multipart(sock: zmq.Socket[Any], buffers: Sequence[Buffer]) -> None:
        # zmq sends later, from its I/O thread: mutable buffers are copied now so a caller
        # changing its array after enqueue returns cannot change the message.
        immutable = all(isinstance(b, bytes) for b in buffers)
        sock.send_multipart(list(buffers), copy=not immutable)

    @contextmanager
    def acquire_write(self, timeout: float | None = DEFAULT_TIMEOUT_S) -> Iterator[int]:
        """Claim the next free chunk and yield its data offset; publish it on exit.

        The body writes the chunk through :attr:`memory` (``memory.write(offset, data)``).
        If the body raises, the chunk is abandoned unpublished (written stays 0) and the
        next acquire claims it again.
        """
        writer, notify = self._claim_chunk(timeout)
        try:
            yield writer.chunk_offset()
        except BaseException:
            writer.abandon()
            raise
        writer.commit()
        if not writer.readers_behind() and not self._readers_running():
            notify()

    def _claim_chunk(self, timeout: float | None) -> tuple[RingWriter, Callable[[], None]]:
        """Claim the next chunk, waiting for it to be free; the writer and its notification
        (which exist together)."""
        writer = self._writer
        notify = self._notify
        if writer is None or notify is None:
            raise RingError("ring.writer.single-writer", "only the writer end has the ring")
        if writer.try_acquire() is None:
            self._wait_for_chunk(writer, timeout)
        return writer, notify

    def _wait_for_chunk(self, writer: RingWriter, timeout: float | None) -> None:
        """After one failed claim: wait for the next chunk to be free and claim it."""
        self._wait_for_free_chunk(writer.try_acquire, timeout)

    def _wait_for_free_chunk(self, attempt: Callable[[], _Found | None], timeout: float | None,
                             started: float | None = None) -> _Found:
        """The writer's wait: repeat ``attempt`` (a claim, or a whole publish) until the next
        chunk is free, checking that the local readers still run; a timeout names the readers
        that hold the chunk (:meth:`_held_up`)."""
        liveness = self._resources.liveness
        try:
            return self._wait_for(attempt, timeout, clause="ring.writer.timeout",
                                  what="a free chunk (every local reader done with it)",
                                  liveness=None if liveness is None else liveness.check_readers,
                                  started=started)
        except ProtocolTimeout as exc:
            raise self._held_up(exc) from None

    def _held_up(self, timeout: ProtocolTimeout) -> ProtocolTimeout:
        """``timeout`` of a writer's wait for a free chunk, saying which local readers have not
        read the chunk and which process each is: a reader that closed its end (or was
        collected) clears its liveness entry, so it is not dead to the liveness check
        (ring.liveness.peer-dead) and the writer can only time out; the error says so."""
        writer, layout = self._writer, self.layout
        if writer is None or layout is None:
            return timeout
        try:
            row = writer.memory.read(layout.metadata_row_offset(writer.index),
                                     layout.metadata_size)
            flags = bytes(row)
            if isinstance(row, memoryview):
                row.release()
        except (IndexError, ValueError, TypeError):
            return timeout  # the mapping is gone (the queue was closed meanwhile)
        record = self._resources.liveness
        unread = []
        for rank, flag in enumerate(flags[1:]):
            if flag:
                continue
            process = None if record is None else record.reader(rank)
            if record is None:
                unread.append(f"reader {rank}")
            elif process is None:
                unread.append(f"reader {rank} (no process attached: it closed its end or "
                              "never attached)")
            else:
                unread.append(f"reader {rank} (pid {process.pid})")
        if not unread:
            return timeout
        return ProtocolTimeout(
            timeout.clause,
            f"{timeout.message}: chunk {writer.index} is still unread by {', '.join(unread)}",
            expected=timeout.expected, got=timeout.got)

    def _wait_for(self, acquire: Callable[[], _Found | None], timeout: float | None, *,
                  clause: str, what: str,
                  block: Callable[[float], bool | None] | None = None,
                  liveness: Callable[[], None] | None = None,
                  started: float | None = None) -> _Found:
        """After one failed ``acquire``: check again back to back, then between yields, then
        back off (the waiting of :mod:`.wait`) until it returns a chunk index, the deadline
        (``timeout`` after ``started``, default now) passes or the queue is shut down."""
        policy = self.wait_policy
        index = spin(acquire, policy, timeout)
        if index is not None:
            return index
        if started is None:
            started = time.monotonic()
        if timeout is None or timeout > 0:
            index = spin_yield(acquire, policy, timeout, started)
            if index is not None:
                return index
        backoff = Backoff(policy, timeout, clause=clause, what=what, block=block,
                          checks=policy.spin_checks, liveness=liveness, started=started)
        try:
            while (index := acquire()) is None:
                if self._shutting_down:
                    raise QueueClosed("the queue was shut down")
                backoff.pause()
        finally:
            if self._blocking:  # the wait is over: RUNNING again (ring.notify.waiting-state)
                self._blocking = False
                record = self._resources.liveness
                if record is not None:
                    record.set_state(RUNNING)
        return index

    # --- readers ---------------------------------------------------------------------------

    def dequeue(self, timeout: float | None = DEFAULT_TIMEOUT_S) -> Any:
        """The next message, decoded with the codec.

        Waits at most ``timeout`` seconds (default :data:`DEFAULT_TIMEOUT_S`, None: forever) in
        total, raising :class:`ProtocolTimeout` (a ``TimeoutError``), or
        :class:`~enginewire.reference.errors.RingPeerDead` once the writer is dead. The ring
        slot is released whatever happens while reading it, decoding errors included (clause
        ring.reader.release-on-error).
        """
        express = self._express_dequeue
        if express is not None:
            # The common message in one call (reference/ring/express.py), which hands anything
            # else to _dequeue_rest.
            return express(self, timeout)
        return self._dequeue_rest(None, False, timeout)

    def _dequeue_rest(self, got: bytes | int | None, tried: bool, timeout: float | None,
                      started: float | None = None) -> Any:
        """:meth:`dequeue` past its express path (``tried``: ``got`` is what it found, the
        index of a chunk it acquired or None when nothing was readable; ``started``: when its
        first turns began, from which ``timeout`` counts) or without one."""
        if self._resources.closed:
            raise QueueClosed("the queue is closed")
        reader = self._reader
        if reader is not None:
            if self._held_views is not None:
                self._release_held()
            # The deadline of an overflowed message's receive counts from the start of this
            # call (or of the express path's turns); read from the clock only when there is a
            # wait to measure (not on every message).
            if not self._pending_overflow:
                # (the wait below calls it again and again)
                read_single: Callable[[], bytes | int | None] = functools.partial(
                    reader.try_read_single, SCAN_BYTES_MAX)
                if not tried:
                    got = read_single()
                if got is None:
                    if started is None:
                        started = time.monotonic()
                    # (mypy cannot solve the wait's type variable from this union)
                    got = cast("bytes | int", self._wait_for(
                        read_single, timeout,
                        clause="ring.reader.timeout", what="a readable chunk",
                        block=self._block_on_notify, liveness=self._writer_liveness(),
                        started=started))
                if type(got) is bytes:
                    now = time.monotonic()
                    if now - self._last_notify_drain >= NOTIFY_POLL_INTERVAL_S:
                        self._drain_notify(now)
                    # Copied before the release: the writer may reuse the slot meanwhile.
                    return self.codec.decode(got, ())
                assert type(got) is int
                chunk = self._chunk_views[got]
                try:
                    view = single_buffer(chunk)
                    if view is not None:
                        try:
                            return self.codec.decode(view, ())
                        finally:
                            _release_view(view)
                    overflow, views = decode_chunk(chunk)
                    if not overflow:
                        try:
                            # Out-of-band buffers are copied: the object may keep them
                            # after the slot is reused (ring.reader.copy-oob-before-release).
                            return self.codec.decode(views[0],
                                                     [bytearray(v) for v in views[1:]])
                        finally:
                            _release_views(views)
                    self._pending_overflow += 1
                finally:
                    self._release_chunk(reader)
            deadline = (None if timeout is None
                        else (time.monotonic() if started is None else started) + timeout)
            return self._decode_frames(self._recv_overflow(deadline))
        # A reader end has a remote socket exactly when it is a remote reader.
        remote_socket = self._remote_socket
        if self.is_remote_reader and remote_socket is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            return self._decode_frames(self._recv_frames(remote_socket, deadline))
        raise RingError("ring.reader.readable-iff", "the writer end cannot dequeue")

    def dequeue_buffers(self, timeout: float | None = DEFAULT_TIMEOUT_S) -> list[bytes | bytearray]:
        """The next message as owned buffers ``[main, oob...]`` (no codec)."""
        if self._held_views is not None:
            self._release_held()
        if self.is_local_reader:
            deadline = None if timeout is None else time.monotonic() + timeout
            if not self._pending_overflow:
                reader, chunk = self._acquire_chunk(timeout)
                try:
                    decoded = decode_chunk(chunk)
                    if not decoded.overflow:
                        views = decoded.buffers
                        try:
                            return [bytes(views[0])] + [bytearray(v) for v in views[1:]]
                        finally:
                            _release_views(views)
                    self._pending_overflow += 1
                finally:
                    self._release_chunk(reader)
            frames = self._recv_overflow(deadline)
        elif self.is_remote_reader:
            deadline = None if timeout is None else time.monotonic() + timeout
            frames = self._recv_remote(deadline)
        else:
            raise RingError("ring.reader.readable-iff", "the writer end cannot dequeue")
        return [frames[0].bytes] + [bytearray(f.buffer) for f in frames[1:]]

    @contextmanager
    def dequeue_borrowed(self, timeout: float | None = DEFAULT_TIMEOUT_S) -> Iterator[Any]:
        """The next message, decoded without copying its out-of-band buffers: arrays and
        tensors in it are read-only views of the ring slot (or of the socket frames).

        The slot stays held until the block ends, so the writer cannot reuse it meanwhile;
        copy whatever must outlive the block. This trades the reader's copy for holding the
        slot; :meth:`dequeue` returns owned copies instead.
        """
        if self._held_views is not None:
            self._release_held()
        if self.is_local_reader and not self._pending_overflow:
            reader, chunk = self._acquire_chunk(timeout)
            deadline = None if timeout is None else time.monotonic() + timeout
            overflow = False
            try:
                decoded = decode_chunk(chunk)
                overflow = decoded.overflow
                if not overflow:
                    views = [v.toreadonly() for v in decoded.buffers]
                    _release_views(decoded.buffers)
                    try:
                        yield self.codec.decode(views[0], views[1:])
                    finally:
                        _release_views(views)
                else:
                    self._pending_overflow += 1
            finally:
                self._release_chunk(reader)
            if not overflow:
                return
        elif self.is_local_reader or self.is_remote_reader:
            deadline = None if timeout is None else time.monotonic() + timeout
        else:
            raise RingError("ring.reader.readable-iff", "the writer end cannot dequeue")
        frames = (self._recv_overflow(deadline) if self.is_local_reader
                  else self._recv_remote(deadline))
        yield self.codec.decode(frames[0].buffer, [f.buffer for f in frames[1:]])

    def dequeue_views(self, timeout: float | None = DEFAULT_TIMEOUT_S) -> list[memoryview]:
        """The next message's buffers ``[main, oob...]`` as read-only views, no codec and no
        copy: the raw-buffer read that pairs with :meth:`enqueue_buffers`.

        The views are valid until the next read from this end (any ``dequeue*``, or
        :meth:`close`): a local reader keeps the ring slot held until then, so the writer
        cannot reuse it meanwhile (with fewer free chunks for the writer, as
        :meth:`dequeue_borrowed`); the next read releases it first. Copy what must live longer.
        An overflowed or remote message comes as views of its socket frames.
        """
        if self._held_views is not None:
            self._release_held()
        if self.is_local_reader:
            deadline = None if timeout is None else time.monotonic() + timeout
            if not self._pending_overflow:
                reader, chunk = self._acquire_chunk(timeout)
                try:
                    decoded = decode_chunk(chunk)
                except BaseException:
                    self._release_chunk(reader)
                    raise
                if not decoded.overflow:
                    views = [view.toreadonly() for view in decoded.buffers]
                    _release_views(decoded.buffers)
                    self._held_views = views
                    return views
                self._pending_overflow += 1
                self._release_chunk(reader)
            frames = self._recv_overflow(deadline)
        elif self.is_remote_reader:
            deadline = None if timeout is None else time.monotonic() + timeout
            frames = self._recv_remote(deadline)
        else:
            raise RingError("ring.reader.readable-iff", "the writer end cannot dequeue")
        return [frame.buffer.toreadonly() for frame in frames]

    def _release_held(self) -> None:
        """Let go of the views :meth:`dequeue_views` returned and release their chunk."""
        views, self._held_views = self._held_views, None
        if views is not None:
            _release_views(views)
            reader = self._reader
            if reader is not None:
                self._release_chunk(reader)

    def broadcast_object(self, obj: Any = None) -> Any:
        """vLLM's collective helper: the writer enqueues ``obj``, a reader returns the next."""
        if self.is_writer:
            self.enqueue(obj)
            return obj
        return self.dequeue()

    @contextmanager
    def acquire_read(self, timeout: float | None = DEFAULT_TIMEOUT_S) -> Iterator[Buffer]:
        """Wait for the next readable chunk and yield its data; release it on exit, also when
        the body raises. Do not keep the view (or slices of it) past the block."""
        if self._held_views is not None:
            self._release_held()
        reader, chunk = self._acquire_chunk(timeout)
        view = chunk[:]
        try:
            yield view
        finally:
            _release_view(view)
            self._release_chunk(reader)

    def _acquire_chunk(self, timeout: float | None) -> tuple[RingReader, memoryview]:
        """Wait for the next readable chunk; the reader holding it and a view of all of it
        (the queue's own: release nothing, keep nothing past :meth:`_release_chunk`)."""
        reader = self._reader
        if reader is None:
            raise RingError("ring.reader.readable-iff", "only a local reader end has the ring")
        index = reader.try_acquire()
        if index is None:
            index = self._wait_for_readable(reader, timeout)
        return reader, self._chunk_views[index]

    def _wait_for_readable(self, reader: RingReader, timeout: float | None) -> int:
        """After one failed acquire: wait for the next chunk to be readable, hold it, return
        its index."""
        return self._wait_for(reader.try_acquire, timeout,
                              clause="ring.reader.timeout", what="a readable chunk",
                              block=self._block_on_notify, liveness=self._writer_liveness())

    def _writer_liveness(self) -> Callable[[], None] | None:
        """The check that the writer still runs (clause ring.liveness.peer-dead), if any."""
        liveness = self._resources.liveness
        return None if liveness is None else liveness.check_writer

    def _release_chunk(self, reader: RingReader) -> None:
        """Release the chunk ``reader`` (this end's) holds and, now and then, drain the notify
        socket."""
        reader.release()
        now = time.monotonic()
        if now - self._last_notify_drain >= NOTIFY_POLL_INTERVAL_S:
            self._drain_notify(now)

    def _drain_notify(self, now: float) -> None:
        self._last_notify_drain = now
        sock = self._notify_socket
        # poll() makes libzmq process the commands it queued for every notification.
        if sock is not None and sock.poll(0):
            sock.recv(zmq.NOBLOCK, copy=False)

    def _block_on_notify(self, seconds: float) -> bool:
        """Wait for a notification for at most ``seconds``; the first call of a wait only
        announces the block (clause ring.notify.waiting-state): this reader's state byte
        BLOCKING, then a fence, and back to the caller, which checks the flags once more before
        it calls again to block. A writer that set a written flag after that check sees the
        byte (both sides fence between their store and their load) and notifies."""
        record = self._resources.liveness
        if record is not None and not self._blocking:
            self._blocking = True
            record.set_state(BLOCKING)
            memory_fence()
            return False
        poller = self._poller
        assert poller is not None
        events = dict(poller.poll(max(1, int(seconds * 1000 + 0.999))))
        cancel_recv = self._cancel_recv
        if cancel_recv is not None and cancel_recv in events:
            cancel_recv.recv(zmq.NOBLOCK)
            raise QueueClosed("the queue was shut down")
        notify_socket = self._notify_socket
        if notify_socket is not None and notify_socket in events:
            notify_socket.recv(zmq.NOBLOCK, copy=False)
            self._last_notify_drain = time.monotonic()
        return True

    def _recv_overflow(self, deadline: float | None) -> list[zmq.Frame]:
        """The frames of the next overflowed message (a local reader's subscribe socket)."""
        sock = self._local_socket
        if sock is None:
            raise RingError("ring.reader.readable-iff", "only a local reader end has the ring")
        frames = self._recv_frames(sock, deadline)
        self._pending_overflow -= 1
        return frames

    def _recv_remote(self, deadline: float | None) -> list[zmq.Frame]:
        """The frames of the next message of a remote reader."""
        sock = self._remote_socket
        if sock is None:
            raise RingError("ring.reader.readable-iff", "only a reader end can dequeue")
        return self._recv_frames(sock, deadline)

    def _recv_frames(self, sock: zmq.Socket[Any], deadline: float | None) -> list[zmq.Frame]:
        liveness = self._resources.liveness
        interval = self.wait_policy.liveness_check_s if liveness is not None else None
        while True:
            if deadline is None:
                timeout_ms = int(min(self.wait_policy.recheck_s, interval or math.inf) * 1000)
            else:
                left = min(deadline - time.monotonic(), interval or math.inf)
                timeout_ms = max(0, int(left * 1000 + 0.999))
            if sock.poll(timeout_ms):
                return sock.recv_multipart(copy=False)
            if liveness is not None:
                liveness.check_writer()
            if self._shutting_down:
                raise QueueClosed("the queue was shut down")
            if deadline is not None and time.monotonic() >= deadline:
                raise ProtocolTimeout("ring.reader.timeout",
                                      "timed out waiting for the message on the subscribe socket",
                                      expected="a multipart message", got="timeout")

    def _decode_frames(self, frames: list[zmq.Frame]) -> Any:
        return self.codec.decode(frames[0].buffer, [bytearray(f.buffer) for f in frames[1:]])
