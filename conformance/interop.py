"""``enginewire interop``: every implementation against every other, one scripted exchange each.

As the QUIC interop runner pairs every client with every server, this pairs, for each
implementation (a conformance target: ``reference``, ``vllm``, ...):

- every **front end** with every **engine core**, over ``ipc`` and over ``tcp``. One cell runs
  the exchange ``handshake`` (``ready-response`` for a front end without a handshake channel),
  ``add`` (a request that must finish with ``finish_reason`` length and exactly the engine's
  expected tokens), ``abort`` (a second, long request aborted after its first token: it must
  finish with abort or stop streaming, never run to length), ``utility`` (the call
  ``get_supported_tasks``, which must answer ``generate``) and ``shutdown`` (both ends stop, no
  process left running, no ipc socket file left).
- every **ring writer** with every implementation's **readers** (two of them): ``ready`` (the
  collective start), ``stream`` (:data:`RING_MESSAGES` messages, one larger than the chunk,
  so carried by the overflow socket, one with an out-of-band buffer), ``receive`` (every reader
  got every message, equal and in order) and ``close`` (segment and ipc files removed).
- vLLM's real **API server** (``vllm serve``, when ``vllm`` is paired) with every **engine
  core** behind it (:func:`run_api_server_cell`): vLLM's own engine core as ``vllm serve``
  launches it, and every other implementation's engine as a remote, headless engine doing the
  handshake with the server (the use case of an engine that sits behind vLLM's front end).
  The exchange: ``start`` (``GET /health``), ``completion`` (``POST /v1/completions`` with
  :data:`API_TOKENS` tokens: exactly the engine's expected tokens, finish ``length``) and
  ``shutdown``.

A front end without a handshake channel (surface attribute ``handshake = False``, vLLM's
``AsyncMPClient`` given ``client_addresses``) is paired as vLLM deploys it: a launcher (here
:class:`HandshakeLauncher`, the reference's handshake) answers the engine's HELLO with the
front end's input and output addresses, and the engine then sends its ready response to the
front end directly.

Each cell is **passed**, **failed** (with the first exchange that failed and why) or a
**deviation**: it failed only where a documented vLLM deviation says it must (the failing
exchange names the clause, the side responsible is vLLM's, and :data:`DEVIATIONS` links the
finding). Every wait is bounded; processes, ipc files and segments are cleaned up whether the
cell passes or not. Exit status of the command: 0 when every cell passed or is a documented
deviation, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from enginewire.cliargs import positive_float, writable_file

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

    @property
    def first_failure(self) -> Exchange | None:
        return next((e for e in self.exchanges if not e.passed), None)

    @property
    def status(self) -> str:
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


def reference_tokens(prompt: list[int], count: int) -> list[int]:
    from enginewire.reference.engine import scripted_tokens

    return scripted_tokens(prompt, count)


def standin_tokens(prompt: list[int], count: int) -> list[int]:
    """The vLLM stand-in worker's tokens: ``FIRST_TOKEN + tokens computed so far``."""
    from enginewire.conformance.targets.vllm.standin import FIRST_TOKEN

    return [FIRST_TOKEN + len(prompt) + i for i in range(count)]


def reference_implementation(engine_class: type | None = None) -> Implementation:
    """The reference; ``engine_class``: a ``ReferenceEngine`` subclass to run instead."""
    from enginewire.conformance.targets.reference import (
        ReferenceCodec,
        ReferenceEngines,
        ReferenceFrontends,
        ReferenceRing,
    )

    return Implementation(
        "reference", frontend=ReferenceFrontends(ReferenceCodec()),
        engine=ReferenceEngines(engine_class, step_delay=REFERENCE_STEP_DELAY),
        ring=ReferenceRing(), expected_tokens=reference_tokens,
    )


def vllm_implementation() -> Implementation:
    """vLLM 0.33.0's own front-end client, engine core and MessageQueue."""
    from enginewire.conformance.targets.vllm.target import vllm_target

    target = vllm_target()
    return Implementation("vllm", frontend=target.frontend, engine=target.engine,
                          ring=target.ring, expected_tokens=standin_tokens,
                          close=target.close)


IMPLEMENTATIONS: dict[str, Callable[[], Implementation]] = {
    "reference": reference_implementation,
    "vllm": vllm_implementation,
}


# --- engine cells ----------------------------------------------------------------------------


def _neutral(value: Any) -> Any:
    from enginewire.conformance.oracle.values import neutral

    return neutral(value)


