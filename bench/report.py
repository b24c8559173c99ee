"""Tables of a run (Markdown, readable as plain text too) and the JSON file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from enginewire.bench.results import (
    BORROWED,
    RAW,
    Results,
    Series,
    benches_of,
    format_bytes,
)
from enginewire.bench.stats import Spread

#: How contenders are shown.
DISPLAY = {
    "reference": "reference",
    "vllm": "vLLM",
    "memcpy": "memcpy (ceiling)",
    "zmq_push_pull": "ZMQ PUSH/PULL",
    "msgspec": "raw msgspec (ceiling)",
    "router_dealer": "bare ROUTER/DEALER (ceiling)",
    "router_dealer+proxy": "bare ROUTER/DEALER through zmq.proxy (forwarding floor)",
    "msgspec_peers": "bare sockets, raw msgspec, PUSH/PULL outputs (codec floor)",
    "minimal_ring": "minimal ring (ceiling)",
    # textbook contenders, with the figure an IPC chapter leads one to expect
    "pipe": "pipe, default 64 KiB buffer (textbook ~1.6 GB/s)",
    "pipe_1mib": "pipe, F_SETPIPE_SZ to pipe-max-size (textbook ~1.6 GB/s)",
    "unix_socket": "Unix domain socket (textbook ~7.9 GB/s)",
    "shm_handshake": "shared memory, one-byte handshake (textbook ~11 GB/s)",
    "pickle": "pickle, 256 dataclasses (textbook ~376 µs)",
    "msgspec_structs": "msgspec structs (textbook ~200 µs)",
    "int_arrays": "flattened integer arrays (textbook ~3 µs)",
    "previous_release": "previous release",
}
TITLES = {
    ("ring", "messages_per_s"): "ring: messages per second",
    ("ring", "gb_per_s"): "ring: GB/s, large payloads",
    ("ring_latency", "p50_us"): "ring: latency at a low rate, p50 (µs)",
    ("ring_latency", "p99_us"): "ring: latency at a low rate, p99 (µs)",
    ("codec", "encode_us"): "codec: encode (µs per message)",
    ("codec", "decode_us"): "codec: decode (µs per message)",
    ("peers", "rtt_p50_us"): "peers: ADD to first output, p50 (µs)",
    ("peers", "rtt_p99_us"): "peers: ADD to first output, p99 (µs)",
    ("peers", "tap_steps_per_s"): "peers: steps per second enginewire tap forwards",
    ("peers", "tap_decoded_steps_per_s"): "peers: steps per second enginewire tap decodes",
    ("textbook", "gb_per_s"): "textbook: bulk bytes between two processes (GB/s)",
    ("textbook_step", "step_us"): "textbook: one scheduling step, encode plus decode (µs)",
    ("explorer", "states_per_s"): "explorer: states per second, reference ring",
    ("explorer", "search_s"): "explorer: time of the search (s), reference ring",
    ("explorer", "states"): "explorer: states visited, reference ring",
}
#: Contender order inside a case: implementations first, then vLLM, baselines, ceilings.
ROLE_ORDER = {"target": 0, "vllm": 1, "baseline": 2, "ceiling": 3}


def display(contender: str) -> str:
    raw = contender.removesuffix(RAW)
    if raw != contender:
        return f"{DISPLAY.get(raw, raw)}, raw buffers (enqueue_buffers, dequeue_views)"
    base = contender.removesuffix(BORROWED)
    if base != contender:
        return f"{DISPLAY.get(base, base)}, zero-copy reads"
    return DISPLAY.get(contender, contender)


def number(value: float) -> str:
    """Three significant digits; k and M for large values."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def ratio_text(value: Spread | None) -> str:
    if value is None:
        return ""
    return f"{value.median:.3g}x ({value.min:.3g}-{value.max:.3g})"


def _metrics(results: Results, bench: str) -> list[str]:
    seen: dict[str, None] = {}
    for series in results.series:
        if series.bench == bench:
            seen.setdefault(series.metric, None)
    return list(seen)


def _ordered(series: Iterable[Series]) -> list[Series]:
    by_case: dict[tuple, list[Series]] = {}
    for item in series:
        by_case.setdefault(tuple(item.case.items()), []).append(item)
    rows = []
    for group in by_case.values():
        rows += sorted(group, key=lambda s: (ROLE_ORDER.get(s.role, 9), s.contender))
    return rows


def _summary_case(series: Series, results: Results) -> bool:
    """Whether a row belongs in the short table: the base reader count and chunk count."""
    if series.bench != "ring":
        return True
    config = results.config
    case = series.case
    if "readers" not in case:  # the memcpy ceiling
        return case["chunks"] == config.get("base_chunks", 10)
    base = (config.get("base_readers", 2), config.get("base_chunks", 10))
    if series.metric == "gb_per_s":
        return (case["readers"], case["chunks"]) == (1, base[1])
    return (case["readers"], case["chunks"]) == base


def render_tables(results: Results, *, summary: bool = False) -> str:
    """One Markdown table per bench and metric: every figure with its spread over rounds and
    its ratios to vLLM and to the ceiling. ``summary`` keeps the headline cases only."""
    parts: list[str] = []
    for bench in benches_of(results.series):
        for metric in _metrics(results, bench):
            rows = [s for s in results.series if s.bench == bench and s.metric == metric]
            if summary:
                rows = [s for s in rows if _summary_case(s, results)]
            if not rows:
                continue
            unit = rows[0].unit
            better = rows[0].better
            title = TITLES.get((bench, metric), f"{bench}: {metric}")
            parts.append(f"### {title}, {better} is better\n")
            parts.append(f"| case | contender | median ({unit}) | min-max | vs vLLM | "
                         "vs ceiling |")
            parts.append("|---|---|---:|---:|---:|---:|")
            for series in _ordered(rows):
                figure = series.summary
                if figure is None:
                    shown, span = "failed", "; ".join(series.errors[:1])
                else:
                    shown = number(figure.median)
                    span = f"{number(figure.min)}-{number(figure.max)}"
                parts.append(
                    f"| {series.label} | {display(series.contender)} | {shown} | {span} | "
                    f"{ratio_text(results.vs_vllm(series))} | "
                    f"{ratio_text(results.vs_ceiling(series))} |")
            parts.append("")
    return "\n".join(parts)


