"""``enginewire bench``: the machinery on a tiny grid, the ratios, the outputs.

Nothing here asserts a timing: figures depend on the machine. The tests check that every
figure is measured, that each ratio is taken against the right comparison, that the JSON has
its keys, that the plots are PNG files, and that nothing is left behind.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.util
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from enginewire.bench import codec_bench, commands, report, rounds
from enginewire.bench.config import KIB, MIB, BenchConfig
from enginewire.bench.results import SCHEMA, Results
from enginewire.bench.stats import paired_ratios, percentile, spread
from enginewire.cli import build_parser

# The fork server that starts the bench's reader processes listens on a socket in
# multiprocessing's temp dir, which multiprocessing removes at interpreter exit. Make that dir
# now, at collection, so it is not inside the session's TMPDIR, which conftest.py removes
# earlier (multiprocessing would then report a missing dir).
multiprocessing.util.get_temp_dir()

#: The smallest run that still goes through every bench and every baseline.
TINY = BenchConfig(
    targets=("reference",), include_vllm=False, rounds=2,
    payloads=(64, MIB), readers=(1,), chunks=(4,), base_readers=1, base_chunks=4,
    chunk_bytes=2 * MIB, cell_seconds=0.02, warmup_seconds=0.005,
    latency_readers=(1,), latency_messages=5, latency_interval=0.001,
    codec_seconds=0.005, transports=("ipc",), round_trips=5, timeout=20.0,
    textbook_bytes=64 * KIB, textbook_seconds=0.005, explorer_max_states=100,
    explorer_previous=False,
)
JSON_KEYS = {"schema", "command", "started_at", "duration_s", "environment", "config",
             "targets", "skipped", "notes", "series", "goals"}
ROW_KEYS = {"bench", "metric", "unit", "better", "case", "label", "contender", "role",
            "samples", "summary", "vs_vllm", "ceiling", "vs_ceiling", "errors",
            "observations"}


def child_processes() -> list[str]:
    """Command lines of this process's children, except multiprocessing's own (the fork
    server and the resource tracker live as long as this process)."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            text = cmdline.decode(errors="replace")
            if "forkserver" in text or "resource_tracker" in text:
                continue
            found.append(f"{pid}: {text}")
    return found


def measured(series: Any) -> list[float | None]:
    """The rounds that measure ``series``: the explorer searches in the first round only."""
    return series.samples[:1] if series.bench == "explorer" else series.samples


def no_failures(results: Results) -> None:
    failed = {s.key: s.errors for s in results.series if any(v is None for v in measured(s))}
    assert not failed, f"failed cells: {failed}"


# --- statistics and ratios ---------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([10, 0, 20], 100) == 20
    assert percentile(list(range(101)), 99) == 99
    with pytest.raises(ValueError):
        percentile([], 50)


def test_spread_ignores_missing_rounds() -> None:
    found = spread([3.0, None, 1.0, 2.0])
    assert (found.median, found.min, found.max) == (2.0, 1.0, 3.0)
    assert spread([None, None]) is None


def test_ratios_are_paired_round_by_round() -> None:
    assert paired_ratios([2.0, 9.0, None, 4.0], [1.0, 3.0, 5.0, 0.0]) == [2.0, 3.0, None, None]


BIG = {"payload_bytes": MIB, "readers": 1, "chunks": 10}


