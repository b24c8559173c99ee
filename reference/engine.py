"""A scripted reference engine core over ZMQ: a thin loop over an
:class:`~enginewire.reference.connection.EngineConnection` (the codec and the session).

It connects like vLLM's engine core: a handshake DEALER with its 2-byte identity (HELLO, init,
READY), then one input DEALER per front-end client and one output PUSH per client, sending its
ready response first on every input DEALER. Built for a release without the handshake (before
0.9.0; ``EngineOptions.version``) it is given the input and output addresses and opens that
release's sockets on them (history/constants.toml ``[[transport]]``: a PULL input without
identity before 0.8.4, binding its output PUSH before 0.8.3 and its input at 0.8.3), sending
``b"READY"`` on its input at 0.8.4 and 0.8.5 and nothing before (those releases told their
parent over a process pipe). Built for 0.9.0 (the handshake on the input socket:
``release_facts.handshake_on_input``) its handshake DEALER is its input: HELLO, the init map
naming the output address, then its output PUSH and READY, its ready response, on the input.
It has no model: it answers each ADD with a
deterministic token stream (:func:`scripted_tokens`), one token per request per step, and
finishes with LENGTH when ``sampling_params.max_tokens`` ran out (STOP after ``tokens`` tokens
when the request sets no max_tokens).

What it serves:

- ADD: a token stream; a request it can decode but cannot serve (no prompt, no sampling
  params, max_tokens < 1, a negative token id, a request id already running, a client_index
  with no output socket) gets one output with finish_reason ERROR.
- ABORT: every aborted request still running gets an output with finish_reason ABORT and its id
  in ``finished_requests`` (handshake.session.abort-output-optional).
- UTILITY: ``echo`` returns its arguments, ``die`` sends ENGINE_CORE_DEAD and exits with status
  1 (no reply), ``get_supported_tasks`` returns ``["generate"]``, ``get_violation_counts``
  (reference only) returns the rejections counted per clause; ``reset_mm_cache``,
  ``reset_encoder_cache`` (None) and ``reset_prefix_cache`` (True) succeed, there being no
  cache to reset (vLLM's API server calls ``reset_mm_cache`` once its engines are ready, and
  fails to start on an error reply); any other method gets a failure message
  (handshake.session.unknown-method-fails-call).
- START_DP_WAVE: accepted, nothing to do.
- Garbage (unknown type byte, wrong frame count, undecodable payload, an event its state does
  not allow): logged with the clause it breaks, counted in :attr:`ReferenceEngine.violations`
  (counts per clause, the recent ones kept with their messages cut), and the engine keeps
  serving.

Work per message is bounded: a request's tokens are computed one per step (a max_tokens of
2**31-1 allocates nothing up front). An unexpected error while serving is fatal: the engine
sends ENGINE_CORE_DEAD on every output (if it got that far) and stops with EXIT_DIED.

Signals (when run by :func:`main` / ``enginewire serve-engine``; handled from before the engine
is built): SIGTERM and SIGINT stop it cleanly (exit 0, no sentinel, as vLLM's shutdown);
SIGUSR1 makes it die (ENGINE_CORE_DEAD, exit 1). It also exits when its parent process goes
away (``parent_pid``), so a test that crashes leaves no orphan behind.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from enginewire.spec.history.release_facts import (
    STATE_KEYS,
    handshake_on_input,
    ready_response_at,
    transport_at,
)
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

from . import structs
from .codec import default_codec
from .connection import (
    EngineConnection,
    Event,
    InitReceived,
    RequestAdded,
    RequestsAborted,
    UtilityCalled,
)
from .errors import ProtocolError, ProtocolTimeout
from .session import EngineSession, get_field
from .transport import (
    ChannelSocket,
    open_socket,
    poll_items,
    readable,
    receive_frames,
    send_frames,
    wait_readable,
)

log = logging.getLogger("enginewire.engine")

#: Exit status of an engine that stopped cleanly, of one that died (sent the sentinel), and of
#: one that failed to start (handshake timeout or violation).
EXIT_CLEAN, EXIT_DIED, EXIT_STARTUP_FAILED = 0, 1, 2
DEFAULT_VOCAB_SIZE = 32000


def scripted_token(
    prompt_token_ids: Sequence[int] | None, k: int, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> int:
    """Token ``k`` the reference engine generates for a prompt:
    ``(prompt[k % len(prompt)] + k + 1) % vocab_size`` (``(k + 1) % vocab_size`` without a
    prompt). Computed when it is sent: a request's tokens never exist as a list."""
    if not prompt_token_ids:
        return (k + 1) % vocab_size
    return (prompt_token_ids[k % len(prompt_token_ids)] + k + 1) % vocab_size


