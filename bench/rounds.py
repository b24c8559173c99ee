"""One bench run: set every contender up, then measure round after round.

A round is one pass over every cell of every bench. Inside a cell the contenders run in an
order that rotates from round to round, so slow drift of the machine (another process,
thermal throttling) falls on all of them alike and each round's figures can be compared
pairwise (:mod:`.results`). The contenders of a ring throughput cell take turns in bursts
(:meth:`Run._interleaved`), so that even a change of the machine's load within the cell falls
on all of them alike.

Set-up happens once, before the first round: reader processes, codec values, engine processes
and front ends. Then the garbage collector's heap is frozen (``gc.freeze()``, as vLLM's own
processes do after start-up), so a full collection over torch's and vLLM's objects does not
land in the middle of some cell. A failed measurement is recorded as a missing sample with
its error; the run goes on. Ctrl-C stops the run after cleaning up; what was measured is kept.
"""

from __future__ import annotations

import gc
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TextIO

from enginewire.bench.config import BenchConfig
from enginewire.bench.results import BORROWED, MINIMAL_RING, RAW, Results, Series
from enginewire.bench.stats import percentile

#: Contender names of the baselines.
MEMCPY, ZMQ, MSGSPEC, ROUTER_DEALER = "memcpy", "zmq_push_pull", "msgspec", "router_dealer"
#: The explorer of the previous release of the bench (:mod:`.explorer_bench`).
PREVIOUS_RELEASE = "previous_release"
#: Payloads from this size on also get a GB/s figure (and zero-copy read contenders).
BANDWIDTH_FROM = 1 << 20


@dataclass
class Step:
    """One measurement of one contender in one cell: ``run(round_index)`` records it."""

    label: str
    run: Callable[[int], None]
    #: Reader processes the step keeps open at once (started before the first round).
    workers: int = 0


class Progress:
    """A one-line progress bar with an estimate of the time left, on a terminal; a line every
    10% otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.done = 0
        self._last_decile = -1

    def update(self, label: str) -> None:
        if not self.enabled:
            return
        fraction = self.done / self.total
        elapsed = time.monotonic() - self.started
        left = elapsed / fraction * (1 - fraction) if self.done else 0.0
        if self.tty:
            width = 28
            bar = "#" * int(width * fraction) + "-" * (width - int(width * fraction))
            line = (f"\r[{bar}] {fraction:4.0%} {self.done}/{self.total} "
                    f"{elapsed:4.0f}s elapsed, ~{left:3.0f}s left  {label}")
            self.stream.write(line[:118].ljust(118))
        else:
            decile = int(fraction * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(f"bench: {fraction:4.0%} after {elapsed:.0f}s  {label}\n")
        self.stream.flush()

    def advance(self) -> None:
        self.done += 1

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 118 + "\r")
            self.stream.flush()


def environment() -> dict[str, Any]:
    """Where the figures come from: versions, processor, load."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for name in ("enginewire", "vllm", "msgspec", "pyzmq", "numpy", "torch"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "versions": versions,
        "load_average_start": list(os.getloadavg()),
    }


