"""The executor RPC's messages, sans-IO: what vLLM's multiprocessing executor and its workers
put on their rings (spec clauses ``ring.executor.*``; ``enginewire spec show CLAUSE``).

- A *request* travels on the executor's broadcast ring: the plain tuple
  ``(method, args, kwargs, output_rank)``. ``method`` is a worker method's name (``str``) or a
  callable pickled by cloudpickle (``bytes``) that the worker calls with itself as first
  argument; ``args`` a tuple, ``kwargs`` a dict, ``output_rank`` the one rank that replies, or
  None for every rank (``ring.executor.rpc-request``, ``ring.executor.reply-rank``).
- A *reply* travels on each worker's own response ring (one reader: the executor): the tuple
  ``(status, value)``, ``status`` a member of vLLM's ``WorkerProc.ResponseStatus`` pickled by
  reference to vLLM's class; SUCCESS carries the result, FAILURE the ``str()`` of the
  exception, FAILURE_WITH_KV_OUTPUT a failed step's KV connector output
  (``ring.executor.response``).

The reference never imports vLLM. :class:`ResponseStatus` has vLLM's members and values;
:class:`ReplyCodec` writes it under vLLM's module and qualified name and reads that name back
as :class:`ResponseStatus`. The rest of a reply is pickled by :class:`.payload.PickleCodec`
(out-of-band buffers, vLLM's tensor reducer), so replies cost what any ring message costs.

Everything here is pure: the ring-driving ends are in :mod:`.executor`.
"""

from __future__ import annotations

import enum
import io
import pickle
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from ..errors import ExecutorError, ProtocolTimeout, WorkerFailure
from .framing import Buffer
from .payload import PickleCodec, _RingUnpickler, _ViewReader

#: Where vLLM defines the reply status enum (``WorkerProc.ResponseStatus``).
RESPONSE_MODULE = "vllm.v1.executor.multiproc_executor"
RESPONSE_QUALNAME = "WorkerProc.ResponseStatus"


class ResponseStatus(enum.Enum):
    """vLLM's ``WorkerProc.ResponseStatus`` (``enum.auto()`` values), without vLLM."""

    SUCCESS = 1
    FAILURE = 2
    FAILURE_WITH_KV_OUTPUT = 3


class Request(NamedTuple):
    """A request read off the broadcast ring and checked (it travels as a plain tuple)."""

    method: str | bytes
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output_rank: int | None


# --- requests ----------------------------------------------------------------------------------


def method_payload(method: str | Callable[..., Any]) -> str | bytes:
    """What a request carries for ``method``: a name as is, a callable pickled as vLLM's
    executor pickles it (cloudpickle, highest protocol; plain pickle, by reference only, where
    cloudpickle is not installed)."""
    if isinstance(method, str):
        return method
    if not callable(method):
        raise ExecutorError("ring.executor.rpc-request", "a method is a name or a callable",
                            expected="str or callable", got=type(method).__name__)
    try:
        import cloudpickle
    except ModuleNotFoundError:
        return pickle.dumps(method, protocol=pickle.HIGHEST_PROTOCOL)
    dumped: bytes = cloudpickle.dumps(method, protocol=pickle.HIGHEST_PROTOCOL)
    return dumped


def make_request(method: str | Callable[..., Any], args: tuple[Any, ...] = (),
                 kwargs: dict[str, Any] | None = None,
                 output_rank: int | None = None) -> tuple[Any, ...]:
    """The broadcast message for one call: the plain 4-tuple (never a named tuple: that would
    pickle as a class the worker may not have)."""
    if type(args) is not tuple:
        raise ExecutorError("ring.executor.rpc-request", "args is a tuple",
                            expected="tuple", got=type(args).__name__)
    if kwargs is not None and type(kwargs) is not dict:
        raise ExecutorError("ring.executor.rpc-request", "kwargs is a dict",
                            expected="dict", got=type(kwargs).__name__)
    return (method_payload(method), args, kwargs or {}, output_rank)


def parse_request(obj: Any) -> Request:
    """A broadcast message as a :class:`Request`, or :class:`ExecutorError` saying what is
    wrong with it (clause ``ring.executor.rpc-request``)."""
    if type(obj) is not tuple or len(obj) != 4:
        raise ExecutorError("ring.executor.rpc-request",
                            "a request is the tuple (method, args, kwargs, output_rank)",
                            expected="a tuple of 4", got=_shape(obj))
    method, args, kwargs, output_rank = obj
    if not isinstance(method, (str, bytes)):
        raise ExecutorError("ring.executor.rpc-request",
                            "method is a name (str) or a pickled callable (bytes)",
                            expected="str or bytes", got=type(method).__name__)
    if type(args) is not tuple or type(kwargs) is not dict:
        raise ExecutorError("ring.executor.rpc-request", "args is a tuple and kwargs a dict",
                            expected="(tuple, dict)",
                            got=(type(args).__name__, type(kwargs).__name__))
    if output_rank is not None and (type(output_rank) is not int or output_rank < 0):
        raise ExecutorError("ring.executor.rpc-request", "output_rank is None or a rank",
                            expected="None or an int >= 0", got=output_rank)
    return Request(method, args, kwargs, output_rank)


def resolve_method(method: str | bytes, worker: Any) -> Callable[..., Any]:
    """What the worker calls for a request's ``method``: its own method of that name, or the
    unpickled callable with the worker bound as first argument. Raises what the lookup or the
    unpickling raises (the worker answers it as a FAILURE)."""
    if isinstance(method, str):
        return getattr(worker, method)  # type: ignore[no-any-return]
    return partial(pickle.loads(method), worker)


