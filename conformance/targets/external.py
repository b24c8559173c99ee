"""External programs as targets: ``enginewire check --target-cmd [SURFACE=]COMMAND``.

A command names the program for one surface. Without ``SURFACE=`` the surface is read from
the placeholders: ``{engine_input}`` or ``{engine_output}`` means ``engine``, ``{input}`` or
``{output}`` ``frontend``, ``{handshake}`` ``engine``; anything else is ``codec`` unless
written ``ring=...``. The command is split like a shell would, then the placeholders are filled
into its words each time the suite starts the program (a value stays one word; a placeholder
with nothing to fill at this release becomes an empty word; a placeholder the surface does not
know is a :class:`TargetError` naming the known ones). ``{version}`` is filled for every
surface: the release the suite checks (``check --version X``; the spec's reference release
without it), for a program that speaks more than one release's layouts, handshake keys and
sockets.

``engine`` -- started once per engine the suite needs::

    myengine --handshake {handshake} --rank {rank} --dp-size {dp_size}
             [--remote {remote}] [--headless {headless}] [--init-timeout {init_timeout}]
             [--input {engine_input} --output {engine_output}] [--version {version}]

Where the engine learns its addresses depends on the release the suite checks (``check
--version X``; history/constants.toml ``[[transport]]``):

- ``{handshake}``: the address of the front end's HELLO/READY handshake, the suite's handshake
  ROUTER from 0.9.1; at 0.9.0, whose engine holds the handshake on its input socket, the suite's
  input ROUTER (the engine's input DEALER sends HELLO there and reads the init map naming the
  output address). Empty before 0.9.0.
- ``{engine_input}`` / ``{engine_output}``: before 0.9.0, which has no handshake, the input and
  output addresses the engine opens that release's sockets on (binding those the release's
  engine binds: its output PUSH at 0.7.3-0.8.2, its input at 0.8.3). Empty from 0.9.0, where
  the handshake names them.
- ``{version}``: the release the suite checks, as for every surface. Filled at every release.

A command needs the placeholders of the release's addresses: without ``{engine_input}`` and
``{engine_output}`` at 0.7.3-0.8.5, or without ``{handshake}`` from 0.9.0, the suite does not
start it and every engine check is NOT IMPLEMENTED, naming the missing placeholder and the
release. ``{rank}`` is the engine index, ``{dp_size}`` the data parallel size,
``{local}``/``{remote}``/``{headless}`` are ``true`` or ``false``, ``{init_timeout}`` is in
seconds. The program is the engine: it connects, serves, and is stopped with SIGTERM (then
SIGKILL after 5 s). Its stderr goes to a file in the check's temporary directory. The
reference engine as such a program, at every release 0.7.3-0.33.0::

    python -m enginewire serve-engine --version {version} --handshake {handshake}
        --input {engine_input} --output {engine_output} --rank {rank} --dp-size {dp_size}
        --remote {remote} --headless {headless} --handshake-timeout {init_timeout}

(``serve-engine`` reads an empty address as not given.)

``frontend``, ``codec`` and ``ring`` -- a long-running program speaking JSON lines: the suite
writes one request per line on its stdin and the program answers each with one line on its
stdout. Every request carries ``"seq"`` (an int) and its answer echoes it; answers may come in
any order (a program may serve requests concurrently; a ring program must, because the
collective ``wait_until_ready`` blocks until the other ends call theirs). An answer is
``{"seq": N, "ok": true, ...}`` or ``{"seq": N, "ok": false, "error": TEXT, "kind": KIND,
"clause": CLAUSE_ID_OR_NULL}`` where KIND is ``"timeout"`` (the suite raises TimeoutError),
``"dead"`` (ConnectionError), ``"error"`` (the program refuses the input: a rejection, raised
as :class:`CommandFailed`, a ``ValueError``), ``"unsupported"`` (the program has no code for
this request: the check is NOT IMPLEMENTED, never passed or failed; raised as
``contract.Unsupported``). Values are neutral values as the tagged JSON of
:mod:`enginewire.conformance.oracle.golden` (``{"$tensor": {...}}``, ``{"$set": [...]}``, ...);
frames and buffers are lists of hex strings.

- ``frontend`` (``{handshake} {input} {output} {engines} {version}`` filled in; the program
  binds the three addresses):
  ``wait_ready {timeout}``; ``add {engine, request}``; ``abort {engine, request_ids}``;
  ``utility {engine, method, args, timeout}`` -> ``result``; ``outputs {timeout}`` ->
  ``outputs``; ``stop``.
- ``codec`` (``{version}`` filled in): ``hello {}`` -> ``role``, ``unsupported`` (both
  optional; asked once, before anything else): the program's declaration of what it implements,
  as an in-process codec's attributes of the same names (``contract`` "Roles"): ``role`` is
  ``"frontend"`` (encodes what a front end sends, decodes the rest), ``"engine"`` (the reverse)
  or ``"both"`` (the default); ``unsupported`` lists ``"encode:KIND"`` / ``"decode:KIND"`` (or
  ``"encode:*"``) and codec capabilities it lacks (``"codec.threshold"``,
  ``"codec.insecure"``). Checks outside the role are NOT APPLICABLE, checks needing an
  unsupported operation NOT IMPLEMENTED, in both cases without sending the program anything. A
  program that answers ``hello`` with ``"unsupported"`` or ``"error"`` (one that predates it)
  declares nothing: role ``both``. Then ``encode {kind, value, threshold}`` -> ``frames``;
  ``decode {kind, frames, threshold}`` -> ``value`` (``threshold`` null: the spec's default).
- ``ring`` (``{version}`` filled in): ``create_writer {n_reader, max_chunk_bytes, max_chunks}``
  -> ``id``, ``handle``; ``attach_reader {handle, rank}`` -> ``id``; ``wait_until_ready {id,
  timeout}``; ``enqueue {id, buffers, timeout}``; ``dequeue {id, timeout}`` -> ``buffers``;
  ``close {id}``. The suite pickles and unpickles; the program only moves ``[main, oob...]``
  buffers through the ring.

``python -m enginewire.conformance.targets.command_server --surface S --target T --version
{version}`` serves these protocols for any in-process target (``--version`` makes the reference
target follow that release, as ``check --version`` does; without it the program speaks the
newest release's layouts and handshake, and fails an older release's codec and front-end
checks); it is also a worked example.

A program that cannot start is a :class:`TargetError` (``check`` exit 2), never a verdict: its
first word is looked for when the command is read (not found, not executable), and one that
exits before its first answer (engine: before its first message to the suite) is a
:class:`TargetStartError` with its status and stderr tail, noted for the runner
(``evidence.note_start_failure``), which stops the run with it.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import signal
import string
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from enginewire.conformance.framework.evidence import note_start_failure
from enginewire.conformance.targets.contract import (
    CAPABILITIES,
    CODEC_ROLES,
    RingHandle,
    TargetError,
    TargetStartError,
    Unsupported,
)
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

SURFACE_PREFIXES = ("codec=", "ring=", "engine=", "frontend=")


#: Engine placeholders naming the addresses the engine opens directly (before 0.9.0).
DIRECT_PLACEHOLDERS = ("engine_input", "engine_output")
#: Engine placeholder naming the address the engine's handshake connects to (from 0.9.0).
HANDSHAKE_PLACEHOLDERS = ("handshake",)


def split_command(text: str) -> tuple[str, str]:
    """``(surface, command)`` of one ``--target-cmd`` entry."""
    for prefix in SURFACE_PREFIXES:
        if text.startswith(prefix):
            return prefix[:-1], text[len(prefix):]
    if any(f"{{{name}}}" in text for name in DIRECT_PLACEHOLDERS):
        return "engine", text
    if "{input}" in text or "{output}" in text:
        return "frontend", text
    if "{handshake}" in text:
        return "engine", text
    return "codec", text


def command_surfaces(commands: Sequence[str], version: str | None = None) -> dict[str, Any]:
    """The surfaces of ``--target-cmd`` entries; ``version``: the vLLM release the suite
    checks (every command's ``{version}``, and the addresses an engine's launch gives; None:
    the spec's reference release)."""
    surfaces: dict[str, Any] = {}
    for text in commands:
        surface, command = split_command(text)
        if not command.strip():
            raise TargetError(f"--target-cmd {text!r}: empty command")
        if surface in surfaces:
            raise TargetError(f"--target-cmd: two commands for {surface}")
        surfaces[surface] = {
            "engine": CommandEngine, "frontend": CommandFrontend, "codec": CommandCodec,
            "ring": CommandRing,
        }[surface](command, version=version)
    return surfaces


def placeholders(template: str) -> frozenset[str]:
    """The placeholder names a command uses (``{name}``; ``{{`` is a literal brace)."""
    try:
        return frozenset(field for word in shlex.split(template)
                         for _, field, _, _ in string.Formatter().parse(word) if field)
    except ValueError as exc:
        raise TargetError(f"cannot read the placeholders of {template!r}: {exc}") from None


def _argv(template: str, **values: Any) -> list[str]:
    """``template`` split like a shell would, then ``values`` filled into each word: a value
    stays one word, an empty value an empty word."""
    filled = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in values.items()}
    try:
        return [word.format(**filled) for word in shlex.split(template)]
    except KeyError as exc:
        raise TargetError(f"unknown placeholder {exc} in {template!r} (known: "
                          f"{', '.join(sorted(filled))})") from None
    except (ValueError, IndexError) as exc:
        raise TargetError(f"cannot fill the placeholders of {template!r}: {exc}") from None


