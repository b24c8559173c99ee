"""vLLM 0.33.0's real engine core on the CPU: the ``engine`` surface of the ``vllm`` target.

Each engine is launched by vLLM's own code: ``CoreEngineProcManager``
(``vllm/v1/engine/utils.py:242``), which starts ``EngineCoreProc.run_engine_core`` in a new
process told to handshake with the suite's handshake ROUTER, as the front end's
``launch_core_engines`` does. The engine process then runs vLLM's handshake, input and output
threads, scheduler and executor. On the CPU platform vLLM picks its ``MultiprocExecutor`` even
for one rank (``vllm/platforms/cpu.py:351-358``), so every engine also starts its worker
processes and talks to them over vLLM's shared-memory rings. Only the model layer is stood in:
the worker class (:mod:`enginewire.conformance.targets.vllm.standin`, through vLLM's
``ParallelConfig.worker_cls``).

The model is a local directory holding only a tiny Llama ``config.json`` (no weights, no
tokenizer: ``skip_tokenizer_init``); Hugging Face is kept offline and vLLM's cache private
(:func:`engine_environment`). The configuration is built once per (data-parallel size,
tensor-parallel size) with vLLM's ``EngineArgs.create_engine_config`` and copied for each
launch.

Start method: vLLM starts engine processes with ``VLLM_WORKER_MULTIPROC_METHOD``
(``get_mp_context``, ``vllm/utils/system_utils.py:185``); the CPU platform sets it to
``spawn`` while building the configuration (``vllm/platforms/cpu.py:426``), for its OpenMP
worker. The stand-in worker runs no OpenMP kernels, so :class:`VllmEngines` sets ``fork`` after
building the configuration unless told otherwise (``start_method="spawn"``): an engine is READY
in about 1 s instead of about 6 s (docs/conformance.md, "vLLM's engine core").

What vLLM does not let a launcher choose, and how the adapter maps it:

- ``launch.init_timeout``: vLLM's engine waits ``HANDSHAKE_TIMEOUT_MINS`` (5) minutes for
  init, a module constant with no setting (``vllm/v1/engine/core.py:116``, ``:1420``); a
  forked engine inherits the launch's value there (the constant's value only, the code that
  waits is vLLM's); a spawned engine re-imports the module and keeps 5 minutes.
- Shared memory: vLLM's rings in the engine and its workers create their segments with
  ``multiprocessing.shared_memory`` (names ``psm_...``), which registers them with the
  resource tracker. :meth:`VllmEngines.start_engine` starts this process's tracker before
  launching, so a forked engine and its workers register with it instead of starting a tracker
  of their own (one that would end with the engine's process tree, warning about "leaked
  shared_memory objects" and unlinking them itself); :meth:`VllmEnginePeer.stop` unlinks what a
  process ended without unlinking and unregisters each ``psm_`` name it unlinks, so the
  tracker has nothing to warn about at exit either.
- ``launch.local`` / ``launch.headless``: vLLM's engine says ``local = local_client and no
  client handshake address`` and ``headless = not local_client`` (``core.py:1366-1367``), so a
  remote engine is always headless and a local one never; the adapter passes
  ``local_client=launch.local``.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from enginewire.conformance.targets.contract import EngineLaunch, Unsupported
from enginewire.conformance.targets.vllm.standin import DIE_FILE_ENV

#: The tiny model: a Llama configuration small enough for any machine (no weights are read).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}
MAX_MODEL_LEN = 256
STANDIN_WORKER = "enginewire.conformance.targets.vllm.standin.StandInWorker"
#: Seconds ``stop`` gives the engine to shut down after SIGTERM before vLLM kills it.
STOP_GRACE_S = 5.0

_ENV_LOCK = threading.Lock()


def engine_environment(cache_root: str) -> None:
    """Set what vLLM reads from the environment to run offline on the CPU.

    ``VLLM_TARGET_DEVICE`` is read once, when vLLM first resolves its platform; it only takes
    effect if nothing resolved it before (a front end built with ``DeviceConfig("cpu")`` does
    not)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_CACHE_ROOT", cache_root)
    # The stand-in worker runs no OpenMP kernels: no thread binding (vLLM's default, "auto",
    # wants one NUMA node per worker and refuses two workers on a one-node machine).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # vLLM's usage-statistics reporter would try the network.
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def default_cache_root() -> str:
    """vLLM's cache for these engines: private to enginewire and the user, kept between runs
    (with vLLM's model-information cache warm, building a configuration takes 0.1 s instead of
    the 8 s or more of inspecting the model in a subprocess)."""
    return str(Path(tempfile.gettempdir()) / f"enginewire-vllm-cache-{os.getuid()}")


