"""vLLM 0.33.0's data-parallel topology on the CPU (tap/vllm_dp.py): its real
front end (DPLBAsyncMPClient), launcher, DP coordinator and two engine cores, watched by the
tap, and the data-parallel clauses checked on what it saw; and its external load balancing
(one DPAsyncMPClient and one launcher per rank).

One launch per topology (about 5-10 s each once vLLM is imported), shared by the tests of a
module-scoped fixture; slow (CI runs ``pytest -m slow``). The checks are also run on the
recorded traffic with one thing broken each, to show that every one of them can fail."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

pytest.importorskip("vllm")

from enginewire.conformance.interop import Cell, topology_cells  # noqa: E402
from enginewire.tap.vllm_dp import (  # noqa: E402
    DP_CLAUSES,
    DPRun,
    VllmDataParallel,
    check_records,
    run_coordinated_dp_cell,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _run(coordinated: bool, external_lb: bool = False) -> DPRun:
    topology = VllmDataParallel(coordinated=coordinated, external_lb=external_lb)
    try:
        topology.start()
        # Two rounds: each starts a request wave from idle engines (coordinated: the
        # engine that got the first request asks the coordinator, which sends START_DP_WAVE).
        topology.generate(4)
        topology.generate(2, prefix="second")
        topology.utility_each("get_supported_tasks")
        topology.wait_for("stats_publish", "coordinator")
    finally:
        topology.stop()
    return topology.run


@pytest.fixture(scope="module")
def coordinated_cell() -> Iterator[tuple[Cell, DPRun]]:
    """The interop matrix's coordinated cell (enginewire interop), kept for its records."""
    topology = VllmDataParallel(coordinated=True)
    cell = run_coordinated_dp_cell(60.0, topology)
    yield cell, topology.run


@pytest.fixture
def coordinated(coordinated_cell: tuple[Cell, DPRun]) -> DPRun:
    return coordinated_cell[1]


def test_the_interop_cell_of_coordinated_dp_passes(coordinated_cell: tuple[Cell, DPRun]) -> None:
    cell, _ = coordinated_cell
    assert cell.status == "passed", cell.exchanges
    assert [e.name for e in cell.exchanges] == ["launch", "add", "utility", "shutdown",
                                                 "dp-clauses"]


def test_coordinated_dp_runs_vllms_own_processes_and_keeps_every_clause(
        coordinated: DPRun) -> None:
    run = coordinated
    assert set(run.processes) == {"VLLM_DP_Coordinator", "EngineCore_DP0", "EngineCore_DP1"}
    assert len(set(run.processes.values())) == 3
    assert set(run.finished_on.values()) == {0, 1}, run.finished_on
    assert all(len(tokens) == 3 for tokens in run.tokens.values()), run.tokens
    assert [list(u) for u in run.utility] == [["generate"], ["generate"]]
    assert check_records(run.records, 2, coordinated=True) == []
    seen = {(r.channel, r.sender) for r in run.records}
    assert {("coordinator_input", "coordinator"), ("coordinator_output", "engine"),
            ("stats_publish", "coordinator"), ("stats_publish", "frontend")} <= seen
    waves = [r for r in run.records if r.channel == "coordinator_input"
             and r.frames[0] == b"\x02"]
    assert waves, "the coordinator started no request wave"


def test_independent_dp_ranks_with_the_stats_coordinator() -> None:
    """A dense model: vLLM runs its ranks as independent engines and the coordinator only
    gathers load statistics (no START_DP_WAVE)."""
    run = _run(coordinated=False)
    assert set(run.finished_on.values()) == {0, 1}, run.finished_on
    assert check_records(run.records, 2, coordinated=False) == []
    assert not [r for r in run.records if r.channel == "coordinator_input"
                and r.frames[0] == b"\x02"]


@pytest.fixture(scope="module")
def external() -> DPRun:
    """External load balancing, launched once: the tiny Mixtral (vLLM 0.33.0 refuses a dense
    model there), one front end and one launcher per rank."""
    return _run(coordinated=True, external_lb=True)


def test_external_lb_one_front_end_per_rank_keeps_every_clause(external: DPRun) -> None:
    run = external
    assert run.external_lb
    # Rank 0's launcher started the coordinator and its engine, rank 1's its own engine.
    assert set(run.processes) == {"VLLM_DP_Coordinator", "EngineCore_DP0", "EngineCore_DP1"}
    # Each front end manages its own rank's engine only.
    assert run.managed == [[b"\x00\x00"], [b"\x01\x00"]]
    # Request i went through front end i % 2, so to rank i % 2, and came back from it.
    assert run.finished_on == {"dp-0": 0, "dp-1": 1, "dp-2": 0, "dp-3": 1,
                               "second-0": 0, "second-1": 1}, run.finished_on
    assert all(len(tokens) == 3 for tokens in run.tokens.values()), run.tokens
    assert [list(u) for u in run.utility] == [["generate"], ["generate"]]
    assert check_records(run.records, 2, coordinated=True) == []
    waves = [r for r in run.records if r.channel == "coordinator_input"
             and r.frames[0] == b"\x02"]
    assert waves, "the coordinator started no request wave"
    # Both front ends subscribed to the coordinator's statistics: rank 0's was given the
    # address, rank 1's took it from its engine's ready response.
    subscriptions = [r for r in run.records if (r.channel, r.sender, r.frames)
                     == ("stats_publish", "frontend", (b"\x01",))]
    assert len(subscriptions) == 2, subscriptions