def scripted_tokens(
    prompt_token_ids: Sequence[int] | None, count: int, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> list[int]:
    """The first ``count`` tokens the reference engine generates for a prompt
    (:func:`scripted_token`)."""
    prompt = list(prompt_token_ids or ())
    return [scripted_token(prompt, k, vocab_size) for k in range(count)]


def generation_request(
    request_id: str,
    prompt_token_ids: Sequence[int] = (1, 2, 3),
    max_tokens: int | None = None,
    *,
    release: structs.ReleaseStructs | None = None,
    **fields: Any,
) -> Any:
    """An EngineCoreRequest (reference structs) the reference engine serves: greedy sampling
    params with ``max_tokens`` (None: the engine's ``tokens``), other fields from ``fields``.
    ``release``: build it in that release's layout (a front end's ``structs``; fields the
    release lacks are left out)."""
    make = (release or structs.ReleaseStructs()).make
    values: dict[str, Any] = {
        "request_id": request_id,
        "prompt_token_ids": list(prompt_token_ids),
        "mm_features": None,
        "sampling_params": make("SamplingParams", max_tokens=max_tokens),
        "pooling_params": None,
        "arrival_time": time.time(),
        "lora_request": None,
        "cache_salt": None,
        "data_parallel_rank": None,
    }
    values.update(fields)
    return make("EngineCoreRequest", **values)


def generation_plan(request: Any, default_tokens: int) -> tuple[int, int]:
    """How many tokens the reference engine generates for ``request``, and the FinishReason
    value it finishes with: ``sampling_params.max_tokens`` and LENGTH, or ``default_tokens``
    and STOP when the request sets no max_tokens."""
    return plan_for(get_field(get_field(request, "sampling_params"), "max_tokens"),
                    default_tokens)


def plan_for(max_tokens: int | None, default_tokens: int) -> tuple[int, int]:
    """:func:`generation_plan` of a request whose sampling params' max_tokens is
    ``max_tokens``."""
    stop, length = _FINISH_VALUES[0] if _FINISH_VALUES else _finish_values()
    if max_tokens is None:
        return default_tokens, stop
    return int(max_tokens), length


def _finish_values() -> tuple[int, int]:
    """The FinishReason values STOP and LENGTH (read from the structs once)."""
    if not _FINISH_VALUES:
        reasons = structs.FinishReason
        _FINISH_VALUES.append((int(reasons.STOP), int(reasons.LENGTH)))
    return _FINISH_VALUES[0]


_FINISH_VALUES: list[tuple[int, int]] = []


def expected_generation(request: Any, default_tokens: int) -> tuple[list[int], int]:
    """The tokens and the FinishReason value the reference engine produces for ``request``
    (for tests: this builds the whole list)."""
    count, reason = generation_plan(request, default_tokens)
    return scripted_tokens(get_field(request, "prompt_token_ids"), count), reason


def parallel_config_hash(dp_size: int) -> str:
    """The READY ``parallel_config_hash`` of a scripted engine in a DP group of ``dp_size``.

    vLLM hashes the parallel settings that affect collective communication; the scripted
    engine has only ``dp_size``, so equal groups agree and different groups differ.
    """
    return hashlib.sha256(f"enginewire-dp-{dp_size}".encode()).hexdigest()


@dataclass(slots=True)
class _Running:
    request_id: str
    client_index: int
    prompt: Sequence[int]
    #: Tokens to generate in all, and how many went out.
    count: int
    finish_reason: int
    sent: int = 0


#: Bound on the rejected messages an engine keeps (the counts per clause are unbounded in
#: time but bounded in size: one per clause), and on the length of each kept message.
VIOLATIONS_KEPT = 100
VIOLATION_MESSAGE_CHARS = 200


class Violations:
    """The messages an engine rejected and survived: counts per clause, and the most recent
    :data:`VIOLATIONS_KEPT` as ``(clause, message)`` with the message cut to
    :data:`VIOLATION_MESSAGE_CHARS` characters (a rejected value can be megabytes).

    Iterating yields the kept ``(clause, message)`` pairs, oldest first; ``len`` is their
    number; :attr:`total` counts every rejection.
    """

    def __init__(self, keep: int = VIOLATIONS_KEPT,
                 message_chars: int = VIOLATION_MESSAGE_CHARS) -> None:
        self.counts: Counter[str] = Counter()
        self.recent: deque[tuple[str, str]] = deque(maxlen=keep)
        self.message_chars = message_chars

    def record(self, clause: str, message: str) -> str:
        """Count one rejection; returns the (possibly cut) message kept for it."""
        if len(message) > self.message_chars:
            message = message[:self.message_chars] + f"... ({len(message)} chars)"
        self.counts[clause] += 1
        self.recent.append((clause, message))
        return message

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def clauses(self) -> set[str]:
        """Every clause rejected at least once."""
        return set(self.counts)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.recent)

    def __len__(self) -> int:
        return len(self.recent)

    def __bool__(self) -> bool:
        return bool(self.counts)