class Run:
    """The state of one run; see :func:`run`."""

    def __init__(self, config: BenchConfig, results: Results) -> None:
        self.config = config
        self.results = results
        self.stack = ExitStack()
        self.targets: dict[str, Any] = {}  # text -> conformance Target
        self.roles: dict[str, str] = {}
        self.ring: Any = None
        self.codec_ops: dict[str, Any] = {}
        self.peers: dict[tuple[str, str], Any] = {}
        self.tap_rates: dict[str, Any] = {}  # transport -> peer_bench.TapOutputRate
        self.explorers: dict[str, Any] = {}  # contender -> explorer_bench.Checkout

    # --- set-up ---------------------------------------------------------------------------

    def wanted(self) -> list[str]:
        """The target texts to load: the asked ones, and vLLM for the comparison."""
        wanted = list(dict.fromkeys(self.config.targets))
        if self.config.include_vllm and "vllm" not in wanted:
            wanted.append("vllm")
        return wanted

    def load_targets(self) -> None:
        from enginewire.conformance.targets.contract import TargetError
        from enginewire.conformance.targets.resolve import load_target

        for text in self.wanted():
            try:
                target = load_target(text)
            except (TargetError, ImportError) as exc:
                reason = str(exc)
                if text == "vllm":
                    reason = f"vLLM is not importable ({exc}): no vs-vLLM ratios"
                self.results.skipped[text] = reason
                continue
            self.targets[text] = target
            self.stack.callback(target.close)
            self.roles[text] = "vllm" if text == "vllm" else "target"
            self.roles[text + BORROWED] = "target"
            self.roles[text + RAW] = "target"

    def ring_targets(self) -> list[str]:
        found = []
        for text, target in self.targets.items():
            ring = target.ring
            if ring is not None and hasattr(ring, "create_writer") and hasattr(
                    ring, "attach_reader"):
                found.append(text)
            else:
                self.results.notes.append(f"ring: {text} has no ring writer and reader")
        return found

    def start_readers(self) -> None:
        """Start the ring's reader processes before anything else: they import the targets'
        modules while this process imports its own."""
        from enginewire.bench.ring_bench import RingBench

        self.ring = RingBench(self.config, self.wanted())
        self.roles[MINIMAL_RING] = "ceiling"
        self.stack.callback(self.ring.close)
        self.ring.start()

    def set_up_codec(self) -> list[str]:
        from enginewire.bench import codec_bench

        for text, target in self.targets.items():
            try:
                if text == "reference":
                    self.codec_ops[text] = codec_bench.reference_operations()
                elif text == "vllm":
                    self.codec_ops[text] = codec_bench.vllm_operations()
                elif target.codec is not None:
                    self.codec_ops[text] = codec_bench.surface_operations(target.codec)
                    self.results.notes.append(
                        f"codec: {text} is timed through the codec surface (neutral values "
                        "in): its figures include building its own values")
                else:
                    self.results.notes.append(f"codec: {text} has no codec")
            except Exception as exc:  # one broken contender must not stop the run
                self.results.notes.append(f"codec: {text} could not be set up: {exc}")
        self.codec_ops[MSGSPEC] = codec_bench.msgspec_operations()
        self.roles[MSGSPEC] = "ceiling"
        return [t for t in self.targets if t in self.codec_ops]

    def set_up_peers(self) -> list[str]:
        from enginewire.bench.peer_bench import (
            CODEC_FLOOR,
            ENGINE_SESSIONS,
            PROXIED,
            SESSIONS,
            TAPPED,
            TapOutputRate,
        )

        names = [t for t in self.targets if t in SESSIONS]
        baselines = []
        if "reference" in names:
            # The same session with enginewire tap in the middle: the tap's cost; the bare
            # round trip through a C forwarder: the least a process in the middle costs; and
            # peers that only encode and decode with bare msgspec: the codec floor.
            names.append(TAPPED)
            baselines += [PROXIED, CODEC_FLOOR]
            self.roles[PROXIED] = self.roles[CODEC_FLOOR] = "baseline"
        for text in self.targets:
            if text not in SESSIONS:
                self.results.notes.append(
                    f"peers: {text} is not measured (the peers bench drives the reference "
                    "front end and vLLM's client)")
        self.roles[ROUTER_DEALER] = "ceiling"
        starting = {}
        for transport in self.config.transports:
            for name in [*names, *baselines, ROUTER_DEALER]:
                try:
                    options = {"step_delay": self.config.engine_step_delay} if (
                        name in ENGINE_SESSIONS and self.config.engine_step_delay) else {}
                    session = SESSIONS[name](transport, self.config.timeout, **options)
                except Exception as exc:  # recorded; the other sessions still run
                    self.results.notes.append(
                        f"peers: {name} over {transport} could not start: {exc}")
                    continue
                self.stack.callback(session.close)
                starting[(name, transport)] = session
            if TAPPED in names:
                # The tap's own rates: a tap of its own between a PUSH and a PULL.
                try:
                    rate = TapOutputRate(transport, TAP_OUTPUTS_PER_STEP, TAP_RATE_STEPS,
                                         self.config.timeout)
                except Exception as exc:
                    self.results.notes.append(
                        f"peers: the tap's output rate over {transport} could not start: {exc}")
                else:
                    self.stack.callback(rate.close)
                    starting[(TAP_RATE, transport)] = rate
        for (name, transport), session in starting.items():
            try:
                session.wait_ready()
            except Exception as exc:
                self.results.notes.append(
                    f"peers: {name} over {transport} did not get ready: {exc}")
                continue
            if name == TAP_RATE:
                self.tap_rates[transport] = session
            else:
                self.peers[(name, transport)] = session
        return names

    def set_up_explorer(self) -> None:
        """This tree's explorer, and the previous release's unpacked from git when asked."""
        import tempfile
        from pathlib import Path

        from enginewire.bench import explorer_bench

        self.explorers["reference"] = explorer_bench.Checkout(None)
        if not self.config.explorer_previous:
            self.results.notes.append(
                "explorer: the previous release's explorer runs in the full bench only")
            return
        repo = explorer_bench.repository_root()
        revision = None if repo is None else explorer_bench.previous_release(repo)
        if repo is None or revision is None:
            self.results.notes.append(
                "explorer: no git checkout with a committed results file: the previous "
                "release is not measured")
            return
        folder = self.stack.enter_context(tempfile.TemporaryDirectory(prefix="ew-bench-"))
        try:
            self.explorers[PREVIOUS_RELEASE] = explorer_bench.unpack(repo, revision,
                                                                     Path(folder))
        except Exception as exc:  # recorded; this tree's explorer is still measured
            self.results.notes.append(f"explorer: could not unpack {revision[:12]}: {exc}")
            return
        self.results.notes.append(f"explorer: previous release = {revision[:12]} (the "
                                  f"revision that last changed {explorer_bench.RESULTS_FILE})")

    # --- steps ----------------------------------------------------------------------------

    def _series(self, bench: str, metric: str, unit: str, better: str,
                case: dict[str, Any], contender: str) -> Series:
        return self.results.series_for(bench, metric, unit, better, case, contender,
                                       self.roles.get(contender, "baseline"))

    def _record(self, round_index: int, bench: str, case: dict[str, Any], contender: str,
                measure: Callable[[], tuple[dict[str, float], list[float]]],
                units: dict[str, tuple[str, str]]) -> None:
        """Run ``measure`` and record each metric it returns (all missing if it raised)."""
        try:
            figures, observations = measure()
            error = None
        except Exception as exc:  # a failed cell is a missing sample, not a failed run
            figures, observations, error = {}, [], f"{type(exc).__name__}: {exc}"
        for metric, (unit, better) in units.items():
            series = self._series(bench, metric, unit, better, case, contender)
            self.results.record(series, round_index, figures.get(metric), error)
            if metric == next(iter(units)):
                series.observations.extend(observations)

    def ring_steps(self, texts: list[str], round_index: int) -> Iterator[Step]:
        config, ring = self.config, self.ring
        first_readers: dict[tuple[int, int], int] = {}
        for payload, readers, chunks in config.ring_cases():
            first_readers.setdefault((payload, chunks), readers)
        for payload, readers, chunks in config.ring_cases():
            case = {"payload_bytes": payload, "readers": readers, "chunks": chunks}
            units = {"messages_per_s": ("msg/s", "higher")}
            if payload >= BANDWIDTH_FROM:
                units["gb_per_s"] = ("GB/s", "higher")
            # (case, contender, opener(first_worker), reader processes)
            cells: list[tuple[dict[str, Any], str, Callable[[int], Any], int]] = []
            if first_readers[(payload, chunks)] == readers:
                memcpy_case = {"payload_bytes": payload, "chunks": chunks}
                cells.append((memcpy_case, MEMCPY, partial(_open_memcpy, ring, payload, chunks),
                              0))
            for text in texts:
                cells.append((case, text, partial(_open_ring, ring, text, self.targets[text],
                                                  payload, readers, chunks), readers))
            if payload >= BANDWIDTH_FROM:
                cells += [(case, text + BORROWED, partial(
                    _open_ring, ring, text, self.targets[text], payload, readers, chunks,
                    borrowed=True), readers)
                    for text in texts if _borrows(self.targets[text])]
                if chunks == config.base_chunks and readers in (1, config.base_readers):
                    # Raw buffers: at the headline cells only (each costs a ring cell).
                    cells += [(case, text + RAW, partial(
                        _open_ring, ring, text, self.targets[text], payload, readers, chunks,
                        raw=True), readers) for text in texts
                        if getattr(self.targets[text].ring, "raw_buffers", False)]
            cells.append((case, ZMQ, partial(ring.open_zmq, payload, readers, chunks,
                                             first_worker=0), readers))
            if self._minimal_case(payload, readers, chunks):
                cells.append((case, MINIMAL_RING, partial(ring.open_minimal, payload, readers,
                                                          chunks, first_worker=0), readers))
            names = " ".join(name for _, name, _, _ in cells)
            yield Step(f"ring {_label(case)} {names}",
                       partial(self._interleaved, _rotate(cells, round_index), units),
                       workers=sum(readers for _, _, _, readers in cells))
        latency_units = {"p50_us": ("µs", "lower"), "p99_us": ("µs", "lower")}
        for readers in config.latency_readers:
            case = {"payload_bytes": config.latency_payload, "readers": readers}
            contenders = [(text, partial(ring.latency, text, self.targets[text], readers))
                          for text in texts]
            contenders.append((ZMQ, partial(ring.zmq_latency, readers)))
            for name, measure in _rotate(contenders, round_index):
                yield Step(f"ring latency {_label(case)} {name}",
                           _bind(self._record, "ring_latency", case, name, measure,
                                 latency_units))

    def _interleaved(self, cells: list[tuple[dict[str, Any], str, Callable[..., Any], int]],
                     units: dict[str, tuple[str, str]], round_index: int) -> None:
        """Measure the contenders of one cell in turns: open each (its ring and readers stay
        open), then ``ring_bursts`` bursts of ``cell_seconds / ring_bursts`` each, the order
        reversed every other burst (A B C, C B A, A B C, ...), so that whatever the machine
        does during the cell falls on every contender alike; then close them all. A
        contender's figure is all its bursts' messages over all their spans; a burst that
        fails makes its round a missing sample with the error."""
        config = self.config
        bursts = config.ring_bursts
        seconds = config.cell_seconds / bursts
        limit = max(2, config.max_messages // bursts)
        opened: dict[int, Any] = {}
        errors: dict[int, str] = {}
        totals = {index: [0, 0.0] for index in range(len(cells))}
        first_worker = 0
        try:
            for index, (_, _, opener, readers) in enumerate(cells):
                try:
                    opened[index] = opener(first_worker=first_worker)
                except Exception as exc:  # a failed contender is a missing sample
                    errors[index] = f"{type(exc).__name__}: {exc}"
                first_worker += readers
            for burst in range(bursts):
                order = list(opened) if burst % 2 == 0 else list(reversed(opened))
                for index in order:
                    if index in errors:
                        continue
                    try:
                        messages, span = opened[index].burst(seconds, limit)
                    except Exception as exc:
                        errors[index] = f"{type(exc).__name__}: {exc}"
                        continue
                    totals[index][0] += messages
                    totals[index][1] += span
        finally:
            for index, cell in opened.items():
                try:
                    cell.close()
                except Exception as exc:
                    errors.setdefault(index, f"{type(exc).__name__}: {exc}")
        for index, (case, name, _, _) in enumerate(cells):
            error = errors.get(index)
            figures: dict[str, float] = {}
            if error is None:
                try:
                    figures = opened[index].figures(*totals[index])
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
            for metric, (unit, better) in units.items():
                series = self._series("ring", metric, unit, better, case, name)
                self.results.record(series, round_index, figures.get(metric), error)

    def _minimal_case(self, payload: int, readers: int, chunks: int) -> bool:
        """Is the minimal ring measured in this cell? At the base chunk count, with the base
        reader count (the target's cell: three processes on this machine's two cores) or one
        reader (each process its own core), below :data:`BANDWIDTH_FROM` (a message-rate
        ceiling; memcpy bounds the GB/s)."""
        config = self.config
        return (payload < BANDWIDTH_FROM and readers in (1, config.base_readers)
                and chunks == config.base_chunks)

    def textbook_steps(self, round_index: int) -> Iterator[Step]:
        from enginewire.bench import textbook_bench

        config = self.config
        case = {"payload_bytes": config.textbook_bytes}
        contenders = [(kind, _pair(partial(textbook_bench.bulk, kind, config.textbook_bytes,
                                           config.textbook_seconds, config.timeout)))
                      for kind in textbook_bench.TRANSPORTS]
        for name, measure in _rotate(contenders, round_index):
            yield Step(f"textbook bulk {name}",
                       _bind(self._record, "textbook", case, name, measure,
                             {"gb_per_s": ("GB/s", "higher")}))
        operations = textbook_bench.step_operations()
        step_case = {"step": f"{textbook_bench.STEP_REQUESTS} requests"}
        steps = [(name, _pair(partial(_micros, "step_us", call, config.codec_seconds)))
                 for name, call in operations.items()]
        for name, measure in _rotate(steps, round_index):
            yield Step(f"textbook step {name}",
                       _bind(self._record, "textbook_step", step_case, name, measure,
                             {"step_us": ("µs", "lower")}))

    def explorer_steps(self, round_index: int) -> Iterator[Step]:
        """The searches, in the first round only (an exhaustive one takes tens of seconds)."""
        from enginewire.bench import explorer_bench

        if round_index != 0:
            return
        config = self.config
        readers, chunks, messages = config.explorer_ring
        units = {"states_per_s": ("states/s", "higher"), "search_s": ("s", "lower"),
                 "states": ("states", "lower")}
        for order, model in enumerate(explorer_bench.MODELS):
            case = {"model": model, "ring": f"{readers}x{chunks}x{messages}"}
            contenders = []
            for name, checkout in self.explorers.items():
                contenders.append((name, _pair(partial(
                    _search, checkout, model, readers, chunks, messages,
                    config.explorer_max_states, config.timeout * 30))))
            # One round only: the order alternates from model to model instead.
            for name, measure in _rotate(contenders, order):
                yield Step(f"explorer {model} {name}",
                           _bind(self._record, "explorer", case, name, measure, units))

    def codec_steps(self, texts: list[str], round_index: int) -> Iterator[Step]:
        from enginewire.bench.codec_bench import OPERATIONS, WORKLOADS

        for workload in WORKLOADS:
            for operation in OPERATIONS:
                names = _rotate([*texts, MSGSPEC], round_index)
                yield Step(f"codec {workload} {operation} {' '.join(names)}",
                           partial(self._codec_turns, workload, operation, names))

    def _codec_turns(self, workload: str, operation: str, names: list[str],
                     round_index: int) -> None:
        """Time ``operation`` of ``workload`` for every contender in ``names``, taking turns
        in ``codec_bursts`` bursts (:func:`~.codec_bench.time_calls`), and record each. A
        contender whose call raises is timed alone, so its error is its own missing sample
        and not its neighbours'."""
        from enginewire.bench.codec_bench import time_calls

        config = self.config
        metric = f"{operation}_us"
        case = {"workload": workload}
        units = {metric: ("µs", "lower")}
        calls = {name: getattr(self.codec_ops[name][workload], operation) for name in names}
        failing: dict[str, str] = {}
        for name, call in calls.items():
            try:
                call()
            except Exception as exc:  # a failed cell is a missing sample, not a failed run
                failing[name] = f"{type(exc).__name__}: {exc}"
        timed = [name for name in names if name not in failing]
        seconds = time_calls([calls[name] for name in timed], config.codec_seconds,
                             config.codec_bursts) if timed else []
        figures = dict(zip(timed, seconds, strict=True))
        for name in names:
            series = self._series("codec", metric, *units[metric], case, name)
            value = figures.get(name)
            self.results.record(series, round_index,
                                None if value is None else value * 1e6, failing.get(name))

    def peers_steps(self, round_index: int) -> Iterator[Step]:
        from enginewire.bench.peer_bench import TAPPED

        count = self.config.round_trips
        units = {"rtt_p50_us": ("µs", "lower"), "rtt_p99_us": ("µs", "lower")}
        for transport in self.config.transports:
            case = {"transport": transport}
            contenders = []
            for (name, where), session in self.peers.items():
                if where == transport:
                    contenders.append((name, partial(_round_trips, session, count,
                                                     f"bench-{name}-r{round_index}")))
            for name, measure in _rotate(contenders, round_index):
                yield Step(f"peers {transport} {name}",
                           _bind(self._record, "peers", case, name, measure, units))
            if transport in self.tap_rates:
                rate_case = {"transport": transport, "outputs_per_step": TAP_OUTPUTS_PER_STEP}
                yield Step(f"peers {transport} tap output rate",
                           _bind(self._record, "peers", rate_case, TAPPED,
                                 _pair(self.tap_rates[transport].measure),
                                 {"tap_steps_per_s": ("steps/s", "higher"),
                                  "tap_decoded_steps_per_s": ("steps/s", "higher")}))


def _open_memcpy(ring: Any, payload: int, chunks: int, first_worker: int = 0) -> Any:
    return ring.open_memcpy(payload, chunks)  # no reader processes


def _open_ring(ring: Any, text: str, target: Any, payload: int, readers: int, chunks: int, *,
               borrowed: bool = False, raw: bool = False, first_worker: int = 0) -> Any:
    return ring.open_ring(text, target, payload, readers, chunks, borrowed=borrowed, raw=raw,
                          first_worker=first_worker)


def _borrows(target: Any) -> bool:
    """Does the target's ring offer zero-copy reads (``borrowed_reads``)?"""
    return bool(getattr(target.ring, "borrowed_reads", False))


def _search(checkout: Any, model: str, readers: int, chunks: int, messages: int,
            max_states: int | None, timeout: float) -> dict[str, float]:
    from enginewire.bench.explorer_bench import search

    found = search(checkout, model, readers, chunks, messages, max_states, timeout)
    return {"states_per_s": found["states_per_s"], "search_s": found["elapsed_s"],
            "states": float(found["states"])}


def _micros(metric: str, call: Callable[[], Any], seconds: float) -> dict[str, float]:
    from enginewire.bench.codec_bench import time_call

    return {metric: time_call(call, seconds) * 1e6}


#: Request outputs per EngineCoreOutputs in the tap's rate figure (vLLM's max_num_seqs).
TAP_OUTPUTS_PER_STEP = 256
#: Steps of one round of the tap's rate figure.
TAP_RATE_STEPS = 400
#: The key of the tap's rate session among the sessions being started.
TAP_RATE = "tap output rate"


def _round_trips(session: Any, count: int, prefix: str) -> tuple[dict[str, float], list]:
    times = [t * 1e6 for t in session.measure(count, prefix)]
    return {"rtt_p50_us": percentile(times, 50), "rtt_p99_us": percentile(times, 99)}, times


def _pair(call: Callable[[], dict[str, float]]) -> Callable[[], tuple[dict[str, float], list]]:
    return lambda: (call(), [])


def _bind(record: Callable[..., None], *args: Any) -> Callable[[int], None]:
    return lambda round_index: record(round_index, *args)


def _label(case: dict[str, Any]) -> str:
    from enginewire.bench.results import case_label

    return case_label(case)


def _rotate(items: list[Any], shift: int) -> list[Any]:
    if not items:
        return items
    shift %= len(items)
    return items[shift:] + items[:shift]


def run(config: BenchConfig, *, progress: bool = True, command: str = "",
        stream: TextIO | None = None) -> Results:
    """Measure everything ``config`` asks for; returns the results (also when interrupted by
    Ctrl-C: then ``results.notes`` says so and the missing rounds are missing samples)."""
    # vLLM logs to stderr at import and when its client starts; the figures need none of it.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    started = time.monotonic()
    results = Results(config=config.to_builtins(), environment=environment(),
                      targets=list(config.targets), command=command,
                      started_at=datetime.now(UTC).isoformat(timespec="seconds"))
    state = Run(config, results)
    bar: Progress | None = None
    frozen = False
    try:
        with state.stack:
            setup: dict[str, float] = {}
            results.environment["setup_s"] = setup
            clock = time.monotonic()

            def phase(name: str) -> None:
                nonlocal clock
                now = time.monotonic()
                setup[name] = round(now - clock, 2)
                clock = now

            if "ring" in config.benches:
                state.start_readers()
            state.load_targets()
            phase("targets")
            ring_texts = state.ring_targets() if "ring" in config.benches else []
            codec_texts = state.set_up_codec() if "codec" in config.benches else []
            phase("codec")
            peers_ready = "peers" in config.benches
            if peers_ready:
                state.set_up_peers()
            phase("peers")
            if "explorer" in config.benches:
                state.set_up_explorer()
                phase("explorer")
            if state.ring is not None:
                problems = state.ring.pool.wait_ready()
                for text, problem in problems.items():
                    if text in ring_texts:  # the others were skipped already
                        results.notes.append(f"ring: readers could not load {text}: {problem}")
                        ring_texts = [t for t in ring_texts if t != text]
            phase("readers")
            gc.collect()
            gc.freeze()
            frozen = True

            def steps(round_index: int) -> Iterator[Step]:
                if state.ring is not None:
                    yield from state.ring_steps(ring_texts, round_index)
                if "codec" in config.benches:
                    yield from state.codec_steps(codec_texts, round_index)
                if peers_ready:
                    yield from state.peers_steps(round_index)
                if "textbook" in config.benches:
                    yield from state.textbook_steps(round_index)
                if "explorer" in config.benches:
                    yield from state.explorer_steps(round_index)

            total = sum(sum(1 for _ in steps(index)) for index in range(config.rounds))
            if state.ring is not None:
                # Every reader process a cell keeps open at once, started now rather than in
                # the middle of a cell.
                state.ring.pool.start(max((step.workers for step in steps(0)), default=0))
                state.ring.pool.wait_ready()
            bar = Progress(total, stream=stream, enabled=progress)
            for round_index in range(config.rounds):
                for step in steps(round_index):
                    bar.update(f"round {round_index + 1}/{config.rounds}: {step.label}")
                    step.run(round_index)
                    bar.advance()
            bar.update("done")
    except KeyboardInterrupt:
        results.notes.append("interrupted (Ctrl-C): later rounds are missing")
    finally:
        if bar is not None:
            bar.finish()
        if frozen:
            gc.unfreeze()
        results.duration_s = round(time.monotonic() - started, 1)
        results.environment["load_average_end"] = list(os.getloadavg())
        for series in results.series:
            while len(series.samples) < config.rounds:
                series.samples.append(None)
    return results
