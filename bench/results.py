"""What a bench run produces: series of per-round figures, their ratios, the reference goals.

A :class:`Series` is one figure (``bench``, ``metric``, ``case``) of one contender, with one
sample per round (None where that round failed). Ratios are *paired*: round ``i`` of a series
is divided by round ``i`` of its comparison series, which was measured moments apart in the
same round, and the ratios' median, min and max are reported. Every ratio is
``value / comparison`` in the metric's own unit, so for a throughput higher is better and for
a time lower is better (``Series.better`` says which).

Comparisons:

- ``vs_vllm``: the ``vllm`` series of the same bench, metric and case;
- ``vs_ceiling``: the bench's ceiling (:data:`CEILINGS`) of the same metric whose case is a
  subset of this case (the memcpy ceiling has no reader count, for example).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from enginewire.bench.stats import Spread, paired_ratios, spread

SCHEMA = "enginewire-bench/1"

#: Bench -> the contender that is its ceiling (the fastest the job can be done).
CEILINGS: dict[str, str] = {"ring": "memcpy", "codec": "msgspec", "peers": "router_dealer"}
#: The contender every figure is compared with.
VLLM = "vllm"
#: The reference session with ``enginewire tap`` between its peers (compared with
#: ``reference``'s figures of the same round: the tap's cost).
TAPPED = "reference+tap"
#: The bare ROUTER/DEALER round trip through a zmq.proxy process: the forwarding floor of a tap.
PROXIED = "router_dealer+proxy"
#: The same round trip between peers that do the least a Python peer of the protocol must: bare
#: msgspec encodes and decodes of the ADD and its outputs over the protocol's own topology
#: (ROUTER/DEALER in, PUSH/PULL out), nothing else: the codec floor under the reference.
CODEC_FLOOR = "msgspec_peers"
#: The suffix of a ring contender whose readers use zero-copy reads (``dequeue_borrowed``).
BORROWED = "+borrowed"
#: The suffix of a ring contender sending raw buffers (``enqueue_buffers``, no pickle) whose
#: readers take views valid until their next read (``dequeue_views``).
RAW = "+raw"
#: The minimal broadcast ring (flags plus memcpy, :mod:`.minimal_ring`): the ceiling of the
#: ring's message rate, measured beside the ring targets.
MINIMAL_RING = "minimal_ring"
#: Roles of contenders: implementations under test, vLLM, baselines and ceilings.
ROLES = ("target", "vllm", "baseline", "ceiling")


def format_bytes(count: int) -> str:
    """``64 B``, ``1 KiB``, ``16 MiB`` (exact binary multiples), else bytes."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} B"


def case_label(case: dict[str, Any]) -> str:
    """A short human label of a case (the order of the keys is kept)."""
    parts = []
    for key, value in case.items():
        if key == "payload_bytes":
            parts.append(format_bytes(int(value)))
        elif key == "readers":
            parts.append(f"{value} reader{'s' if value != 1 else ''}")
        elif key == "chunks":
            parts.append(f"{value} chunks")
        else:
            parts.append(str(value))
    return ", ".join(parts)


@dataclass
class Series:
    """One figure of one contender: a sample per round."""

    bench: str
    metric: str
    unit: str
    better: str  # "higher" or "lower"
    case: dict[str, Any]
    contender: str
    role: str
    samples: list[float | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Raw observations kept for plots (latency samples in microseconds, ...).
    observations: list[float] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, tuple[tuple[str, Any], ...], str]:
        return (self.bench, self.metric, tuple(self.case.items()), self.contender)

    @property
    def label(self) -> str:
        return case_label(self.case)

    @property
    def summary(self) -> Spread | None:
        return spread(self.samples)


@dataclass(frozen=True)
class Goal:
    """A reference target: ``contender``'s ratio against ``against`` meets ``threshold``."""

    name: str
    description: str
    bench: str
    metric: str
    case: dict[str, Any]
    #: "vllm", "ceiling", or the contender of the same case to divide by ("reference": the
    #: same session without the tap; :data:`MINIMAL_RING`).
    against: str
    threshold: float
    at_least: bool  # True: ratio >= threshold; False: ratio <= threshold
    contender: str = "reference"
    #: Met only when the ratio of every round meets the threshold (not only the median).
    every_round: bool = False