def _synthetic() -> Results:
    results = Results(config=TINY.to_builtins(), environment={}, targets=["reference"])
    ring = {"payload_bytes": 1024, "readers": 2, "chunks": 10}
    rows = [
        ("ring", "messages_per_s", ring, "reference", "target", [300.0, 600.0, 900.0]),
        ("ring", "messages_per_s", ring, "vllm", "vllm", [100.0, 100.0, 150.0]),
        ("ring", "messages_per_s", ring, "zmq_push_pull", "baseline", [50.0, 60.0, 90.0]),
        ("ring", "messages_per_s", ring, "minimal_ring", "ceiling", [1000.0, 1000.0, 1000.0]),
        ("ring", "messages_per_s", {"payload_bytes": 1024, "chunks": 10}, "memcpy", "ceiling",
         [1000.0, 1000.0, 1000.0]),
        # A memcpy of another payload must never be taken as the ceiling of 1 KiB.
        ("ring", "messages_per_s", {"payload_bytes": 64, "chunks": 10}, "memcpy", "ceiling",
         [7.0, 7.0, 7.0]),
        ("codec", "encode_us", {"workload": "engine_step"}, "reference", "target",
         [11.0, 12.0, 13.0]),
        ("codec", "encode_us", {"workload": "engine_step"}, "vllm", "vllm", [10.0, 10.0, 10.0]),
        ("codec", "encode_us", {"workload": "engine_step"}, "msgspec", "ceiling",
         [10.0, 10.0, 10.0]),
        ("peers", "rtt_p50_us", {"transport": "ipc"}, "reference", "target", [300, 200, None]),
        ("peers", "rtt_p50_us", {"transport": "ipc"}, "router_dealer", "ceiling",
         [100, 100, 100]),
        ("peers", "rtt_p50_us", {"transport": "ipc"}, "reference+tap", "baseline",
         [360, 300, 500]),
        ("ring", "gb_per_s", BIG, "reference", "target", [4.0, 5.0, 6.0]),
        ("ring", "gb_per_s", BIG, "reference+borrowed", "target", [8.0, 9.0, 9.0]),
        ("ring", "gb_per_s", {"payload_bytes": MIB, "chunks": 10}, "memcpy", "ceiling",
         [10.0, 10.0, 10.0]),
    ]
    unit = {"messages_per_s": ("msg/s", "higher"), "gb_per_s": ("GB/s", "higher")}
    for bench, metric, case, contender, role, samples in rows:
        series = results.series_for(bench, metric, *unit.get(metric, ("µs", "lower")), case,
                                    contender, role)
        for index, value in enumerate(samples):
            results.record(series, index, value)
    return results


def test_ratios_against_vllm_and_the_matching_ceiling() -> None:
    results = _synthetic()
    case = {"payload_bytes": 1024, "readers": 2, "chunks": 10}
    reference = results.find("ring", "messages_per_s", "reference", case)
    vs_vllm = results.vs_vllm(reference)
    assert (vs_vllm.median, vs_vllm.min, vs_vllm.max) == (6.0, 3.0, 6.0)
    assert results.ceiling_of(reference).case == {"payload_bytes": 1024, "chunks": 10}
    vs_ceiling = results.vs_ceiling(reference)
    assert (vs_ceiling.median, vs_ceiling.min, vs_ceiling.max) == (0.6, 0.3, 0.9)
    zmq = results.find("ring", "messages_per_s", "zmq_push_pull", case)
    assert results.vs_vllm(zmq).median == 0.6
    vllm = results.find("ring", "messages_per_s", "vllm", case)
    assert results.vs_vllm(vllm) is None and results.vs_ceiling(vllm).median == 0.1
    memcpy = results.find("ring", "messages_per_s", "memcpy", {"payload_bytes": 1024,
                                                               "chunks": 10})
    assert results.vs_ceiling(memcpy) is None and results.vs_vllm(memcpy) is None
    codec = results.find("codec", "encode_us", "reference", {"workload": "engine_step"})
    assert results.ceiling_of(codec).contender == "msgspec"
    assert results.vs_ceiling(codec).median == pytest.approx(1.2)
    peers = results.find("peers", "rtt_p50_us", "reference", {"transport": "ipc"})
    assert results.ceiling_of(peers).contender == "router_dealer"
    assert results.vs_ceiling(peers).median == 2.5  # the missing round is left out
    assert results.vs_vllm(peers) is None  # no vLLM figure for this case


