"""What every interop cell shares: the constants of the exchanges, a cell's result
(:class:`Cell`, :class:`Exchange`, documented deviations and :func:`classify`), the
step runner, addresses and leftovers, the handshake launcher for front ends without a
handshake channel, and the implementations paired (:data:`IMPLEMENTATIONS`)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: The implementations paired by default (conformance target names).
PEERS = ("reference", "vllm")
TRANSPORTS = ("ipc", "tcp")
#: Seconds any one wait of an exchange may take (multiplied by ``--timeout-scale``).
STEP_TIMEOUT = 30.0
#: The generation request: its prompt and max_tokens (below the vLLM stand-in's model length).
ADD_PROMPT = [7, 8, 9]
ADD_TOKENS = 5
#: The request that is aborted: long enough that an engine that ignores the ABORT is seen
#: running on to length (and within the vLLM stand-in's model length, 256).
ABORT_TOKENS = 240
#: Seconds without output for the aborted request after which it counts as stopped (an engine
#: that aborts without sending a final output, as vLLM's does).
ABORT_QUIET_S = 1.0
#: Seconds between the reference engine's generation steps in the matrix (so the ABORT of a
#: 240-token request arrives while it still runs).
REFERENCE_STEP_DELAY = 0.01
RING_MESSAGES = 1000
RING_READERS = 2
RING_CHUNK = 2 * 1024 * 1024
RING_CHUNKS = 4
#: Message indices of the stream that carry the special payloads.
OVERFLOW_INDEX = 333
OUT_OF_BAND_INDEX = 666
FINISH_LENGTH = 1  # FinishReason.LENGTH
FINISH_ABORT = 2  # FinishReason.ABORT


# --- results ---------------------------------------------------------------------------------


class ExchangeFailure(Exception):
    """One exchange of a cell went wrong: ``message`` says what was expected and what came;
    ``clause`` the spec clause broken (if one is); ``side`` which end is responsible
    (``frontend``, ``engine``, ``writer``, ``readers``; None: unknown)."""

    def __init__(self, message: str, clause: str | None = None,
                 side: str | None = None) -> None:
        super().__init__(message)
        self.clause = clause
        self.side = side


@dataclass(frozen=True)
class Deviation:
    """A documented vLLM deviation: a failure of ``clause`` caused by vLLM's ``side``."""

    finding: str
    title: str
    link: str
    clauses: tuple[str, ...]
    sides: tuple[str, ...]


#: vLLM deviations a cell may show (docs/vllm-findings/index.md has them all).
DEVIATIONS = (
    Deviation("021", "vLLM leaves its ipc socket files behind",
              "docs/vllm-findings/021-ipc-socket-files-left.md",
              ("transport.ipc-files-removed", "ring.lifecycle.ipc-files"),
              ("frontend", "writer")),
)


@dataclass
class Exchange:
    name: str
    passed: bool
    seconds: float
    detail: str = ""
    clause: str | None = None
    side: str | None = None


