"""vLLM 0.33.0's real OpenAI-compatible API server (``vllm serve``) on the CPU, in a child
process, with either vLLM's own engine core behind it or an engine it does not launch.

The model directory (:func:`write_serve_model_dir`) holds the tiny Llama ``config.json`` of
:mod:`.engine_core` (no weights) and a tokenizer written on the spot: a word-level
``tokenizer.json`` built with the ``tokenizers`` library, one token ``t<i>`` per id up to the
model's vocabulary size (ids 0-3 are ``<unk> <s> </s> <pad>``), split on whitespace, and a
``tokenizer_config.json`` naming ``PreTrainedTokenizerFast``. vLLM loads it through its
``hf`` tokenizer mode (``vllm/tokenizers/registry.py`` -> ``transformers.AutoTokenizer``),
offline. The prompt ``"t7 t8 t9"`` is the token ids ``[7, 8, 9]``; token id ``i`` decodes
to ``t<i>``.

Two ways the server runs (:class:`ApiServer`):

- ``engine="vllm"``: plain ``vllm serve`` of that directory with the stand-in worker
  (``--worker-cls``, :mod:`.standin`), ``--load-format dummy``: the API server process starts
  vLLM's engine core process through its own ``launch_core_engines``, which starts its worker
  process under vLLM's ``MultiprocExecutor``.
- ``engine="vllm", tp_size=2``: the same with ``--tensor-parallel-size 2``: the engine core's
  ``MultiprocExecutor`` starts two worker processes (ranks 0 and 1) and drives them over its
  shared-memory broadcast ring and one response ring each. Nothing else is needed on the
  CPU: vLLM picks the ``mp`` executor backend for a world size above 1 when Ray is absent
  (``vllm/config/parallel.py:1054-1095``), and the stand-in worker joins no
  ``torch.distributed`` group; ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (set below for every
  server) keeps the platform from asking for a NUMA node per worker.
- ``engine="external"``: ``vllm serve ... --data-parallel-size-local 0`` with a
  ``--data-parallel-address``/``--data-parallel-rpc-port``: vLLM's front end launches no
  engine and binds its handshake ROUTER at ``tcp://ADDRESS:RPC_PORT``
  (``vllm/v1/engine/utils.py:1348``, ``get_engine_client_zmq_addr`` with
  ``handshake_local_only`` false), then waits for one *remote, headless* engine of rank 0
  (``wait_for_engine_startup``: a remote engine must be headless unless in hybrid or external
  load balancing). Whatever engine connects there and does the handshake serves the
  requests: :attr:`ApiServer.engine_handshake_address`.

Start method: vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` while it builds
the configuration (``vllm/platforms/cpu.py:426``), so every vLLM process imports vLLM anew
(about 10 s of CPU each). With ``start_method="fork"`` (the default) the server runs through
:func:`main` of this module, which calls vLLM's own CLI (``vllm.entrypoints.cli.main``) after
wrapping ``CpuPlatform.check_and_update_config`` to set ``fork`` once the platform has set
``spawn``: the start method a GPU run of vLLM uses by default; the platform wants spawn for its
OpenMP kernels, which the stand-in worker never runs (as :class:`.engine_core.VllmEngines`
does). Nothing else changes, but that a forked process does not keep the API server's
listening socket, as no spawned one does (:func:`_release_listener_in_children`;
:meth:`ApiServer.listening_pids` shows it). With ``start_method="spawn"`` the child is exactly
``python -m vllm.entrypoints.cli.main serve ...`` (what the ``vllm`` script runs).

``dev_mode=True`` sets ``VLLM_SERVER_DEV_MODE=1``, vLLM's own setting that adds its
development routes, among them ``POST /collective_rpc`` (:meth:`ApiServer.collective_rpc`):
the API server passes the call to the engine core as the utility ``collective_rpc``, which
runs a method on every worker and returns their answers (``describe_process`` of the
stand-in says which process each worker is).

Clean-up: the server runs in a session (process group) of its own with a private temp
directory (``TMPDIR`` and ``VLLM_RPC_BASE_PATH``: vLLM's ipc socket files go there).
:meth:`ApiServer.stop` sends SIGTERM (vLLM's own shutdown of its engine and workers), then
SIGKILL to the group after :data:`STOP_GRACE_S`; then removes the ``/dev/shm`` segments the
group's processes mapped that no live process maps any more (vLLM's rings leak them when a
process is killed) and the temp directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from enginewire.conformance.targets.vllm.engine_core import (
    MAX_MODEL_LEN,
    STANDIN_WORKER,
    TINY_LLAMA,
    _mapped_segments,
    _shm_names,
    default_cache_root,
    write_model_dir,
)

#: The tokenizer's special tokens, ids 0-3 (the tiny model's bos 1 and eos 2 among them).
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
#: Served model name (``--served-model-name``): what a request's ``model`` field names.
MODEL_NAME = "enginewire-tiny"
#: Seconds :meth:`ApiServer.stop` waits after SIGTERM before it kills the process group.
STOP_GRACE_S = 10.0
ENGINES = ("vllm", "external")
START_METHODS = ("fork", "spawn")


def token(i: int) -> str:
    """The text of token id ``i`` in the tiny tokenizer."""
    return SPECIAL_TOKENS[i] if i < len(SPECIAL_TOKENS) else f"t{i}"


def prompt_text(token_ids: list[int]) -> str:
    """The prompt text that the tiny tokenizer turns into ``token_ids`` (no special ids)."""
    return " ".join(token(i) for i in token_ids)


def write_tokenizer(directory: Path) -> None:
    """Write the tiny word-level tokenizer (``tokenizer.json``, ``tokenizer_config.json``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    size = int(TINY_LLAMA["vocab_size"])  # type: ignore[call-overload]
    vocab = {token(i): i for i in range(size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Tokens joined with a space, none glued to the previous one (no "##" prefix exists).
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKENS[0], "bos_token": SPECIAL_TOKENS[1],
        "eos_token": SPECIAL_TOKENS[2], "pad_token": SPECIAL_TOKENS[3],
        "model_max_length": MAX_MODEL_LEN, "add_bos_token": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1),
                                                     encoding="utf-8")


def write_serve_model_dir(directory: Path) -> Path:
    """The tiny Llama ``config.json`` and the tiny tokenizer in ``directory`` (created)."""
    write_model_dir(directory)
    write_tokenizer(directory)
    return directory


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the server binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def serve_argv(model_dir: Path, port: int, *, engine: str = "vllm",
               rpc_port: int | None = None, host: str = "127.0.0.1",
               tp_size: int = 1) -> list[str]:
    """The ``vllm serve`` arguments (after ``serve``) for the tiny model."""
    argv = [str(model_dir), "--host", host, "--port", str(port),
            "--served-model-name", MODEL_NAME, "--load-format", "dummy", "--dtype", "float32",
            "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
            "--worker-cls", STANDIN_WORKER, "--disable-uvicorn-access-log",
            "--tensor-parallel-size", str(tp_size)]
    if engine == "external":
        if rpc_port is None:
            raise ValueError("an external engine needs the handshake's rpc_port")
        argv += ["--data-parallel-size-local", "0", "--data-parallel-address", host,
                 "--data-parallel-rpc-port", str(rpc_port)]
    return argv


class ServerFailed(RuntimeError):
    """The API server exited, or did not answer in time; the message ends with its log."""


class ApiServer:
    """``vllm serve`` in a child process (see the module doc). Use as a context manager, or
    :meth:`start` / :meth:`stop`; :meth:`stop` is idempotent and runs on every exit."""

    def __init__(self, *, engine: str = "vllm", start_method: str = "fork",
                 host: str = "127.0.0.1", tp_size: int = 1, dev_mode: bool = False) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine: expected one of {ENGINES}, got {engine!r}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method: expected one of {START_METHODS}, "
                             f"got {start_method!r}")
        if tp_size < 1:
            raise ValueError(f"tp_size: expected a positive number of workers, got {tp_size}")
        self.engine = engine
        self.start_method = start_method
        self.tp_size = tp_size
        self.dev_mode = dev_mode
        self.host = host
        self._tmp = tempfile.TemporaryDirectory(prefix="enginewire-vllm-serve-")
        self.root = Path(self._tmp.name)
        # The same path as the engine target's: vLLM's model-information cache is keyed by it.
        self.cache_root = default_cache_root()
        self.model_dir = write_serve_model_dir(Path(self.cache_root) / "tiny-llama")
        self.port = free_port(host)
        self.rpc_port = free_port(host) if engine == "external" else None
        self.log_path = self.root / "server.log"
        #: The log as it was when :meth:`stop` removed the temporary directory.
        self._final_log: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._segments: set[str] = set()
        self._watching = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def engine_handshake_address(self) -> str:
        """Where an external engine connects for the handshake (``engine="external"``)."""
        if self.rpc_port is None:
            raise ValueError("the server launches its own engine: no handshake address")
        return f"tcp://{self.host}:{self.rpc_port}"

    def argv(self) -> list[str]:
        module = (__name__ if self.start_method == "fork" else "vllm.entrypoints.cli.main")
        return [sys.executable, "-m", module, "serve",
                *serve_argv(self.model_dir, self.port, engine=self.engine,
                            rpc_port=self.rpc_port, host=self.host, tp_size=self.tp_size)]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CACHE_ROOT": self.cache_root, "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "TMPDIR": str(self.root), "VLLM_RPC_BASE_PATH": str(self.root),
        })
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return env

    def start(self) -> ApiServer:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.environment(), start_new_session=True)
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name="vllm serve segments")
        self._watcher.start()
        return self

    def processes(self) -> list[tuple[int, int]]:
        """The live processes of the server's process group (it and every process it
        started): ``(pid, parent pid)`` pairs."""
        if self.process is None:
            return []
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            # The command name (field 2) may hold spaces: split after the last ')'.
            fields = text[text.rindex(")") + 2:].split()
            if fields[0] not in ("Z", "X") and int(fields[2]) == self.process.pid:
                found.append((int(stat.parent.name), int(fields[1])))
        return found

    def listening_pids(self) -> list[int]:
        """The processes holding a listening TCP socket on the server's port: the API server
        alone when no other process inherited it (psutil names one process per socket, so
        an inherited socket may show as the child's alone)."""
        import psutil

        return sorted({connection.pid for connection in psutil.net_connections(kind="tcp")
                       if connection.status == psutil.CONN_LISTEN and connection.laddr
                       and connection.laddr.port == self.port and connection.pid is not None})

    def _group(self) -> list[int]:
        return [pid for pid, _ in self.processes()]

    def _watch(self) -> None:
        while not self._watching.wait(0.5):
            self._segments |= _shm_names(self._group())

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log; after :meth:`stop`, the log as it was then."""
        if self._final_log is not None:
            return self._final_log[-chars:]
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _fail(self, message: str) -> ServerFailed:
        return ServerFailed(f"{message}; server log (tail):\n{self.log_tail()}")

    def wait_ready(self, timeout: float) -> float:
        """Wait until ``GET /health`` answers 200; returns the seconds it took. Raises
        :class:`ServerFailed` when the server exits first or ``timeout`` runs out."""
        assert self.process is not None, "start() first"
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                raise self._fail(f"vllm serve exited with status {self.process.returncode} "
                                 "before it was ready")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return time.monotonic() - start
            time.sleep(0.5)
        raise self._fail(f"vllm serve not ready within {timeout:g} s")

    def post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """POST ``body`` as JSON to ``path``; the decoded JSON answer. An HTTP error status
        raises :class:`ServerFailed` with the answer's body."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                data: dict[str, Any] = json.loads(answer.read())
                return data
        except urllib.error.HTTPError as error:
            raise self._fail(f"POST {path} answered {error.code}: "
                             f"{error.read().decode(errors='replace')[:2000]}") from error

    def complete(self, prompt: str, max_tokens: int, timeout: float) -> dict[str, Any]:
        """``POST /v1/completions`` (greedy, ``max_tokens``, token ids in the answer)."""
        return self.post("/v1/completions", {
            "model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "return_token_ids": True}, timeout)

    def collective_rpc(self, method: str, timeout: float) -> list[Any]:
        """``POST /collective_rpc`` (``dev_mode`` only): ``method`` run on every worker
        (no arguments); their answers in rank order."""
        if not self.dev_mode:
            raise ValueError("POST /collective_rpc is one of vLLM's development routes: "
                             "start the server with dev_mode=True")
        results: list[Any] = self.post("/collective_rpc",
                                       {"method": method, "timeout": timeout},
                                       timeout)["results"]
        return results

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, then SIGKILL to the whole group after ``grace``; segments and files
        removed. The server's exit status (None if it was never started)."""
        process = self.process
        status = None
        if process is not None:
            self._segments |= _shm_names(self._group())
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(grace)
                except subprocess.TimeoutExpired:
                    pass
            deadline = time.monotonic() + grace
            while self._group() and time.monotonic() < deadline:
                self._segments |= _shm_names(self._group())
                time.sleep(0.1)
            if self._group():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            if process.poll() is None:
                process.kill()
            status = process.wait(grace)
            self._watching.set()
            if self._watcher is not None:
                self._watcher.join(grace)
            deadline = time.monotonic() + grace
            while self._group() and time.monotonic() < deadline:
                time.sleep(0.05)
            in_use = _mapped_segments()
            for name in self._segments - in_use:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"/dev/shm/{name}")
            self._segments.clear()
        if self._final_log is None:
            self._final_log = self.log_tail(chars=1 << 20)
        self._tmp.cleanup()
        return status

    def __enter__(self) -> ApiServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _fork_after_platform() -> None:
    """Make vLLM start its engine and worker processes with fork (see the module doc)."""
    from vllm.platforms.cpu import CpuPlatform

    chosen = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        chosen(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(  # type: ignore[method-assign,assignment]
        check_and_update_config)


def _release_listener_in_children(port: int) -> None:
    """In every process forked from here, put ``/dev/null`` in place of the API server's
    socket bound to ``port`` (its listening socket).

    A forked child inherits that socket (spawn, the CPU platform's own choice, passes no
    descriptors). vLLM's shutdown then finds the child as "the process using the port"
    (``find_process_using_port`` in ``vllm/entrypoints/launchers/launcher.py``) and asks for its
    command line; a worker that has exited but is not yet reaped is a zombie, psutil raises
    ``ZombieProcess``, and the server exits with status 1 after an otherwise clean shutdown
    (vLLM finding 025, docs/vllm-findings/025-shutdown-fails-on-zombie-port-holder.md).
    The socket is found by its descriptor: when the engine core is forked it is bound but not
    yet listening (uvicorn calls ``listen()`` later), and the kernel's connection tables do not
    list it. ``dup2`` rather than ``close``: a socket object in the child still owns the
    descriptor number, which must not be reused by anything its eventual close would hit."""

    def release() -> None:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    continue
                probe = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            with probe:
                if probe.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if probe.type != socket.SOCK_STREAM or probe.getsockname()[1] != port:
                    continue
                try:
                    probe.getpeername()
                    continue  # a connection, not the listener
                except OSError:
                    pass
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)

    os.register_at_fork(after_in_child=release)


def main() -> None:
    """``python -m enginewire.conformance.targets.vllm.api_server serve ...``: vLLM's own CLI
    (``vllm serve ...``) with engine and worker processes forked (see
    :func:`_release_listener_in_children` for the one thing a fork must not inherit)."""
    _fork_after_platform()
    if "--port" in sys.argv:
        _release_listener_in_children(int(sys.argv[sys.argv.index("--port") + 1]))
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
