"""vLLM 0.33.0's data-parallel topology on the CPU, launched by vLLM and watched on the wire.

What runs, all of it vLLM's own code: the front end is vLLM's ``DPLBAsyncMPClient`` (the
internal load balancer, ``EngineCoreClient.make_async_mp_client`` for ``data_parallel_size``
> 1); the launcher is vLLM's ``launch_core_engines`` (``vllm/v1/engine/utils.py:1205``), which
starts vLLM's ``DPCoordinator`` process, one engine-core process per DP rank through
``CoreEngineProcManager``, and runs vLLM's handshake with them (``wait_for_engine_startup``);
each engine runs vLLM's ``MultiprocExecutor`` with its worker process. The only stand-in is
the worker class (:mod:`.standin`), as for the single engine (:mod:`.engine_core`).

Coordinated or not: vLLM runs the DP ranks of a dense model as independent engines
(``EngineCoreProc``, ``vllm/v1/engine/core.py:1544-1555``) and starts the coordinator for them
only to gather load statistics (``VllmConfig.needs_dp_coordinator``, internal load balancing);
the ranks of a mixture-of-experts model run ``DPEngineCoreProc``, joined by a
``torch.distributed`` group (gloo on the CPU) for the all-reduce that ends a request wave, and
the coordinator also runs the waves (``START_DP_WAVE``). :data:`TINY_MIXTRAL` is the tiny
configuration that makes vLLM's ``ModelConfig.is_moe`` true (``get_num_experts() > 0``); the
stand-in worker answers the MoE ranks' idle steps (``execute_dummy_batch``) as it does any
step.

External load balancing (``external_lb=True``, ``data_parallel_external_lb``): one front end
per rank, each vLLM's ``DPAsyncMPClient`` managing only its own rank's engine, and one
``launch_core_engines`` per rank with that rank's configuration (``data_parallel_rank`` set),
as ``vllm serve --data-parallel-rank R`` runs on each node. vLLM 0.33.0 allows it only for a
mixture-of-experts model (``EngineArgs.create_engine_config`` refuses a dense one:
``vllm/engine/arg_utils.py:2456-2465``), so it runs the tiny Mixtral, and the coordinator runs
(rank 0's launcher starts it: ``VllmConfig.needs_dp_coordinator`` is true for a MoE model).
Rank 0's launcher binds its handshake ROUTER on tcp (the ranks' launchers share
``data_parallel_rpc_port``, a free port) and does the handshake with every rank's engine
(``launch_core_engines``, ``utils.py:1319-1336``); rank ``r > 0``'s launcher binds an ipc
handshake and does it with its own engine only, which therefore does two handshakes
(``EngineCoreProc._perform_handshakes``, ``core.py:1318-1345``): the coordinator's addresses
from rank 0's init, its front end's input and output from its own launcher's. The launchers'
handshakes run at once, one thread each (rank 0's waits for rank 1's engine, which waits for
its own launcher too).

Watching: :class:`.proxy.Tap` stands on every channel the engines and the
coordinator use. The front end binds its input and output sockets at the addresses it is
given (``client_addresses``); the launcher's ``EngineZmqAddresses`` (the object the init
message is encoded from, ``utils.py:1542``) is given the tap's addresses in their place, and
the coordinator's two engine-facing addresses are replaced by the tap's after the
coordinator bound them (between ``launch_core_engines``' start of the processes and its
handshake, which sends the init); so is its stats publisher's, which the init carries too
(the engines echo it in their ready responses) and the front end is given. The tap forwards
every frame unchanged; nothing in vLLM is patched. The handshake channel itself is not
watched (vLLM's launcher and engines speak it; the engine surface's checks cover it).

:func:`check_records` then checks the data-parallel clauses on what the tap saw
(:data:`DP_CLAUSES`); :func:`run_coordinated_dp_cell` is the topology's cell of
``enginewire interop`` (registered with
:func:`enginewire.conformance.interop.register_topology_cell` when this module is imported, as
the command line does). The module lives in the tap's layer
because it watches with the tap; the suite below it never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginewire.conformance.interop import (
    STEP_TIMEOUT,
    Cell,
    ExchangeFailure,
    _Script,
    classify,
    register_topology_cell,
)
from enginewire.conformance.targets.vllm.engine_core import (
    PRELOAD,
    TINY_LLAMA,
    _mapped_segments,
    _shm_names,
    default_cache_root,
    engine_config,
    engine_environment,
    write_model_dir,
)

#: The tiny mixture-of-experts model: the tiny Llama with four experts, two per token.
TINY_MIXTRAL = {**TINY_LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": 4, "num_experts_per_tok": 2}

#: The clauses :func:`check_records` checks, each with what it looks at.
DP_CLAUSES = {
    "identity.little-endian-rank": "the ready response of rank r comes from identity r "
                                   "(2 bytes little-endian) on the input channel",
    "transport.output-has-no-identity": "outputs of rank r say engine_index r",
    "frames.coordinator-subscribe-first": "each engine's first coordinator_input message is "
                                          "the subscription 0x01; the coordinator's READY "
                                          "follows",
    "frames.coordinator-outputs-single-frame": "every engine -> coordinator message is one "
                                               "EngineCoreOutputs frame without request "
                                               "outputs",
    "frames.start-dp-wave-payload": "START_DP_WAVE is [new_wave, exclude_engine_index]",
    "frames.start-dp-wave-from-coordinator": "START_DP_WAVE comes only from the coordinator",
    "frames.stats-update-payload": "stats_update is [counts, current_wave, engines_running], "
                                   "counts one [waiting, running, kv] per engine",
}
#: Besides :data:`DP_CLAUSES`, every message the tap saw must decode with the release's spec
#: (the tap's annotator); a message that does not is reported under the clause the decoder
#: names.


def write_moe_model_dir(directory: Path) -> Path:
    """Write the tiny Mixtral ``config.json`` into ``directory`` (created) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_MIXTRAL, indent=1),
                                           encoding="utf-8")
    return directory