@dataclass
class EngineOptions:
    """How a reference engine starts and behaves (see :class:`ReferenceEngine`)."""

    handshake_address: str | None = None
    #: Without a handshake address: the input/output addresses to connect to directly.
    input_addresses: Sequence[str] = ()
    output_addresses: Sequence[str] = ()
    rank: int = 0
    local: bool = True
    headless: bool = False
    #: Tokens per request when its sampling params set no max_tokens.
    tokens: int = 4
    #: Seconds between generation steps (0: as fast as it can).
    step_delay: float = 0.0
    #: Bound on the wait for init after HELLO (the spec's engine_init_wait by default).
    handshake_timeout: float = 300.0
    max_model_len: int = 4096
    dp_size: int = 1
    #: Extra READY keys (parallel_config_hash, ...).
    ready_extra: dict[str, Any] = field(default_factory=dict)
    #: Exit when this process is no longer our parent (None: don't watch).
    parent_pid: int | None = None
    #: The vLLM release whose layouts, handshake keys and ready response it speaks (None:
    #: the spec's reference release).
    version: str | None = None


#: Values of the READY keys an older release requires beyond status, local and headless
#: (history/constants.toml [[handshake]]): what a scripted engine without a GPU says.
READY_KEY_VALUES: dict[str, Any] = {"num_gpu_blocks": 1024, "dp_stats_address": None}


#: Most messages read from one input socket per poll, so a flood on one socket cannot hold off
#: the generation step, the other sockets, or a stop or death request.
MAX_MESSAGES_PER_POLL = 256
#: Serving turns with messages between two checks that the parent process is still there
#: (checked at once whenever a poll comes back empty).
SERVING_TURNS_PER_PARENT_CHECK = 256


