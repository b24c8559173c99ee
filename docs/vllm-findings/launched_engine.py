"""vLLM's real engine-core process for the engine findings' ``--launched`` mode (vLLM 0.33.0).

Used by the reproductions 004-008 and 019 beside this file: with ``--launched`` each sends its
messages to a live engine core instead of an in-process input thread. Uses only vLLM, pyzmq,
msgspec and the standard library.

The engine is started by vLLM's own process manager (``CoreEngineProcManager``, as vLLM's front
end launches it) with a configuration built by vLLM's ``EngineArgs`` for a tiny Llama
``config.json`` written on the spot (no weights, no tokenizer, offline). It runs vLLM's
handshake, input and output threads, scheduler, KV cache manager and executor
(``MultiprocExecutor``, with a worker process, on the CPU platform). Only the model layer is
stood in: :class:`TinyWorker`, through vLLM's own worker-class setting
(``ParallelConfig.worker_cls``); it returns one scripted token per scheduled request. Raw zmq
sockets play the front end: a handshake ROUTER (HELLO, init, READY), an input ROUTER and an
output PULL. Processes start with fork (about a second to READY; the CPU platform's default,
spawn, re-imports vLLM in each child).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

import msgspec  # noqa: E402
import zmq  # noqa: E402

IDENTITY = (0).to_bytes(2, "little")
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    "tie_word_embeddings": False,
}
#: Seconds the engine gets to start (READY), and a request to show its first output.
START_S = 120.0


class TinyWorker:
    """The model layer: vLLM's worker interface with scripted outputs (token 100 + tokens
    computed so far for each request whose prompt is computed)."""

    def __init__(self, vllm_config: Any, local_rank: int = 0, rank: int = 0,
                 distributed_init_method: str = "", is_driver_worker: bool = False,
                 **_: Any) -> None:
        self.vllm_config = vllm_config
        self.rank = rank
        self._pending: Any = None
        self._prompt: dict[str, int] = {}

    def init_device(self) -> None:
        pass

    def load_model(self, **_: Any) -> None:
        pass

    def _spec(self) -> Any:
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        model = self.vllm_config.model_config
        return FullAttentionSpec(block_size=16,
                                 num_kv_heads=model.get_num_kv_heads(
                                     self.vllm_config.parallel_config),
                                 head_size=model.get_head_size(), dtype=torch.float32)

    def get_kv_cache_spec(self) -> dict[str, Any]:
        layers = self.vllm_config.model_config.hf_config.num_hidden_layers
        return {f"model.layers.{i}.self_attn.attn": self._spec() for i in range(layers)}

    def determine_available_memory(self) -> int:
        return self._spec().page_size_bytes * len(self.get_kv_cache_spec()) * 256

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["NHD"]

    def set_kv_cache_layout(self, *args: Any, **kwargs: Any) -> None:
        pass

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        pass

    def compile_or_warm_up_model(self) -> Any:
        from vllm.v1.worker.worker_base import CompilationTimes

        return CompilationTimes(language_model=0.0, encoder=0.0)

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_simple_cpu_offload_num_cpu_blocks(self) -> None:
        return None

    def get_kv_connector_handshake_metadata(self) -> None:
        return None

    def supports_draft_weight_updates(self) -> bool:
        return False

    def execute_model(self, scheduler_output: Any) -> None:
        self._pending = scheduler_output

    def sample_tokens(self, grammar_output: Any) -> Any:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        scheduled, self._pending = self._pending, None
        if scheduled is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        computed: dict[str, int] = {}
        for new in scheduled.scheduled_new_reqs:
            self._prompt[new.req_id] = len(new.prompt_token_ids or ())
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduled.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        req_ids = list(scheduled.num_scheduled_tokens)
        sampled = []
        for request_id in req_ids:
            total = computed.get(request_id, 0) + scheduled.num_scheduled_tokens[request_id]
            sampled.append([100 + total] if total >= self._prompt.get(request_id, 0) else [])
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def take_draft_token_ids(self) -> None:
        return None

    def execute_dummy_batch(self) -> None:
        pass

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def _segments(pids: set[int]) -> set[str]:
    """The /dev/shm segments the processes ``pids`` map (all processes: ``pids`` empty)."""
    found: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if pids and int(maps.parent.name) not in pids:
            continue
        try:
            found.update(re.findall(r" /dev/shm/(\S+)", maps.read_text()))
        except OSError:
            continue
    return found


def _tree(root: int) -> set[int]:
    """``root`` and its descendants."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree = {root}
    while True:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        if not more:
            return tree
        tree |= more