def render_goals(results: Results) -> str:
    """The reference targets: measured ratio (median of the paired ratios) and verdict."""
    goals = results.goals()
    if not goals:
        return ""
    lines = ["### reference targets (measured, never asserted)\n",
             "| target | measured ratio | needed | met |", "|---|---:|---:|---|"]
    for goal in goals:
        ratio, met = results.evaluate(goal)
        against = {"vllm": "vLLM", "reference": "without the tap",
                   "ceiling": "ceiling"}.get(goal.against, display(goal.against))
        needed = f"{'>=' if goal.at_least else '<='} {goal.threshold:g}x {against}"
        if goal.every_round:
            needed += ", every round"
        verdict = "not measured" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {goal.description} | {ratio_text(ratio)} | {needed} | {verdict} |")
    lines.append("")
    return "\n".join(lines)


def render_header(results: Results) -> str:
    env = results.environment
    versions = env.get("versions", {})
    config = results.config
    lines = [
        f"enginewire bench: {', '.join(results.targets)}; {config['rounds']} rounds, "
        f"{results.duration_s:.0f} s",
        f"machine: {env.get('cpu_model')} ({env.get('cpu_count')} CPUs), Python "
        f"{env.get('python')}; vLLM {versions.get('vllm') or 'not installed'}, msgspec "
        f"{versions.get('msgspec')}, pyzmq {versions.get('pyzmq')}; load average "
        f"{_load(env.get('load_average_start'))} at start, "
        f"{_load(env.get('load_average_end'))} at end",
        "figures: median over rounds (min-max); ratios: median of per-round ratios "
        "(min-max), value / comparison",
    ]
    if results.command:
        lines.insert(1, f"command: {results.command}")
    for name, reason in results.skipped.items():
        lines.append(f"skipped {name}: {reason}")
    lines += [f"note: {note}" for note in results.notes]
    return "\n".join(lines) + "\n"


def _load(values: list[float] | None) -> str:
    return "?" if not values else "/".join(f"{v:.2f}" for v in values)


def render(results: Results, *, summary: bool = False) -> str:
    return "\n".join(part for part in (render_header(results), render_goals(results),
                                       render_tables(results, summary=summary)) if part)


def read_json(path: str | Path) -> Results:
    """Results saved by :func:`write_json` (ValueError if the file is not one)."""
    return Results.from_builtins(json.loads(Path(path).read_text(encoding="utf-8")))


def write_json(results: Results, path: str | Path) -> None:
    """The results as JSON: indented, except that each series (with its hundreds of
    observations) takes one line."""
    document = results.to_builtins()
    rows = document.pop("series")
    text = json.dumps(document, indent=1, ensure_ascii=False)
    series = ",\n".join("  " + json.dumps(row, ensure_ascii=False) for row in rows)
    text = text[:-2] + f',\n "series": [\n{series}\n ]\n}}'
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n", encoding="utf-8")


def payload_axis(sizes: Iterable[int]) -> list[str]:
    """Tick labels for payload sizes."""
    return [format_bytes(size) for size in sizes]


def render_markdown(results: Results, plot_dir: str | None = None,
                    page_dir: str | Path = ".") -> str:
    """A README section: how the figures were made, the targets, the headline tables.

    Links (the method page ``docs/bench.md``, the plots in ``plot_dir``; both relative to the
    working directory) are written relative to ``page_dir``, the folder the page goes to."""

    def link(path: str | Path) -> str:
        return Path(os.path.relpath(path, page_dir)).as_posix()

    env = results.environment
    versions = env.get("versions", {})
    lines = [
        f"Measured with `{results.command or 'enginewire bench'}` "
        f"({results.config['rounds']} rounds, {results.duration_s:.0f} s) on "
        f"{env.get('cpu_model')} ({env.get('cpu_count')} CPUs), Python {env.get('python')}, "
        f"vLLM {versions.get('vllm') or 'not installed'}, msgspec {versions.get('msgspec')}, "
        f"pyzmq {versions.get('pyzmq')}; load average {_load(env.get('load_average_start'))} "
        "at the start. Figures are medians over rounds (min-max); ratios are medians of the "
        f"per-round ratios, value / comparison. Method: [docs/bench.md]({link('docs/bench.md')}).",
        "",
    ]
    for name, reason in results.skipped.items():
        lines.append(f"Skipped {name}: {reason}\n")
    goals = render_goals(results)
    if goals:
        lines.append(goals)
    lines.append(render_tables(results, summary=True))
    if plot_dir:
        for name, title in (("ring-throughput.png", "ring throughput"),
                            ("ring-bandwidth.png", "ring bandwidth"),
                            ("ring-latency-cdf.png", "ring latency"),
                            ("peers-rtt-cdf.png", "round trips"),
                            ("textbook.png", "textbook contenders")):
            lines.append(f"![{title}]({link(Path(plot_dir) / name)})")
        lines.append("")
    return "\n".join(lines)


def write_markdown(results: Results, path: str | Path, plot_dir: str | None = None) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_markdown(results, plot_dir, page_dir=target.parent),
                      encoding="utf-8")