@dataclass
class DPRun:
    """What one run of the topology produced."""

    dp_size: int
    coordinated: bool
    #: Every message the tap forwarded (:class:`enginewire.tap.capture.Record`), in order.
    records: list[Any] = field(default_factory=list)
    #: request id -> engine_index of the outputs that finished it.
    finished_on: dict[str, int] = field(default_factory=dict)
    #: request id -> tokens the front end delivered.
    tokens: dict[str, list[int]] = field(default_factory=dict)
    #: Utility results, one per engine (the front end's call to each rank).
    utility: list[Any] = field(default_factory=list)
    #: Process names and ids vLLM started: the coordinator and the engines.
    processes: dict[str, int] = field(default_factory=dict)
    #: Seconds from the launch to the front end's ready.
    startup_s: float = 0.0
    #: One front end per rank (external load balancing), else one for all ranks.
    external_lb: bool = False
    #: Per front end, the engine identities it manages (its ``core_engines``).
    managed: list[list[bytes]] = field(default_factory=list)


class VllmDataParallel:
    """vLLM's DP topology (see the module doc): :meth:`start`, then requests, then
    :meth:`stop` (also on error; idempotent)."""

    def __init__(self, *, dp_size: int = 2, coordinated: bool = True,
                 start_method: str = "fork", external_lb: bool = False) -> None:
        if external_lb and not coordinated:
            raise ValueError("external load balancing needs coordinated=True: vLLM 0.33.0 "
                             "refuses it for a dense model (vllm/engine/arg_utils.py:2456)")
        self.dp_size = dp_size
        self.external_lb = external_lb
        self.coordinated = coordinated
        self.start_method = start_method
        cache_root = default_cache_root()
        engine_environment(cache_root)
        name = "tiny-mixtral" if coordinated else "tiny-llama"
        writer = write_moe_model_dir if coordinated else write_model_dir
        # A fixed path: vLLM's model-information cache is keyed by it.
        self.model_dir = writer(Path(cache_root) / name)
        self._tmp = tempfile.TemporaryDirectory(prefix="enginewire-vllm-dp-")
        self.run = DPRun(dp_size, coordinated, external_lb=external_lb)
        self._tap: Any = None
        #: The launchers' contexts (``launch_core_engines``) still to exit, their launches,
        #: and the front ends with their event-loop threads (one per rank with external LB).
        self._launch_cms: list[Any] = []
        self._launches: list[Any] = []
        self._clients: list[Any] = []
        self._loops: list[Any] = []
        self._segments: set[str] = set()

    # -- start ----------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Launch the topology and wait until every front end has its ready responses."""
        from concurrent.futures import ThreadPoolExecutor

        from vllm.v1.engine.utils import EngineZmqAddresses, launch_core_engines
        from vllm.v1.executor.abstract import Executor

        from enginewire.conformance.targets.vllm.api_server import free_port
        from enginewire.conformance.targets.vllm.frontend_client import _LoopThread

        from .proxy import Tap, TapConfig

        # One configuration per launcher: each rank's with external load balancing.
        ranks = range(self.dp_size) if self.external_lb else [None]
        configs = [engine_config(self.model_dir, dp_size=self.dp_size, dp_rank=rank)
                   for rank in ranks]
        if self.external_lb:
            port = free_port()
            for config in configs:
                config.parallel_config.data_parallel_rpc_port = port
        if configs[0].model_config.is_moe != self.coordinated:
            raise RuntimeError(f"vLLM says is_moe={configs[0].model_config.is_moe} for "
                               f"{self.model_dir}, expected {self.coordinated}")
        for module in PRELOAD:
            __import__(module)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = self.start_method
        executor_class = Executor.get_class(configs[0])
        fronts = [(f"ipc://{self._tmp.name}/frontend-input-{i}",
                   f"ipc://{self._tmp.name}/frontend-output-{i}") for i in range(len(configs))]
        self._tap = Tap(TapConfig(upstream_inputs=[i for i, _ in fronts],
                                  upstream_outputs=[o for _, o in fronts]),
                        record=self.run.records.append)
        addresses = [EngineZmqAddresses(inputs=[self._tap.input_addresses[i]],
                                        outputs=[self._tap.output_addresses[i]])
                     for i in range(len(configs))]
        started = time.monotonic()
        try:
            for config, address in zip(configs, addresses, strict=True):
                cm = launch_core_engines(copy.deepcopy(config), executor_class, False, address)
                # vLLM's multiprocessing launch (the Ray backend is not installed).
                launch: Any = cm.__enter__()
                self._launch_cms.append(cm)
                self._launches.append(launch)
                if launch.engine_manager is not None:
                    for process in launch.engine_manager.processes:
                        self.run.processes[process.name] = process.pid
            coordinator = self._launches[0].coordinator
            if coordinator is None:
                raise RuntimeError("vLLM's launcher started no DP coordinator")
            self.run.processes["VLLM_DP_Coordinator"] = coordinator.proc.pid
            first = addresses[0]
            for key in ("coordinator_input", "coordinator_output"):
                setattr(first, key, self._tap.add_coordinator(key, getattr(first, key)))
            # The engines echo this address in their ready responses, and the front end
            # checks it against its own (core_client.py:900-903); a front end given none
            # (rank r > 0's with external load balancing) takes it from there.
            stats = first.frontend_stats_publish_address = self._tap.add_coordinator(
                "stats_publish", first.frontend_stats_publish_address)
            self._tap.start()
            built = []
            for i, config in enumerate(configs):
                loop = _LoopThread(f"vllm dp front end {i}")
                self._loops.append(loop)
                given = {"input_address": fronts[i][0], "output_address": fronts[i][1]}
                if i == 0:
                    given["stats_update_address"] = stats
                built.append(loop.submit(
                    functools.partial(self._build, config, executor_class, given)))
            # The handshakes (vLLM's): HELLO, init with the tap's addresses, READY; every
            # launcher's at once (rank 0's waits for the engines of every rank).
            pool = ThreadPoolExecutor(len(self._launch_cms),
                                      thread_name_prefix="vllm dp launcher")
            try:
                exits = [pool.submit(cm.__exit__, None, None, None) for cm in self._launch_cms]
                deadline = time.monotonic() + timeout
                for rank, done in enumerate(exits):
                    try:
                        done.result(max(deadline - time.monotonic(), 0.0))
                    except TimeoutError:
                        raise TimeoutError(f"vLLM's launcher {rank} did not finish its "
                                           f"handshakes within {timeout:g} s") from None
            finally:
                # Not waiting: after a timeout, stop() ends the engines, which ends the
                # handshakes still waiting for them.
                pool.shutdown(wait=False)
            self._launch_cms.clear()
            for i, future in enumerate(built):
                try:
                    self._clients.append(future.result(timeout))
                except TimeoutError:
                    raise TimeoutError(f"vLLM's front end {i} had no ready response from "
                                       f"its engines within {timeout:g} s") from None
        except BaseException:
            self.stop()
            raise
        self.run.managed = [list(client.core_engines) for client in self._clients]
        self.run.startup_s = time.monotonic() - started

    async def _build(self, config: Any, executor_class: Any, given: dict[str, str]) -> Any:
        from vllm.v1.engine.core_client import EngineCoreClient

        return EngineCoreClient.make_async_mp_client(config, executor_class, False,
                                                     client_addresses=given)

    # -- traffic --------------------------------------------------------------------------

    def call(self, func: Callable[[], Any], timeout: float = 30.0, front_end: int = 0) -> Any:
        """Run the coroutine ``func()`` on the loop of front end ``front_end``."""
        return self._loops[front_end].call(func, timeout)

    def generate(self, count: int, max_tokens: int = 3, prompt: Sequence[int] = (5, 6, 7),
                 timeout: float = 30.0, prefix: str = "dp") -> None:
        """Add ``count`` requests through the front end's load balancer (with external load
        balancing: request ``i`` through front end ``i % dp_size``, as an outside balancer
        spreads them) and read outputs until every one finished (recorded in :attr:`run`)."""
        ids = [f"{prefix}-{i}" for i in range(count)]
        fronts = len(self._clients)
        for front_end in range(fronts):
            self._generate(front_end, ids[front_end::fronts], max_tokens, prompt, timeout)

    def _generate(self, front_end: int, ids: list[str], max_tokens: int,
                  prompt: Sequence[int], timeout: float) -> None:
        from vllm import SamplingParams
        from vllm.v1.engine import EngineCoreRequest

        client = self._clients[front_end]

        async def go() -> None:
            for request_id in ids:
                await client.add_request_async(EngineCoreRequest(
                    request_id=request_id, prompt_token_ids=list(prompt), mm_features=None,
                    sampling_params=SamplingParams(max_tokens=max_tokens),
                    pooling_params=None, arrival_time=time.time(), lora_request=None,
                    cache_salt=None, data_parallel_rank=None))
            deadline = time.monotonic() + timeout
            while not set(ids) <= set(self.run.finished_on):
                outputs = await asyncio.wait_for(client.get_output_async(),
                                                 deadline - time.monotonic())
                for output in outputs.outputs:
                    self.run.tokens.setdefault(output.request_id, []).extend(
                        output.new_token_ids)
                    if output.finish_reason is not None:
                        self.run.finished_on[output.request_id] = outputs.engine_index

        self.call(go, timeout + 5.0, front_end)

    def utility_each(self, method: str, timeout: float = 10.0) -> None:
        """Call ``method`` on every engine, rank by rank (vLLM's ``_call_utility_async`` with
        the rank's identity, as its DP clients do), each through a front end managing it."""
        self.run.utility = []
        for front_end, client in enumerate(self._clients):

            async def go(client: Any = client) -> list[Any]:
                return [await asyncio.wait_for(
                    client._call_utility_async(method, engine=engine), timeout)
                    for engine in client.core_engines]

            self.run.utility += self.call(go, timeout * self.dp_size + 5.0, front_end)

    def wait_for(self, channel: str, sender: str, timeout: float = 5.0) -> bool:
        """Wait until the tap saw a message on ``channel`` from ``sender`` (the coordinator
        publishes its statistics on a timer, every 100 ms while they change); False if none
        came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any((r.channel, r.sender) == (channel, sender) for r in list(self.run.records)):
                return True
            time.sleep(0.05)
        return False

    def segments(self) -> set[str]:
        import psutil

        pids = list(self.run.processes.values())
        for pid in list(pids):
            with contextlib.suppress(psutil.Error):
                pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        return _shm_names(pids)

    # -- stop -----------------------------------------------------------------------------

    def stop(self, timeout: float = 10.0) -> None:
        """vLLM's own shutdown (the front end's, then the engines' and the coordinator's),
        then the tap; shared-memory segments a killed process left are removed."""
        with contextlib.suppress(Exception):
            self._segments |= self.segments()
        while self._launch_cms:
            # A handshake failed or never ran: the context manager's exit, told so, closes
            # its handshake socket without waiting.
            cm = self._launch_cms.pop()
            with contextlib.suppress(BaseException):
                cm.__exit__(RuntimeError, RuntimeError("stopped"), None)
        for front_end, client in enumerate(self._clients):

            async def shutdown(client: Any = client) -> None:
                client.shutdown()

            with contextlib.suppress(Exception):
                self.call(shutdown, timeout, front_end)
            with contextlib.suppress(Exception):
                client.resources.ctx.destroy(linger=0)
        self._clients = []
        while self._launches:
            launch = self._launches.pop()
            if launch.engine_manager is not None:
                with contextlib.suppress(Exception):
                    launch.engine_manager.shutdown(timeout=timeout)
            if launch.coordinator is not None:
                with contextlib.suppress(Exception):
                    launch.coordinator.shutdown()
        while self._loops:
            self._loops.pop().close(timeout)
        if self._tap is not None:
            tap, self._tap = self._tap, None
            tap.close(timeout)
        in_use = _mapped_segments()
        for name in self._segments - in_use:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")
        self._tmp.cleanup()

    def __enter__(self) -> VllmDataParallel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the clauses, on what the tap saw ----------------------------------------------------------


@dataclass(frozen=True)
class DPProblem:
    """One clause a run broke: what was expected, what came."""

    clause: str
    message: str


def check_records(records: Sequence[Any], dp_size: int, *, coordinated: bool,
                  release: str = "0.33.0") -> list[DPProblem]:
    """The data-parallel clauses (:data:`DP_CLAUSES`) on a run's tap records: every message
    decoded with ``release``'s spec, the identities and engine indices per rank, the
    coordinator's channels. ``coordinated``: the engines ran request waves (START_DP_WAVE
    expected). An empty list: every clause held."""
    from enginewire.reference.session import get_field
    from enginewire.spec import load

    from .annotate import Annotator

    def spec_types() -> Any:
        return load(release).surface("request_types").types

    annotator = Annotator(release, explain_skew=False)
    problems: list[DPProblem] = []
    # A subscriber's unsubscription (coordinator_unsubscribe, stats_unsubscribe) decodes as
    # its own kind like every other message (frames.unsubscribe-ignored).
    notes = [annotator.annotate(record) for record in records]
    for note in notes:
        for violation in note.violations:
            problems.append(DPProblem(violation.clause, f"{note.record.channel} message from "
                                      f"the {note.record.sender}: {violation.message}"))

    def kind(note: Any, channel: str, sender: str, name: str) -> bool:
        return (note.record.channel, note.record.sender, note.kind) == (channel, sender, name)

    ranks = range(dp_size)
    # identity.little-endian-rank: one ready response per rank, from that rank's identity.
    ready_ids = [n.record.identity or b"" for n in notes if kind(n, "input", "engine",
                                                                 "ready_response")]
    want = [r.to_bytes(2, "little") for r in ranks]
    if sorted(ready_ids) != want:
        problems.append(DPProblem("identity.little-endian-rank", "ready responses from "
                                  f"identities {[i.hex() for i in ready_ids]}, expected "
                                  f"{[i.hex() for i in want]}"))
    for note in notes:
        if kind(note, "input", "engine", "ready_response") and note.record.identity in want:
            rank = int.from_bytes(note.record.identity, "little")
            got = get_field(note.value, "data_parallel_rank")
            if coordinated and got != rank:
                problems.append(DPProblem("identity.little-endian-rank",
                                          f"the ready response from identity "
                                          f"{note.record.identity.hex()} says "
                                          f"data_parallel_rank {got}"))
    # transport.output-has-no-identity: each request's outputs carry the engine_index of the
    # identity the front end routed it to.
    routed: dict[str, int] = {}
    for note in notes:
        if kind(note, "input", "frontend", "add") and note.record.identity is not None:
            for request_id in note.request_ids:
                routed[request_id] = int.from_bytes(note.record.identity, "little")
    for note in notes:
        if kind(note, "output", "engine", "outputs"):
            index = get_field(note.value, "engine_index")
            for request_id in note.request_ids:
                where = routed.get(request_id)
                if where is not None and where != index:
                    problems.append(DPProblem(
                        "transport.output-has-no-identity",
                        f"request {request_id!r} went to rank {where}, its outputs say "
                        f"engine_index {index}"))
    if not routed or set(routed.values()) != set(ranks):
        problems.append(DPProblem("identity.little-endian-rank",
                                  f"requests reached ranks {sorted(set(routed.values()))}, "
                                  f"expected every rank of {list(ranks)}"))
    # frames.coordinator-subscribe-first
    # (an engine's later unsubscription, coordinator_unsubscribe, is no subscription: the
    # coordinator ignores it, frames.unsubscribe-ignored)
    from_engines = [n for n in notes if n.record.channel == "coordinator_input"
                    and n.record.sender == "engine"
                    and n.kind != "coordinator_unsubscribe"]
    subscribe = [n for n in from_engines if n.kind == "coordinator_subscribe"]
    if len(subscribe) < dp_size or len(subscribe) != len(from_engines):
        problems.append(DPProblem("frames.coordinator-subscribe-first",
                                  f"engines sent {[n.record.frames for n in from_engines]} on "
                                  f"coordinator_input, expected {dp_size} subscriptions "
                                  "(coordinator_subscribe)"))
    first_ready = next((i for i, n in enumerate(notes)
                        if kind(n, "coordinator_input", "coordinator", "coordinator_ready")),
                       None)
    if first_ready is None:
        problems.append(DPProblem("frames.coordinator-subscribe-first",
                                  "the coordinator sent no READY on coordinator_input"))
    elif any(notes.index(n) > first_ready for n in subscribe[:dp_size]):
        problems.append(DPProblem("frames.coordinator-subscribe-first",
                                  "the coordinator's READY came before every engine "
                                  "subscribed"))
    # frames.coordinator-outputs-single-frame
    to_coordinator = [n for n in notes if n.record.channel == "coordinator_output"]
    if not to_coordinator:
        problems.append(DPProblem("frames.coordinator-outputs-single-frame",
                                  "no engine sent the coordinator anything"))
    for note in to_coordinator:
        outputs = get_field(note.value, "outputs") if note.value is not None else None
        utility = get_field(note.value, "utility_output") if note.value is not None else None
        if len(note.record.frames) != 1 or outputs or utility is not None:
            problems.append(DPProblem("frames.coordinator-outputs-single-frame",
                                      f"an engine -> coordinator message of "
                                      f"{len(note.record.frames)} frames, outputs "
                                      f"{outputs!r}, utility output {utility!r}"))
    # frames.start-dp-wave-payload / -from-coordinator
    waves = [n for n in notes if kind(n, "coordinator_input", "coordinator", "start_dp_wave")]
    for note in waves:
        value = note.value
        if not (isinstance(value, list | tuple) and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                and value[1] in ranks):
            problems.append(DPProblem("frames.start-dp-wave-payload",
                                      f"START_DP_WAVE payload {value!r}, expected "
                                      f"[new_wave, exclude_engine_index in 0..{dp_size - 1}]"))
    if coordinated and not waves:
        problems.append(DPProblem("frames.start-dp-wave-payload",
                                  "the coordinator sent no START_DP_WAVE though an idle "
                                  "engine got a request"))
    if not coordinated and waves:
        problems.append(DPProblem("frames.start-dp-wave-from-coordinator",
                                  "START_DP_WAVE in a topology without request waves"))
    wave_byte = bytes([next(t.byte for t in spec_types() if t.message == "start_dp_wave")])
    on_input = [n for n in notes if (n.record.channel, n.record.sender) == ("input", "frontend")
                and n.record.frames[:1] == (wave_byte,)]
    if on_input:
        problems.append(DPProblem("frames.start-dp-wave-from-coordinator",
                                  f"{len(on_input)} START_DP_WAVE on the input channel"))
    # frames.stats-update-payload
    stats = [n for n in notes if kind(n, "stats_publish", "coordinator", "stats_update")]
    if not stats:
        problems.append(DPProblem("frames.stats-update-payload",
                                  "the coordinator published no stats_update"))
    for note in stats:
        value = note.value
        counts = value[0] if isinstance(value, list | tuple) and value else None
        if not (isinstance(value, list | tuple) and len(value) == 3) or (
                counts is not None and (len(counts) != dp_size
                                        or any(len(c) != 3 for c in counts))):
            problems.append(DPProblem("frames.stats-update-payload",
                                      f"stats_update {value!r}, expected [counts (one "
                                      f"[waiting, running, kv] per engine of {dp_size}), "
                                      "current_wave, engines_running]"))
    return problems


# --- the interop matrix's cell ------------------------------------------------------------


def run_coordinated_dp_cell(timeout: float = STEP_TIMEOUT,
                            topology: VllmDataParallel | None = None) -> Cell:
    """vLLM's whole coordinated data-parallel topology
    (:class:`VllmDataParallel`: its DPLB front end,
    launcher, DP coordinator and two MoE engine cores running request waves), with the tap on
    every channel but the handshake. Exchanges: ``launch`` (every rank ready), ``add`` (four
    requests through vLLM's load balancer, served by both ranks), ``utility`` (each rank),
    ``shutdown``, and ``dp-clauses`` (:func:`check_records` on what the tap saw).
    The reference has no DP coordinator side (neither its front end nor its engine speaks the
    coordinator channels), so this cell pairs vLLM with vLLM only. ``topology``: the
    (unstarted) ``VllmDataParallel`` to run, for a caller that looks at its records after."""
    cell = Cell("engine-dp-coordinated", "vllm", "vllm", "ipc")
    script = _Script(cell)
    if topology is None:
        topology = VllmDataParallel(coordinated=True)

    def add() -> None:
        topology.generate(4, timeout=timeout)
        ranks = set(topology.run.finished_on.values())
        if ranks != set(range(topology.dp_size)):
            raise ExchangeFailure(f"vLLM's load balancer served the requests on ranks "
                                  f"{sorted(ranks)}", "identity.little-endian-rank", None)

    def utility() -> None:
        topology.utility_each("get_supported_tasks", timeout)
        if any("generate" not in (r or []) for r in topology.run.utility):
            raise ExchangeFailure(f"get_supported_tasks answered {topology.run.utility}",
                                  "frames.utility-payload", "engine")

    def shutdown() -> None:
        topology.wait_for("stats_publish", "coordinator", timeout)
        topology.stop(timeout)

    def clauses() -> None:
        problems = check_records(topology.run.records, topology.dp_size, coordinated=True)
        if problems:
            raise ExchangeFailure(f"{problems[0].message} (and {len(problems) - 1} more)",
                                  problems[0].clause, None)

    try:
        script.step("launch", lambda: topology.start(timeout * 4))
        script.step("add", add)
        script.step("utility", utility)
        script.step("shutdown", shutdown)
        script.step("dp-clauses", clauses)
    finally:
        topology.stop(timeout)
    classify(cell)
    return cell


register_topology_cell("vllm-coordinated-dp", ("vllm",), run_coordinated_dp_cell)