def test_external_lb_refuses_a_dense_model() -> None:
    """vLLM 0.33.0 itself refuses external load balancing for a dense model, so the
    topology runs the MoE model only (and says so before launching anything)."""
    from pathlib import Path

    from enginewire.conformance.targets.vllm.engine_core import (
        default_cache_root,
        engine_config,
        write_model_dir,
    )

    # The path the engine target uses: vLLM's model-information cache is keyed by it.
    dense = write_model_dir(Path(default_cache_root()) / "tiny-llama")
    with pytest.raises(ValueError, match="Non-MoE models do not support external data"):
        engine_config(dense, dp_size=2, dp_rank=1)
    with pytest.raises(ValueError, match="dense model"):
        VllmDataParallel(coordinated=False, external_lb=True)


# --- every check fails on broken traffic ------------------------------------------------------


def _replace(records: list[Any], match: Callable[[Any], bool],
             frames: Callable[[Any], tuple[bytes, ...] | None]) -> list[Any]:
    """``records`` with each matching record's frames replaced (None: record dropped)."""
    out = []
    for record in records:
        if match(record):
            new = frames(record)
            if new is None:
                continue
            record = dataclasses.replace(record, frames=new)
        out.append(record)
    return out


def _is(channel: str, sender: str, first: bytes | None = None) -> Callable[[Any], bool]:
    return lambda r: (r.channel, r.sender) == (channel, sender) and (
        first is None or r.frames[0] == first)


def _swap_ready_identities(records: list[Any]) -> list[Any]:
    ids = {(0).to_bytes(2, "little"): (1).to_bytes(2, "little"),
           (1).to_bytes(2, "little"): (5).to_bytes(2, "little")}
    return [dataclasses.replace(r, identity=ids.get(r.identity, r.identity))
            if (r.channel, r.sender) == ("input", "engine") else r for r in records]


def _wrong_engine_index(records: list[Any]) -> list[Any]:
    def change(record: Any) -> tuple[bytes, ...]:
        value = msgspec.msgpack.decode(record.frames[0])
        if not value[1]:  # no request outputs: leave it
            return record.frames
        value[0] = 1 - value[0]
        return (msgspec.msgpack.encode(value), *record.frames[1:])
    return _replace(records, _is("output", "engine"), change)


BROKEN: dict[str, tuple[str, Callable[[list[Any]], list[Any]]]] = {
    "ready responses from the wrong identities":
        ("identity.little-endian-rank", _swap_ready_identities),
    "outputs naming the other engine": ("transport.output-has-no-identity", _wrong_engine_index),
    "no subscription on coordinator_input":
        ("frames.coordinator-subscribe-first",
         lambda rs: _replace(rs, _is("coordinator_input", "engine", b"\x01"), lambda r: None)),
    "a two-frame engine -> coordinator message":
        ("frames.coordinator-outputs-single-frame",
         lambda rs: _replace(rs, _is("coordinator_output", "engine"),
                             lambda r: (*r.frames, b"extra"))),
    "START_DP_WAVE with a one-element payload":
        ("frames.start-dp-wave-payload",
         lambda rs: _replace(rs, _is("coordinator_input", "coordinator", b"\x02"),
                             lambda r: (b"\x02", msgspec.msgpack.encode([1])))),
    "no START_DP_WAVE at all":
        ("frames.start-dp-wave-payload",
         lambda rs: _replace(rs, _is("coordinator_input", "coordinator", b"\x02"),
                             lambda r: None)),
    "START_DP_WAVE from the front end":
        ("frames.start-dp-wave-from-coordinator",
         lambda rs: [*rs, dataclasses.replace(
             next(r for r in rs if r.channel == "input" and r.sender == "frontend"),
             frames=(b"\x02", msgspec.msgpack.encode([1, 0])))]),
    "stats_update counting one engine":
        ("frames.stats-update-payload",
         lambda rs: _replace(rs, _is("stats_publish", "coordinator"),
                             lambda r: (msgspec.msgpack.encode([[[0, 0, 0.0]], 0, False]),))),
    "an outputs message that does not decode":
        ("structs.array.type-checked",
         lambda rs: _replace(rs, _is("output", "engine"),
                             lambda r: (msgspec.msgpack.encode({"nonsense": 1}),))),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_check_fails_on_broken_traffic(coordinated: DPRun, name: str) -> None:
    clause, breaker = BROKEN[name]
    problems = check_records(breaker(list(coordinated.records)), 2, coordinated=True)
    assert clause in {p.clause for p in problems}, (name, problems)


def test_each_check_fails_on_broken_external_lb_traffic(external: DPRun) -> None:
    for name, (clause, breaker) in BROKEN.items():
        problems = check_records(breaker(list(external.records)), 2, coordinated=True)
        assert clause in {p.clause for p in problems}, (name, problems)


def test_every_dp_clause_is_proved_failable_here() -> None:
    assert set(DP_CLAUSES) <= {clause for clause, _ in BROKEN.values()}


def test_the_coordinated_cell_is_registered_with_the_interop_matrix() -> None:
    needs, run = topology_cells()["vllm-coordinated-dp"]
    assert needs == {"vllm"} and run is run_coordinated_dp_cell