def program_problem(program: str) -> str | None:
    """Why ``program`` (a command's first word) cannot be started, or None: a path (a word
    with ``/``) must be an executable file, a bare name an executable on ``PATH``."""
    if "/" not in program:
        return None if shutil.which(program) else "not found on PATH"
    if not os.path.exists(program):
        return "no such file"
    if os.path.isdir(program):
        return "is a directory"
    if not os.access(program, os.X_OK):
        return "is not executable"
    return None


def start_failure(surface: str, program: str, status: int, stderr_tail: str) -> TargetStartError:
    """The error for a program that exited at start: its status and the end of its stderr."""
    tail = " ".join(stderr_tail.split())[-500:]
    return TargetStartError(f"--target-cmd {surface}: {program!r} exited at start with status "
                            f"{status}" + (f"; its stderr ends: {tail}" if tail else
                                           " and wrote nothing on stderr"))


class CommandSurface:
    """One ``--target-cmd`` command: ``version`` is the vLLM release the suite checks (None:
    the spec's reference release), filled into ``{version}`` whenever the program starts.
    A program that cannot be started (not found, not executable) is a :class:`TargetError`
    when the command is read, before any check runs."""

    #: The surface the command serves (``--target-cmd SURFACE=...``).
    surface = ""

    def __init__(self, command: str, version: str | None = None) -> None:
        self.command = command
        self.version = version or REFERENCE_VLLM_VERSION
        self.placeholders = placeholders(command)
        words = shlex.split(command)
        program = words[0] if words else ""
        if program and "{" not in program:
            problem = program_problem(program)
            if problem is not None:
                raise TargetError(f"--target-cmd {self.surface}: cannot start {program!r}: "
                                  f"{problem}")

    def argv(self, **values: Any) -> list[str]:
        """The program's argv: ``values`` and ``{version}`` filled into the command."""
        return _argv(self.command, version=self.version, **values)