def write_model_dir(directory: Path) -> Path:
    """Write the tiny Llama ``config.json`` into ``directory`` (created) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA, indent=1), encoding="utf-8")
    return directory


def engine_config(model_dir: Path, *, dp_size: int = 1, tp_size: int = 1,
                  worker_cls: str = STANDIN_WORKER, dp_rank: int | None = None) -> Any:
    """A ``VllmConfig`` for the tiny model through vLLM's ``EngineArgs``. ``dp_rank``: the
    configuration of that rank's front end under external load balancing
    (``data_parallel_external_lb``, one front end per rank)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", dtype="float32",
        max_model_len=MAX_MODEL_LEN, enforce_eager=True, data_parallel_size=dp_size,
        tensor_parallel_size=tp_size, worker_cls=worker_cls, data_parallel_rank=dp_rank,
        data_parallel_external_lb=dp_rank is not None,
    )
    return args.create_engine_config()


#: Modules an engine process imports on its way to READY; imported once before the first
#: fork, so that forked engines and workers do not each import them again.
PRELOAD = (
    "vllm.v1.engine.core",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.structured_output",
    "vllm.v1.worker.worker_base",
    "vllm.v1.kv_cache_interface",
)


def _shm_names(pids: list[int]) -> set[str]:
    """The ``/dev/shm`` segments the processes ``pids`` map."""
    found: set[str] = set()
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        found.update(m.group(1) for m in re.finditer(r" /dev/shm/(\S+)", text))
    return found