class _Outputs:
    """What the front end delivered, per request: tokens and finish reason."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, int] = {}
        self.last_seen: dict[str, float] = {}

    def read(self, timeout: float) -> bool:
        """Read one batch (False: none within ``timeout``)."""
        try:
            batch = _neutral(self.client.next_outputs(timeout))
        except TimeoutError:
            return False
        except ConnectionError as exc:
            raise ExchangeFailure(f"the front end saw the engine die: {exc}",
                                  "frames.engine-core-dead-fatal", "engine") from exc
        for output in (batch or {}).get("outputs") or []:
            request_id = output["request_id"]
            self.tokens.setdefault(request_id, []).extend(output.get("new_token_ids") or [])
            self.last_seen[request_id] = time.monotonic()
            if output.get("finish_reason") is not None:
                self.finish[request_id] = int(output["finish_reason"])
        return True


def _request(request_id: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    from enginewire.conformance.oracle.samples import minimal_request

    request = minimal_request(request_id, prompt_token_ids=list(prompt), arrival_time=time.time())
    request["sampling_params"] = {**request["sampling_params"], "max_tokens": max_tokens}
    return request


def _start_session(frontend_impl: Implementation, engine_impl: Implementation,
                   addresses: tuple[str, str, str], launches: list[Any],
                   state: dict[str, Any], timeout: float,
                   started: list[Any] | None = None) -> list[Any]:
    """Start the engines of ``launches`` and then the front end (``state["client"]``; a
    :class:`HandshakeLauncher` in ``state["launcher"]`` for a front end without its own
    handshake) and wait until the front end is ready. Each engine is appended to ``started``
    as it starts, so a caller's clean-up finds it even when a later start fails; returns
    ``started``."""
    from enginewire.conformance.targets.contract import FrontendLaunch

    engines = started if started is not None else []
    for surface in (frontend_impl.frontend, engine_impl.engine):
        prepare = getattr(surface, "prepare", None)
        if prepare is not None:
            prepare()
    launch = FrontendLaunch(*addresses, engine_count=len(launches))
    if getattr(frontend_impl.frontend, "handshake", True) is False:
        state["launcher"] = HandshakeLauncher(*addresses, engine_count=len(launches))
    # The engines first: vLLM's launcher forks them, before this process runs the front
    # end's threads (connecting before the other end binds is fine for ZMQ).
    for engine_launch in launches:
        engines.append(engine_impl.engine.start_engine(engine_launch))
    state["client"] = frontend_impl.frontend.start_frontend(launch)
    if "launcher" in state:
        state["launcher"].serve(timeout)
    try:
        state["client"].wait_ready(timeout)
    except TimeoutError as exc:
        raise ExchangeFailure(f"the front end was not ready within {timeout:g} s: {exc}",
                              "handshake.frontend.bounded-handshake") from exc
    return engines


def run_engine_cell(frontend_impl: Implementation, engine_impl: Implementation,
                    transport: str, timeout: float = STEP_TIMEOUT) -> Cell:
    """Front end ``frontend_impl`` against engine core ``engine_impl`` over ``transport``."""
    from enginewire.conformance.targets.contract import EngineLaunch

    cell = Cell("engine", frontend_impl.name, engine_impl.name, transport)
    script = _Script(cell)
    handshake_address, input_address, output_address = _addresses(transport)
    handshake = getattr(frontend_impl.frontend, "handshake", True) is not False
    state: dict[str, Any] = {}
    outputs: list[_Outputs] = []

    def start() -> None:
        started: list[Any] = []
        try:
            _start_session(
                frontend_impl, engine_impl, (handshake_address, input_address, output_address),
                [EngineLaunch(handshake_address, init_timeout=timeout)], state, timeout,
                started=started)
        finally:
            if started:  # the clean-up below stops it, also when the front end failed
                state["engine"] = started[0]
        outputs.append(_Outputs(state["client"]))

    def add() -> None:
        assert engine_impl.expected_tokens is not None
        client, seen = state["client"], outputs[0]
        client.add_request(_request("interop-add", ADD_PROMPT, ADD_TOKENS), 0)
        deadline = time.monotonic() + timeout
        while "interop-add" not in seen.finish:
            if time.monotonic() > deadline or not seen.read(deadline - time.monotonic()):
                raise ExchangeFailure(
                    f"no finished output for the ADD within {timeout:g} s (tokens so far "
                    f"{seen.tokens.get('interop-add', [])})", "frames.outputs-payload",
                    "engine")
        expected = engine_impl.expected_tokens(ADD_PROMPT, ADD_TOKENS)
        got = (seen.tokens.get("interop-add", []), seen.finish["interop-add"])
        if got != (expected, FINISH_LENGTH):
            raise ExchangeFailure(
                f"expected tokens {expected} and finish_reason length ({FINISH_LENGTH}), "
                f"got tokens {got[0]} and finish_reason {got[1]}", None, "engine")

    def abort() -> None:
        client, seen = state["client"], outputs[0]
        client.add_request(_request("interop-abort", ADD_PROMPT, ABORT_TOKENS), 0)
        deadline = time.monotonic() + timeout
        while not seen.tokens.get("interop-abort"):
            if "interop-abort" in seen.finish:
                break
            if time.monotonic() > deadline or not seen.read(deadline - time.monotonic()):
                raise ExchangeFailure(f"no output for the request to abort within "
                                      f"{timeout:g} s", "frames.outputs-payload", "engine")
        client.abort(["interop-abort"], 0)
        aborted_at = time.monotonic()
        deadline = aborted_at + timeout
        while "interop-abort" not in seen.finish:
            quiet = time.monotonic() - max(seen.last_seen.get("interop-abort", 0.0),
                                           aborted_at)
            if quiet >= ABORT_QUIET_S:
                return  # stopped without a final output (vLLM's engine sends none)
            if time.monotonic() > deadline:
                raise ExchangeFailure(
                    f"the aborted request still streams {timeout:g} s after the ABORT",
                    "frames.abort-payload", "engine")
            seen.read(min(ABORT_QUIET_S - quiet, deadline - time.monotonic()) + 0.01)
        reason = seen.finish["interop-abort"]
        if reason != FINISH_ABORT:
            count = len(seen.tokens.get("interop-abort", []))
            raise ExchangeFailure(
                f"expected the ABORT to end the request (finish_reason abort ({FINISH_ABORT}) "
                f"or no more output), got finish_reason {reason} after {count} of "
                f"{ABORT_TOKENS} tokens", "frames.abort-payload", "engine")

    def utility() -> None:
        result = _neutral(state["client"].call_utility("get_supported_tasks", [], 0,
                                                       timeout))
        if not isinstance(result, list | tuple) or "generate" not in result:
            raise ExchangeFailure(
                f"get_supported_tasks answered {result!r}, expected a list with 'generate'",
                "frames.utility-payload", "engine")

    def shutdown() -> None:
        client, engine = state.pop("client"), state.pop("engine")
        client.stop(timeout)
        engine.stop(timeout)
        running = [name for name, peer in (("front end", client), ("engine", engine))
                   if peer.alive()]
        if running:
            raise ExchangeFailure(f"still running after stop: {', '.join(running)}", None,
                                  "engine" if "engine" in running else "frontend")
        left = _left_files([input_address, output_address])
        if left:
            raise ExchangeFailure(f"the front end left its ipc socket files {left}",
                                  "transport.ipc-files-removed", "frontend")

    try:
        script.step("handshake" if handshake else "ready-response", start)
        script.step("add", add)
        script.step("abort", abort)
        script.step("utility", utility)
        script.step("shutdown", shutdown)
    finally:
        for name in ("client", "engine"):
            peer = state.pop(name, None)
            if peer is not None:
                with contextlib.suppress(Exception):
                    peer.stop(timeout)
        launcher = state.pop("launcher", None)
        if launcher is not None:
            launcher.close()
        _remove_files([handshake_address, input_address, output_address])
    classify(cell)
    return cell


# --- API server cells ------------------------------------------------------------------------

#: The completion request of an API server cell: its prompt (token ids; the tiny tokenizer's
#: text for them is sent) and max_tokens.
API_PROMPT = [7, 8, 9]
API_TOKENS = 4
#: Seconds vLLM's API server may take to answer ``/health`` (it imports vLLM, builds its
#: configuration and starts its engine; about 40 s on a loaded 2-core machine), multiplied by
#: the cell's ``timeout / STEP_TIMEOUT``.
API_READY_TIMEOUT = 240.0


def check_completion(answer: dict[str, Any], prompt: list[int], expected: list[int]) -> None:
    """An OpenAI completion answer for ``prompt`` must carry exactly the engine's ``expected``
    tokens (ids and their text in the tiny tokenizer), finish with ``length`` and count the
    tokens in ``usage``; :class:`ExchangeFailure` says what differs."""
    from enginewire.conformance.targets.vllm.api_server import token

    choices = answer.get("choices") or []
    if len(choices) != 1:
        raise ExchangeFailure(f"expected one choice, got {len(choices)}: {answer!r}"[:400])
    choice = choices[0]
    got = (choice.get("token_ids"), choice.get("text", "").split(), choice.get("finish_reason"))
    want = (expected, [token(i) for i in expected], "length")
    if got != want:
        raise ExchangeFailure(
            f"expected token ids {want[0]}, text {' '.join(want[1])!r} and finish_reason "
            f"length, got token ids {got[0]}, text {' '.join(got[1])!r} and finish_reason "
            f"{got[2]}", None, "engine")
    usage = answer.get("usage") or {}
    counts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
    if counts != (len(prompt), len(expected)):
        raise ExchangeFailure(f"expected usage of {len(prompt)} prompt and {len(expected)} "
                              f"completion tokens, got {counts}", None, "frontend")


def run_api_server_cell(engine_impl: Implementation, timeout: float = STEP_TIMEOUT,
                        evidence: dict[str, Any] | None = None) -> Cell:
    """vLLM's real API server (``vllm serve``, :mod:`.targets.vllm.api_server`) with the
    engine core of ``engine_impl`` behind it: vLLM's own (launched by ``vllm serve``, over
    ipc) for ``vllm``; for any other implementation, its engine surface started as a remote,
    headless engine that does the handshake with the server's tcp handshake address.
    Exchanges: ``start`` (the engine's handshake and ``GET /health``), ``completion`` (``POST
    /v1/completions``: the engine's expected tokens, finish ``length``) and ``shutdown``
    (SIGTERM: the server and every process it started exit, the engine stops).
    ``evidence``: filled with the answer, the server's processes while it served, and exit
    statuses, for tests."""
    from enginewire.conformance.targets.contract import EngineLaunch
    from enginewire.conformance.targets.vllm.api_server import ApiServer, prompt_text

    own = engine_impl.name == "vllm"
    cell = Cell("api-server", "vllm", engine_impl.name, "ipc" if own else "tcp")
    script = _Script(cell)
    state: dict[str, Any] = {}
    found = evidence if evidence is not None else {}

    def start() -> None:
        server = state["server"] = ApiServer(engine="vllm" if own else "external")
        server.start()
        if not own:
            prepare = getattr(engine_impl.engine, "prepare", None)
            if prepare is not None:
                prepare()
            state["engine"] = engine_impl.engine.start_engine(EngineLaunch(
                server.engine_handshake_address, local=False, headless=True,
                init_timeout=API_READY_TIMEOUT * timeout / STEP_TIMEOUT))
        found["ready_s"] = server.wait_ready(API_READY_TIMEOUT * timeout / STEP_TIMEOUT)

    def completion() -> None:
        assert engine_impl.expected_tokens is not None
        server = state["server"]
        answer = found["answer"] = server.complete(prompt_text(API_PROMPT), API_TOKENS,
                                                   timeout)
        found["processes"] = server.processes()
        check_completion(answer, API_PROMPT,
                         engine_impl.expected_tokens(API_PROMPT, API_TOKENS))

    def shutdown() -> None:
        server = state.pop("server")
        found["server_status"] = server.stop()
        engine = state.pop("engine", None)
        if engine is not None:
            engine.stop(timeout)
            if engine.alive():
                raise ExchangeFailure("the engine still runs after stop", None, "engine")
        if found["server_status"] != 0:
            raise ExchangeFailure(f"vllm serve exited with status {found['server_status']} "
                                  "on SIGTERM, expected 0", None, "frontend")

    try:
        script.step("start", start)
        script.step("completion", completion)
        script.step("shutdown", shutdown)
    finally:
        engine = state.pop("engine", None)
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.stop(timeout)
        server = state.pop("server", None)
        if server is not None:
            found.setdefault("log", server.log_tail())
            server.stop()
    classify(cell)
    return cell


# --- data-parallel cells ----------------------------------------------------------------------

#: Engines of the data-parallel cells (ranks 0 .. DP_SIZE - 1 behind one front end).
DP_SIZE = 2


def run_dp_cell(frontend_impl: Implementation, engine_impl: Implementation, transport: str,
                timeout: float = STEP_TIMEOUT) -> Cell:
    """Front end ``frontend_impl`` with :data:`DP_SIZE` engine cores of ``engine_impl``
    (engine indices 0 .. DP_SIZE - 1, data_parallel_size DP_SIZE, no coordinator) over
    ``transport``: the ranks the way vLLM runs a dense model's (independent engines, each
    with its own identity and engine_index). Exchanges: the handshake with every rank, one
    request to each rank (it must finish with the engine's tokens, its outputs naming that
    rank's engine_index), a utility call to each rank, shutdown."""
    from enginewire.conformance.targets.contract import EngineLaunch

    cell = Cell("engine-dp", frontend_impl.name, engine_impl.name, transport)
    script = _Script(cell)
    handshake_address, input_address, output_address = _addresses(transport)
    handshake = getattr(frontend_impl.frontend, "handshake", True) is not False
    state: dict[str, Any] = {"engines": []}
    outputs: list[_Outputs] = []

    def start() -> None:
        _start_session(
            frontend_impl, engine_impl, (handshake_address, input_address, output_address),
            [EngineLaunch(handshake_address, engine_index=rank, dp_size=DP_SIZE,
                          init_timeout=timeout) for rank in range(DP_SIZE)],
            state, timeout, started=state["engines"])
        outputs.append(_Outputs(state["client"]))

    def add_each_rank() -> None:
        assert engine_impl.expected_tokens is not None
        client, seen = state["client"], outputs[0]
        ids = [f"interop-dp-rank{rank}" for rank in range(DP_SIZE)]
        for rank, request_id in enumerate(ids):
            client.add_request(_request(request_id, ADD_PROMPT, ADD_TOKENS), rank)
        engine_of: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout
        while not all(i in seen.finish for i in ids):
            try:
                batch = _neutral(client.next_outputs(max(deadline - time.monotonic(), 0.0)))
            except TimeoutError as exc:
                raise ExchangeFailure(
                    f"requests {sorted(set(ids) - set(seen.finish))} did not finish within "
                    f"{timeout:g} s", "frames.outputs-payload", "engine") from exc
            except ConnectionError as exc:
                raise ExchangeFailure(f"the front end saw an engine die: {exc}",
                                      "frames.engine-core-dead-fatal", "engine") from exc
            for output in (batch or {}).get("outputs") or []:
                request_id = output["request_id"]
                engine_of[request_id] = (batch or {}).get("engine_index")
                seen.tokens.setdefault(request_id, []).extend(output.get("new_token_ids")
                                                              or [])
                if output.get("finish_reason") is not None:
                    seen.finish[request_id] = int(output["finish_reason"])
        expected = engine_impl.expected_tokens(ADD_PROMPT, ADD_TOKENS)
        for rank, request_id in enumerate(ids):
            if engine_of.get(request_id) != rank:
                raise ExchangeFailure(
                    f"the request sent to rank {rank} came back with engine_index "
                    f"{engine_of.get(request_id)}", "transport.output-has-no-identity",
                    "engine")
            got = (seen.tokens.get(request_id, []), seen.finish[request_id])
            if got != (expected, FINISH_LENGTH):
                raise ExchangeFailure(
                    f"rank {rank}: expected tokens {expected} and finish_reason length, got "
                    f"tokens {got[0]} and finish_reason {got[1]}", None, "engine")

    def utility_each_rank() -> None:
        for rank in range(DP_SIZE):
            result = _neutral(state["client"].call_utility("get_supported_tasks", [], rank,
                                                           timeout))
            if not isinstance(result, list | tuple) or "generate" not in result:
                raise ExchangeFailure(
                    f"rank {rank}: get_supported_tasks answered {result!r}, expected a list "
                    "with 'generate'", "frames.utility-payload", "engine")

    def shutdown() -> None:
        client, engines = state.pop("client"), state.pop("engines")
        state["engines"] = []
        client.stop(timeout)
        for engine in engines:
            engine.stop(timeout)
        running = [f"engine {rank}" for rank, engine in enumerate(engines) if engine.alive()]
        if client.alive():
            running.insert(0, "front end")
        if running:
            raise ExchangeFailure(f"still running after stop: {', '.join(running)}", None,
                                  "engine" if running[-1].startswith("engine") else "frontend")
        left = _left_files([input_address, output_address])
        if left:
            raise ExchangeFailure(f"the front end left its ipc socket files {left}",
                                  "transport.ipc-files-removed", "frontend")

    try:
        script.step("handshake" if handshake else "ready-response", start)
        script.step("add-each-rank", add_each_rank)
        script.step("utility-each-rank", utility_each_rank)
        script.step("shutdown", shutdown)
    finally:
        peers = [state.pop("client", None), *state.pop("engines", [])]
        for peer in peers:
            if peer is not None:
                with contextlib.suppress(Exception):
                    peer.stop(timeout)
        launcher = state.pop("launcher", None)
        if launcher is not None:
            launcher.close()
        _remove_files([handshake_address, input_address, output_address])
    classify(cell)
    return cell


#: Cells of whole topologies that layers above the suite add (:func:`register_topology_cell`):
#: name -> (the implementations the cell needs, the function that runs it with a timeout).
_TOPOLOGY_CELLS: dict[str, tuple[frozenset[str], Callable[[float], Cell]]] = {}


def register_topology_cell(name: str, needs: Sequence[str],
                           run: Callable[[float], Cell]) -> None:
    """Add a data-parallel cell of a whole topology (vLLM's coordinated one:
    ``enginewire.tap.vllm_dp``, which watches it with the tap, a layer above this one), run
    with the data-parallel cells when every implementation in ``needs`` is paired."""
    _TOPOLOGY_CELLS[name] = (frozenset(needs), run)


def topology_cells() -> dict[str, tuple[frozenset[str], Callable[[float], Cell]]]:
    return dict(_TOPOLOGY_CELLS)


# --- ring cells ------------------------------------------------------------------------------


def ring_message(index: int) -> Any:
    """Message ``index`` of the ring stream: ``(index, payload)``. Message
    :data:`OVERFLOW_INDEX` is larger than a chunk; :data:`OUT_OF_BAND_INDEX` carries a
    1.5 MB numpy array, which pickle hands out of band (vLLM's rule: buffers of 1 MiB and more)."""
    if index == OVERFLOW_INDEX:
        return index, bytes(range(256)) * (RING_CHUNK // 256 + 4096)
    if index == OUT_OF_BAND_INDEX:
        import numpy

        return index, numpy.arange(200_000, dtype=numpy.int64) * index
    return index, index.to_bytes(4, "little") * (index % 97)


def _same(expected: Any, got: Any) -> bool:
    import numpy

    if not isinstance(got, tuple) or len(got) != 2 or got[0] != expected[0]:
        return False
    if isinstance(expected[1], numpy.ndarray):
        return (isinstance(got[1], numpy.ndarray) and got[1].dtype == expected[1].dtype
                and numpy.array_equal(got[1], expected[1]))
    return bool(got[1] == expected[1])


def _describe(message: Any) -> str:
    if isinstance(message, tuple) and len(message) == 2:
        body = message[1]
        size = getattr(body, "nbytes", None) or (len(body) if isinstance(body, bytes) else 0)
        return f"message {message[0]!r} ({type(body).__name__} of {size} bytes)"
    return repr(message)[:80]


class _ReaderThread:
    """One reader on a thread: attach, take part in the start, read the stream, check it."""

    def __init__(self, ring: Any, handle: Any, rank: int, count: int, timeout: float) -> None:
        self.error: str | None = None
        self.received = 0
        self.ready = threading.Event()
        self.reader: Any = None
        self._args = (ring, handle, rank, count, timeout)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"interop ring reader {rank}")
        self.thread.start()

    def _run(self) -> None:
        ring, handle, rank, count, timeout = self._args
        try:
            self.reader = ring.attach_reader(handle, rank)
            self.reader.wait_until_ready(timeout)
            self.ready.set()
            for index in range(count):
                got = self.reader.dequeue(timeout)
                expected = ring_message(index)
                self.received += 1
                if self.error is None and not _same(expected, got):
                    # Recorded, and the stream read on: the writer is not left blocked.
                    self.error = (f"reader {rank}: message {index} differs: expected "
                                  f"{_describe(expected)}, got {_describe(got)}")
        except Exception as exc:  # noqa: BLE001 - reported by the cell
            self.error = self.error or (f"reader {rank} after {self.received} messages: "
                                        f"{type(exc).__name__}: {exc}")[:400]
        finally:
            self.ready.set()

    def close(self, timeout: float) -> None:
        self.thread.join(timeout)
        if self.reader is not None and not self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.reader.close()


def run_ring_cell(writer_impl: Implementation, reader_impl: Implementation,
                  timeout: float = STEP_TIMEOUT) -> Cell:
    """``writer_impl``'s ring writer to :data:`RING_READERS` readers of ``reader_impl``."""
    cell = Cell("ring", writer_impl.name, reader_impl.name, "shm")
    script = _Script(cell)
    state: dict[str, Any] = {}
    readers: list[_ReaderThread] = []

    def ready() -> None:
        writer = writer_impl.ring.create_writer(n_reader=RING_READERS,
                                                max_chunk_bytes=RING_CHUNK,
                                                max_chunks=RING_CHUNKS)
        state["writer"] = writer
        for rank in range(RING_READERS):
            readers.append(_ReaderThread(reader_impl.ring, writer.handle, rank,
                                         RING_MESSAGES, timeout))
        try:
            writer.wait_until_ready(timeout)
        except TimeoutError as exc:
            problems = [r.error for r in readers if r.error]
            raise ExchangeFailure(f"the writer's start did not complete within {timeout:g} s"
                                  f" ({'; '.join(problems) or exc})",
                                  "ring.ready.collective", None) from exc
        for reader in readers:
            if not reader.ready.wait(timeout) or reader.error:
                raise ExchangeFailure(reader.error or "a reader did not start",
                                      "ring.ready.collective", "readers")

    def stream() -> None:
        for index in range(RING_MESSAGES):
            try:
                state["writer"].enqueue(ring_message(index), timeout)
            except TimeoutError as exc:
                problems = [r.error for r in readers if r.error]
                raise ExchangeFailure(
                    f"message {index} not enqueued within {timeout:g} s"
                    f" ({'; '.join(problems) or 'readers still running'})", None,
                    "readers" if problems else None) from exc

    def receive() -> None:
        for reader in readers:
            reader.thread.join(timeout)
        problems = [r.error for r in readers if r.error]
        stuck = [i for i, r in enumerate(readers) if r.thread.is_alive()]
        if problems or stuck:
            side = "readers" if any("differs" in p for p in problems) else None
            raise ExchangeFailure("; ".join(problems) or
                                  f"readers {stuck} still reading after {timeout:g} s", None,
                                  side)
        counts = [r.received for r in readers]
        if counts != [RING_MESSAGES] * RING_READERS:
            raise ExchangeFailure(f"readers received {counts} of {RING_MESSAGES}")

    def close() -> None:
        for reader in readers:
            reader.close(timeout)
        writer = state.pop("writer")
        handle = writer.handle
        writer.close()
        segment = Path("/dev/shm") / handle.shm_name.lstrip("/")
        if segment.exists():
            raise ExchangeFailure(f"the segment {handle.shm_name} is left after close",
                                  "ring.lifecycle.creator-unlinks", "writer")
        left = _left_files([handle.subscribe_address, handle.notify_address])
        if left:
            raise ExchangeFailure(f"the writer left its ipc socket files {left}",
                                  "ring.lifecycle.ipc-files", "writer")

    try:
        script.step("ready", ready)
        script.step("stream", stream)
        script.step("receive", receive)
        script.step("close", close)
    finally:
        for reader in readers:
            reader.close(timeout)
        writer = state.pop("writer", None)
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        _sweep_ring(writer_impl)
    classify(cell)
    return cell


def _sweep_ring(impl: Implementation) -> None:
    """Remove what a vLLM queue leaves behind (its ipc files), after the cell looked."""
    if impl.name == "vllm":
        from enginewire.conformance.targets.vllm.target import sweep

        sweep()


# --- the matrix ------------------------------------------------------------------------------


@dataclass
class Matrix:
    cells: list[Cell]
    peers: list[str]
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.unavailable and all(cell.ok for cell in self.cells)

    def to_builtins(self) -> dict[str, Any]:
        return {"peers": self.peers, "unavailable": self.unavailable, "ok": self.ok,
                "cells": [cell.to_builtins() for cell in self.cells]}


@contextlib.contextmanager
def implementations(names: Sequence[str],
                    factories: dict[str, Callable[[], Implementation]] | None = None,
                    ) -> Iterator[tuple[dict[str, Implementation], dict[str, str]]]:
    """The named implementations (closed afterwards), and why any could not be loaded."""
    factories = factories or IMPLEMENTATIONS
    loaded: dict[str, Implementation] = {}
    unavailable: dict[str, str] = {}
    try:
        for name in names:
            try:
                loaded[name] = factories[name]()
            except Exception as exc:  # noqa: BLE001 - reported as unavailable
                unavailable[name] = f"{type(exc).__name__}: {exc}"[:300]
        yield loaded, unavailable
    finally:
        for impl in loaded.values():
            impl.close()


def run_matrix(impls: dict[str, Implementation], *, transports: Sequence[str] = TRANSPORTS,
               ring: bool = True, engine: bool = True, timeout: float = STEP_TIMEOUT,
               progress: Callable[[Cell], None] | None = None, dp: bool = False,
               coordinated_dp: bool = True, api_server: bool = True) -> list[Cell]:
    """Every front end x engine core x transport, then every ring writer x readers; with
    ``dp``, also every front end x :data:`DP_SIZE` engine cores x transport and (unless
    ``coordinated_dp`` is false) the registered topology cells whose implementations are
    paired (:func:`register_topology_cell`); then (with ``api_server``, when ``vllm`` is
    among ``impls``) vLLM's API server x every engine core."""
    cells: list[Cell] = []
    names = list(impls)
    if engine:
        for left in names:
            for right in names:
                for transport in transports:
                    cells.append(run_engine_cell(impls[left], impls[right], transport,
                                                 timeout))
                    if progress:
                        progress(cells[-1])
    if dp:
        for left in names:
            for right in names:
                for transport in transports:
                    cells.append(run_dp_cell(impls[left], impls[right], transport, timeout))
                    if progress:
                        progress(cells[-1])
        for needs, run in (_TOPOLOGY_CELLS.values() if coordinated_dp else ()):
            if needs <= set(names):
                cells.append(run(timeout))
                if progress:
                    progress(cells[-1])
    if ring:
        for left in names:
            for right in names:
                cells.append(run_ring_cell(impls[left], impls[right], timeout))
                if progress:
                    progress(cells[-1])
    if api_server and "vllm" in impls:
        for right in names:
            cells.append(run_api_server_cell(impls[right], timeout))
            if progress:
                progress(cells[-1])
    return cells


# --- rendering -------------------------------------------------------------------------------


def _status_text(cell: Cell) -> str:
    failure = cell.first_failure
    if failure is None:
        return "passed"
    text = f"FAILED at {failure.name}: {failure.detail}"
    if cell.deviation is not None:
        d = cell.deviation
        text = (f"deviation at {failure.name} ({failure.clause}): vLLM finding {d.finding}, "
                f"{d.title} ({d.link})")
    return text


def render_table(matrix: Matrix) -> str:
    rows = [("kind", "front end / writer", "engine / readers", "transport", "result")]
    for cell in matrix.cells:
        rows.append((cell.kind, cell.left, cell.right, cell.transport, _status_text(cell)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(value.ljust(widths[i]) if i < 4 else value
                       for i, value in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ------")
    for name, why in matrix.unavailable.items():
        lines.append(f"{name}: not run ({why})")
    counts = {s: sum(c.status == s for c in matrix.cells)
              for s in ("passed", "deviation", "failed")}
    lines.append(f"{counts['passed']} passed, {counts['deviation']} documented deviations, "
                 f"{counts['failed']} failed"
                 + (f", {len(matrix.unavailable)} unavailable" if matrix.unavailable else ""))
    return "\n".join(lines)


def render_html(matrix: Matrix) -> str:
    colours = {"passed": "#c8f7c5", "deviation": "#fff3b0", "failed": "#f7c5c5"}
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>enginewire interop"
             "</title><style>td,th{border:1px solid #999;padding:4px 8px;vertical-align:top}"
             "table{border-collapse:collapse;margin-bottom:1em}</style></head><body>",
             "<h1>enginewire interop</h1>"]
    for kind, title, right in (
            ("engine", "Front end (rows) x engine core (columns)", "engine"),
            ("engine-dp", f"Front end (rows) x {DP_SIZE} engine cores, data parallel "
                          "(columns)", "engines"),
            ("engine-dp-coordinated", "vLLM's coordinated data parallel (front end, DP "
                                      "coordinator, engine cores)", "engines"),
            ("ring", "Ring writer (rows) x readers (columns)", "readers"),
            ("api-server", "vLLM API server (rows) x engine core (columns)", "engine")):
        cells = [c for c in matrix.cells if c.kind == kind]
        if not cells:
            continue
        columns = sorted({(c.right, c.transport) for c in cells})
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr><th></th>")
        parts += [f"<th>{html.escape(r)} {right} ({html.escape(t)})</th>" for r, t in columns]
        parts.append("</tr>")
        for left in sorted({c.left for c in cells}):
            parts.append(f"<tr><th>{html.escape(left)}</th>")
            for r, t in columns:
                cell = next((c for c in cells if (c.left, c.right, c.transport) == (left, r, t)),
                            None)
                if cell is None:
                    parts.append("<td></td>")
                    continue
                text = html.escape(_status_text(cell))
                if cell.deviation is not None:
                    text += (f" <a href='{html.escape(cell.deviation.link)}'>finding "
                             f"{cell.deviation.finding}</a>")
                parts.append(f"<td style='background:{colours[cell.status]}'>{text}</td>")
            parts.append("</tr>")
        parts.append("</table>")
    for name, why in matrix.unavailable.items():
        parts.append(f"<p>{html.escape(name)}: not run ({html.escape(why)})</p>")
    parts.append("</body></html>")
    return "".join(parts)


# --- command ---------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(IMPLEMENTATIONS)}, got {text!r}")
    return list(dict.fromkeys(names))


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "interop",
        help="run every implementation against every other (the interop matrix)",
        description=(
            "Pair every front end with every engine core (over ipc and tcp), every ring "
            "writer with every implementation's readers, and vLLM's API server (vllm serve) "
            "with every engine core, one scripted exchange per pair, and print the matrix. "
            "Exit 0 when every cell passed or failed only where a "
            "documented vLLM deviation says it must, 1 otherwise."
        ),
    )
    parser.add_argument("--peers", type=_names, default=list(PEERS), metavar="A,B",
                        help=f"implementations to pair (default: {','.join(PEERS)})")
    parser.add_argument("--transport", action="append", choices=TRANSPORTS, default=[],
                        help="run engine cells over this transport only; may repeat")
    parser.add_argument("--only", choices=("engine", "dp", "ring", "api-server"), default=None,
                        help="run only the engine cells, only the data-parallel engine "
                             "cells, only the ring cells, or only the API server cells "
                             "(vLLM's `vllm serve` x each engine core)")
    parser.add_argument("--no-dp", action="store_true",
                        help="leave out the data-parallel engine cells")
    parser.add_argument("--json", metavar="PATH", type=writable_file,
                        help="write the matrix as JSON here")
    parser.add_argument("--html", metavar="PATH", type=writable_file,
                        help="write the matrix as a self-contained HTML page here")
    parser.add_argument("--timeout-scale", type=positive_float, default=1.0, metavar="X",
                        help="multiply every wait's time limit by X (slow machines)")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    timeout = STEP_TIMEOUT * args.timeout_scale
    transports = args.transport or list(TRANSPORTS)
    # vLLM logs every engine start at INFO on stdout, around the table; its errors still show.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    def progress(cell: Cell) -> None:
        print(f"{cell.kind} {cell.left} x {cell.right} ({cell.transport}): "
              f"{_status_text(cell)}", file=sys.stderr, flush=True)

    with implementations(args.peers) as (impls, unavailable):
        cells = run_matrix(impls, transports=transports, ring=args.only in (None, "ring"),
                           engine=args.only in (None, "engine"), timeout=timeout,
                           progress=progress,
                           dp=args.only in (None, "dp") and not args.no_dp,
                           api_server=args.only in (None, "api-server"))
    matrix = Matrix(cells, args.peers, unavailable)
    if args.json:
        Path(args.json).write_text(json.dumps(matrix.to_builtins(), indent=2) + "\n")
    if args.html:
        Path(args.html).write_text(render_html(matrix))
    print(render_table(matrix))
    return 0 if matrix.ok else 1
