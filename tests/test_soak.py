"""A short ``enginewire soak``: live peers keep serving through malformed traffic and report
every malformed case as a typed error; killed ring processes are noticed and cleaned up; an
engine flood (``--engine-flood``) leaves the engine serving and counting every message."""

from __future__ import annotations

from enginewire.fuzz.flood import FloodReport, run_flood
from enginewire.fuzz.soak import SoakReport, run_soak


def test_a_short_soak_is_clean() -> None:
    report = run_soak(2.0, seed=3, batch=4, timeout=20.0, ring_every=1)
    assert report.rounds >= 1 and report.cases > 0
    assert report.crashes == 0 and report.hangs == 0, report.findings
    assert report.typed_errors == report.cases
    assert report.ring_kills >= 1 and report.peer_dead_detected == report.ring_kills
    assert report.leftovers == 0
    assert report.ok


def test_the_report_fails_on_any_crash_hang_or_leftover() -> None:
    assert SoakReport().ok
    assert not SoakReport(crashes=1).ok
    assert not SoakReport(hangs=1).ok
    assert not SoakReport(leftovers=1).ok
    assert "FAILED" in SoakReport(hangs=1).render()


def test_an_engine_flood_keeps_the_engine_serving() -> None:
    """20,000 malformed messages at one engine: it stays alive, answers the valid ADD sent
    every 5,000, and counts every malformed message as a rejection (RSS is measured by the
    full run, docs/hardening.md, never asserted)."""
    report = run_flood(20_000, seed=3, pool_size=200, check_every=5_000, sample_every=10_000)
    # Hypothesis's example() draws from a bounded batch, so how many of the 200 asked-for cases
    # are distinct varies from run to run; the flood needs some beyond the two hostile payloads.
    assert report.messages == 20_000 and report.pool > 2
    assert report.alive, report.findings
    assert report.valid_sent == 5 and report.valid_answered == report.valid_sent, report.findings
    assert report.rejections == report.messages, report.violation_counts
    assert len(report.rss_samples_kib) == 3 and all(kib > 0 for _, kib in report.rss_samples_kib)
    assert report.ok
    assert "FAILED" in FloodReport(messages=1).render()