class ReferenceEngine:
    """One scripted engine core. :meth:`run` blocks until it stops or dies.

    A thin loop over an :class:`~enginewire.reference.connection.EngineConnection`: one
    poll per batch of ready input sockets
    (:func:`~enginewire.reference.transport.wait_readable`), each message handed to
    ``connection.receive`` (an ADD first to its express path, ``receive_add_express``), each
    event acted on, each answer encoded by ``connection.send`` and
    written to its socket. Work per message is bounded: tokens are computed one per step
    (:func:`scripted_token`), never as a list of ``max_tokens``; the record of rejected
    messages (:attr:`violations`, a :class:`Violations`) is counted and sampled.

    Thread-safe controls: :meth:`request_stop` (clean exit) and :meth:`request_death`
    (ENGINE_CORE_DEAD, then exit). Everything else runs on the thread that called :meth:`run`.
    An unexpected error while serving is fatal: the engine sends ENGINE_CORE_DEAD on every
    output it has (frames.engine-core-dead-fatal) and :meth:`run` returns EXIT_DIED.
    """

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        handshake = options.handshake_address is not None
        if not handshake and not options.input_addresses:
            raise ValueError("an engine needs a handshake address or input/output addresses")
        release = options.version if options.version != REFERENCE_VLLM_VERSION else None
        #: The release it speaks (None: the reference release, the handshake surface's terms).
        self.release = release
        codec = default_codec(version=release) if release is not None else None
        self.connection = EngineConnection(
            options.rank, local=options.local, headless=options.headless, handshake=handshake,
            codec=codec, input_address=options.handshake_address,
        )
        self.structs = structs.ReleaseStructs(codec)
        self._ready_form = "struct" if release is None else ready_response_at(release)
        #: The release's input/output sockets (None: the transport surface's).
        self._transport = transport_at(release) if release is not None else None
        direct = self._transport is not None and not self._transport.handshake
        #: The release holds the handshake on the input socket, READY its ready response
        #: (0.9.0): the handshake DEALER stays open as the input.
        self._on_input = release is not None and handshake_on_input(release)
        if direct and handshake:
            raise ValueError(f"vLLM {release} has no HELLO/READY handshake: give the engine "
                             "its input and output addresses")
        # Forms of the ready signal it speaks: a struct or an empty frame after the handshake;
        # without one, b"READY" on each input (0.8.4, 0.8.5) or none on the wire (a pipe).
        forms = ("struct", "empty", "READY", "none") if direct else \
            ("handshake",) if self._on_input else ("struct", "empty")
        if self._ready_form not in forms:
            raise NotImplementedError(
                f"vLLM {release}'s engine sends no ready response frame "
                f"({self._ready_form}): the reference engine speaks the handshake of "
                "releases that send one")
        self._stop = threading.Event()
        self._die = threading.Event()
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._inputs: list[ChannelSocket] = []
        self._outputs: list[ChannelSocket] = []
        self._running: dict[str, _Running] = {}
        self._next_step = 0.0
        # What every output is built from, decided once. The reference release calls its
        # classes directly (the per-step path); another release's go through ReleaseStructs,
        # which leaves out fields the release lacks and maps finish reasons it lacks.
        if release is None:
            classes = self.connection.codec.structs
            self._output_class: Callable[..., Any] = classes["EngineCoreOutput"]
            self._outputs_class: Callable[..., Any] = classes["EngineCoreOutputs"]
            self._finish_reason: Callable[[int], Any] = {
                int(reason): reason for reason in classes["FinishReason"]}.__getitem__
        else:
            # Read self.structs at each call: what it builds is the engine's current release.
            self._output_class = lambda **values: self.structs.make("EngineCoreOutput", **values)
            self._outputs_class = lambda **values: self.structs.make("EngineCoreOutputs",
                                                                     **values)
            self._finish_reason = lambda value: self.structs.finish_reason(value)
        #: The connection's express path for an ADD (what :meth:`_handle` does with one, in
        #: one call), decided when serving starts (:meth:`_express_path`).
        self._express_add: Callable[[list[Any]], Any] | None = None
        #: The violations the engine logged and survived (counted per clause, recent sampled).
        self.violations = Violations()
        self._utilities: dict[str, Callable[..., Any]] = {
            "echo": lambda *args: args,
            "get_supported_tasks": lambda: ["generate"],
            "get_violation_counts": lambda: dict(self.violations.counts),
            "reset_mm_cache": lambda: None,
            "reset_encoder_cache": lambda: None,
            "reset_prefix_cache": lambda *args: True,
        }

    @property
    def session(self) -> EngineSession:
        """The connection's session state machine."""
        return self.connection.session

    # --- controls ------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def request_death(self) -> None:
        self._die.set()

    # --- lifecycle -----------------------------------------------------------------------

    def run(self) -> int:
        """Start up, serve until stopped or dead; returns EXIT_CLEAN or EXIT_DIED."""
        if self._stop.is_set():  # asked to stop before it started: connect nothing
            return EXIT_CLEAN
        self._ctx = zmq.Context()
        try:
            try:
                addresses = self._start_up()
            except Exception:
                self._report_fatal()
                raise
            if addresses is None:
                return EXIT_CLEAN
            try:
                return self._serve()
            except Exception as error:  # anything unexpected: die, telling the front end
                log.exception("engine %d: fatal error: %s", self.options.rank, error)
                self._report_fatal()
                return EXIT_DIED
        finally:
            # Nothing the engine sends on an input socket is owed after it stops (its ready
            # response at most, to a front end that may have gone before it was delivered),
            # and the input DEALER has no LINGER (infinite): closed at linger 0, or that
            # undelivered message would hold term() forever. (vLLM's input thread is a
            # daemon that ends with its process, so it never waits.) The outputs keep their
            # linger (transport.output-push-linger), which ENGINE_CORE_DEAD needs.
            for sock in self._inputs:
                sock.close(0)
            for sock in self._outputs:
                sock.close()
            self._ctx.term()
            self._ctx = None

    def _report_fatal(self) -> None:
        """Send ENGINE_CORE_DEAD if the outputs are connected and the state allows it."""
        if self._outputs and self.session.machine.can("send_dead"):
            try:
                self._send_dead()
            except Exception as error:  # noqa: BLE001 - nothing more can be reported
                log.error("engine %d: could not send ENGINE_CORE_DEAD: %s",
                          self.options.rank, error)

    def _start_up(self) -> Any:
        opts = self.options
        if opts.handshake_address is None:
            addresses = structs.EngineZmqAddresses(
                inputs=list(opts.input_addresses), outputs=list(opts.output_addresses)
            )
            self.connection.use_addresses(addresses)
            self._connect(addresses)
            self._send_ready_responses()
            self.connection.begin_serving()
            return addresses
        assert self._ctx is not None
        handshake = open_socket(
            self._ctx, "handshake", "engine", opts.handshake_address,
            identity=self.connection.identity,
        )
        ready_sent = False
        try:
            handshake.socket.send_multipart(self.connection.send("hello"))
            deadline = time.monotonic() + opts.handshake_timeout
            while not handshake.socket.poll(50):
                if self._stop.is_set() or self._parent_gone():
                    return None
                if time.monotonic() > deadline:
                    raise ProtocolTimeout(
                        "handshake.engine-init-timeout",
                        f"no init message within {opts.handshake_timeout} s of HELLO",
                    )
            [init] = self.connection.receive("handshake", handshake.socket.recv_multipart())
            assert isinstance(init, InitReceived)
            if self._on_input:
                # The handshake DEALER is the input; the init map names the output only.
                self._inputs.append(handshake)
                self._connect({"inputs": [], "outputs": get_field(init.addresses, "outputs")})
            else:
                self._connect(init.addresses)
            self._send_ready_responses()
            extra = self._release_ready_keys()
            extra.update(opts.ready_extra)
            if opts.dp_size > 1 and self._release_has_ready_key("parallel_config_hash"):
                # Clause handshake.ready-optional-keys: DP > 1 engines send their config hash.
                extra.setdefault("parallel_config_hash", parallel_config_hash(opts.dp_size))
            handshake.socket.send_multipart(self.connection.send("ready", extra or None))
            ready_sent = True
            return init.addresses
        finally:
            if handshake not in self._inputs:
                # transport.handshake-dealer-linger: closed right after READY, the socket
                # keeps its linger so READY reaches the front end. A handshake given up
                # before READY (stopped, parent gone, init timeout, a violation) has
                # nothing left to deliver: the unanswered HELLO is dropped (linger 0), or a
                # front end that never bound would hold the context's term() for the full
                # linger.
                handshake.close(None if ready_sent else 0)

    def _connect(self, addresses: Any) -> None:
        """Open the input and output sockets the release has (their types, binds and the
        identity on input: history/constants.toml [[transport]] for an older release)."""
        assert self._ctx is not None
        routed = self._transport is None or self._transport.identity
        for address in get_field(addresses, "inputs"):
            self._inputs.append(
                open_socket(self._ctx, "input", "engine", address,
                            identity=self.connection.identity if routed else None,
                            version=self.release)
            )
        for address in get_field(addresses, "outputs"):
            self._outputs.append(open_socket(self._ctx, "output", "engine", address,
                                             version=self.release))

    def _ready_keys(self) -> set[str]:
        """Every key the release's READY has (the session's READY message)."""
        message = self.connection.session.ready_message
        return {k.name for k in message.keys} if message is not None else set()

    def _release_has_ready_key(self, key: str) -> bool:
        return key in self._ready_keys()

    def _release_ready_keys(self) -> dict[str, Any]:
        """The READY keys the release requires beyond status, local and headless
        (num_gpu_blocks, and dp_stats_address from 0.9.2, before 0.20.0)."""
        message = self.connection.session.ready_message
        required = [k.name for k in message.keys if k.required] if message is not None else []
        return {k: READY_KEY_VALUES[k] for k in required if k not in STATE_KEYS}

    def _ready_response(self) -> Any:
        """The ready response: the release's EngineCoreReadyResponse, or None (an empty
        frame, or the literal b"READY" of 0.8.4 and 0.8.5: the codec writes the release's)."""
        if self._ready_form in ("empty", "READY", "none", "handshake"):
            return None
        opts = self.options
        return self.structs.make("EngineCoreReadyResponse",
            max_model_len=opts.max_model_len,
            num_gpu_blocks=1024,
            block_size=16,
            dp_stats_address=None,
            dtype="float16",
            vllm_version=self.release or REFERENCE_VLLM_VERSION,
            world_size=1,
            data_parallel_size=opts.dp_size,
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            data_parallel_rank=opts.rank,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            instance_id=f"enginewire-reference-{opts.rank}",
            supports_lora=False,
            max_loras=0,
        )

    def _send_ready_responses(self) -> None:
        frames = self.connection.send("ready_response", self._ready_response())
        if self._ready_form in ("none", "handshake"):
            # "handshake": READY on the input socket is the ready response (0.9.0).
            # The release signals readiness to its parent over a pipe: nothing on the wire
            # (the session still records that the engine is ready).
            return
        for sock in self._inputs:
            sock.socket.send_multipart(frames)

    def _express_path(self) -> Callable[[list[Any]], Any] | None:
        """The connection's express path for an ADD where every message would reach the
        connection's own ``receive`` through this module's :meth:`_handle` and :meth:`_act`;
        None where a subclass handles messages its own way or ``receive`` was replaced on the
        connection (to watch or rewrite what comes): those see every message."""
        cls = type(self)
        if cls._handle is not ReferenceEngine._handle or cls._act is not ReferenceEngine._act \
                or "receive" in vars(self.connection):
            return None
        return self.connection.receive_add_express

    def _serve(self) -> int:
        self._express_add = self._express_path()
        # One poll over every input socket (zmq_poll, as zmq.Poller.poll calls it).
        items = poll_items([sock.socket for sock in self._inputs])
        dying, stopping = self._die.is_set, self._stop.is_set
        clock, step_delay = time.monotonic, self.options.step_delay
        busy_turns = 0
        while True:
            if dying():
                self._send_dead()
                return EXIT_DIED
            if stopping():
                return EXIT_CLEAN
            wait_ms = 50
            if self._running and step_delay:
                wait_ms = max(0, int((self._next_step - clock()) * 1000))
            elif self._running:
                wait_ms = 0
            # One poll per batch: read what each ready socket holds (bounded), so a burst of
            # requests joins one step.
            ready = wait_readable(items, wait_ms)
            for index, (sock, _) in enumerate(ready):
                # (Checked at the top of this loop before the first socket; _drain checks
                # between messages.)
                if index and (dying() or stopping()):
                    break
                self._drain(sock)
            # Whether the parent is still there (a system call) when the poll came back
            # empty, and every SERVING_TURNS_PER_PARENT_CHECK turns under a steady load.
            busy_turns = busy_turns + 1 if ready else SERVING_TURNS_PER_PARENT_CHECK
            if busy_turns >= SERVING_TURNS_PER_PARENT_CHECK:
                busy_turns = 0
                if self._parent_gone():
                    return EXIT_CLEAN
            if self._running and not dying() and (not step_delay or clock() >= self._next_step):
                self._step()
                if step_delay:
                    self._next_step = clock() + step_delay

    def _drain(self, sock: zmq.Socket[Any]) -> None:
        """Read what a socket the poll found ready holds, at most
        :data:`MAX_MESSAGES_PER_POLL` messages, asking the socket whether another one waits
        (a receive that finds none raises, which costs several times the question)."""
        # (The serving loop checks the stop and death requests before it calls this.)
        express, add = self._express_add, self._add
        for _ in range(MAX_MESSAGES_PER_POLL):
            frames = receive_frames(sock)
            request = express(frames) if express is not None else None
            if request is not None:
                add(request)
            else:
                self._handle(frames)
            if not readable(sock) or self._die.is_set() or self._stop.is_set():
                return

    def _parent_gone(self) -> bool:
        parent = self.options.parent_pid
        return parent is not None and os.getppid() != parent

    # --- input ---------------------------------------------------------------------------

    def _violation(self, error: BaseException, what: str) -> None:
        clause = getattr(error, "clause", "frames.payload-msgpack-first")
        message = self.violations.record(clause, str(error))
        log.warning("engine %d: %s rejected [%s]: %s", self.options.rank, what, clause, message)

    def _handle(self, frames: list[bytes]) -> None:
        """One message from an input DEALER: a rejected one is logged and survived."""
        try:
            events = self.connection.receive("input", frames)
        except Exception as error:  # a ProtocolError, or a codec bug: the engine goes on
            self._violation(error, "message")
            return
        for event in events:
            self._act(event)

    def _act(self, event: Event) -> None:
        if isinstance(event, RequestAdded):
            self._add(event.request)
        elif isinstance(event, RequestsAborted):
            self._abort(event.request_ids)
        elif isinstance(event, UtilityCalled):
            self._call(event.client_index, event.call_id, event.method, event.args)

    # A request here is the codec's EngineCoreRequest struct: its fields are read as
    # attributes (with the defaults get_field gives a field this release lacks).

    def _bad_content(self, request: Any, prompt: Any, sampling: Any, max_tokens: Any,
                     client_index: int) -> str | None:
        """Why the reference engine cannot serve ``request`` (None: it can), given its
        prompt_token_ids, its sampling params and their max_tokens, and its client_index."""
        if prompt is None and getattr(request, "prompt_embeds", None) is None:
            return "no prompt_token_ids and no prompt_embeds"
        if sampling is None:
            return "no sampling_params (the reference engine only generates)"
        if max_tokens is not None and max_tokens < 1:
            return f"max_tokens {max_tokens} < 1"
        if prompt and min(prompt) < 0:
            return "a negative token id"
        if not 0 <= client_index < len(self._outputs):
            return f"client_index {client_index} has no output socket"
        return None

    def _add(self, request: Any) -> None:
        # Each field read once (the request is the codec's struct; getattr's default stands
        # for a field this release lacks).
        request_id = request.request_id
        prompt = getattr(request, "prompt_token_ids", None)
        sampling = getattr(request, "sampling_params", None)
        max_tokens = getattr(sampling, "max_tokens", None)  # (None for no sampling params)
        client_index = getattr(request, "client_index", 0) or 0
        problem = self._bad_content(request, prompt, sampling, max_tokens, client_index)
        if problem is None and request_id in self._running:
            problem = "a request with this id is already running"
        if problem is not None:
            log.warning("engine %d: request %r refused: %s", self.options.rank, request_id,
                        problem)
            if not 0 <= client_index < len(self._outputs):
                client_index = 0
            if request_id not in self._running:
                self._finish_now([request_id], client_index, int(structs.FinishReason.ERROR))
            return
        count, reason = plan_for(max_tokens, self.options.tokens)
        self._running[request_id] = _Running(request_id, client_index, prompt or (), count,
                                             reason)
        if self.options.step_delay and len(self._running) == 1:
            self._next_step = time.monotonic() + self.options.step_delay

    def _abort(self, request_ids: list[str]) -> None:
        by_client: dict[int, list[str]] = {}
        for request_id in request_ids:
            running = self._running.pop(request_id, None)
            if running is not None:
                by_client.setdefault(running.client_index, []).append(request_id)
        for client_index, ids in by_client.items():
            self._finish_now(ids, client_index, int(structs.FinishReason.ABORT))

    def _finish_now(self, request_ids: list[str], client_index: int, reason: int) -> None:
        make = self.structs.make
        outputs = make(
            "EngineCoreOutputs",
            engine_index=self.options.rank,
            outputs=[
                make("EngineCoreOutput", request_id=r, new_token_ids=[],
                     finish_reason=self.structs.finish_reason(reason))
                for r in request_ids
            ],
            # A list (set[str] on the wire is an array): the encoded order stays the send order.
            finished_requests=list(request_ids),
            timestamp=time.monotonic(),
        )
        send_frames(self._outputs[client_index].socket, self.connection.send("outputs", outputs))

    def _call(self, client_index: int, call_id: int, method: str, args: Sequence[Any]) -> None:
        if method == "die":
            self._die.set()
            return
        failure, result = None, None
        function = self._utilities.get(method)
        try:
            if function is None:
                raise AttributeError(f"the reference engine has no method {method!r}")
            value = function(*args)
            # Releases before 0.10.1 carry the bare result (no UtilityResult).
            result = (self.structs.make("UtilityResult", type_info=None, value=value)
                      if self.structs.has("UtilityResult") else value)
        except Exception as error:  # every failure becomes the call's answer
            failure = f"Call to {method} method failed: {error}"
        outputs = self.structs.make(
            "EngineCoreOutputs",
            engine_index=self.options.rank,
            utility_output=self.structs.make(
                "UtilityOutput",
                call_id=call_id, failure_message=failure, result=result
            ),
            timestamp=time.monotonic(),
        )
        frames = self.connection.send("utility_reply", outputs, client_index=client_index)
        send_frames(self._outputs[client_index].socket, frames)

    # --- output --------------------------------------------------------------------------

    def _step(self) -> None:
        output_class, finish_reason = self._output_class, self._finish_reason
        running_requests = self._running
        # client_index -> (its request outputs, the ids among them that finish)
        by_client: dict[int, tuple[list[Any], list[str]]] = {}
        for request_id, running in list(running_requests.items()):
            sent = running.sent
            running.sent = sent + 1
            done = sent + 1 >= running.count
            client = by_client.get(running.client_index)
            if client is None:
                client = by_client[running.client_index] = ([], [])
            client[0].append(output_class(
                request_id=request_id,
                new_token_ids=[scripted_token(running.prompt, sent)] if sent < running.count
                else [],
                finish_reason=finish_reason(running.finish_reason) if done else None,
            ))
            if done:
                client[1].append(request_id)
                del running_requests[request_id]
        for client_index, (outputs, done_ids) in by_client.items():
            message = self._outputs_class(
                engine_index=self.options.rank,
                outputs=outputs,
                # A list (set[str] on the wire is an array): the encoded order is the send order.
                finished_requests=done_ids or None,
                timestamp=time.monotonic(),
            )
            send_frames(self._outputs[client_index].socket,
                        self.connection.send("outputs", message))

    def _send_dead(self) -> None:
        frames = self.connection.send("engine_core_dead")
        for sock in self._outputs:
            send_frames(sock.socket, frames)
        log.warning("engine %d: sent ENGINE_CORE_DEAD", self.options.rank)


