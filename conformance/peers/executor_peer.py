"""The executor RPC over the ring, the suite's side: messages, a worker object, a worker end.

vLLM's multiprocessing executor broadcasts every call to its workers as the tuple
``(method, args, kwargs, output_rank)`` on one ring; each worker answers ``(status, value)`` on
a ring of its own whose single reader is the executor, ``status`` being a member of vLLM's
``WorkerProc.ResponseStatus`` enum pickled by reference (spec clauses ``ring.executor.*``,
``vllm/v1/executor/multiproc_executor.py:488-548``, ``:1091-1183``).

The suite reads and writes those messages without importing vLLM: :class:`ResponseStatus` is a
stand-in with the same members and values; :func:`dumps_reply` pickles it under vLLM's module
and qualified name (exactly the opcodes ``pickle`` writes for vLLM's own class), and
:func:`loads_reply` maps vLLM's name back to the stand-in, so a reply that names any other
class does not come out as a :class:`ResponseStatus`.

- :class:`ConformanceWorker`: the object a target's worker executes calls on; it records them.
- :func:`add_rank`: the callable the suite sends pickled (``method`` as bytes).
- :class:`SuiteWorker`: the suite as worker ``rank`` of a target's executor.
"""

from __future__ import annotations

import enum
import io
import pickle
import threading
from collections.abc import Sequence
from typing import Any

from enginewire.conformance.peers.ring_peer import OOB_MIN_BYTES, SuiteRingReader, SuiteRingWriter
from enginewire.conformance.targets.contract import RingHandle

RESPONSE_MODULE = "vllm.v1.executor.multiproc_executor"
RESPONSE_QUALNAME = "WorkerProc.ResponseStatus"


class ResponseStatus(enum.Enum):
    """The suite's stand-in for vLLM's ``WorkerProc.ResponseStatus`` (``enum.auto()`` values)."""

    SUCCESS = 1
    FAILURE = 2
    FAILURE_WITH_KV_OUTPUT = 3


class _ReplyPickler(pickle._Pickler):
    """The pure-Python pickler, writing :class:`ResponseStatus` as vLLM's class."""

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if obj is ResponseStatus:
            self.save(RESPONSE_MODULE)  # type: ignore[attr-defined]
            self.save(RESPONSE_QUALNAME)  # type: ignore[attr-defined]
            self.write(pickle.STACK_GLOBAL)  # type: ignore[attr-defined]
            self.memoize(obj)  # type: ignore[attr-defined]
            return
        super().save_global(obj, name)  # type: ignore[misc]


def dumps_reply(status: ResponseStatus, value: Any) -> list[bytes]:
    """``(status, value)`` as a worker's ring message ``[pickle, oob...]``: protocol 5,
    PickleBuffers of 1 MiB or more out of band, ``status`` naming vLLM's enum."""
    extra: list[bytes] = []

    def callback(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if len(raw) < OOB_MIN_BYTES:
            return True
        extra.append(bytes(raw))
        return False

    with io.BytesIO() as out:
        _ReplyPickler(out, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=callback).dump(
            (status, value))
        return [out.getvalue(), *extra]


class _ReplyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == (RESPONSE_MODULE, RESPONSE_QUALNAME):
            return ResponseStatus
        return super().find_class(module, name)


def loads_reply(buffers: Sequence[bytes]) -> Any:
    """A worker's reply, with vLLM's ``WorkerProc.ResponseStatus`` read as the stand-in."""
    with io.BytesIO(bytes(buffers[0])) as stream:
        return _ReplyUnpickler(stream, buffers=[bytearray(b) for b in buffers[1:]]).load()


def names_response_status(main: bytes) -> bool:
    """Whether a pickle stream names vLLM's ``WorkerProc.ResponseStatus`` (by reference)."""
    return RESPONSE_MODULE.encode() in main and RESPONSE_QUALNAME.encode() in main


def add_rank(worker: Any, offset: int) -> int:
    """Sent pickled as a request's ``method``: the worker calls it with itself first."""
    return worker.rank + offset


def method_bytes(func: Any) -> bytes:
    """A module-level function pickled by reference, as cloudpickle pickles an importable one
    (what vLLM's executor sends for a callable ``method``)."""
    return pickle.dumps(func, protocol=pickle.HIGHEST_PROTOCOL)


class ConformanceWorker:
    """The object a target's worker runs requests on; every call is recorded.

    ``echo(*args, **kwargs)`` returns ``(rank, args, kwargs)``; ``fail(message)`` raises
    ``ValueError(message)``.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self._lock = threading.Lock()

    def _record(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append((method, args, kwargs))

    def echo(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
        self._record("echo", args, kwargs)
        return (self.rank, args, kwargs)

    def fail(self, message: str) -> None:
        self._record("fail", (message,), {})
        raise ValueError(message)

    def recorded(self) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        with self._lock:
            return list(self.calls)


class SuiteWorker:
    """The suite as worker ``rank`` of a target's executor: local reader ``rank`` of the
    executor's broadcast ring, writer of a response ring with one reader (the executor)."""

    def __init__(self, broadcast: RingHandle, rank: int, directory: str, *,
                 max_chunk_bytes: int = 65536, max_chunks: int = 4) -> None:
        self.rank = rank
        self.requests = SuiteRingReader(broadcast, rank)
        try:
            self.responses = SuiteRingWriter(1, max_chunk_bytes, max_chunks, directory)
        except BaseException:
            self.requests.close()
            raise
        self.response_handle = self.responses.handle

    def read_request(self, timeout: float) -> tuple[list[bytes], Any]:
        """The next broadcast message: its buffers and the unpickled object."""
        buffers = self.requests.read_buffers(timeout)
        return buffers, pickle.loads(buffers[0], buffers=[bytearray(b) for b in buffers[1:]])

    def reply(self, status: ResponseStatus, value: Any, timeout: float = 5.0) -> list[bytes]:
        buffers = dumps_reply(status, value)
        self.responses.write_buffers(buffers, timeout)
        return buffers

    def close(self) -> None:
        self.requests.close()
        self.responses.close()