def test_goals_are_evaluated_on_the_median_ratio() -> None:
    results = _synthetic()
    verdicts = {goal.name: results.evaluate(goal) for goal in results.goals()}
    ratio, met = verdicts["ring-messages-vs-vllm"]
    assert ratio.median == 6.0 and ratio.min == 3.0 and met is True  # every round >= 3x
    ratio, met = verdicts["ring-messages-vs-minimal"]
    assert ratio.median == pytest.approx(0.6) and met is True
    ratio, met = verdicts["codec-engine_step-encode"]
    assert ratio.median == pytest.approx(1.2) and met is True  # within 1.2x: boundary met
    ratio, met = verdicts["peers-ipc"]
    assert ratio.median == 2.5 and met is False
    # The tap's cost: paired with the reference session of the same round (1.2x, 1.5x).
    ratio, met = verdicts["tap-ipc"]
    assert (ratio.median, ratio.min, ratio.max) == (pytest.approx(1.35), 1.2, 1.5)
    assert met is False
    assert "codec-engine_step-decode" not in verdicts  # not measured: no goal
    # Bandwidth: one goal for copying reads, one for zero-copy reads.
    ratio, met = verdicts["ring-bandwidth-1MiB"]
    assert ratio.median == 0.5 and met is False
    ratio, met = verdicts["ring-bandwidth-1MiB-zero-copy"]
    assert ratio.median == 0.9 and met is True
    # The vLLM goal needs every round: one round at 2x fails it although the median is 6x,
    # and so does a round without a figure (median 4.5x).
    ring = {"payload_bytes": 1024, "readers": 2, "chunks": 10}
    for samples in ([200.0, 600.0, 900.0], [300.0, 600.0, None]):
        results = _synthetic()
        results.find("ring", "messages_per_s", "reference", ring).samples = samples
        goal = next(g for g in results.goals() if g.name == "ring-messages-vs-vllm")
        ratio, met = results.evaluate(goal)
        assert ratio.median >= 3.0 and met is False, samples  # the median alone would pass
    without_reference = Results(config={}, environment={}, targets=["vllm"])
    assert without_reference.goals() == []


def test_json_document_and_tables() -> None:
    results = _synthetic()
    document = results.to_builtins()
    assert set(document) == JSON_KEYS
    assert document["schema"] == SCHEMA
    for row in document["series"]:
        assert set(row) == ROW_KEYS
    rows = {(r["bench"], r["contender"], r["label"]): r for r in document["series"]}
    reference = rows[("ring", "reference", "1 KiB, 2 readers, 10 chunks")]
    assert reference["ceiling"] == "memcpy"
    assert reference["vs_vllm"] == {"median": 6.0, "min": 3.0, "max": 6.0}
    assert reference["summary"] == {"median": 600.0, "min": 300.0, "max": 900.0}
    json.dumps(document)  # serialisable as is
    goal = next(g for g in document["goals"] if g["name"] == "peers-ipc")
    assert goal["met"] is False and goal["against"] == "ceiling" and goal["threshold"] == 1.5
    text = report.render(results)
    assert "| 1 KiB, 2 readers, 10 chunks | reference | 600 | 300-900 | 6x (3-6) | " \
           "0.6x (0.3-0.9) |" in text
    assert "**no**" in text


def test_results_read_back_from_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = _synthetic()
    path = tmp_path / "results.json"
    report.write_json(results, path)
    again = report.read_json(path)
    assert again.to_builtins() == json.loads(path.read_text())
    assert report.render(again) == report.render(results)
    parser = build_parser()
    args = parser.parse_args(["bench", "--from-json", str(path)])
    assert args.handler(args) == 0
    assert "| 1 KiB, 2 readers, 10 chunks | reference | 600 |" in capsys.readouterr().out
    path.write_text('{"schema": "something else"}')
    args = parser.parse_args(["bench", "--from-json", str(path)])
    assert args.handler(args) == 2


# --- configuration and command line -------------------------------------------------------


def test_star_and_product_grids() -> None:
    config = BenchConfig(payloads=(64, KIB), readers=(1, 2, 3), chunks=(4, 10),
                         base_readers=2, base_chunks=10)
    star = config.ring_cases()
    assert star == [(64, 1, 10), (64, 2, 10), (64, 3, 10), (64, 2, 4),
                    (KIB, 1, 10), (KIB, 2, 10), (KIB, 3, 10), (KIB, 2, 4)]
    product = replace(config, grid="product").ring_cases()
    assert len(product) == 12 and set(star) <= set(product)


@pytest.mark.parametrize("overrides", [
    {"rounds": 0}, {"benches": ("ring", "disk")}, {"payloads": (8,)},
    {"payloads": (32 * MIB,)}, {"chunks": (1,)}, {"transports": ("udp",)}, {"grid": "cube"},
    {"engine_step_delay": -0.001}, {"ring_bursts": 0}, {"codec_bursts": 0},
])
def test_invalid_configurations(overrides: dict) -> None:
    with pytest.raises(ValueError):
        BenchConfig(**overrides)