class CommandFailed(ValueError):
    """The program refused the input (``"kind": "error"``); ``clause`` is the clause it
    names, if any. A ``ValueError``: the contract's rejection."""

    def __init__(self, message: str, clause: str | None = None) -> None:
        super().__init__(message)
        self.clause = clause


# --- processes ---------------------------------------------------------------------------


class ProcessPeer:
    """A started program: SIGTERM then SIGKILL on :meth:`stop`."""

    def __init__(self, argv: list[str], *, stdin: Any = subprocess.DEVNULL,
                 stdout: Any = subprocess.DEVNULL, surface: str = "") -> None:
        self.surface = surface
        self.program = argv[0]
        self.log = tempfile.NamedTemporaryFile(prefix="ewc-target-", suffix=".log",  # noqa: SIM115
                                               delete=False)
        try:
            self.popen = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=self.log,
                                          start_new_session=True)
        except OSError as exc:
            self.log.close()
            os.unlink(self.log.name)
            failure = TargetStartError(f"--target-cmd {surface}: cannot start {argv[0]!r}: "
                                       f"{exc.strerror or exc}")
            note_start_failure(failure)
            raise failure from exc

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_failure(self) -> TargetStartError | None:
        """The start failure to report if the program has exited (its status and the end of
        its stderr), else None. The caller decides that the exit came at start."""
        status = self.popen.poll()
        if status is None:
            return None
        return start_failure(self.surface, self.program, status, self.log_tail(800))

    def stop(self, timeout: float = 5.0) -> None:
        if self.popen.stdin is not None and self.alive():
            # A line-protocol program ends when its stdin does: let it clean up first.
            try:
                self.popen.stdin.close()
                self.popen.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    # Closing flushes what a failed write left in stdin's buffer, into a pipe
                    # nobody reads any more: BrokenPipeError, and the stream is closed anyway.
                    pass
        self.log.close()
        try:
            os.unlink(self.log.name)
        except FileNotFoundError:
            pass

    def log_tail(self, limit: int = 2000) -> str:
        try:
            with open(self.log.name, "rb") as handle:
                return handle.read()[-limit:].decode("utf-8", "replace")
        except OSError:
            return ""


