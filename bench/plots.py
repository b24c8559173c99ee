"""PNG plots of a run (matplotlib, the ``bench`` extra).

- ``ring-throughput.png``: messages/s against payload size, one panel per reader count, one
  line per contender, log axes, bars from min to max over rounds;
- ``ring-bandwidth.png``: the same in GB/s (messages/s x payload size);
- ``ring-chunks.png``: messages/s against payload size for each chunk count (base readers);
- ``ring-latency-cdf.png``: the distribution of every latency sample, one panel per reader
  count;
- ``peers-rtt-cdf.png``: the distribution of every round trip, one panel per transport;
- ``textbook.png``: the textbook contenders' bulk GB/s beside the ring's at the same payload
  (1 reader, base chunks) and memcpy, with the textbook expectation marked; and the
  scheduling step's µs per encoding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from enginewire.bench.report import display
from enginewire.bench.results import BORROWED, Results, Series, format_bytes

COLORS = {"reference": "tab:blue", "reference" + BORROWED: "tab:purple", "vllm": "tab:orange",
          "memcpy": "tab:gray", "zmq_push_pull": "tab:green", "router_dealer": "tab:gray"}


def available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _line(axis: Any, series: list[Series], scale: Callable[[Series], float],
          label: str, **style: Any) -> None:
    points = [(s.case["payload_bytes"], s.summary, scale(s)) for s in series
              if s.summary is not None]
    if not points:
        return
    points.sort(key=lambda p: p[0])
    xs = [p[0] for p in points]
    ys = [p[1].median * p[2] for p in points]
    low = [(p[1].median - p[1].min) * p[2] for p in points]
    high = [(p[1].max - p[1].median) * p[2] for p in points]
    axis.errorbar(xs, ys, yerr=[low, high], marker="o", markersize=3, capsize=2, label=label,
                  **style)


def _payload_axis(axis: Any, sizes: list[int]) -> None:
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xticks(sizes)
    axis.set_xticklabels([format_bytes(s) for s in sizes], rotation=45, fontsize=7)
    axis.grid(True, which="both", alpha=0.3)


def _ring_series(results: Results) -> list[Series]:
    return [s for s in results.series if s.bench == "ring" and s.metric == "messages_per_s"]


def plot_throughput(results: Results, path: Path, *, bandwidth: bool) -> bool:
    """One panel per reader count at the base chunk count; False when there is no data."""
    plt = _pyplot()
    chunks = results.config.get("base_chunks", 10)
    series = [s for s in _ring_series(results) if s.case.get("chunks") == chunks]
    readers = sorted({s.case["readers"] for s in series if "readers" in s.case})
    if not readers:
        return False
    sizes = sorted({s.case["payload_bytes"] for s in series})
    figure, axes = plt.subplots(1, len(readers), figsize=(4.2 * len(readers), 4), sharey=True,
                                squeeze=False)
    contenders = list(dict.fromkeys(s.contender for s in series))
    for axis, count in zip(axes[0], readers, strict=True):
        for contender in contenders:
            mine = [s for s in series if s.contender == contender
                    and s.case.get("readers", count) == count]
            _line(axis, mine,
                  (lambda s: s.case["payload_bytes"] / 1e9) if bandwidth else (lambda s: 1.0),
                  display(contender), color=COLORS.get(contender))
        axis.set_title(f"{count} reader{'s' if count > 1 else ''}, {chunks} chunks")
        axis.set_xlabel("payload")
        _payload_axis(axis, sizes)
    axes[0][0].set_ylabel("GB/s" if bandwidth else "messages/s")
    axes[0][-1].legend(fontsize=7)
    figure.suptitle("ring " + ("bandwidth" if bandwidth else "throughput"))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def plot_chunks(results: Results, path: Path) -> bool:
    """messages/s against payload size for each chunk count, at the base reader count."""
    plt = _pyplot()
    readers = results.config.get("base_readers", 2)
    series = [s for s in _ring_series(results) if s.case.get("readers") == readers]
    chunk_counts = sorted({s.case["chunks"] for s in series})
    if len(chunk_counts) < 2:
        return False
    sizes = sorted({s.case["payload_bytes"] for s in series})
    contenders = list(dict.fromkeys(s.contender for s in series))
    figure, axes = plt.subplots(1, len(contenders), figsize=(4.2 * len(contenders), 4),
                                sharey=True, squeeze=False)
    for axis, contender in zip(axes[0], contenders, strict=True):
        for chunks in chunk_counts:
            mine = [s for s in series if s.contender == contender and s.case["chunks"] == chunks]
            _line(axis, mine, lambda s: 1.0, f"{chunks} chunks")
        axis.set_title(f"{display(contender)}, {readers} readers")
        _payload_axis(axis, sizes)
        axis.set_xlabel("payload")
    axes[0][0].set_ylabel("messages/s")
    axes[0][-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def plot_textbook(results: Results, path: Path) -> bool:
    """Bars (median, min-max) of the bulk transfers beside the ring, and of the step."""
    from enginewire.bench.textbook_bench import EXPECTED_GB_PER_S, EXPECTED_STEP_US

    plt = _pyplot()
    bulk = [s for s in results.series if s.bench == "textbook" and s.summary is not None]
    steps = [s for s in results.series if s.bench == "textbook_step" and s.summary is not None]
    if not bulk and not steps:
        return False
    size = bulk[0].case["payload_bytes"] if bulk else None
    chunks = results.config.get("base_chunks", 10)
    ring = [s for s in results.series if s.bench == "ring" and s.metric == "gb_per_s"
            and s.case.get("payload_bytes") == size and s.case.get("chunks") == chunks
            and s.case.get("readers", 1) == 1 and s.summary is not None]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    for axis, group, expected, unit in ((axes[0][0], ring + bulk, EXPECTED_GB_PER_S, "GB/s"),
                                        (axes[0][1], steps, EXPECTED_STEP_US, "µs per step")):
        labels = [display(s.contender).split(" (textbook")[0] for s in group]
        medians = [s.summary.median for s in group]  # type: ignore[union-attr]
        low = [s.summary.median - s.summary.min for s in group]  # type: ignore[union-attr]
        high = [s.summary.max - s.summary.median for s in group]  # type: ignore[union-attr]
        positions = list(range(len(group)))
        axis.bar(positions, medians, yerr=[low, high], capsize=3,
                 color=[COLORS.get(s.contender, "tab:cyan") for s in group])
        marks = [(i, expected[s.contender]) for i, s in enumerate(group)
                 if s.contender in expected]
        if marks:
            axis.scatter([m[0] for m in marks], [m[1] for m in marks], marker="_", s=400,
                         color="black", label="textbook expectation", zorder=3)
            axis.legend(fontsize=7)
        axis.set_xticks(positions)
        axis.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        axis.set_yscale("log")
        axis.set_ylabel(unit)
        axis.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].set_title(f"bulk bytes, {format_bytes(size or 0)} messages, 1 reader")
    axes[0][1].set_title("one scheduling step of 256 requests, encode + decode")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def plot_cdf(results: Results, path: Path, *, bench: str, metric: str, panel: str,
             title: str) -> bool:
    """Empirical CDFs of the observations of ``bench``/``metric``, one panel per value of
    the case key ``panel``."""
    plt = _pyplot()
    series = [s for s in results.series if s.bench == bench and s.metric == metric
              and s.observations]
    keys = list(dict.fromkeys(s.case[panel] for s in series))
    if not keys:
        return False
    figure, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.8), squeeze=False)
    for axis, key in zip(axes[0], keys, strict=True):
        for item in series:
            if item.case[panel] != key:
                continue
            values = sorted(item.observations)
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            axis.step(values, fractions, where="post", label=display(item.contender),
                      color=COLORS.get(item.contender))
        axis.set_xscale("log")
        axis.set_xlabel("µs")
        axis.set_ylabel("fraction of messages")
        axis.set_title(f"{panel} {key}" if panel != "readers" else
                       f"{key} reader{'s' if key != 1 else ''}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def write_plots(results: Results, directory: str | Path) -> list[Path]:
    """Write every plot the results have data for into ``directory``; returns the files.

    Raises ``ImportError`` when matplotlib is not installed.
    """
    _pyplot()
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    jobs: list[tuple[str, Callable[[Path], bool]]] = [
        ("ring-throughput.png", lambda p: plot_throughput(results, p, bandwidth=False)),
        ("ring-bandwidth.png", lambda p: plot_throughput(results, p, bandwidth=True)),
        ("ring-chunks.png", lambda p: plot_chunks(results, p)),
        ("ring-latency-cdf.png", lambda p: plot_cdf(
            results, p, bench="ring_latency", metric="p50_us", panel="readers",
            title=f"ring latency, {format_bytes(results.config.get('latency_payload', 1024))} "
                  f"every {results.config.get('latency_interval', 0) * 1000:g} ms")),
        ("peers-rtt-cdf.png", lambda p: plot_cdf(
            results, p, bench="peers", metric="rtt_p50_us", panel="transport",
            title="ADD to first output")),
        ("textbook.png", lambda p: plot_textbook(results, p)),
    ]
    for name, job in jobs:
        path = folder / name
        if job(path):
            written.append(path)
    return written