def test_quick_grid_is_small() -> None:
    quick = BenchConfig.quick()
    assert quick.rounds == 3 and quick.payloads == (64, KIB, 64 * KIB, MIB)
    assert quick.readers == (1, 2) and quick.chunks == (10,)
    assert len(quick.ring_cases()) == 8


def test_command_line() -> None:
    parser = build_parser()
    args = parser.parse_args(["bench", "--target", "reference,vllm", "--target", "vllm",
                              "--quick", "--bench", "codec", "--rounds", "4", "--no-vllm"])
    config = commands.config_from(args)
    assert config.targets == ("reference", "vllm")
    assert config.benches == ("codec",) and config.rounds == 4 and not config.include_vllm
    assert config.payloads == BenchConfig.quick().payloads
    assert commands.command_line(args) == ("enginewire bench --target reference,vllm "
                                           "--target vllm --quick --bench codec --rounds 4 "
                                           "--no-vllm")
    defaults = commands.config_from(parser.parse_args(["bench"]))
    assert defaults.targets == ("reference",) and defaults.include_vllm
    assert defaults.rounds == 7
    assert defaults.engine_step_delay == 0.0 and defaults.transports == ("ipc", "tcp")
    peers = parser.parse_args(["bench", "--bench", "peers", "--step-delay", "0.01",
                               "--transport", "tcp"])
    config = commands.config_from(peers)
    assert config.engine_step_delay == 0.01 and config.transports == ("tcp",)
    assert commands.command_line(peers) == ("enginewire bench --bench peers --step-delay 0.01 "
                                            "--transport tcp")
    with pytest.raises(SystemExit) as caught:  # a usage error, found when parsing
        parser.parse_args(["bench", "--rounds", "0"])
    assert caught.value.code == 2


def test_ring_cells_selected_on_the_command_line() -> None:
    parser = build_parser()
    args = parser.parse_args(["bench", "--bench", "ring", "--payload", "1KiB", "--payload",
                              "1048576", "--readers", "1", "--readers", "2", "--chunks", "10"])
    config = commands.config_from(args)
    assert config.payloads == (KIB, MIB) and config.readers == (1, 2)
    assert config.chunks == (10,) and config.base_readers == 2 and config.base_chunks == 10
    assert config.latency_readers == (1, 2)
    assert sorted(config.ring_cases()) == [(KIB, 1, 10), (KIB, 2, 10), (MIB, 1, 10),
                                           (MIB, 2, 10)]
    assert commands.command_line(args) == ("enginewire bench --bench ring --payload 1024 "
                                           "--payload 1048576 --readers 1 --readers 2 "
                                           "--chunks 10")
    only_three = commands.config_from(parser.parse_args(["bench", "--readers", "3",
                                                         "--chunks", "4"]))
    assert only_three.base_readers == 3 and only_three.base_chunks == 4
    for bad in ("1GiB", "KiB", "-5", "1.5MiB"):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", "--payload", bad])


# --- the machinery on a tiny grid ---------------------------------------------------------


@pytest.fixture(scope="module")
def tiny() -> Results:
    """One run of the tiny grid (every bench, two rounds), shared by the tests that read it;
    none of them changes it."""
    return rounds.run(TINY, progress=False)


