"""A short ``enginewire soak``: live peers keep serving through malformed traffic and report
every malformed case as a typed error; killed ring processes are noticed and cleaned up."""

from __future__ import annotations

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
