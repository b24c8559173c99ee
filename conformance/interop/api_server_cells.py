"""API server cells: vLLM's real ``vllm serve`` with an engine core behind it
(:func:`run_api_server_cell`)."""

from __future__ import annotations

import contextlib
from typing import Any

from .common import (
    STEP_TIMEOUT,
    Cell,
    ExchangeFailure,
    Implementation,
    _Script,
    classify,
)

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
            # Not a documented deviation here although vLLM 0.33.0 has one (finding 025): the
            # harness's fork start keeps the listening socket out of the processes it forks
            # (api_server._release_listener_in_children), so a non-zero status is a failure.
            raise ExchangeFailure(f"vllm serve exited with status {found['server_status']} "
                                  "on SIGTERM, expected 0", "handshake.session.stop-exits-zero",
                                  "frontend")

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