def test_tiny_run_measures_every_figure(tiny: Results, tmp_path: Path) -> None:
    results = tiny
    no_failures(results)
    assert results.skipped == {} and results.targets == ["reference"]
    found = {(s.bench, s.metric, s.contender, tuple(s.case.items())) for s in results.series}
    small = (("payload_bytes", 64), ("readers", 1), ("chunks", 4))
    large = (("payload_bytes", MIB), ("readers", 1), ("chunks", 4))
    for contender in ("reference", "zmq_push_pull"):
        assert ("ring", "messages_per_s", contender, small) in found
        assert ("ring", "gb_per_s", contender, large) in found
        assert ("ring", "gb_per_s", contender, small) not in found  # GB/s from 1 MiB on
        latency = (("payload_bytes", KIB), ("readers", 1))
        assert ("ring_latency", "p50_us", contender, latency) in found
        assert ("ring_latency", "p99_us", contender, latency) in found
    assert ("ring", "messages_per_s", "memcpy", (("payload_bytes", 64), ("chunks", 4))) in found
    # Zero-copy reads: a contender of their own, for bandwidth payloads only.
    assert ("ring", "gb_per_s", "reference+borrowed", large) in found
    assert ("ring", "gb_per_s", "reference+raw", large) in found  # raw buffers, 1 MiB on
    assert not any(c == "reference+raw" and dict(case)["payload_bytes"] < MIB
                   for _, _, c, case in found)
    assert not any(c == "reference+borrowed" and dict(case)["payload_bytes"] < MIB
                   for _, _, c, case in found)
    assert report.display("reference+borrowed") == "reference, zero-copy reads"
    for workload in ("engine_step", "prompt_embeds"):
        for metric in ("encode_us", "decode_us"):
            for contender in ("reference", "msgspec"):
                assert ("codec", metric, contender, (("workload", workload),)) in found
    for contender in ("reference", "router_dealer", "reference+tap", "router_dealer+proxy",
                      "msgspec_peers"):
        assert ("peers", "rtt_p50_us", contender, (("transport", "ipc"),)) in found
    for metric in ("tap_steps_per_s", "tap_decoded_steps_per_s"):
        assert ("peers", metric, "reference+tap",
                (("transport", "ipc"), ("outputs_per_step", 256))) in found
    for series in results.series:
        assert len(series.samples) == TINY.rounds
        assert all(v > 0 for v in measured(series)), series.key  # type: ignore[operator]
        if series.role == "target" and series.bench != "explorer":
            assert results.vs_vllm(series) is None  # vLLM was not measured
            if series.bench != "ring_latency":
                assert results.vs_ceiling(series) is not None, series.key
    latency = results.find("ring_latency", "p50_us", "reference",
                           {"payload_bytes": KIB, "readers": 1})
    assert len(latency.observations) == TINY.rounds * TINY.latency_messages
    peers = results.find("peers", "rtt_p50_us", "reference", {"transport": "ipc"})
    assert len(peers.observations) == TINY.rounds * TINY.round_trips
    assert {g.name for g in results.goals()} >= {"codec-prompt_embeds-decode", "peers-ipc",
                                                 "tap-ipc"}
    assert set(results.environment["setup_s"]) == {"targets", "codec", "peers", "explorer",
                                                   "readers"}
    # The minimal ring at the base cell below 1 MiB; the textbook contenders; the explorer.
    assert ("ring", "messages_per_s", "minimal_ring", small) in found
    assert not any(c == "minimal_ring" and dict(case)["payload_bytes"] >= MIB
                   for _, _, c, case in found)
    for kind in ("pipe", "pipe_1mib", "unix_socket", "shm_handshake"):
        assert ("textbook", "gb_per_s", kind, (("payload_bytes", 64 * KIB),)) in found
    for encoding in ("pickle", "msgspec_structs", "int_arrays"):
        assert ("textbook_step", "step_us", encoding, (("step", "256 requests"),)) in found
    for model in ("sc", "tso", "weak"):
        case = (("model", model), ("ring", "2x2x3"))
        for metric in ("states_per_s", "search_s", "states"):
            assert ("explorer", metric, "reference", case) in found
        states = results.find("explorer", "states", "reference", dict(case))
        assert states is not None and states.samples == [100.0, None]  # max_states, round 1

    path = tmp_path / "out" / "results.json"
    report.write_json(results, path)
    document = json.loads(path.read_text())
    assert set(document) == JSON_KEYS and document["config"]["rounds"] == TINY.rounds
    assert all(set(row) == ROW_KEYS for row in document["series"])
    assert child_processes() == []
    assert multiprocessing.active_children() == []


def test_the_previous_release_explorer_runs_from_a_git_archive(tmp_path: Path) -> None:
    from enginewire.bench import explorer_bench

    repo = explorer_bench.repository_root()
    if repo is None or explorer_bench.previous_release(repo) is None:
        pytest.skip("not a git checkout with a committed bench results file")
    checkout = explorer_bench.unpack(repo, "HEAD", tmp_path)
    assert (checkout.root / "enginewire" / "fuzz" / "explore").is_dir()
    found = explorer_bench.search(checkout, "tso", 2, 2, 3, 50, timeout=120)
    assert found["states"] == 50 and not found["complete"] and found["states_per_s"] > 0


