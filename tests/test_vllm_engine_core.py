"""vLLM 0.33.0's real engine core on the CPU (conformance/targets/vllm/engine_core.py), driven by
the suite's front end: a few launches only (each about 1-5 s with fork); the whole engine
surface runs in test_conformance_vllm.py's slow test and in CI."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")

from enginewire.conformance.framework.outcomes import FAILED, PASSED  # noqa: E402
from enginewire.conformance.framework.registry import all_checks, select  # noqa: E402
from enginewire.conformance.framework.runner import run  # noqa: E402
from enginewire.conformance.oracle.samples import minimal_request  # noqa: E402
from enginewire.conformance.peers.zmq_peers import SuiteFrontend, identity_of  # noqa: E402
from enginewire.conformance.targets.contract import EngineLaunch, Target  # noqa: E402
from enginewire.conformance.targets.vllm.engine_core import VllmEngines  # noqa: E402
from enginewire.conformance.targets.vllm.standin import StandInWorker  # noqa: E402
from enginewire.spec import load  # noqa: E402

pytestmark = pytest.mark.vllm

STANDIN = f"{StandInWorker.__module__}.{StandInWorker.__qualname__}"
#: enginewire modules that speak the wire or launch engines: none may run in a worker process.
SUITE_MODULES = ("enginewire.conformance.peers", "enginewire.conformance.targets.vllm.engine_core",
                 "enginewire.conformance.targets.vllm.target", "enginewire.reference")


@pytest.fixture
def front() -> Iterator[SuiteFrontend]:
    with tempfile.TemporaryDirectory(prefix="ewt-") as directory:
        frontend = SuiteFrontend(load(), directory)
        try:
            yield frontend
        finally:
            frontend.close()


def _start(engines: VllmEngines, front: SuiteFrontend,
           timeout: float = 60.0) -> tuple[Any, Any]:
    peer = engines.start_engine(EngineLaunch(handshake_address=front.handshake_address))
    return peer, front.handshake(timeout, expect=identity_of(0))


def _describe(front: SuiteFrontend, identity: bytes) -> list[dict[str, Any]]:
    """Every worker's ``describe_process``, through vLLM's collective_rpc utility (the
    executor's broadcast ring out, each worker's response ring back)."""
    reply = front.call(identity, "collective_rpc", ["describe_process"], 30.0,
                       call_id=77)["utility_output"]
    assert reply["failure_message"] is None, reply
    return reply["result"]["value"]


def _generate(front: SuiteFrontend, identity: bytes, request_id: str, tokens: int) -> list[int]:
    request = minimal_request(request_id)
    request["sampling_params"] = {**request["sampling_params"], "max_tokens": tokens}
    front.add(identity, request)
    seen = front.finish(request_id, 30.0)
    return [t for output in seen for t in output.get("new_token_ids") or []]


@pytest.mark.slow
def test_engine_checks_pass_and_fail_on_the_live_vllm_engine() -> None:
    """Three engine checks, three real engine processes: a served request, a recorded vLLM
    deviation (the input thread dies on an unknown type byte), and a worker crash that vLLM's
    executor turns into ENGINE_CORE_DEAD."""
    engines = VllmEngines()
    target = Target(name="vllm", engine=engines)
    checks = select(all_checks(), patterns=["engine/serve/timestamp-set",
                                            "engine/garbage/unknown-type-byte",
                                            "engine/dead/sentinel-last"])
    try:
        result = run(checks, target, load(), strict=True, timeout_scale=2.0)
    finally:
        engines.close()
    verdicts = {r.check.id: (r.status, r.message) for r in result.results}
    assert verdicts["engine/serve/timestamp-set"][0] == PASSED, verdicts
    assert verdicts["engine/dead/sentinel-last"][0] == PASSED, verdicts
    status, message = verdicts["engine/garbage/unknown-type-byte"]
    assert status == FAILED and message.startswith(
        "the engine stopped serving after type byte 0x09"), verdicts


def test_the_stand_in_is_only_the_model_layer(front: SuiteFrontend) -> None:
    """The engine process is vLLM's, with the executor vLLM picks (MultiprocExecutor); the one
    class of enginewire's in the topology is the worker, in a process of its own that the
    engine started, and it saw the scheduler's steps for a request."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    engines = VllmEngines()
    try:
        peer, handshake = _start(engines, front)
        process = peer.process
        assert process.name == "EngineCore"  # CoreEngineProcManager's process for a DP=1 engine
        assert peer.launched["executor_class"] is MultiprocExecutor
        assert peer.launched["vllm_config"].parallel_config.worker_cls == STANDIN
        assert peer.launched["handshake_address"] == front.handshake_address
        tokens = _generate(front, handshake.identity, "req-layer", 3)
        assert len(tokens) == 3
        (worker,) = _describe(front, handshake.identity)
        assert worker["worker_class"] == STANDIN
        assert worker["parent_pid"] == process.pid != worker["pid"]
        assert worker["steps"] >= 3
    finally:
        engines.close()


