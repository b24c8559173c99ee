"""``enginewire soak --engine-flood N``: N malformed input messages at one live reference engine,
as fast as its input socket takes them, with its resident memory sampled.

A measurement, not a campaign: a pool of distinct malformed ADD/ABORT/UTILITY messages
(:func:`enginewire.fuzz.mutations.malformed` plus the soak's attack payloads) is drawn once,
each decoded here to confirm it is a typed error, then sent round-robin to an engine process
(spawned as the soak spawns it) through the front end's input ROUTER. Every ``check_every``
messages a valid ADD goes in and its output must come back within ``timeout`` s (the engine keeps
serving; as the engine reads its input in order, this also bounds what is queued). The engine's
VmRSS is sampled every ``sample_every`` messages; at the end its violation counts are read with
the reference engine's ``get_violation_counts`` utility.

The report: messages sent, duration and rate, the RSS series (first, peak, last, growth after
the warm-up sample), valid requests answered, the engine's rejections per clause, and whether
it stayed alive. :attr:`FloodReport.ok`: alive, every valid ADD answered, every message sent
counted as a rejection by the engine.
"""

from __future__ import annotations

import random
import subprocess
import time
from dataclasses import dataclass, field

from .live import INPUT_KINDS, MalformedCases, hostile_inputs, rss_kib, serve_check

#: Distinct malformed messages drawn for the pool (the hostile payloads come on top).
DEFAULT_POOL = 2000
#: The RSS sample this index is the warm-up baseline (0: the sample before any message).
WARM_UP_SAMPLE = 1


@dataclass
class FloodReport:
    messages: int = 0
    pool: int = 0
    seconds: float = 0.0
    valid_sent: int = 0
    valid_answered: int = 0
    rss_samples_kib: list[tuple[int, int]] = field(default_factory=list)
    violation_counts: dict[str, int] = field(default_factory=dict)
    alive: bool = True
    findings: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def rejections(self) -> int:
        return sum(self.violation_counts.values())

    @property
    def rss_growth_after_warm_up_kib(self) -> int:
        """Last sample minus the warm-up sample (:data:`WARM_UP_SAMPLE`); 0 with too few."""
        if len(self.rss_samples_kib) <= WARM_UP_SAMPLE:
            return 0
        return self.rss_samples_kib[-1][1] - self.rss_samples_kib[WARM_UP_SAMPLE][1]

    @property
    def ok(self) -> bool:
        return (self.alive and self.valid_answered == self.valid_sent
                and self.rejections == self.messages and not self.findings)

    def render(self) -> str:
        rss = [kib for _, kib in self.rss_samples_kib]
        lines = [f"engine flood: {self.messages} malformed messages ({self.pool} distinct) in "
                 f"{self.seconds:.1f} s, {self.rate:,.0f} messages/s",
                 f"  valid ADDs answered   {self.valid_answered}/{self.valid_sent}",
                 f"  engine rejections     {self.rejections} "
                 f"({len(self.violation_counts)} clauses)",
                 f"  engine alive          {'yes' if self.alive else 'NO'}"]
        if rss:
            warm = (self.rss_samples_kib[WARM_UP_SAMPLE] if len(rss) > WARM_UP_SAMPLE
                    else self.rss_samples_kib[0])
            lines += [f"  engine RSS first      {rss[0]} KiB",
                      f"  engine RSS warm-up    {warm[1]} KiB (after {warm[0]} messages)",
                      f"  engine RSS peak       {max(rss)} KiB",
                      f"  engine RSS last       {rss[-1]} KiB",
                      f"  growth after warm-up  {self.rss_growth_after_warm_up_kib} KiB",
                      "  RSS series (messages:KiB) " + " ".join(
                          f"{sent}:{kib}" for sent, kib in self.rss_samples_kib)]
        for clause, count in sorted(self.violation_counts.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {count:>9}  {clause}")
        lines += [f"  finding: {text}" for text in self.findings[:20]]
        lines.append("ok" if self.ok else "FAILED")
        return "\n".join(lines)


def _pool(seed: int, size: int) -> list[tuple[str, list[bytes]]]:
    """``size`` distinct malformed input messages plus the hostile payloads, each confirmed to
    be a typed error when decoded here."""
    from enginewire.reference.codec import Codec
    from enginewire.reference.errors import ProtocolError

    cases = MalformedCases(random.Random(seed))
    codec = Codec(tensors="wire")
    seen: set[tuple[bytes, ...]] = set()
    pool: list[tuple[str, list[bytes]]] = []
    for kind, frames in hostile_inputs():
        seen.add(tuple(frames))
        pool.append((kind, frames))
    attempts = 0
    while len(pool) < size + 2 and attempts < 4 * size:
        attempts += 1
        ((kind, frames),) = cases.draw(INPUT_KINDS, 1)
        if tuple(frames) in seen:
            continue
        try:
            codec.decode(kind, frames)
        except ProtocolError:
            seen.add(tuple(frames))
            pool.append((kind, frames))
            continue
        raise AssertionError(f"a malformed {kind} decoded without a ProtocolError: {frames!r}")
    return pool


def run_flood(messages: int, seed: int = 0, *, pool_size: int = DEFAULT_POOL,
              check_every: int = 10_000, sample_every: int = 50_000, timeout: float = 30.0,
              progress: bool = False) -> FloodReport:
    """Send ``messages`` malformed messages to a live reference engine; see the module
    docstring."""
    from enginewire.reference.engine import EngineOptions, spawn_engine
    from enginewire.reference.frontend import ReferenceFrontend
    from enginewire.reference.ring.clean import clean

    report = FloodReport()
    pool = _pool(seed, pool_size)
    report.pool = len(pool)
    with ReferenceFrontend(1) as frontend:
        engine = spawn_engine(EngineOptions(handshake_address=frontend.handshake_address),
                              stderr=subprocess.DEVNULL)
        try:
            frontend.wait_ready(30.0)

            def check(tag: str) -> None:
                report.valid_sent += 1
                problem = serve_check(frontend, timeout, tag)
                if problem is None:
                    report.valid_answered += 1
                else:
                    report.findings.append(f"after {report.messages} messages: {problem}")

            def sample() -> None:
                report.rss_samples_kib.append((report.messages, rss_kib(engine.pid)))
                if progress:
                    print(f"  {report.messages:>9} messages  engine RSS "
                          f"{report.rss_samples_kib[-1][1]} KiB  "
                          f"{time.monotonic() - started:.0f} s", flush=True)

            check("warm-up")
            started = time.monotonic()
            sample()
            raw = [frames for _, frames in pool]
            send = frontend.send_raw
            while report.messages < messages and not report.findings:
                chunk = min(check_every - report.messages % check_every,
                            sample_every - report.messages % sample_every,
                            messages - report.messages)
                start = report.messages
                for index in range(start, start + chunk):
                    send(0, raw[index % len(raw)])
                report.messages += chunk
                if report.messages % check_every == 0 or report.messages == messages:
                    check(str(report.messages))
                    if not engine.alive():
                        report.findings.append(
                            f"the engine process died after {report.messages} messages")
                if report.messages % sample_every == 0 or report.messages == messages:
                    sample()
            report.seconds = time.monotonic() - started
            report.alive = engine.alive()
            if report.alive:
                report.violation_counts = dict(
                    frontend.call_utility("get_violation_counts", timeout=timeout))
        finally:
            engine.stop(10.0)
    clean()
    return report

