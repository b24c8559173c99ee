"""The only stand-in in vLLM's engine topology on the CPU: the worker (vLLM's model layer).

vLLM's engine core never touches a model itself: it calls its executor, and the executor calls
one worker per tensor-parallel rank (``vllm/v1/worker/gpu_worker.py`` on a GPU), which owns the
device, the weights, the KV cache and the model runner. :class:`StandInWorker` takes that
place through vLLM's own setting for it, ``ParallelConfig.worker_cls`` (a qualified name the
executor resolves with ``resolve_obj_by_qualname``, ``vllm/v1/worker/worker_base.py:298``), so
the engine core, the scheduler, the executor (``UniProcExecutor`` or ``MultiprocExecutor`` with
its rings and worker processes) and every socket stay vLLM's own.

What it answers (the calls ``EngineCore._initialize_kv_caches`` and every step make,
``vllm/v1/engine/core.py:251-389``): one full-attention KV cache spec per layer of the model
config, memory for :data:`KV_BLOCKS` blocks, no compilation, the task ``generate``; each step a
``ModelRunnerOutput`` with one scripted token per request whose prompt is fully computed
(token id ``FIRST_TOKEN + number of tokens computed so far``, never the model's end-of-sequence
id), nothing for a request still in chunked prefill.

Nothing on the wire depends on it: the engine core's frames are made from the scheduler's
outputs, which hold only token ids and counts (the stand-in picks the ids, a model would pick
others), and its ring traffic carries the scheduler's ``SchedulerOutput`` in and these
``ModelRunnerOutput``s back, of the same classes a real worker returns.

:data:`DIE_FILE_ENV`: when that environment variable names a file and the file exists, the
worker's process exits at once (exit status 70) at its next call or within 0.1 s, the way a
crashed GPU worker disappears; vLLM's ``MultiprocExecutor`` notices the dead worker process
and fails the engine (capability ``engine.die`` of the ``vllm`` target's multiprocess engines).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: Blocks of KV cache the stand-in reports (``determine_available_memory``).
KV_BLOCKS = 512
BLOCK_SIZE = 16
#: The first scripted token id; ids below it are the tiny model's special tokens.
FIRST_TOKEN = 100
DIE_FILE_ENV = "ENGINEWIRE_VLLM_WORKER_DIE_FILE"
#: Exit status of a worker told to die.
DIE_STATUS = 70


class StandInWorker:
    """vLLM's worker interface (``vllm.v1.worker.worker_base.WorkerBase``) with scripted
    outputs instead of a model. Constructed by vLLM's ``WorkerWrapperBase.init_worker`` with
    ``vllm_config, local_rank, rank, distributed_init_method, is_driver_worker``."""

    def __init__(self, vllm_config: Any, local_rank: int = 0, rank: int = 0,
                 distributed_init_method: str = "", is_driver_worker: bool = False,
                 **_: Any) -> None:
        self.vllm_config = vllm_config
        self.local_rank = local_rank
        self.rank = rank
        self.is_driver_worker = is_driver_worker
        #: request id -> prompt length, for requests the scheduler has given this worker.
        self._prompt_len: dict[str, int] = {}
        self._pending: Any = None
        self._sleeping = False
        #: Scheduler outputs this worker received over the executor (the broadcast ring when
        #: it runs in its own process).
        self.steps = 0
        self._watch_die_file()

    # -- start-up (EngineCore._initialize_kv_caches) ----------------------------------------

    def init_device(self) -> None:
        pass

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        pass

    def _layers(self) -> list[str]:
        count = self.vllm_config.model_config.hf_config.num_hidden_layers
        return [f"model.layers.{i}.self_attn.attn" for i in range(count)]

    def _spec(self) -> Any:
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        model = self.vllm_config.model_config
        return FullAttentionSpec(
            block_size=BLOCK_SIZE,
            num_kv_heads=model.get_num_kv_heads(self.vllm_config.parallel_config),
            head_size=model.get_head_size(), dtype=torch.float32)

    def get_kv_cache_spec(self) -> dict[str, Any]:
        spec = self._spec()
        return {name: spec for name in self._layers()}

    def determine_available_memory(self) -> int:
        return self._spec().page_size_bytes * len(self._layers()) * KV_BLOCKS

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

    # -- steps ------------------------------------------------------------------------------

    def execute_model(self, scheduler_output: Any) -> None:
        self._pending = scheduler_output
        self.steps += 1
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        scheduled, self._pending = self._pending, None
        if scheduled is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        for request_id in scheduled.finished_req_ids:
            self._prompt_len.pop(request_id, None)
        computed: dict[str, int] = {}
        for new in scheduled.scheduled_new_reqs:
            if new.prompt_token_ids is not None:
                length = len(new.prompt_token_ids)
            else:
                length = int(new.prompt_embeds.shape[0])
            self._prompt_len[new.req_id] = length
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduled.scheduled_cached_reqs
        for request_id, done in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            computed[request_id] = done
        req_ids = list(scheduled.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for request_id in req_ids:
            total = computed.get(request_id, 0) + scheduled.num_scheduled_tokens[request_id]
            prompt = self._prompt_len.get(request_id, 0)
            sampled.append([FIRST_TOKEN + total] if total >= prompt else [])
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def take_draft_token_ids(self) -> None:
        return None

    def execute_dummy_batch(self) -> None:
        pass

    # -- utilities the engine core passes through -------------------------------------------

    def sleep(self, level: int = 1) -> None:
        self._sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._sleeping = False

    def reset_mm_cache(self) -> None:
        pass

    def reset_encoder_cache(self) -> None:
        pass

    def check_health(self) -> None:
        pass

    def list_loras(self) -> set[int]:
        return set()

    def shutdown(self) -> None:
        pass

    def describe_process(self) -> dict[str, Any]:
        """What runs where, for tests through vLLM's ``collective_rpc`` utility: this worker's
        class, rank, process, the steps it saw, and the enginewire modules its process holds."""
        import sys

        return {
            "worker_class": f"{type(self).__module__}.{type(self).__qualname__}",
            "rank": self.rank, "pid": os.getpid(), "parent_pid": os.getppid(),
            "steps": self.steps,
            "enginewire_modules": sorted(m for m in sys.modules if m.startswith("enginewire")),
        }

    # -- failure ----------------------------------------------------------------------------

    def _watch_die_file(self) -> None:
        path = os.environ.get(DIE_FILE_ENV)
        if not path:
            return

        def watch() -> None:
            while not os.path.exists(path):
                time.sleep(0.1)
            os._exit(DIE_STATUS)

        threading.Thread(target=watch, daemon=True, name="stand-in worker die watch").start()
