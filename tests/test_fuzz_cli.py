"""``enginewire fuzz`` and the campaign runner: codec findings, replay, hangs, engine robustness.

The broken targets below are in-process objects (``--target test_fuzz_cli:BROKEN``), each with
one deliberate defect the campaign must report; the engine campaign runs the reference engine in
a thread against the reference front end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from enginewire.cli import main
from enginewire.conformance.targets.contract import EngineLaunch
from enginewire.fuzz.campaigns import (
    CaseTimeout,
    CodecCampaign,
    EngineCampaign,
    Outcome,
    call_with_timeout,
    fuzz_codec,
    fuzz_engine,
    judge,
)
from enginewire.fuzz.strategies import Malformed
from enginewire.reference import codec
from enginewire.reference.engine import EngineOptions, ReferenceEngine


class _BrokenCodec:
    """The reference codec with two defects: an untyped IndexError for an abort with an extra
    frame, and a hang on an altered ENGINE_CORE_DEAD literal."""

    def decode(self, kind: str, frames: list[bytes]) -> Any:
        if kind == "abort" and len(frames) > 2:
            raise IndexError("list index out of range")
        if kind == "engine_core_dead" and frames and bytes(frames[0]) != b"ENGINE_CORE_DEAD":
            time.sleep(0.5)
        return codec.decode(kind, frames)


class _BrokenTarget:
    codec = _BrokenCodec()


BROKEN = _BrokenTarget()


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_reference_codec_campaign_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["fuzz", "--target", "reference", "--kind", "abort", "--kind",
                   "engine_core_dead", "--kind", "coordinator_ready", "--max-examples", "15",
                   "--no-database", "--seed", "1"])
    out = capsys.readouterr().out
    assert _last_line(out) == "45 cases, 0 findings"
    assert status == 0


def test_findings_are_reported_minimized_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["fuzz", "--target", f"{__name__}:BROKEN", "--kind", "abort", "--max-examples", "25",
            "--database", str(tmp_path / "db"), "--seed", "3"]
    assert main(argv) == 1
    first = capsys.readouterr().out
    assert "untyped-error" in first and "IndexError" in first
    assert "mutation extra-frame" in first
    assert _last_line(first).endswith("1 findings")
    # The minimal input: the type frame, an abort of one empty id, one empty extra frame.
    assert "frame 0: 01\n  frame 1: 91a0\n  frame 2: (empty)" in first

    assert main([*argv[:-2], "--seed", "4", "--max-examples", "1"]) == 1
    replay = capsys.readouterr().out
    assert "frame 0: 01\n  frame 1: 91a0\n  frame 2: (empty)" in replay


def test_hang_is_a_finding(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["fuzz", "--target", f"{__name__}:BROKEN", "--kind", "engine_core_dead",
                   "--max-examples", "20", "--no-database", "--timeout", "0.1", "--seed", "5"])
    out = capsys.readouterr().out
    assert status == 1
    assert "engine_core_dead: hang" in out


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--target", "no-such-target"]) == 2
    assert main(["fuzz", "--kind", "no_such_kind"]) == 2
    assert main(["fuzz", "--target", f"{__name__}:BROKEN", "--surface", "engine"]) == 2
    err = capsys.readouterr().err
    assert "does not implement engine" in err


def test_judge_classifies() -> None:
    case = Malformed(kind="abort", frames=(b"\x01", b"\x91\xa1x", b"x"),
                     clause="frames.untyped-payload-no-oob", description="extra frame",
                     mutation="extra-frame")
    assert judge(codec.decode, case).status == "rejected"
    assert judge(lambda k, f: None, case) == Outcome("accepted")
    assert judge(_BrokenCodec().decode, case).status == "untyped-error"
    wrong = Malformed(kind="abort", frames=case.frames, clause="frames.frame-count",
                      description="", mutation="extra-frame")
    assert judge(codec.decode, wrong).got == "frames.untyped-payload-no-oob"
    with pytest.raises(CaseTimeout):
        call_with_timeout(lambda: time.sleep(0.3), 0.05)


def test_strict_counts_accepted_cases() -> None:
    report = fuzz_codec(lambda kind, frames: None, ["abort"],
                        CodecCampaign(target_name="lenient", max_examples=10, strict=True,
                                      seed=0))
    assert report.findings and all(f.problem == "accepted" for f in report.findings)
    lenient = fuzz_codec(lambda kind, frames: None, ["abort"],
                         CodecCampaign(target_name="lenient", max_examples=10, seed=0))
    assert not lenient.findings and lenient.accepted == lenient.cases == 10


# --- engine -----------------------------------------------------------------------------------


class _FragileEngine(ReferenceEngine):
    """Dies (ENGINE_CORE_DEAD) on the first malformed message instead of serving on."""

    def _violation(self, error: BaseException, what: str) -> None:
        super()._violation(error, what)
        self.request_death()


class _ThreadPeer:
    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine
        self.thread = threading.Thread(target=engine.run, name="fuzz-engine", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self.engine.request_stop()
        self.thread.join(timeout)


class _ThreadedEngines:
    """An engine surface running reference engines in threads of this process."""

    def __init__(self, engine_class: type[ReferenceEngine] = ReferenceEngine) -> None:
        self.engine_class = engine_class
        self.peers: list[_ThreadPeer] = []

    def start_engine(self, launch: EngineLaunch) -> _ThreadPeer:
        options = EngineOptions(handshake_address=launch.handshake_address,
                                rank=launch.engine_index, local=launch.local,
                                headless=launch.headless, handshake_timeout=10.0)
        peer = _ThreadPeer(self.engine_class(options))
        self.peers.append(peer)
        return peer


def test_reference_engine_keeps_serving() -> None:
    engines = _ThreadedEngines()
    report = fuzz_engine(engines, EngineCampaign(target_name="reference-thread", max_examples=4,
                                                 seed=2, timeout=5.0))
    assert report.findings == []
    assert report.cases >= 4
    assert not any(p.alive() for p in engines.peers)


def test_engine_that_dies_on_garbage_is_a_finding() -> None:
    engines = _ThreadedEngines(_FragileEngine)
    report = fuzz_engine(engines, EngineCampaign(target_name="fragile-thread", max_examples=4,
                                                 seed=2, timeout=3.0))
    assert len(report.findings) == 1
    finding = report.findings[0]
    assert finding.surface == "engine" and finding.problem == "stopped-serving"
    assert "ENGINE_CORE_DEAD" in (finding.message or "")
    # Reduced to the single message that kills it.
    assert finding.minimized and len(finding.frames) == 1
    assert not any(p.alive() for p in engines.peers)