class VllmEnginePeer:
    """One engine-core process launched by vLLM's ``CoreEngineProcManager``.

    vLLM leaves its rings' shared-memory segments behind when an engine or worker process
    ends without its own clean-up (killed after the shutdown grace, or a worker that
    crashed). A watcher thread notes every segment the engine's process tree maps, and
    :meth:`stop` unlinks those that no live process maps any more."""

    def __init__(self, manager: Any, die_file: Path, launched: dict[str, Any]) -> None:
        self.manager = manager
        self.die_file = die_file
        #: What the process was started with (multiprocessing forgets it once started):
        #: executor_class, vllm_config, handshake_address.
        self.launched = launched
        self.process = manager.processes[0]
        self.segments: set[str] = set()
        self._watching = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name="vllm engine segments")
        self._watcher.start()

    def _tree(self) -> list[int]:
        import psutil

        try:
            root = psutil.Process(self.process.pid)
            return [root.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.Error:
            return []

    def _watch(self) -> None:
        while not self._watching.wait(0.5) and self.process.is_alive():
            self.segments |= _shm_names(self._tree())

    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """vLLM's own shutdown: SIGTERM, then SIGKILL after the grace (its workers exit with
        the engine: vLLM's death pipe); then the segments left behind are removed."""
        self.segments |= _shm_names(self._tree())
        self._watching.set()
        self.manager.shutdown(timeout=max(timeout, 0.5))
        self.process.join(timeout)
        self._watcher.join(timeout)
        self.segments |= _shm_names(self._tree())
        deadline = time.monotonic() + timeout
        while self._tree() and time.monotonic() < deadline:
            time.sleep(0.05)
        in_use = _mapped_segments()
        for name in self.segments - in_use:
            remove_segment(name)
        self.segments.clear()
        try:
            self.die_file.unlink()
        except FileNotFoundError:
            pass


#: The prefix of the names ``multiprocessing.shared_memory`` gives the segments it creates
#: (``shared_memory._SHM_NAME_PREFIX``): vLLM's rings' segments, registered with the tracker.
TRACKED_PREFIX = "psm_"


def remove_segment(name: str) -> None:
    """Unlink ``/dev/shm/NAME``, a segment a process of vLLM's ended without unlinking; a
    ``psm_`` segment is also unregistered from this process's resource tracker (which the
    engine's processes share), which would otherwise unlink it again at exit and warn."""
    from multiprocessing import resource_tracker

    try:
        os.unlink(f"/dev/shm/{name}")
    except FileNotFoundError:
        return
    if name.startswith(TRACKED_PREFIX):
        resource_tracker.unregister(f"/{name}", "shared_memory")


def _mapped_segments() -> set[str]:
    """Every ``/dev/shm`` segment some live process maps."""
    return _shm_names([int(p.name) for p in Path("/proc").glob("[0-9]*")])


class VllmEngines:
    """The ``engine`` surface: vLLM's ``EngineCoreProc`` per launch (see the module doc)."""

    #: The tiny model is dense: vLLM runs its data-parallel ranks as independent engines
    #: (mode ``engine.coordinated-dp`` of
    #: :data:`enginewire.conformance.targets.contract.MODES`).
    coordinated_dp = False

    def __init__(self, start_method: str = "fork", tp_size: int = 1) -> None:
        self.start_method = start_method
        self.tp_size = tp_size
        self._tmp = tempfile.TemporaryDirectory(prefix="enginewire-vllm-engine-")
        self.root = Path(self._tmp.name)
        cache_root = default_cache_root()
        engine_environment(cache_root)
        # A fixed path: vLLM's model-information cache is keyed by it.
        self.model_dir = write_model_dir(Path(cache_root) / "tiny-llama")
        self._configs: dict[int, Any] = {}
        self._peers: list[VllmEnginePeer] = []
        self._count = 0

    def prepare(self) -> None:
        """Build the data-parallel-size-1 configuration and import the engine's modules
        (the runner calls this outside the checks' time limits)."""
        self.config(1)

    def config(self, dp_size: int) -> Any:
        """A fresh copy of the configuration for ``dp_size`` engines (built once)."""
        if dp_size not in self._configs:
            self._configs[dp_size] = engine_config(self.model_dir, dp_size=dp_size,
                                                   tp_size=self.tp_size)
            for module in PRELOAD:
                importlib.import_module(module)
        return copy.deepcopy(self._configs[dp_size])

    def start_engine(self, launch: EngineLaunch) -> VllmEnginePeer:
        from vllm.v1.engine import core
        from vllm.v1.engine.utils import CoreEngineProcManager
        from vllm.v1.executor.abstract import Executor

        if launch.handshake_address is None:
            raise Unsupported("vLLM's engine core is started with a handshake address; a launch "
                              "with input and output addresses given directly is a release "
                              "before 0.9.0")
        config = self.config(launch.dp_size)
        executor_class = Executor.get_class(config)
        # The engine's processes register their segments with this process's tracker (module
        # doc, "Shared memory"); a forked process inherits a tracker only if it runs already.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        self._count += 1
        die_file = self.root / f"die-{self._count}"
        with _ENV_LOCK:
            if self.start_method == "fork":
                # The engine's one bound on the wait for init, a module constant in minutes;
                # a forked engine inherits the value. A float is fine: vLLM only scales it
                # into a poll timeout, which pyzmq truncates to whole milliseconds.
                core.HANDSHAKE_TIMEOUT_MINS = launch.init_timeout / 60  # type: ignore[assignment]
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = self.start_method
            os.environ[DIE_FILE_ENV] = str(die_file)
            manager = CoreEngineProcManager(
                local_engine_count=1, start_index=launch.engine_index, local_start_index=0,
                vllm_config=config, local_client=launch.local,
                handshake_address=launch.handshake_address,
                executor_class=executor_class, log_stats=False,
            )
        peer = VllmEnginePeer(manager, die_file, {
            "executor_class": executor_class,
            "vllm_config": config, "handshake_address": launch.handshake_address})
        self._peers.append(peer)
        return peer

    def die(self, peer: VllmEnginePeer) -> None:
        """Make one of the engine's worker processes exit, as a crashed GPU worker does; vLLM's
        executor notices and fails the engine, which sends ENGINE_CORE_DEAD."""
        peer.die_file.touch()

    def close(self) -> None:
        for peer in self._peers:
            peer.stop(1.0)
        self._peers.clear()
        self._tmp.cleanup()