def replies(output_rank: int | None, rank: int) -> bool:
    """Whether worker ``rank`` answers a request for ``output_rank`` (it executes it anyway;
    clause ``ring.executor.reply-rank``)."""
    return output_rank is None or output_rank == rank


# --- replies -----------------------------------------------------------------------------------


def success(value: Any) -> tuple[ResponseStatus, Any]:
    return (ResponseStatus.SUCCESS, value)


def failure(error: BaseException) -> tuple[ResponseStatus, Any]:
    """A FAILURE reply carries the exception's text, not the exception."""
    return (ResponseStatus.FAILURE, str(error))


def parse_reply(obj: Any, rank: int) -> tuple[ResponseStatus, Any]:
    """A reply as ``(status, value)``, or :class:`ExecutorError` (``ring.executor.response``)."""
    if type(obj) is not tuple or len(obj) != 2:
        raise ExecutorError("ring.executor.response",
                            f"worker {rank}'s reply is the tuple (status, value)",
                            expected="a tuple of 2", got=_shape(obj))
    if not isinstance(obj[0], ResponseStatus):
        raise ExecutorError("ring.executor.response",
                            f"worker {rank}'s reply status is a WorkerProc.ResponseStatus",
                            expected="a ResponseStatus member", got=obj[0])
    return obj


def reply_error(status: ResponseStatus, value: Any, rank: int) -> WorkerFailure | None:
    """The error the executor raises for a reply (None for SUCCESS), with vLLM's text
    (clause ``ring.executor.failure``, without fault tolerance)."""
    if status is ResponseStatus.SUCCESS:
        return None
    if status is ResponseStatus.FAILURE_WITH_KV_OUTPUT:
        text = "Worker failed with KV connector output"
    else:
        text = (f"Worker failed with error '{value}', please check the stack trace above for "
                "the root cause")
    return WorkerFailure(text, rank=rank, status=status, value=value)


def rpc_timeout(method: Any) -> ProtocolTimeout:
    """The error of a timed call that got no reply in time (clause ``ring.executor.timeout``);
    raise it ``from`` the queue's own ``TimeoutError``."""
    return ProtocolTimeout("ring.executor.timeout", f"RPC call to {method} timed out.")


def _shape(obj: Any) -> str:
    size = f" of {len(obj)}" if isinstance(obj, (tuple, list)) else ""
    return f"{type(obj).__name__}{size}"


# --- the reply codec ---------------------------------------------------------------------------

_PROTO = b"\x80\x05"
_STOP = b"."
_TUPLE2 = b"\x86"


def _status_opcodes(status: ResponseStatus) -> bytes:
    """``ResponseStatus(value)`` naming vLLM's class: the opcodes vLLM's own pickler writes for
    the member (SHORT_BINUNICODE module, SHORT_BINUNICODE qualname, STACK_GLOBAL, BININT1,
    TUPLE1, REDUCE), without its MEMOIZE opcodes, so that the memo indices of whatever
    follows stay those its own pickler gave them."""
    module, qualname = RESPONSE_MODULE.encode(), RESPONSE_QUALNAME.encode()
    return (b"\x8c" + bytes((len(module),)) + module + b"\x8c" + bytes((len(qualname),))
            + qualname + b"\x93K" + bytes((status.value,)) + b"\x85R")


_STATUS_OPCODES = {status: _status_opcodes(status) for status in ResponseStatus}


class _ReplyUnpickler(_RingUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == RESPONSE_MODULE and name == RESPONSE_QUALNAME:
            return ResponseStatus
        return super().find_class(module, name)


class ReplyCodec:
    """The payload codec of a worker's response ring: ``(status, value)`` as vLLM writes it.

    ``encode`` pickles ``value`` with :class:`.payload.PickleCodec` and puts the status in
    front of it at the opcode level: ``PROTO 5, <status>, <value's opcodes>, TUPLE2, STOP``
    (a pickler of the C library cannot name a class it does not import, and vLLM is not
    imported here). ``decode`` reads vLLM's class name as :class:`ResponseStatus` and maps
    vLLM's tensor rebuild as :class:`.payload.PickleCodec` does.
    """

    name = "executor-reply"

    def __init__(self, oob_threshold: int | None = None) -> None:
        self._values = PickleCodec() if oob_threshold is None else PickleCodec(oob_threshold)

    def encode(self, obj: Any) -> list[Buffer]:
        if type(obj) is not tuple or len(obj) != 2 or not isinstance(obj[0], ResponseStatus):
            raise ExecutorError("ring.executor.response",
                                "a reply is the tuple (ResponseStatus, value)",
                                expected="(ResponseStatus, value)", got=_shape(obj))
        status, value = obj
        buffers = self._values.encode(value)
        main = memoryview(buffers[0]).cast("B")
        if main[:2] != _PROTO or main[-1:] != _STOP:
            raise ExecutorError("ring.payload.pickle-protocol-5",
                                "the value's pickle is one protocol-5 stream",
                                expected=_PROTO, got=bytes(main[:2]))
        # The value's last frame (if framed) ends with its STOP byte: TUPLE2 takes that place
        # inside the frame, and the new STOP follows outside it.
        buffers[0] = b"".join((_PROTO, _STATUS_OPCODES[status], main[2:-1], _TUPLE2, _STOP))
        return buffers

    def decode(self, main: Buffer, oob: Sequence[Buffer]) -> Any:
        reader = _ViewReader(main) if not isinstance(main, bytes) else io.BytesIO(main)
        return _ReplyUnpickler(reader, buffers=oob).load()