def test_tensor_parallel_two_workers_behind_vllms_rings(front: SuiteFrontend) -> None:
    """TP=2: vLLM's MultiprocExecutor starts two WorkerProc processes; every SchedulerOutput
    reaches both over its broadcast ring, and the workers' rings (one each) bring the replies:
    three shared-memory rings in the engine's process tree."""
    engines = VllmEngines(tp_size=2)
    try:
        peer, handshake = _start(engines, front)
        tokens = _generate(front, handshake.identity, "req-tp2", 4)
        assert len(tokens) == 4
        workers = _describe(front, handshake.identity)
        assert sorted(w["rank"] for w in workers) == [0, 1]
        assert len({w["pid"] for w in workers}) == 2
        assert {w["parent_pid"] for w in workers} == {peer.process.pid}
        steps = {w["steps"] for w in workers}
        assert len(steps) == 1 and steps.pop() >= 4, workers
        assert len(peer.segments | _segments(peer)) >= 3
    finally:
        engines.close()


def _segments(peer: Any) -> set[str]:
    from enginewire.conformance.targets.vllm.engine_core import _shm_names

    return _shm_names(peer._tree())


@pytest.mark.slow
def test_spawned_engine_and_worker_hold_no_suite_code(front: SuiteFrontend) -> None:
    """With spawn (the CPU platform's default), the worker process imports only what vLLM's
    worker_cls setting names: the stand-in module, none of the suite's wire code."""
    engines = VllmEngines(start_method="spawn")
    try:
        # Engine and worker each import vLLM and torch afresh: tens of seconds on a busy machine.
        _, handshake = _start(engines, front, timeout=300.0)
        (worker,) = _describe(front, handshake.identity)
        modules = worker["enginewire_modules"]
        assert "enginewire.conformance.targets.vllm.standin" in modules
        assert not [m for m in modules if m.startswith(SUITE_MODULES)], modules
    finally:
        engines.close()


def test_the_model_directory_holds_only_a_config(tmp_path: Path) -> None:
    from enginewire.conformance.targets.vllm.engine_core import write_model_dir

    directory = write_model_dir(tmp_path / "m")
    assert [p.name for p in directory.iterdir()] == ["config.json"]


#: An engine killed (SIGKILL) after its handshake: its process and its worker's rings'
#: segments are left for the suite to remove.
_KILLED_ENGINE = """
import os, signal, sys, tempfile
from enginewire.conformance.peers.zmq_peers import SuiteFrontend, identity_of
from enginewire.conformance.targets.contract import EngineLaunch
from enginewire.conformance.targets.vllm.engine_core import VllmEngines, _shm_names
from enginewire.spec import load

with tempfile.TemporaryDirectory(prefix="ewt-") as directory:
    front = SuiteFrontend(load(), directory)
    engines = VllmEngines()
    try:
        peer = engines.start_engine(EngineLaunch(handshake_address=front.handshake_address))
        front.handshake(120.0, expect=identity_of(0))
        segments = _shm_names(peer._tree())
        print("SEGMENTS", " ".join(sorted(segments)), flush=True)
        os.kill(peer.process.pid, signal.SIGKILL)
    finally:
        engines.close()
        front.close()
"""


@pytest.mark.slow
def test_a_killed_engine_leaves_no_segment_and_no_tracker_warning() -> None:
    """The engine's processes register their rings' segments with the suite's resource tracker,
    and the suite unregisters what it unlinks after a kill: no "leaked shared_memory objects"
    warning, during the run or at exit, and nothing left in /dev/shm (about 20 s: one engine in
    a fresh interpreter)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _KILLED_ENGINE], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("SEGMENTS")]
    segments = line.split()[1:]
    assert any(name.startswith("psm_") for name in segments), line  # vLLM's rings, tracked
    assert "resource_tracker" not in done.stderr, done.stderr[-3000:]
    assert "leaked" not in done.stderr, done.stderr[-3000:]
    left = set(os.listdir("/dev/shm")) & set(segments)
    assert not left, left