# --- process ---------------------------------------------------------------------------------


_SIGNAL_CONTROLS = {
    signal.SIGTERM: ReferenceEngine.request_stop,
    signal.SIGINT: ReferenceEngine.request_stop,
    signal.SIGUSR1: ReferenceEngine.request_death,
}


def main(options: EngineOptions) -> int:
    """Run an engine in this process with SIGTERM/SIGINT (stop) and SIGUSR1 (die) handlers;
    returns the exit status (EXIT_CLEAN, EXIT_DIED or EXIT_STARTUP_FAILED).

    The handlers are in place before the engine is built: a signal that comes while it loads
    its spec is kept and acted on as soon as the engine exists.
    """
    engine: ReferenceEngine | None = None
    early: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if engine is None:
            early.append(signum)
        else:
            _SIGNAL_CONTROLS[signal.Signals(signum)](engine)

    previous = {signum: signal.signal(signum, on_signal) for signum in _SIGNAL_CONTROLS}
    try:
        engine = ReferenceEngine(options)
        for signum in early:
            _SIGNAL_CONTROLS[signal.Signals(signum)](engine)
        # As vLLM's engine core does once it is set up: the objects made so far (the spec, the
        # codec, the struct classes) leave the collector's generations, so no collection on
        # the serving path walks them.
        gc.freeze()
        return engine.run()
    except ProtocolError as error:
        log.error("engine %d failed to start: %s", options.rank, error)
        return EXIT_STARTUP_FAILED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class EngineProcess:
    """A reference engine in a child process (``enginewire serve-engine``)."""

    def __init__(self, popen: subprocess.Popen[bytes], options: EngineOptions) -> None:
        self.popen = popen
        self.options = options

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill_with(self, signum: int) -> None:
        if self.alive():
            self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """The exit status, waiting at most ``timeout`` s (subprocess.TimeoutExpired after)."""
        return self.popen.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; idempotent. Returns the status."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait(timeout)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def engine_argv(options: EngineOptions) -> list[str]:
    """The ``enginewire serve-engine`` arguments that reproduce ``options``."""
    argv = ["serve-engine", "--rank", str(options.rank), "--tokens", str(options.tokens),
            "--step-delay", str(options.step_delay),
            "--handshake-timeout", str(options.handshake_timeout),
            "--max-model-len", str(options.max_model_len), "--dp-size", str(options.dp_size)]
    if options.handshake_address is not None:
        argv += ["--handshake", options.handshake_address]
    for address in options.input_addresses:
        argv += ["--input", address]
    for address in options.output_addresses:
        argv += ["--output", address]
    argv.append("--local" if options.local else "--remote")
    if options.headless:
        argv.append("--headless")
    if options.parent_pid is not None:
        argv += ["--parent-pid", str(options.parent_pid)]
    if options.version is not None:
        argv += ["--version", options.version]
    return argv


def spawn_engine(options: EngineOptions, *, stderr: Any = None) -> EngineProcess:
    """Start ``enginewire serve-engine`` as a child that exits when this process goes away.

    ``stderr``: where its log goes (a file object, ``subprocess.DEVNULL``; None: inherit).
    """
    if options.parent_pid is None:
        options = EngineOptions(**{**options.__dict__, "parent_pid": os.getpid()})
    argv = [sys.executable, "-m", "enginewire", *engine_argv(options)]
    popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=stderr)
    return EngineProcess(popen, options)