@dataclass
class Results:
    """Everything one run measured, plus how it was run."""

    config: dict[str, Any]
    environment: dict[str, Any]
    targets: list[str]
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    command: str = ""
    started_at: str = ""
    duration_s: float = 0.0
    _index: dict[tuple[Any, ...], Series] = field(default_factory=dict, repr=False)

    # --- building -------------------------------------------------------------------------

    def series_for(self, bench: str, metric: str, unit: str, better: str,
                   case: dict[str, Any], contender: str, role: str) -> Series:
        """The series of this figure, created (empty) on first use."""
        key = (bench, metric, tuple(case.items()), contender)
        found = self._index.get(key)
        if found is None:
            found = Series(bench, metric, unit, better, dict(case), contender, role)
            self._index[key] = found
            self.series.append(found)
        return found

    def record(self, series: Series, round_index: int, value: float | None,
               error: str | None = None) -> None:
        """Put round ``round_index``'s value (None: failed) into ``series``."""
        while len(series.samples) <= round_index:
            series.samples.append(None)
        series.samples[round_index] = value
        if error:
            series.errors.append(f"round {round_index + 1}: {error}")

    # --- reading --------------------------------------------------------------------------

    def find(self, bench: str, metric: str, contender: str, case: dict[str, Any]) -> Series | None:
        return self._index.get((bench, metric, tuple(case.items()), contender))

    def vllm_of(self, series: Series) -> Series | None:
        """The vLLM series ``series`` compares with (None for vLLM itself or when absent)."""
        if series.contender == VLLM:
            return None
        return self.find(series.bench, series.metric, VLLM, series.case)

    def ceiling_of(self, series: Series) -> Series | None:
        """The ceiling series ``series`` compares with (None for the ceiling itself)."""
        name = CEILINGS.get(series.bench)
        if name is None or series.contender == name:
            return None
        items = set(series.case.items())
        for other in self.series:
            if (other.bench == series.bench and other.metric == series.metric
                    and other.contender == name and set(other.case.items()) <= items):
                return other
        return None

    def vs_vllm(self, series: Series) -> Spread | None:
        other = self.vllm_of(series)
        return None if other is None else spread(paired_ratios(series.samples, other.samples))

    def vs_ceiling(self, series: Series) -> Spread | None:
        other = self.ceiling_of(series)
        return None if other is None else spread(paired_ratios(series.samples, other.samples))

    # --- goals ----------------------------------------------------------------------------

    def goals(self) -> list[Goal]:
        """The reference targets that apply to what was measured."""
        if "reference" not in self.targets:
            return []
        goals: list[Goal] = []
        for series in self.series:
            if series.contender not in ("reference", "reference" + BORROWED, "reference" + RAW):
                continue
            case = series.case
            borrowed = series.contender != "reference"
            if borrowed and (series.bench, series.metric) != ("ring", "gb_per_s"):
                continue
            if (series.bench, series.metric) == ("ring", "messages_per_s") and case == {
                    "payload_bytes": 1024, "readers": 2, "chunks": 10}:
                goals.append(Goal(
                    "ring-messages-vs-vllm",
                    "ring messages/s at 1 KiB with 2 readers: at least 3x vLLM's in every round",
                    "ring", "messages_per_s", case, "vllm", 3.0, at_least=True,
                    every_round=True))
                goals.append(Goal(
                    "ring-messages-vs-minimal",
                    "ring messages/s at 1 KiB with 2 readers: at least half a minimal "
                    "broadcast ring's (flags plus memcpy)",
                    "ring", "messages_per_s", case, MINIMAL_RING, 0.5, at_least=True))
            elif ((series.bench, series.metric) == ("ring", "gb_per_s")
                  and case.get("chunks") == 10 and case.get("readers") == 1):
                size = format_bytes(case["payload_bytes"])
                raw = series.contender.endswith(RAW)
                reads = ("raw buffers, zero-copy views" if raw else
                         "zero-copy reads" if borrowed else "copying reads")
                if not borrowed and case["payload_bytes"] == 1 << 20:
                    goals.append(Goal(
                        "ring-pickled-1MiB-vs-vllm",
                        "ring GB/s at 1 MiB (1 reader, pickled array, copying reads): at "
                        "least 1.3x vLLM's",
                        "ring", "gb_per_s", case, "vllm", 1.3, at_least=True))
                goals.append(Goal(
                    f"ring-bandwidth-{size.replace(' ', '')}"
                    + ("-raw" if raw else "-zero-copy" if borrowed else ""),
                    f"ring GB/s at {size} (1 reader, {reads}): at least 80% of memcpy",
                    "ring", "gb_per_s", case, "ceiling", 0.8, at_least=True,
                    contender=series.contender))
            elif series.bench == "codec":
                goals.append(Goal(
                    f"codec-{case['workload']}-{series.metric.removesuffix('_us')}",
                    f"codec {series.metric.removesuffix('_us')} of {case['workload']}: "
                    "within 1.2x of raw msgspec",
                    "codec", series.metric, case, "ceiling", 1.2, at_least=False))
            elif (series.bench, series.metric) == ("peers", "rtt_p50_us") and \
                    self.find("peers", "rtt_p50_us", TAPPED, case) is not None:
                goals.append(Goal(
                    f"tap-{case['transport']}",
                    f"ADD to first output over {case['transport']}:// through enginewire tap: "
                    "within 1.3x of the same session without it",
                    "peers", series.metric, case, "reference", 1.3, at_least=False,
                    contender=TAPPED))
            if (series.bench, series.metric) == ("peers", "rtt_p50_us"):
                goals.append(Goal(
                    f"peers-{case['transport']}",
                    f"ADD to first output over {case['transport']}://: within 1.5x of a bare "
                    "ROUTER/DEALER round trip",
                    "peers", series.metric, case, "ceiling", 1.5, at_least=False))
        return goals

    def evaluate(self, goal: Goal) -> tuple[Spread | None, bool | None]:
        """The goal's measured ratio and whether its median meets it (None: not measured)."""
        series = self.find(goal.bench, goal.metric, goal.contender, goal.case)
        if series is None:
            return None, None
        if goal.against == "vllm":
            other = self.vllm_of(series)
        elif goal.against == "ceiling":
            other = self.ceiling_of(series)
        else:
            other = self.find(goal.bench, goal.metric, goal.against, goal.case)
        ratios = [] if other is None else paired_ratios(series.samples, other.samples)
        ratio = spread(ratios)
        if ratio is None:
            return None, None
        if goal.every_round:
            # The worst round decides; a round without a ratio (a failed cell) fails the goal.
            worst = ratio.min if goal.at_least else ratio.max
            met = None not in ratios and (worst >= goal.threshold if goal.at_least
                                          else worst <= goal.threshold)
            return ratio, met
        met = ratio.median >= goal.threshold if goal.at_least else ratio.median <= goal.threshold
        return ratio, met

    # --- output ---------------------------------------------------------------------------

    @classmethod
    def from_builtins(cls, document: dict[str, Any]) -> Results:
        """Results read back from :meth:`to_builtins` (ratios and goals are recomputed)."""
        if document.get("schema") != SCHEMA:
            raise ValueError(f"not a bench results document: schema "
                             f"{document.get('schema')!r}, expected {SCHEMA!r}")
        results = cls(config=document["config"], environment=document["environment"],
                      targets=list(document["targets"]), skipped=dict(document["skipped"]),
                      notes=list(document["notes"]), command=document["command"],
                      started_at=document["started_at"], duration_s=document["duration_s"])
        for row in document["series"]:
            series = results.series_for(row["bench"], row["metric"], row["unit"], row["better"],
                                        row["case"], row["contender"], row["role"])
            series.samples = list(row["samples"])
            series.errors = list(row["errors"])
            series.observations = list(row["observations"])
        return results

    def to_builtins(self) -> dict[str, Any]:
        """The JSON document (schema :data:`SCHEMA`)."""

        def opt(value: Spread | None) -> dict[str, float] | None:
            return None if value is None else value.to_builtins()

        rows = []
        for series in self.series:
            ceiling = self.ceiling_of(series)
            rows.append({
                "bench": series.bench,
                "metric": series.metric,
                "unit": series.unit,
                "better": series.better,
                "case": series.case,
                "label": series.label,
                "contender": series.contender,
                "role": series.role,
                "samples": series.samples,
                "summary": opt(series.summary),
                "vs_vllm": opt(self.vs_vllm(series)),
                "ceiling": None if ceiling is None else ceiling.contender,
                "vs_ceiling": opt(self.vs_ceiling(series)),
                "errors": series.errors,
                # Sub-microsecond digits of a wake-up time are noise: 0.01 µs keeps the file small.
                "observations": [round(value, 2) for value in series.observations],
            })
        goals = []
        for goal in self.goals():
            ratio, met = self.evaluate(goal)
            goals.append({
                "name": goal.name,
                "description": goal.description,
                "contender": goal.contender,
                "bench": goal.bench,
                "metric": goal.metric,
                "case": goal.case,
                "against": goal.against,
                "threshold": goal.threshold,
                "at_least": goal.at_least,
                "ratio": opt(ratio),
                "met": met,
            })
        return {
            "schema": SCHEMA,
            "command": self.command,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "environment": self.environment,
            "config": self.config,
            "targets": self.targets,
            "skipped": self.skipped,
            "notes": self.notes,
            "series": rows,
            "goals": goals,
        }


def benches_of(series: Iterable[Series]) -> list[str]:
    """The benches present, in first-seen order."""
    seen: dict[str, None] = {}
    for item in series:
        seen.setdefault(item.bench, None)
    return list(seen)
