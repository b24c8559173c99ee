"""The target contract: what an implementation gives the conformance suite, per surface.

A *target* is the implementation under test. It may implement any subset of four surfaces;
checks of a surface it lacks are reported NOT IMPLEMENTED, never passed.

``codec`` -- encoding and decoding by kind (:class:`CodecSurface`)
    ``encode(kind, value) -> list[bytes-like]`` and ``decode(kind, frames) -> value``.
    ``kind`` is a spec struct name (``"EngineCoreRequest"``, ``"EngineCoreOutputs"``,
    ``"EngineCoreReadyResponse"``, ``"EngineHandshakeMetadata"``, ...) or a message kind
    (``"add"``, ``"abort"``, ``"start_dp_wave"``, ``"utility"``, ``"hello"``, ``"init"``,
    ``"ready"``, ``"ready_response"``, ``"outputs"``, ``"engine_core_dead"``).
    For a struct kind the frames are ``[msgpack, oob...]``; for a message kind they are the
    frames exactly as the *sender* hands them to its socket (an input message starts with its
    one-byte type frame; no routing identity: the ROUTER adds and strips that).
    Values are neutral values (:mod:`enginewire.conformance.oracle.values`): structs as dicts by
    field name, tensors as ``torch.Tensor``, arrays as ``numpy.ndarray``. ``decode`` may return
    its own classes: the suite normalizes them. ``decode`` is also how the suite hands the
    codec raw, possibly malformed, frames: it must raise an exception for frames the spec
    rejects (ideally one carrying ``.clause``, the violated clause ID; when it carries one, it
    must be the right one). Optional: ``with_threshold(n) -> CodecSurface``, a codec whose
    inline threshold for tensors is ``n`` bytes (capability ``codec.threshold``): a new codec
    of the *same* implementation, never a reference codec, and ``with_threshold(default)``
    encodes exactly as the codec itself does.

    *Rejections are evidence only in the contract's error kind* (:func:`is_rejection`): any
    ``Exception`` other than ``NotImplementedError`` refuses the input (best: a ``ValueError``
    carrying ``.clause``, the reference's ``ProtocolError`` or msgspec's ``ValidationError``).
    ``NotImplementedError`` says the target has no code for the operation: the check is NOT
    IMPLEMENTED, never passed or failed, whatever the check did with it. An adapter whose
    implementation refuses some input with ``NotImplementedError`` (vLLM's decoder does, for
    an unknown extension code) translates that into a rejection itself.

    *Roles* (attribute ``role``, :data:`CODEC_ROLES`): ``"frontend"`` encodes what a front end
    sends (``add``, ``abort``, ``utility``, ``init``, ``EngineCoreRequest``, ...) and decodes
    what the others send; ``"engine"`` encodes what an engine sends (``outputs``,
    ``utility_reply``, ``hello``, ``ready``, ``ready_response``, ``EngineCoreOutputs``, ...)
    and decodes what the others send; ``"both"`` (the default) does everything. A check that
    needs an operation outside the role is NOT APPLICABLE, counted apart. Finer: the
    attribute ``unsupported`` may list ``"encode:KIND"`` / ``"decode:KIND"`` (or
    ``"encode:*"``): checks that need those are NOT IMPLEMENTED without calling the codec.

``ring`` -- the shared-memory broadcast ring (:class:`RingSurface`)
    ``create_writer(n_reader=, max_chunk_bytes=, max_chunks=) -> RingWriter`` creates the
    segment and sockets; ``writer.handle`` is a :class:`RingHandle`. ``attach_reader(handle,
    rank) -> RingReader`` attaches reader ``rank`` (0-based local reader rank) to a ring that
    the suite or the target created. Both sides have ``wait_until_ready(timeout)`` (the
    collective start: the writer waits for one subscription per reader and publishes
    ``READY``), ``enqueue(obj, timeout)`` / ``dequeue(timeout)`` (raising ``TimeoutError``
    when the time runs out) and ``close()`` (which unlinks what it created). Objects are
    Python objects carried by pickle, as in vLLM. Either side alone is enough: a target with
    only ``attach_reader`` is checked as a reader against the suite's writer and vice versa
    (capabilities ``ring.writer`` and ``ring.reader``). Optional (capability ``ring.memory``):
    ``memory_writer(memory, n_reader=, max_chunk_bytes=, max_chunks=)`` with ``write(buffers)
    -> bool`` (False: no free chunk) and ``memory_reader(memory, ..., rank=)`` with ``read() ->
    buffers | None`` (optionally ``read(consume=)``: call ``consume(buffers)`` while the chunk
    is held, releasing it also when that raises, then re-raise), the flag protocol over a
    memory the suite provides (``load(offset)``,
    ``store(offset, value)``, ``read(offset, length)``, ``write(offset, data)``, ``fence()``,
    ``yield_()``, ``notify()``, ``wait_notify()``), so the suite can log the order of every
    store and fence; the reader may have ``wait()``, called after a ``read()`` that found
    nothing: how it waits (``memory.yield_()``: until a flag changes, as a reader that
    rechecks; ``memory.wait_notify()``: until a notification, with no recheck); the
    writer calls ``memory.notify()`` where it sends its notification (the notify socket send),
    so the notification is an ordered event of that log too. Optional (capability
    ``ring.remote``): ``create_remote_writer(n_reader=, n_local_reader=, max_chunk_bytes=,
    max_chunks=, connect_ip=)``, a writer with readers on other nodes, whose handle carries
    ``remote_subscribe_address``. Optional, for ``enginewire bench`` only: a reader's
    ``dequeue_borrowed(timeout)``, a context manager yielding the next object with its large
    buffers still in the ring slot (zero-copy reads), announced by ``borrowed_reads = True``
    on the surface. A ring that implements vLLM's shared-memory tensor arena (its readers
    attach to a handle whose ``tensor_arena_handle`` names one) says so with
    ``tensor_arena = True`` on the surface; without it, a reader must refuse such a handle.

``engine`` -- an engine core the suite drives as a front end (:class:`EngineSurface`)
    ``start_engine(launch: EngineLaunch) -> RunningPeer``: start an engine with index
    ``launch.engine_index`` that connects to the suite's handshake ROUTER at
    ``launch.handshake_address`` and then follows the handshake (HELLO, init, READY, the
    ready response on every input socket). The suite binds every socket; the engine only
    connects, to exactly the addresses init names. The engine must serve ADD (an output for
    the request, finished within ``sampling_params.max_tokens`` tokens), ABORT, and UTILITY
    (any reply to a method it does not have: a ``failure_message``), and must survive
    malformed input. It must give up the handshake after ``launch.init_timeout`` seconds
    without init. Optional: ``die(peer)`` makes a running engine fail, so that it sends
    ENGINE_CORE_DEAD (capability ``engine.die``).

``frontend`` -- a front end the suite serves as a conformance engine core
    ``start_frontend(launch: FrontendLaunch) -> FrontendClient``: a front end that binds the
    handshake ROUTER at ``launch.handshake_address`` and the input ROUTER and output PULL at
    ``launch.input_address`` / ``launch.output_address`` for ``launch.engine_count`` engines
    (identities of ranks 0..N-1), as one client (client_index 0), with the engines local and
    not data-parallel-coordinated. The returned :class:`FrontendClient` lets the suite make
    it send requests (to the engine the suite names) and read what it delivered back.
    A front end that has no handshake channel by design (vLLM's client given
    ``client_addresses``) sets the surface attribute ``handshake = False``: it ignores
    ``launch.handshake_address``, the suite's engines connect to the input and output
    addresses directly and send their ready responses, and checks of the handshake itself
    report NOT APPLICABLE (mode ``frontend.handshake``, :data:`MODES`). Optional (capability
    ``frontend.coordinated``, surface attribute ``supports_coordinated_dp``): a launch with
    ``parallel_config_hash`` starts a front end of coordinated data parallelism whose own
    parallel config hashes to that value.

Set-up (optional, any surface): ``prepare()``, called before each check of the surface and
outside its time limit; it does its work once (a vLLM engine configuration, say) and returns at
once afterwards.

Introspection (optional, in-process targets only): a surface may expose the ZMQ sockets a
running peer has open, for the clauses that are socket options nobody outside can observe
(``transport.hwm-zero``, ``ring.notify.sub-conflate``). ``engine.zmq_sockets(peer)``,
``frontend.zmq_sockets(client)`` and ``ring.zmq_sockets(end)`` return a list of
``(channel, zmq.Socket)`` pairs (channels ``handshake``, ``input``, ``output``; for a ring end
``subscribe``, ``notify``, ``remote``); the suite only reads options with ``getsockopt``
(capabilities ``engine.sockets``, ``frontend.sockets``, ``ring.sockets``).

Executor RPC over the ring (optional, in-process targets): what vLLM's multiprocessing executor
and its workers send through their rings (spec clauses ``ring.executor.*``).
``ring.start_worker(broadcast, rank, worker) -> WorkerPeer`` (capability ``ring.worker``):
attach as reader ``rank`` of the broadcast ring ``broadcast`` (a :class:`RingHandle` the suite
created), create a response ring with one reader and expose its handle as
``peer.response_handle``, take part in both rings' ``wait_until_ready`` (on a thread of its
own), then execute every request ``(method, args, kwargs, output_rank)`` on the object
``worker`` (a method name) or with it as first argument (a pickled callable) and reply
``(status, value)``; ``peer.stop()``. ``ring.create_executor(world_size=, max_chunk_bytes=,
max_chunks=) -> ExecutorEnd`` (capability ``ring.executor``): an executor without fault
tolerance whose broadcast ring's handle is ``.broadcast_handle``;
``.connect(response_handles, timeout)`` attaches to the workers' response rings and takes part
in every ``wait_until_ready``; ``.collective_rpc(method, args=(), kwargs=None,
unique_reply_rank=None, timeout=None)`` returns the reply values (a list in rank order, or
the one value of ``unique_reply_rank``) or raises as the executor does; ``.close()``.

Kinds of target (``enginewire check --target T``, resolved by :mod:`.resolve`):

- ``reference`` (default): :mod:`enginewire.reference`.
- ``vllm``: adapters over vLLM's ``MsgpackEncoder``/``MsgpackDecoder``, ``MessageQueue`` and
  front-end client (:mod:`enginewire.conformance.targets.vllm.target`).
- ``PREFIX:NAME``: a target from a provider a higher layer registered with
  :func:`enginewire.conformance.targets.resolve.register_provider` (``mutant:NAME``: a
  deliberately broken target of ``enginewire.fuzz.mutants``, registered by that package).
- ``package.module:attr``: an in-process Python object (or a zero-argument factory of one)
  with any of the attributes ``codec``, ``ring``, ``engine``, ``frontend``.
- external programs, per surface, with ``--target-cmd SURFACE=COMMAND`` (see
  :mod:`enginewire.conformance.targets.external` for the stdin/stdout protocols and placeholders).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from enginewire.conformance.framework.registry import SURFACES, NotImplementedSurface

Frames = Sequence[bytes | bytearray | memoryview]

#: Optional capabilities: name -> (surface, attribute the surface object must have).
CAPABILITIES: dict[str, tuple[str, str]] = {
    "codec.threshold": ("codec", "with_threshold"),
    "codec.insecure": ("codec", "with_insecure_serialization"),
    "ring.writer": ("ring", "create_writer"),
    "ring.reader": ("ring", "attach_reader"),
    "ring.memory": ("ring", "memory_writer"),
    "engine.die": ("engine", "die"),
    "ring.remote": ("ring", "create_remote_writer"),
    "ring.sockets": ("ring", "zmq_sockets"),
    "ring.executor": ("ring", "create_executor"),
    "ring.worker": ("ring", "start_worker"),
    "engine.sockets": ("engine", "zmq_sockets"),
    "frontend.sockets": ("frontend", "zmq_sockets"),
    "frontend.coordinated": ("frontend", "supports_coordinated_dp"),
}

#: Parts of the protocol a surface may leave out by design (not by omission): name ->
#: (surface, flag attribute). A surface whose flag attribute is ``False`` says it works
#: without that part, and checks that need it report NOT APPLICABLE for it (never passed).
#: A surface without the attribute has the part.
MODES: dict[str, tuple[str, str]] = {
    # A front end given the engines' input/output addresses directly (vLLM's
    # ``client_addresses``): no handshake ROUTER; it waits for one ready response per engine
    # identity on the input ROUTER and nothing else.
    "frontend.handshake": ("frontend", "handshake"),
    # An engine launched with dp_size > 1 that runs coordinated data parallelism (READY
    # carries parallel_config_hash). vLLM runs the data-parallel ranks of a dense (non-MoE)
    # model as independent engines of DP size 1 (vllm/v1/engine/core.py:1544-1555).
    "engine.coordinated-dp": ("engine", "coordinated_dp"),
}


class TargetError(ValueError):
    """The ``--target`` or ``--target-cmd`` text names nothing the suite can load."""


class TargetStartError(TargetError):
    """A target's program could not be started, or exited before it served anything (a
    ``--target-cmd`` program exiting before its first answer, an engine program before its
    first message). Not a verdict on the check that started it: the run stops and ``check``
    reports it as it reports a target it cannot load (exit 2)."""


# --- evidence ----------------------------------------------------------------------------

#: ``codec.role`` values: which side's messages the codec encodes (it decodes the others').
CODEC_ROLES = ("frontend", "engine", "both")


class Unsupported(NotImplementedError):
    """The target has no code for this operation (a declared ``unsupported`` kind, or an
    external program's ``"kind": "unsupported"`` answer): the check is NOT IMPLEMENTED."""


class OutsideRole(NotImplementedError):
    """The operation lies outside the codec's declared ``role``: the check is NOT
    APPLICABLE."""


def is_rejection(exc: BaseException) -> bool:
    """Whether ``exc`` is the contract's way of refusing invalid input (see the module doc):
    an ``Exception`` that is not a ``NotImplementedError``."""
    return isinstance(exc, Exception) and not isinstance(exc, NotImplementedError)


# --- codec -------------------------------------------------------------------------------


@runtime_checkable
class CodecSurface(Protocol):
    def encode(self, kind: str, value: Any) -> Frames:
        """Encode ``value`` (neutral) as ``kind``; return the frames (first: msgpack/type)."""

    def decode(self, kind: str, frames: Frames) -> Any:
        """Decode ``frames`` as ``kind``; raise on frames the spec rejects."""


# --- ring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RingHandle:
    """Everything a reader needs to attach, the neutral form of vLLM's ``Handle``.

    ``shm_name`` names the POSIX shared-memory segment (without ``/dev/shm/``);
    ``subscribe_address`` is the writer's XPUB (readiness and overflow messages),
    ``notify_address`` its PUB of wake-up pings.
    """

    n_reader: int
    max_chunk_bytes: int
    max_chunks: int
    shm_name: str
    subscribe_address: str
    notify_address: str
    reader_ranks: tuple[int, ...] = ()
    #: vLLM's shared-memory tensor arena, when the writer uses one (a reader that does not
    #: implement it must refuse such a handle).
    tensor_arena_handle: tuple[Any, ...] | None = None
    #: The writer's TCP XPUB for readers on other nodes (ranks not in ``reader_ranks``).
    remote_subscribe_address: str | None = None
    remote_ipv6: bool = False

    def as_handle(self, handle_class: Any) -> Any:
        """This handle as ``handle_class`` (vLLM's ``shm_broadcast.Handle``, or an
        implementation's class with the same fields)."""
        return handle_class(
            local_reader_ranks=list(self.reader_ranks or range(self.n_reader)),
            buffer_handle=(self.n_reader, self.max_chunk_bytes, self.max_chunks, self.shm_name),
            local_subscribe_addr=self.subscribe_address,
            local_notify_addr=self.notify_address,
            remote_subscribe_addr=self.remote_subscribe_address,
            remote_addr_ipv6=self.remote_ipv6,
            tensor_arena_handle=self.tensor_arena_handle,
        )

    def to_builtins(self) -> dict[str, Any]:
        return {
            "n_reader": self.n_reader,
            "max_chunk_bytes": self.max_chunk_bytes,
            "max_chunks": self.max_chunks,
            "shm_name": self.shm_name,
            "subscribe_address": self.subscribe_address,
            "notify_address": self.notify_address,
            "reader_ranks": list(self.reader_ranks or range(self.n_reader)),
            "tensor_arena_handle": (list(self.tensor_arena_handle)
                                    if self.tensor_arena_handle else None),
            "remote_subscribe_address": self.remote_subscribe_address,
            "remote_ipv6": self.remote_ipv6,
        }

    @classmethod
    def from_builtins(cls, data: dict[str, Any]) -> RingHandle:
        return cls(
            n_reader=int(data["n_reader"]),
            max_chunk_bytes=int(data["max_chunk_bytes"]),
            max_chunks=int(data["max_chunks"]),
            shm_name=str(data["shm_name"]),
            subscribe_address=str(data["subscribe_address"]),
            notify_address=str(data["notify_address"]),
            reader_ranks=tuple(data.get("reader_ranks") or ()),
            tensor_arena_handle=(tuple(data["tensor_arena_handle"])
                                 if data.get("tensor_arena_handle") else None),
            remote_subscribe_address=data.get("remote_subscribe_address"),
            remote_ipv6=bool(data.get("remote_ipv6", False)),
        )


class RingWriter(Protocol):
    handle: RingHandle

    def wait_until_ready(self, timeout: float) -> None: ...
    def enqueue(self, obj: Any, timeout: float | None = None) -> None: ...
    def close(self) -> None: ...


class RingReader(Protocol):
    def wait_until_ready(self, timeout: float) -> None: ...
    def dequeue(self, timeout: float | None = None) -> Any: ...
    def close(self) -> None: ...


class RingSurface(Protocol):
    def create_writer(self, *, n_reader: int, max_chunk_bytes: int, max_chunks: int) -> RingWriter:
        ...

    def attach_reader(self, handle: RingHandle, rank: int) -> RingReader: ...


# --- engine and front end ----------------------------------------------------------------


@dataclass(frozen=True)
class EngineLaunch:
    """How the suite asks for an engine: it binds, the engine connects.

    For a release without the HELLO/READY handshake (before 0.9.0: history/constants.toml
    ``[[transport]]``) ``handshake_address`` is None and the engine is given its input and
    output addresses directly, on which it opens the release's sockets (binding those the
    release's engine binds)."""

    handshake_address: str | None
    engine_index: int = 0
    dp_size: int = 1
    #: The engine runs on the front end's node (HELLO/READY ``local``).
    local: bool = True
    headless: bool = False
    #: Seconds the engine waits for init after HELLO before it gives up.
    init_timeout: float = 300.0
    #: Without a handshake: the input and output addresses (one pair).
    input_addresses: tuple[str, ...] = ()
    output_addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class FrontendLaunch:
    """How the suite asks for a front end: the front end binds these three addresses (of a
    release without the handshake: opens the release's input and output sockets on the two,
    binding those the release's front end binds, and has no handshake ROUTER)."""

    handshake_address: str
    input_address: str
    output_address: str
    engine_count: int = 1
    #: Not None: run as a front end of coordinated data parallelism whose own parallel config
    #: hashes to this value, so it accepts only a READY carrying it (capability
    #: ``frontend.coordinated``).
    parallel_config_hash: str | None = None


class RunningPeer(Protocol):
    def stop(self, timeout: float = 5.0) -> None:
        """Stop the peer and free everything it holds; idempotent."""

    def alive(self) -> bool:
        """True while the peer still runs (process or thread)."""


class EngineSurface(Protocol):
    def start_engine(self, launch: EngineLaunch) -> RunningPeer: ...


class FrontendClient(RunningPeer, Protocol):
    def wait_ready(self, timeout: float) -> None:
        """Return once the front end completed the handshake with every engine."""

    def add_request(self, request: dict[str, Any], engine_index: int = 0) -> None:
        """Send an ADD with the neutral ``EngineCoreRequest`` to engine ``engine_index``."""

    def abort(self, request_ids: list[str], engine_index: int = 0) -> None: ...

    def call_utility(
        self, method: str, args: list[Any], engine_index: int = 0, timeout: float = 5.0
    ) -> Any:
        """Send a UTILITY call and return its result (raise with the failure message)."""

    def next_outputs(self, timeout: float) -> Any:
        """The next ``EngineCoreOutputs`` the front end received (neutral or its own class);
        raise ``TimeoutError`` when none came, ``ConnectionError`` once it saw the engine die."""


class FrontendSurface(Protocol):
    def start_frontend(self, launch: FrontendLaunch) -> FrontendClient: ...


# --- targets -----------------------------------------------------------------------------


@dataclass
class Target:
    """An implementation under test: a name and the surfaces it implements (None: absent)."""

    name: str
    codec: Any = None
    ring: Any = None
    engine: Any = None
    frontend: Any = None
    description: str = ""
    _closers: list[Callable[[], Any]] = field(default_factory=list)

    def surface(self, name: str) -> Any:
        """The surface object, or raise :class:`NotImplementedSurface`."""
        if name not in SURFACES:
            raise KeyError(f"unknown surface {name!r}")
        found = getattr(self, name)
        if found is None:
            raise NotImplementedSurface(f"target {self.name!r} does not implement {name}")
        return found

    def has(self, capability: str) -> bool:
        """Whether the target implements ``capability`` (a surface name, a CAPABILITIES key,
        or a MODES key: then whether the surface exists; see :meth:`applies`)."""
        if capability in SURFACES:
            return getattr(self, capability) is not None
        if capability in MODES:
            return getattr(self, MODES[capability][0]) is not None
        surface, attribute = CAPABILITIES[capability]
        found = getattr(self, surface)
        if found is None:
            return False
        missing = getattr(found, "unsupported", ())
        return hasattr(found, attribute) and capability not in missing

    def applies(self, mode: str) -> bool:
        """Whether the target has the part of the protocol ``mode`` (a :data:`MODES` key)
        names; False only when its surface says it works without it."""
        surface, attribute = MODES[mode]
        found = getattr(self, surface)
        return found is None or getattr(found, attribute, True) is not False

    def implemented(self) -> list[str]:
        return [name for name in SURFACES if getattr(self, name) is not None]

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()


def from_object(name: str, obj: Any, description: str = "") -> Target:
    """Wrap an in-process object (or a zero-argument factory of one) as a :class:`Target`."""
    if isinstance(obj, Target):
        return obj
    if callable(obj) and not any(hasattr(obj, s) for s in SURFACES):
        obj = obj()
        if isinstance(obj, Target):
            return obj
    found = {s: getattr(obj, s, None) for s in SURFACES}
    if not any(v is not None for v in found.values()):
        raise TargetError(
            f"{name}: {type(obj).__name__} has none of the attributes {', '.join(SURFACES)}"
        )
    target = Target(name=name, description=description or (obj.__doc__ or "").strip(), **found)  # type: ignore[arg-type]
    if hasattr(obj, "close"):
        target._closers.append(obj.close)
    return target