def test_plots_are_png_files(tiny: Results, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from enginewire.bench import plots

    results = tiny
    no_failures(results)
    written = plots.write_plots(results, tmp_path / "plots")
    names = {p.name for p in written}
    assert {"ring-throughput.png", "ring-bandwidth.png", "ring-latency-cdf.png",
            "peers-rtt-cdf.png", "textbook.png"} <= names
    assert "ring-chunks.png" not in names  # one chunk count only: nothing to compare
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = report.render_markdown(results, plot_dir="docs/bench")
    assert "![ring throughput](docs/bench/ring-throughput.png)" in markdown
    # A page written into the plot folder links its plots and the method page from there.
    beside = report.render_markdown(results, plot_dir="docs/bench", page_dir="docs/bench")
    assert "![ring throughput](ring-throughput.png)" in beside
    assert "Method: [docs/bench.md](../bench.md)" in beside


def test_codec_through_a_target_surface() -> None:
    """A ``package.module:attr`` target is timed through its codec surface."""
    text = "enginewire.conformance.targets.reference:reference_target"
    results = rounds.run(replace(TINY, targets=(text,), benches=("codec",), rounds=1),
                         progress=False)
    no_failures(results)
    series = results.find("codec", "decode_us", text, {"workload": "prompt_embeds"})
    assert series is not None and series.role == "target"
    assert results.ceiling_of(series).contender == "msgspec"
    assert any("codec surface" in note for note in results.notes)


def test_unknown_target_is_skipped_with_a_reason() -> None:
    results = rounds.run(replace(TINY, targets=("no_such_module:thing",), benches=("codec",),
                                 rounds=1), progress=False)
    assert "no_such_module:thing" in results.skipped
    assert {s.contender for s in results.series} == {"msgspec"}


def test_ctrl_c_keeps_what_was_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    from enginewire.bench import ring_bench

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ring_bench.RingBench, "zmq_latency", interrupt)
    results = rounds.run(replace(TINY, benches=("ring",), rounds=2), progress=False)
    assert any("interrupted" in note for note in results.notes)
    reference = results.find("ring", "messages_per_s", "reference",
                             {"payload_bytes": 64, "readers": 1, "chunks": 4})
    assert reference.samples[0] is not None and reference.samples[1] is None
    assert child_processes() == []
    assert multiprocessing.active_children() == []


@pytest.mark.slow
@pytest.mark.vllm
def test_tiny_run_against_vllm() -> None:
    pytest.importorskip("vllm")
    # The benches vLLM takes part in (textbook and explorer have no vLLM contender).
    results = rounds.run(replace(TINY, include_vllm=True, rounds=1,
                                 benches=("ring", "codec", "peers")), progress=False)
    no_failures(results)
    assert results.skipped == {}
    for series in results.series:
        if series.contender == "reference":
            assert results.vs_vllm(series) is not None, series.key
        if series.contender == "vllm":
            assert series.role == "vllm" and results.vs_vllm(series) is None
    assert results.find("peers", "rtt_p50_us", "vllm", {"transport": "ipc"}) is not None
    assert results.find("ring", "gb_per_s", "vllm",
                        {"payload_bytes": MIB, "readers": 1, "chunks": 4}) is not None
    assert child_processes() == []


# --- bursts: a cell's contenders take turns ------------------------------------------------


class _FakeCell:
    """A contender that records when it bursts; its bursts carry fixed figures."""

    def __init__(self, name: str, log: list[str], fail_at: int | None = None) -> None:
        self.name, self.log, self.fail_at = name, log, fail_at
        self.bursts = 0
        self.closed = False

    def burst(self, seconds: float, limit: int) -> tuple[int, float]:
        self.bursts += 1
        self.log.append(self.name)
        if self.bursts == self.fail_at:
            raise RuntimeError("lost a reader")
        return 100 * self.bursts, 0.5  # messages, span

    def figures(self, messages: int, span: float) -> dict[str, float]:
        return {"messages_per_s": messages / span}

    def close(self) -> None:
        self.closed = True