@dataclass
class Cell:
    """One pair: ``left`` (front end or ring writer) against ``right`` (engine or readers)."""

    kind: str  # "engine" | "engine-dp" | "engine-dp-coordinated" | "ring" | "api-server"
    left: str
    right: str
    transport: str
    exchanges: list[Exchange] = field(default_factory=list)
    deviation: Deviation | None = None
    #: Why the cell was not run at the matrix's release (``--version``): what the release
    #: lacks, or which implementation cannot speak it. None: it ran.
    not_applicable: str | None = None

    @property
    def first_failure(self) -> Exchange | None:
        return next((e for e in self.exchanges if not e.passed), None)

    @property
    def status(self) -> str:
        if self.not_applicable is not None:
            return "not applicable"
        failure = self.first_failure
        if failure is None:
            return "passed"
        return "deviation" if self.deviation is not None else "failed"

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def to_builtins(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status
        failure = self.first_failure
        data["first_failure"] = failure.name if failure else None
        return data


def _implementation(cell: Cell, side: str) -> str:
    return cell.left if side in ("frontend", "writer") else cell.right


def classify(cell: Cell) -> None:
    """Set ``cell.deviation`` when every failed exchange is a documented vLLM deviation."""
    failed = [e for e in cell.exchanges if not e.passed]
    found: Deviation | None = None
    for exchange in failed:
        match = next((d for d in DEVIATIONS if exchange.clause in d.clauses
                      and exchange.side in d.sides
                      and _implementation(cell, exchange.side) == "vllm"), None)
        if match is None:
            cell.deviation = None
            return
        found = match
    cell.deviation = found


class _Script:
    """Runs a cell's exchanges in order; after the first failure the rest are not run (the
    clean-up always is, by the caller)."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self.failed = False

    def step(self, name: str, func: Callable[[], None], *, always: bool = False) -> None:
        if self.failed and not always:
            return
        start = time.monotonic()
        try:
            func()
        except ExchangeFailure as exc:
            self._record(name, start, str(exc), exc.clause, exc.side)
        except Exception as exc:  # noqa: BLE001 - any error fails the exchange, named
            self._record(name, start, f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                         [:400], None, None)
        else:
            self.cell.exchanges.append(Exchange(name, True, time.monotonic() - start))

    def _record(self, name: str, start: float, detail: str, clause: str | None,
                side: str | None) -> None:
        self.failed = True
        self.cell.exchanges.append(Exchange(name, False, time.monotonic() - start, detail,
                                            clause, side))


# --- addresses and leftovers -----------------------------------------------------------------


def free_tcp_address() -> str:
    """``tcp://127.0.0.1:PORT`` with a port free right now (the front end binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def _addresses(transport: str) -> list[str]:
    from enginewire.reference.addresses import ipc_address

    make = ipc_address if transport == "ipc" else free_tcp_address
    return [make() for _ in range(3)]


def _left_files(addresses: Sequence[str]) -> list[str]:
    from enginewire.reference.addresses import ipc_path

    return [a for a in addresses if (path := ipc_path(a)) is not None and os.path.exists(path)]


def _remove_files(addresses: Sequence[str]) -> None:
    from enginewire.reference.addresses import remove_ipc_file

    for address in addresses:
        remove_ipc_file(address)


# --- the launcher for front ends without a handshake channel ---------------------------------


class HandshakeLauncher:
    """The handshake a deployment's launcher runs for a front end given ``client_addresses``:
    bind the handshake ROUTER, answer each HELLO with init naming the front end's input and
    output addresses, return once every engine sent READY (the engines then send their ready
    responses to the front end itself)."""

    def __init__(self, address: str, input_address: str, output_address: str,
                 engine_count: int = 1) -> None:
        import zmq

        from enginewire.reference.connection import FrontendConnection
        from enginewire.reference.transport import open_socket

        self.connection = FrontendConnection(range(engine_count))
        self.input_address, self.output_address = input_address, output_address
        self._ctx = zmq.Context()
        try:
            self._socket = open_socket(self._ctx, "handshake", "frontend", address)
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self.address = self._socket.address

    def serve(self, timeout: float) -> None:
        from enginewire.reference import structs
        from enginewire.reference.connection import HelloReceived

        deadline = time.monotonic() + timeout
        metadata = structs.EngineHandshakeMetadata(
            addresses=structs.EngineZmqAddresses(inputs=[self.input_address],
                                                 outputs=[self.output_address]),
            parallel_config={},
        )
        while self.connection.session.awaiting_handshake():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._socket.socket.poll(int(remaining * 1000)):
                raise ExchangeFailure(
                    f"no HELLO/READY within {timeout:g} s (handshake states "
                    f"{self.connection.session.states()})", "handshake.hello-first",
                    "engine")
            frames = self._socket.socket.recv_multipart()
            for event in self.connection.receive("handshake", frames):
                if isinstance(event, HelloReceived):
                    self._socket.socket.send_multipart(
                        self.connection.send("init", metadata, rank=event.rank))

    def close(self) -> None:
        from enginewire.reference.addresses import remove_ipc_file

        self._socket.socket.close(linger=0)
        self._ctx.destroy(linger=0)
        remove_ipc_file(self.address)


# --- peers -----------------------------------------------------------------------------------


@dataclass
class Implementation:
    """One implementation's surfaces as the matrix uses them."""

    name: str
    frontend: Any = None
    engine: Any = None
    ring: Any = None
    #: (prompt, count) -> the tokens its engine generates for a request of ``count`` tokens.
    expected_tokens: Callable[[list[int], int], list[int]] | None = None
    close: Callable[[], None] = lambda: None
    #: The vLLM release it speaks (None: the spec's reference release).
    version: str | None = None
    #: cell kind -> why this implementation cannot take part in such a cell at
    #: :attr:`version` (None: it can).
    gap: Callable[[str], str | None] = lambda kind: None


def _at_reference(version: str | None) -> bool:
    from enginewire.spec.loader import REFERENCE_VLLM_VERSION

    return version in (None, REFERENCE_VLLM_VERSION)


def _reference_gap(version: str) -> Callable[[str], str | None]:
    """Why the reference cannot hold a cell of a kind at ``version``: the engine cells need
    the release's start-up conversation (:func:`~enginewire.spec.history.release_facts.
    conversation_gap`), the data-parallel cells an engine identity on the input channel too
    (``identity_gap``: before 0.8.4 one engine per front end); the ring cells the ring's
    chunk framing of the reference release."""
    from enginewire.spec import load
    from enginewire.spec.history.constants import constants_at
    from enginewire.spec.history.release_facts import conversation_gap, identity_gap
    from enginewire.spec.loader import REFERENCE_VLLM_VERSION

    conversation = conversation_gap(load(version))
    ranks = conversation or identity_gap(version)
    framing = constants_at(version, "chunk_framing")
    ring = None
    if framing != constants_at(REFERENCE_VLLM_VERSION, "chunk_framing"):
        ring = (f"vLLM {version} lays a ring chunk out as {framing.get('framing')} "
                "(history/constants.toml [[chunk_framing]]); the reference ring writes the "
                f"framing of {REFERENCE_VLLM_VERSION}")

    def gap(kind: str) -> str | None:
        return {"ring": ring, "engine-dp": ranks}.get(kind, conversation)

    return gap


def reference_tokens(prompt: list[int], count: int) -> list[int]:
    from enginewire.reference.engine import scripted_tokens

    return scripted_tokens(prompt, count)


def standin_tokens(prompt: list[int], count: int) -> list[int]:
    """The vLLM stand-in worker's tokens: ``FIRST_TOKEN + tokens computed so far``."""
    from enginewire.conformance.targets.vllm.standin import FIRST_TOKEN

    return [FIRST_TOKEN + len(prompt) + i for i in range(count)]


def reference_implementation(engine_class: type | None = None, *,
                             version: str | None = None) -> Implementation:
    """The reference; ``engine_class``: a ``ReferenceEngine`` subclass to run instead;
    ``version``: the vLLM release its front end and engines speak (layouts, HELLO/READY
    keys, ready response)."""
    from enginewire.conformance.targets.reference import (
        ReferenceCodec,
        ReferenceEngines,
        ReferenceFrontends,
        ReferenceRing,
    )

    if _at_reference(version):
        return Implementation(
            "reference", frontend=ReferenceFrontends(ReferenceCodec()),
            engine=ReferenceEngines(engine_class, step_delay=REFERENCE_STEP_DELAY),
            ring=ReferenceRing(), expected_tokens=reference_tokens,
        )
    return Implementation(
        "reference", frontend=ReferenceFrontends(ReferenceCodec(version=version)),
        engine=ReferenceEngines(engine_class, step_delay=REFERENCE_STEP_DELAY, version=version),
        ring=ReferenceRing(), expected_tokens=reference_tokens, version=version,
        gap=_reference_gap(str(version)),
    )


def vllm_implementation(*, version: str | None = None) -> Implementation:
    """vLLM 0.33.0's own front-end client, engine core and MessageQueue. At another
    ``version`` nothing is loaded: every cell it takes part in is not applicable (the
    installed vLLM speaks its own release only)."""
    from enginewire.spec.loader import REFERENCE_VLLM_VERSION

    if not _at_reference(version):
        reason = (f"needs the installed vLLM {REFERENCE_VLLM_VERSION}, which speaks only its "
                  f"own release, not vLLM {version}")
        return Implementation("vllm", version=version, gap=lambda kind: reason)
    from enginewire.conformance.targets.vllm.target import vllm_target

    target = vllm_target()
    return Implementation("vllm", frontend=target.frontend, engine=target.engine,
                          ring=target.ring, expected_tokens=standin_tokens,
                          close=target.close)


IMPLEMENTATIONS: dict[str, Callable[[], Implementation]] = {
    "reference": reference_implementation,
    "vllm": vllm_implementation,
}