class LaunchedEngine:
    """One engine core launched by vLLM in ``tmp`` (a directory of the caller's), with raw
    zmq front-end sockets. Use as a context manager; :meth:`close` shuts the engine down the
    way vLLM does (SIGTERM, then SIGKILL after its grace) and removes the ipc files."""

    def __init__(self, tmp: str) -> None:
        self.tmp = Path(tmp)
        self.ctx = zmq.Context()
        self.manager: Any = None
        self.process: Any = None
        #: Shared-memory segments of the engine's rings (with its worker), removed at close
        #: if no process maps them any more (an engine that died does not unlink its own).
        self.segments: set[str] = set()
        self.sockets: dict[str, Any] = {}
        self.addresses = {name: f"ipc://{tmp}/{name}"
                          for name in ("handshake", "input", "output")}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _socket(self, name: str, kind: int) -> Any:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.addresses[name])
        self.sockets[name] = sock
        return sock

    def _config(self) -> Any:
        from vllm.engine.arg_utils import EngineArgs

        model = self.tmp / "tiny-llama"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(TINY_LLAMA))
        os.environ.setdefault("VLLM_CACHE_ROOT", str(self.tmp / "vllm-cache"))
        return EngineArgs(model=str(model), skip_tokenizer_init=True, load_format="dummy",
                          dtype="float32", max_model_len=256, enforce_eager=True,
                          worker_cls=f"{__name__}.TinyWorker").create_engine_config()

    def _start(self) -> None:
        from vllm.v1.engine.utils import CoreEngineProcManager
        from vllm.v1.executor.abstract import Executor

        config = self._config()
        # The CPU platform picks spawn while building the configuration; fork starts the
        # engine and its worker in about a second (the stand-in runs no OpenMP kernels).
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        handshake = self._socket("handshake", zmq.ROUTER)
        inputs = self._socket("input", zmq.ROUTER)
        self._socket("output", zmq.PULL)
        self.manager = CoreEngineProcManager(
            local_engine_count=1, start_index=0, local_start_index=0, vllm_config=config,
            local_client=True, handshake_address=self.addresses["handshake"],
            executor_class=Executor.get_class(config), log_stats=False)
        self.process = self.manager.processes[0]
        hello = self._recv(handshake, "HELLO")
        handshake.send_multipart([hello[0], msgspec.msgpack.encode({
            "addresses": {"inputs": [self.addresses["input"]],
                          "outputs": [self.addresses["output"]]},
            "parallel_config": {}})])
        self._recv(inputs, "the ready response")
        ready = self._recv(handshake, "READY")
        if msgspec.msgpack.decode(ready[1]).get("status") != "READY":
            raise RuntimeError(f"expected READY, got {ready!r}")
        self.segments |= _segments(_tree(self.process.pid))

    def _recv(self, sock: Any, what: str) -> list[bytes]:
        if not sock.poll(int(START_S * 1000)):
            raise RuntimeError(f"the engine sent no {what} within {START_S} s")
        return sock.recv_multipart()

    # -- front end ------------------------------------------------------------------------

    def send(self, frames: list[bytes]) -> None:
        """Send ``[type, payload...]`` to the engine on the input channel."""
        self.sockets["input"].send_multipart([IDENTITY, *frames])

    def add(self, request_id: str, max_tokens: int = 3) -> None:
        """A valid ADD, encoded by vLLM's MsgpackEncoder."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.serial_utils import MsgpackEncoder

        request = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=[7, 8, 9], mm_features=None,
            sampling_params=SamplingParams(max_tokens=max_tokens), pooling_params=None,
            arrival_time=time.time(), lora_request=None, cache_salt=None,
            data_parallel_rank=None)
        self.send([b"\x00", *MsgpackEncoder().encode(request)])

    def outputs(self, timeout: float) -> Any:
        """The next EngineCoreOutputs (decoded by vLLM's MsgpackDecoder), ENGINE_CORE_DEAD,
        or None when nothing came within ``timeout``."""
        from vllm.v1.engine import EngineCoreOutputs
        from vllm.v1.serial_utils import MsgpackDecoder

        pull = self.sockets["output"]
        if not pull.poll(int(timeout * 1000)):
            return None
        frames = pull.recv_multipart()
        if frames == [ENGINE_CORE_DEAD]:
            return ENGINE_CORE_DEAD
        return MsgpackDecoder(EngineCoreOutputs).decode(frames)

    def serves(self, request_id: str, timeout: float) -> bool:
        """Send a valid ADD and wait for an output of it: whether the engine still serves."""
        self.add(request_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.outputs(deadline - time.monotonic())
            if got is None or got == ENGINE_CORE_DEAD:
                return False
            if any(o.request_id == request_id for o in got.outputs):
                return True
        return False

    def close(self) -> None:
        if self.process is not None and self.process.pid is not None:
            self.segments |= _segments(_tree(self.process.pid))
        if self.manager is not None:
            self.manager.shutdown(timeout=5.0)
            self.manager = None
        if self.segments:
            time.sleep(0.5)  # the worker exits after the engine (vLLM's death pipe)
            for name in self.segments - _segments(set()):
                try:
                    os.unlink(f"/dev/shm/{name}")
                except FileNotFoundError:
                    pass
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.ctx.term()
        for address in self.addresses.values():
            try:
                os.unlink(address.removeprefix("ipc://"))
            except FileNotFoundError:
                pass

    def __enter__(self) -> LaunchedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stops_serving(tmp: str, messages: dict[str, list[bytes]], wait_s: float) -> bool:
    """For each message (a fresh engine each): the engine serves a valid request, gets the
    message, then must serve another within ``wait_s``. True when one message stopped it
    (the bug reproduces on the live engine); each verdict is printed."""
    stopped = False
    for number, (name, message) in enumerate(messages.items()):
        with LaunchedEngine(os.path.join(tmp, f"engine-{number}")) as engine:
            if not engine.serves(f"before-{number}", START_S):
                raise RuntimeError("the launched engine did not serve a valid request")
            engine.send(message)
            if engine.serves(f"probe-{number}", wait_s):
                print(f"fixed: after {name}, vLLM's engine core process still serves requests")
                continue
            state = "is still running" if engine.process.is_alive() else \
                f"exited with status {engine.process.exitcode}"
            print(f"BUG: after {name}, vLLM's engine core process (pid {engine.process.pid}, "
                  f"launched by CoreEngineProcManager) served no request within {wait_s} s; "
                  f"it {state}")
            stopped = True
    return stopped
