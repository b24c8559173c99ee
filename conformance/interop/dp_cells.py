"""Data-parallel cells: one front end with :data:`DP_SIZE` engine cores
(:func:`run_dp_cell`), and the cells of whole topologies layers above the suite
register (:func:`register_topology_cell`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .common import (
    ADD_PROMPT,
    ADD_TOKENS,
    FINISH_LENGTH,
    STEP_TIMEOUT,
    Cell,
    ExchangeFailure,
    Implementation,
    _addresses,
    _Script,
    classify,
)
from .engine_cells import (
    _neutral,
    _Outputs,
    _release_session,
    _request,
    _start_session,
    _stop_session,
    engine_launch,
)

# --- data-parallel cells ----------------------------------------------------------------------

#: Engines of the data-parallel cells (ranks 0 .. DP_SIZE - 1 behind one front end).
DP_SIZE = 2


def run_dp_cell(frontend_impl: Implementation, engine_impl: Implementation, transport: str,
                timeout: float = STEP_TIMEOUT) -> Cell:
    """Front end ``frontend_impl`` with :data:`DP_SIZE` engine cores of ``engine_impl``
    (engine indices 0 .. DP_SIZE - 1, data_parallel_size DP_SIZE, no coordinator) over
    ``transport``: the ranks the way vLLM runs a dense model's (independent engines, each
    with its own identity and engine_index). Exchanges: the handshake with every rank, one
    request to each rank (it must finish with the engine's tokens, its outputs naming that
    rank's engine_index), a utility call to each rank, shutdown."""
    cell = Cell("engine-dp", frontend_impl.name, engine_impl.name, transport)
    script = _Script(cell)
    handshake_address, input_address, output_address = _addresses(transport)
    handshake = getattr(frontend_impl.frontend, "handshake", True) is not False
    state: dict[str, Any] = {"engines": []}
    outputs: list[_Outputs] = []

    def start() -> None:
        _start_session(
            frontend_impl, engine_impl, (handshake_address, input_address, output_address),
            [engine_launch(engine_impl, (handshake_address, input_address, output_address),
                           timeout, engine_index=rank, dp_size=DP_SIZE)
             for rank in range(DP_SIZE)],
            state, timeout, started=state["engines"])
        outputs.append(_Outputs(state["client"]))

    def add_each_rank() -> None:
        assert engine_impl.expected_tokens is not None
        client, seen = state["client"], outputs[0]
        ids = [f"interop-dp-rank{rank}" for rank in range(DP_SIZE)]
        for rank, request_id in enumerate(ids):
            client.add_request(_request(request_id, ADD_PROMPT, ADD_TOKENS), rank)
        deadline = time.monotonic() + timeout
        while not all(i in seen.finish for i in ids):
            if not seen.read(max(deadline - time.monotonic(), 0.0)):
                raise ExchangeFailure(
                    f"requests {sorted(set(ids) - set(seen.finish))} did not finish within "
                    f"{timeout:g} s", "frames.outputs-payload", "engine")
        expected = engine_impl.expected_tokens(ADD_PROMPT, ADD_TOKENS)
        for rank, request_id in enumerate(ids):
            if seen.engine_index.get(request_id) != rank:
                raise ExchangeFailure(
                    f"the request sent to rank {rank} came back with engine_index "
                    f"{seen.engine_index.get(request_id)}", "transport.output-has-no-identity",
                    "engine")
            got = (seen.tokens.get(request_id, []), seen.finish[request_id])
            if got != (expected, FINISH_LENGTH):
                raise ExchangeFailure(
                    f"rank {rank}: expected tokens {expected} and finish_reason length, got "
                    f"tokens {got[0]} and finish_reason {got[1]}", None, "engine")

    def utility_each_rank() -> None:
        for rank in range(DP_SIZE):
            result = _neutral(state["client"].call_utility("get_supported_tasks", [], rank,
                                                           timeout))
            if not isinstance(result, list | tuple) or "generate" not in result:
                raise ExchangeFailure(
                    f"rank {rank}: get_supported_tasks answered {result!r}, expected a list "
                    "with 'generate'", "frames.utility-payload", "engine")

    def shutdown() -> None:
        _stop_session(state.pop("client"), state.pop("engines"),
                      [input_address, output_address], timeout)

    try:
        script.step("handshake" if handshake else "ready-response", start)
        script.step("add-each-rank", add_each_rank)
        script.step("utility-each-rank", utility_each_rank)
        script.step("shutdown", shutdown)
    finally:
        _release_session(state, [handshake_address, input_address, output_address], timeout)
    classify(cell)
    return cell


#: Cells of whole topologies that layers above the suite add (:func:`register_topology_cell`):
#: name -> (the implementations the cell needs, the function that runs it with a timeout).
_TOPOLOGY_CELLS: dict[str, tuple[frozenset[str], Callable[[float], Cell]]] = {}


def register_topology_cell(name: str, needs: Sequence[str],
                           run: Callable[[float], Cell]) -> None:
    """Add a data-parallel cell of a whole topology (vLLM's coordinated one:
    ``enginewire.tap.vllm_dp``, which watches it with the tap, a layer above this one), run
    with the data-parallel cells when every implementation in ``needs`` is paired."""
    _TOPOLOGY_CELLS[name] = (frozenset(needs), run)


def topology_cells() -> dict[str, tuple[frozenset[str], Callable[[float], Cell]]]:
    return dict(_TOPOLOGY_CELLS)