def test_the_contenders_of_a_cell_take_turns_burst_by_burst() -> None:
    """A B C, C B A, A B C, C B A; a figure is all its bursts' messages over their spans; a
    contender whose burst fails is a missing sample with the error, and every cell closes."""
    config = replace(TINY, ring_bursts=4)
    results = Results(config=config.to_builtins(), environment={}, targets=["reference"])
    run = rounds.Run(config, results)
    log: list[str] = []
    cells = {name: _FakeCell(name, log, fail_at=2 if name == "c" else None)
             for name in ("a", "b", "c")}
    case = {"payload_bytes": 64, "readers": 1, "chunks": 4}
    entries = [(case, name, lambda first_worker, n=name: cells[n], 1) for name in "abc"]
    run._interleaved(entries, {"messages_per_s": ("msg/s", "higher")}, 0)
    assert log == ["a", "b", "c", "c", "b", "a", "a", "b", "b", "a"]
    assert all(cell.closed for cell in cells.values())
    by_name = {s.contender: s for s in results.series}
    assert by_name["a"].samples == [(100 + 200 + 300 + 400) / 2.0]
    assert by_name["c"].samples == [None] and "lost a reader" in by_name["c"].errors[0]


def test_codec_contenders_take_turns_burst_by_burst() -> None:
    """time_calls: each call warmed up and calibrated, then A B C, C B A, ... with a burst's
    share of each call's batch; one figure per call, CPU seconds per call."""
    log: list[str] = []
    calls = [lambda n=name: log.append(n) for name in "abc"]
    figures = codec_bench.time_calls(calls, 0.002, 4)
    assert len(figures) == 3 and all(f >= 0 for f in figures)
    # Runs of one letter: the calibrations (a, b, c), then the bursts a b c, c b a, a b c,
    # c b a, where the last call of a burst and the first of the next one make one run.
    runs = [name for index, name in enumerate(log) if index == 0 or log[index - 1] != name]
    assert runs == ["a", "b", "c", "a", "b", "c", "b", "a", "b", "c", "b", "a"]


def test_a_codec_contender_that_raises_is_its_own_missing_sample() -> None:
    """One step times every contender of a codec cell in turns; one that raises is recorded
    missing with its error, the others still get their figure."""
    config = replace(TINY, codec_seconds=0.002)
    results = Results(config=config.to_builtins(), environment={}, targets=["reference"])
    run = rounds.Run(config, results)

    def broken() -> None:
        raise ValueError("no such frame")

    run.codec_ops = {"reference": {"prompt_embeds": codec_bench.Operations(broken, broken)},
                     "msgspec": {"prompt_embeds": codec_bench.Operations(int, int)}}
    run._codec_turns("prompt_embeds", "encode", ["reference", "msgspec"], 0)
    by_name = {s.contender: s for s in results.series}
    assert by_name["reference"].samples == [None]
    assert "no such frame" in by_name["reference"].errors[0]
    assert by_name["msgspec"].samples[0] is not None and by_name["msgspec"].samples[0] >= 0


def test_a_parked_ring_resumes_for_every_burst(tmp_path: Path) -> None:
    """A real cell of the reference ring and of the minimal ring, open for three bursts in
    turns: every burst's messages arrive in order at every reader, and the pool's workers take
    the next cell without a stale report."""
    from enginewire.bench.ring_bench import RingBench
    from enginewire.conformance.targets.resolve import load_target

    config = replace(TINY, readers=(2,), base_readers=2)
    bench = RingBench(config, ["reference"])
    target = load_target("reference")
    try:
        for _ in range(2):
            cells = [bench.open_ring("reference", target, 64, 2, 4, first_worker=0),
                     bench.open_minimal(64, 2, 4, first_worker=2)]
            try:
                for _ in range(3):
                    for cell in cells:
                        messages, span = cell.burst(0.01, 1000)
                        assert messages >= 1 and span > 0
            finally:
                for cell in cells:
                    cell.close()
        assert len(bench.pool.workers) == 4
    finally:
        bench.close()
        target.close()
    assert child_processes() == []


def test_the_minimal_ring_runs_beside_the_base_readers_and_one_reader() -> None:
    """The minimal ring is measured at the base chunk count below the bandwidth sizes, with
    the base reader count (the target's cell) and with one reader (each process its own
    core on two), nowhere else."""
    run = rounds.Run.__new__(rounds.Run)
    run.config = BenchConfig()
    assert run._minimal_case(KIB, 2, 10) and run._minimal_case(KIB, 1, 10)
    assert run._minimal_case(64, 1, 10)
    assert not run._minimal_case(KIB, 3, 10)
    assert not run._minimal_case(KIB, 2, 4)
    assert not run._minimal_case(MIB, 1, 10)
