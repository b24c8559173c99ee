"""vLLM's real OpenAI-compatible API server (``vllm serve``) on the CPU with an engine core
behind it: vLLM's own (launched by ``vllm serve``) and the reference engine (a separate
``enginewire serve-engine`` process doing the handshake as a remote, headless engine). A
completion request over HTTP goes through vLLM's real front end and the engine core.

The three server tests are ``slow`` (each starts vLLM's API server: about 20 s on a quiet
2-core machine, 40 s and more under load, most of it importing vLLM); the checks of a
completion answer are not. The third runs ``vllm serve --tensor-parallel-size 2``: the engine
core's executor drives two worker processes.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from enginewire.conformance import interop
from enginewire.conformance.interop import (
    API_PROMPT,
    API_TOKENS,
    ExchangeFailure,
    Implementation,
    check_completion,
    run_api_server_cell,
    standin_tokens,
)
from enginewire.conformance.targets.vllm.api_server import (
    ApiServer,
    prompt_text,
    token,
    write_serve_model_dir,
)
from enginewire.reference.engine import scripted_tokens

pytestmark = pytest.mark.vllm

TIMEOUT = 60.0


def _answer(tokens: list[int], finish: str = "length") -> dict[str, Any]:
    return {"choices": [{"text": " " + " ".join(token(i) for i in tokens),
                         "token_ids": tokens, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(API_PROMPT), "completion_tokens": len(tokens)}}


def test_a_completion_answer_is_checked_token_by_token() -> None:
    expected = standin_tokens(API_PROMPT, API_TOKENS)
    check_completion(_answer(expected), API_PROMPT, expected)
    with pytest.raises(ExchangeFailure, match="expected token ids") as wrong:
        check_completion(_answer(expected[:-1] + [5]), API_PROMPT, expected)
    assert wrong.value.side == "engine"
    with pytest.raises(ExchangeFailure, match="finish_reason stop"):
        check_completion(_answer(expected, "stop"), API_PROMPT, expected)
    text_off = _answer(expected)
    text_off["choices"][0]["text"] = "t1 t2 t3 t4"
    with pytest.raises(ExchangeFailure, match="text"):
        check_completion(text_off, API_PROMPT, expected)
    counted = copy.deepcopy(_answer(expected))
    counted["usage"]["completion_tokens"] = 3
    with pytest.raises(ExchangeFailure, match="usage") as usage:
        check_completion(counted, API_PROMPT, expected)
    assert usage.value.side == "frontend"


def test_the_tiny_tokenizer_round_trips_through_transformers(tmp_path: Any) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(write_serve_model_dir(tmp_path / "m")))
    assert tokenizer(prompt_text(API_PROMPT))["input_ids"] == API_PROMPT
    assert tokenizer.decode([103, 104]).split() == ["t103", "t104"]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)


def test_tensor_parallel_and_dev_mode_reach_vllm_serve() -> None:
    pytest.importorskip("tokenizers")
    with pytest.raises(ValueError, match="tp_size"):
        ApiServer(tp_size=0)
    for tp_size, dev_mode in ((2, True), (1, False)):
        server = ApiServer(tp_size=tp_size, dev_mode=dev_mode)
        try:
            argv = server.argv()
            assert argv[argv.index("--tensor-parallel-size") + 1] == str(tp_size)
            # Without dev_mode the server inherits whatever the caller's environment says.
            want = "1" if dev_mode else os.environ.get("VLLM_SERVER_DEV_MODE")
            assert server.environment().get("VLLM_SERVER_DEV_MODE") == want
            if not dev_mode:
                with pytest.raises(ValueError, match="dev_mode=True"):
                    server.collective_rpc("describe_process", 1.0)
        finally:
            server.stop()


@pytest.mark.slow
def test_completion_through_vllm_serve_and_its_own_engine_core() -> None:
    pytest.importorskip("vllm")
    evidence: dict[str, Any] = {}
    vllm = interop.vllm_implementation()
    try:
        cell = run_api_server_cell(vllm, TIMEOUT, evidence)
    finally:
        vllm.close()
    assert cell.status == "passed", (cell.exchanges, evidence.get("log"))
    assert [e.name for e in cell.exchanges] == ["start", "completion", "shutdown"]
    [choice] = evidence["answer"]["choices"]
    assert choice["token_ids"] == standin_tokens(API_PROMPT, API_TOKENS)
    assert choice["prompt_token_ids"] == API_PROMPT
    # The API server, the one engine core process it started, and the engine's own children
    # (its worker, and multiprocessing's resource tracker): the request crossed the engine
    # core's sockets and the executor's rings between processes.
    processes = dict(evidence["processes"])
    [server] = [pid for pid, parent in processes.items() if parent not in processes]
    [engine] = [pid for pid, parent in processes.items() if parent == server]
    assert [pid for pid, parent in processes.items() if parent == engine], processes
    assert evidence["server_status"] == 0


@pytest.mark.slow
def test_completion_through_vllm_serve_with_tensor_parallel_two() -> None:
    """``vllm serve --tensor-parallel-size 2``: the completion crosses vLLM's front end, its
    engine core and, over the executor's broadcast ring, both worker processes; the workers
    describe themselves through vLLM's own ``POST /collective_rpc`` (its development routes)."""
    pytest.importorskip("vllm")
    from enginewire.conformance.targets.vllm.engine_core import STANDIN_WORKER

    with ApiServer(tp_size=2, dev_mode=True) as server:
        server.wait_ready(interop.API_READY_TIMEOUT)
        answer = server.complete(prompt_text(API_PROMPT), API_TOKENS, TIMEOUT)
        expected = standin_tokens(API_PROMPT, API_TOKENS)
        check_completion(answer, API_PROMPT, expected)
        assert answer["choices"][0]["token_ids"] == expected
        workers = server.collective_rpc("describe_process", TIMEOUT)
        processes = dict(server.processes())
        # No forked process keeps the API server's listening socket: vLLM's shutdown would
        # look one up and fail on it once it is a zombie (api_server._release_listener_in_children).
        listeners = server.listening_pids()
        status = server.stop()
    assert status == 0, server.log_tail()
    assert server.process is not None and listeners == [server.process.pid], listeners
    # The API server, the one engine core process it started, and the engine's children:
    # the two workers (and multiprocessing's resource tracker).
    [root] = [pid for pid, parent in processes.items() if parent not in processes]
    [engine] = [pid for pid, parent in processes.items() if parent == root]
    assert [w["rank"] for w in workers] == [0, 1], workers
    assert {w["worker_class"] for w in workers} == {STANDIN_WORKER}
    pids = {w["pid"] for w in workers}
    assert len(pids) == 2 and pids <= set(processes), (workers, processes)
    assert {processes[pid] for pid in pids} == {engine} == {w["parent_pid"] for w in workers}
    # Both saw every step of the request (the scheduler's outputs reach each worker).
    assert len({w["steps"] for w in workers}) == 1 and workers[0]["steps"] >= API_TOKENS