class LineRpc:
    """JSON-lines requests and answers over a program's stdin/stdout, matched by ``seq``."""

    def __init__(self, argv: list[str], surface: str = "") -> None:
        self.peer = ProcessPeer(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                surface=surface)
        self._seq = itertools.count(1)
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        #: Whether the program has answered a request: one that exits before its first
        #: answer failed to start (a :class:`TargetStartError`, not a verdict on a check).
        self.answered = False
        self._reader = threading.Thread(target=self._read, daemon=True, name="target stdout")
        self._reader.start()

    def _read(self) -> None:
        stdout = self.peer.popen.stdout
        assert stdout is not None
        for raw in stdout:
            try:
                answer = json.loads(raw)
                future = self._pending.pop(int(answer["seq"]))
            except (ValueError, KeyError, TypeError):
                continue
            self.answered = True
            future.set_result(answer)
        failure = None if self.answered else self._start_failure()
        with self._lock:
            for future in self._pending.values():
                future.set_exception(failure or ConnectionError(
                    "the target program exited: " + self.peer.log_tail(500)))
            self._pending.clear()

    def _start_failure(self) -> TargetStartError | None:
        """The program closed its stdout before its first answer: if it has exited (waited
        for briefly), the start failure, noted for the running check."""
        try:
            self.peer.popen.wait(5.0)
        except subprocess.TimeoutExpired:
            return None
        failure = self.peer.exit_failure()
        if failure is not None:
            note_start_failure(failure)
        return failure

    def call(self, op: str, rpc_timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        """Send ``{"op": op, **fields}`` and wait ``rpc_timeout`` s for its answer."""
        seq = next(self._seq)
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if not self.peer.alive():
                failure = None if self.answered else self._start_failure()
                if failure is not None:
                    raise failure
                raise ConnectionError("the target program is not running: "
                                      + self.peer.log_tail(500))
            self._pending[seq] = future
        line = json.dumps({"seq": seq, "op": op, **fields}) + "\n"
        stdin = self.peer.popen.stdin
        assert stdin is not None
        try:
            stdin.write(line.encode())
            stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            self._pending.pop(seq, None)
            # A program that exited before its first answer failed to start.
            failure = None if self.answered else self._start_failure()
            if failure is not None:
                raise failure from exc
            raise ConnectionError(f"the target program closed its stdin: {exc}") from exc
        try:
            answer = future.result(rpc_timeout)
        except TimeoutError:
            self._pending.pop(seq, None)
            raise TimeoutError(f"the target program did not answer {op!r} within "
                               f"{rpc_timeout:g} s") from None
        if answer.get("ok"):
            return answer
        kind = answer.get("kind")
        message = str(answer.get("error", "failed"))
        if kind == "timeout":
            raise TimeoutError(message)
        if kind == "dead":
            raise ConnectionError(message)
        if kind == "unsupported":
            raise Unsupported(f"{op} {fields.get('kind', '')}".strip()
                              + f": the program answered unsupported: {message}")
        raise CommandFailed(message, answer.get("clause"))

    def close(self) -> None:
        self.peer.stop()


# --- surfaces ----------------------------------------------------------------------------


class CommandEngine(CommandSurface):
    """An engine program started per engine (module doc)."""

    surface = "engine"

    def start_engine(self, launch: Any) -> ProcessPeer:
        direct = launch.handshake_address is None
        needed = DIRECT_PLACEHOLDERS if direct else HANDSHAKE_PLACEHOLDERS
        missing = [f"{{{name}}}" for name in needed if name not in self.placeholders]
        if missing:
            if direct:
                why = (f"vLLM {self.version} has no HELLO/READY handshake: the suite gives its "
                       "engine the input and output addresses ({engine_input}, "
                       "{engine_output})")
            else:
                why = (f"vLLM {self.version}'s engine connects to the front end's handshake "
                       "address ({handshake}; at 0.9.0 the input ROUTER, on which the "
                       "handshake runs)")
            raise Unsupported(f"the engine command has no {' or '.join(missing)} placeholder: "
                              f"{why}")
        if direct and (len(launch.input_addresses), len(launch.output_addresses)) != (1, 1):
            raise Unsupported(
                "an engine command takes one {engine_input} and one {engine_output}; the "
                f"launch gives {len(launch.input_addresses)} input and "
                f"{len(launch.output_addresses)} output addresses")
        return ProcessPeer(self.argv(
            handshake=launch.handshake_address or "",
            engine_input=launch.input_addresses[0] if direct else "",
            engine_output=launch.output_addresses[0] if direct else "",
            rank=launch.engine_index, dp_size=launch.dp_size,
            local=launch.local, remote=not launch.local, headless=launch.headless,
            init_timeout=launch.init_timeout,
        ), surface=self.surface)


class _CommandFrontendClient:
    def __init__(self, rpc: LineRpc) -> None:
        self.rpc = rpc

    def wait_ready(self, timeout: float) -> None:
        self.rpc.call("wait_ready", timeout + 5, timeout=timeout)

    def add_request(self, request: dict[str, Any], engine_index: int = 0) -> None:
        from enginewire.conformance.oracle.golden import to_json

        self.rpc.call("add", engine=engine_index, request=to_json(request))

    def abort(self, request_ids: list[str], engine_index: int = 0) -> None:
        self.rpc.call("abort", engine=engine_index, request_ids=list(request_ids))

    def call_utility(self, method: str, args: list[Any], engine_index: int = 0,
                     timeout: float = 5.0) -> Any:
        from enginewire.conformance.oracle.golden import from_json, to_json

        answer = self.rpc.call("utility", timeout + 5, engine=engine_index, method=method,
                               args=to_json(list(args)), timeout=timeout)
        return from_json(answer.get("result"))

    def next_outputs(self, timeout: float) -> Any:
        from enginewire.conformance.oracle.golden import from_json

        return from_json(self.rpc.call("outputs", timeout + 5, timeout=timeout)["outputs"])

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self.rpc.call("stop", timeout)
        except (TimeoutError, ConnectionError, CommandFailed):
            pass
        self.rpc.close()

    def alive(self) -> bool:
        return self.rpc.peer.alive()


class CommandFrontend(CommandSurface):
    """A front-end program started per front end (module doc)."""

    surface = "frontend"

    def start_frontend(self, launch: Any) -> _CommandFrontendClient:
        return _CommandFrontendClient(LineRpc(self.argv(
            handshake=launch.handshake_address, input=launch.input_address,
            output=launch.output_address, engines=launch.engine_count,
        ), self.surface))


#: Seconds a codec program has to answer ``hello``.
HELLO_TIMEOUT_S = 30.0


def codec_declaration(rpc: LineRpc) -> dict[str, Any]:
    """The program's answer to ``hello``: ``{"role": ROLE, "unsupported": [...]}`` (role
    ``both`` and nothing unsupported when it declares nothing). A role outside
    :data:`CODEC_ROLES` or a malformed list is a :class:`TargetError`."""
    try:
        answer = rpc.call("hello", HELLO_TIMEOUT_S)
    except (Unsupported, CommandFailed):
        return {"role": "both", "unsupported": []}
    role = answer.get("role", "both")
    if role not in CODEC_ROLES:
        raise TargetError(f"the codec program's hello declares role {role!r}; expected one of "
                          f"{', '.join(CODEC_ROLES)}")
    unsupported = answer.get("unsupported", [])
    capabilities = {name for name in CAPABILITIES if name.startswith("codec.")}
    if not isinstance(unsupported, list) or not all(
            isinstance(item, str) and (item in capabilities or (
                item.partition(":")[0] in ("encode", "decode") and item.partition(":")[2]))
            for item in unsupported):
        raise TargetError("the codec program's hello declares unsupported "
                          f"{unsupported!r}; expected a list of 'encode:KIND' / 'decode:KIND' "
                          f"or codec capabilities ({', '.join(sorted(capabilities))})")
    return {"role": role, "unsupported": list(unsupported)}


class CommandCodec(CommandSurface):
    """A codec program, started once and shared by its threshold variants (module doc)."""

    surface = "codec"

    def __init__(self, command: str, rpc: LineRpc | None = None,
                 threshold: int | None = None,
                 declaration: dict[str, Any] | None = None, *,
                 version: str | None = None) -> None:
        super().__init__(command, version)
        self._rpc = rpc
        self.threshold = threshold
        self._declaration = declaration

    @property
    def rpc(self) -> LineRpc:
        if self._rpc is None:
            self._rpc = LineRpc(self.argv(), self.surface)
        return self._rpc

    @property
    def declaration(self) -> dict[str, Any]:
        """What the program declares in its ``hello`` answer (asked once)."""
        if self._declaration is None:
            self._declaration = codec_declaration(self.rpc)
        return self._declaration

    @property
    def role(self) -> str:
        """The codec role the program declares (``contract`` "Roles")."""
        return str(self.declaration["role"])

    @property
    def unsupported(self) -> frozenset[str]:
        """The operations the program declares unsupported."""
        return frozenset(self.declaration["unsupported"])

    def with_threshold(self, threshold: int) -> CommandCodec:
        return CommandCodec(self.command, self.rpc, threshold, self.declaration,
                            version=self.version)

    def encode(self, kind: str, value: Any) -> list[bytes]:
        from enginewire.conformance.oracle.golden import to_json

        try:
            tagged = to_json(value)
            json.dumps(tagged)
        except Exception as exc:  # noqa: BLE001 - the value has no tagged-JSON form
            # The suite cannot hand this value to the program at all: refusing it here would
            # be the suite's rejection, not the program's.
            raise Unsupported(f"encode {kind}: the tagged JSON cannot carry the value "
                              f"({type(exc).__name__}: {exc})") from exc
        answer = self.rpc.call("encode", kind=kind, value=tagged, threshold=self.threshold)
        return [bytes.fromhex(f) for f in answer["frames"]]

    def decode(self, kind: str, frames: Sequence[Any]) -> Any:
        from enginewire.conformance.oracle.golden import from_json

        answer = self.rpc.call("decode", kind=kind, frames=[bytes(f).hex() for f in frames],
                               threshold=self.threshold)
        return from_json(answer["value"])

    def close(self) -> None:
        if self._rpc is not None:
            self._rpc.close()


class _CommandRingEnd:
    def __init__(self, rpc: LineRpc, end_id: int, handle: RingHandle | None = None) -> None:
        self.rpc = rpc
        self.id = end_id
        if handle is not None:
            self.handle = handle

    def wait_until_ready(self, timeout: float) -> None:
        self.rpc.call("wait_until_ready", timeout + 5, id=self.id, timeout=timeout)

    def enqueue(self, obj: Any, timeout: float | None = None) -> None:
        from enginewire.conformance.peers.ring_peer import pickle_buffers

        self.rpc.call("enqueue", (timeout or 30) + 5, id=self.id, timeout=timeout,
                      buffers=[b.hex() for b in pickle_buffers(obj)])

    def dequeue(self, timeout: float | None = None) -> Any:
        from enginewire.conformance.peers.ring_peer import unpickle_buffers

        answer = self.rpc.call("dequeue", (timeout or 30) + 5, id=self.id, timeout=timeout)
        return unpickle_buffers([bytes.fromhex(b) for b in answer["buffers"]])

    def close(self) -> None:
        try:
            self.rpc.call("close", 10, id=self.id)
        except (TimeoutError, ConnectionError, CommandFailed):
            pass


class CommandRing(CommandSurface):
    """A ring program, restarted if it has exited (module doc)."""

    surface = "ring"

    def __init__(self, command: str, version: str | None = None) -> None:
        super().__init__(command, version)
        self._rpc: LineRpc | None = None

    @property
    def rpc(self) -> LineRpc:
        if self._rpc is None or not self._rpc.peer.alive():
            self._rpc = LineRpc(self.argv(), self.surface)
        return self._rpc

    def create_writer(self, *, n_reader: int, max_chunk_bytes: int,
                      max_chunks: int) -> _CommandRingEnd:
        answer = self.rpc.call("create_writer", n_reader=n_reader,
                               max_chunk_bytes=max_chunk_bytes, max_chunks=max_chunks)
        return _CommandRingEnd(self.rpc, answer["id"],
                               RingHandle.from_builtins(answer["handle"]))

    def attach_reader(self, handle: RingHandle, rank: int) -> _CommandRingEnd:
        answer = self.rpc.call("attach_reader", handle=handle.to_builtins(), rank=rank)
        return _CommandRingEnd(self.rpc, answer["id"])

    def close(self) -> None:
        if self._rpc is not None:
            self._rpc.close()