@pytest.mark.slow
def test_completion_through_vllm_serve_and_the_reference_engine_process() -> None:
    """The reference engine as a process of its own (``enginewire serve-engine --remote
    --headless``), the way an engine sits behind vLLM's front end on another node."""
    pytest.importorskip("vllm")
    from enginewire.conformance.targets.vllm.engine_core import MAX_MODEL_LEN
    from enginewire.reference.engine import EngineOptions, spawn_engine

    class EngineProcesses:
        def __init__(self) -> None:
            self.started: list[Any] = []

        def start_engine(self, launch: Any) -> Any:
            engine = spawn_engine(EngineOptions(
                handshake_address=launch.handshake_address, local=launch.local,
                headless=launch.headless, handshake_timeout=launch.init_timeout,
                max_model_len=MAX_MODEL_LEN))
            self.started.append(engine)
            return engine

    processes = EngineProcesses()
    reference = Implementation("reference", engine=processes,
                               expected_tokens=interop.reference_tokens)
    evidence: dict[str, Any] = {}
    cell = run_api_server_cell(reference, TIMEOUT, evidence)
    assert cell.status == "passed", (cell.exchanges, evidence.get("log"))
    [choice] = evidence["answer"]["choices"]
    assert choice["token_ids"] == scripted_tokens(API_PROMPT, API_TOKENS)
    [engine] = processes.started
    # The engine ran outside the server's process group and stopped cleanly (SIGTERM).
    assert engine.pid not in dict(evidence["processes"])
    assert engine.wait(1.0) == 0
    # vLLM launched no engine of its own: the API server is alone in its group.
    assert len(evidence["processes"]) == 1, evidence["processes"]
