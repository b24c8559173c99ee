"""The conformance suite against vLLM 0.33.0 itself (its codec, MessageQueue, executor RPC and
front-end client): every deviation is recorded in conformance/data/expected/vllm-0.33.0.txt,
the list is exact, and docs/conformance-vllm.md is what the run produces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ci_reports import recorded

vllm = pytest.importorskip("vllm")

from enginewire.cli import main  # noqa: E402
from enginewire.conformance.framework.outcomes import FAILED, NOT_APPLICABLE, PASSED  # noqa: E402
from enginewire.conformance.framework.registry import all_checks, select  # noqa: E402
from enginewire.conformance.framework.runner import run  # noqa: E402
from enginewire.conformance.targets.resolve import load_target  # noqa: E402
from enginewire.spec import load  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXPECTED = "conformance/data/expected/vllm-0.33.0.txt"
PAGE = "docs/conformance-vllm.md"

pytestmark = pytest.mark.vllm


def test_vllm_matches_its_expected_failure_list_and_published_page(
        capsys: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole suite, strict, against vLLM: exit 0 against the expected-failure list, and
    the Markdown page it writes is the one in docs/ (regenerate it with the same command)."""
    monkeypatch.chdir(REPO)
    ran = recorded("vllm-check")  # the run .ci/run made, if it made one (see ci_reports.py)
    if ran is not None:
        page, page_as_given = ran.path("conformance-vllm.md"), f"{ran.folder}/conformance-vllm.md"
        code, out = ran.returncode, ran.output
    else:
        page = tmp_path / "conformance-vllm.md"
        page_as_given = str(page)
        code = main(["check", "--target", "vllm", "--strict", "--no-progress",
                     "--expected-failures", EXPECTED, "--markdown", str(page)])
        out = capsys.readouterr().out
    assert code == 0, out[-4000:]
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "not applicable" in lines["frontend"]
    assert "0 failed" not in lines["frontend"]
    published = (REPO / PAGE).read_text(encoding="utf-8")
    generated = page.read_text(encoding="utf-8").replace(page_as_given, PAGE)
    assert generated == published, (
        f"{PAGE} is out of date; regenerate it with: enginewire check --target vllm --strict "
        f"--expected-failures {EXPECTED} --markdown {PAGE}")


def test_vllm_negative_index_deviation_is_caught() -> None:
    checks = select(all_checks(), patterns=["codec/tensor/index-negative-rejected",
                                            "codec/tensor/inline-threshold-exact"])
    result = run(checks, load_target("vllm"), load())
    verdicts = {r.check.id: r.status for r in result.results}
    assert verdicts == {"codec/tensor/index-negative-rejected": FAILED,
                        "codec/tensor/inline-threshold-exact": PASSED}


def test_vllm_front_end_runs_without_its_handshake_channel() -> None:
    """vLLM's AsyncMPClient serves the suite's engines; handshake checks do not apply."""
    checks = select(all_checks(), patterns=["frontend/requests/routed-to-engine",
                                            "frontend/handshake/every-engine-ready",
                                            "frontend/handshake/init-answers-hello",
                                            "frontend/utility/stray-reply"])
    target = load_target("vllm")
    try:
        result = run(checks, target, load())
    finally:
        target.close()
    verdicts = {r.check.id: r.status for r in result.results}
    assert verdicts == {
        "frontend/requests/routed-to-engine": PASSED,
        "frontend/handshake/every-engine-ready": PASSED,
        "frontend/handshake/init-answers-hello": NOT_APPLICABLE,
        # vLLM deviation (handshake.session.reply-known-call-id).
        "frontend/utility/stray-reply": FAILED,
    }
    assert result.count(PASSED) == 2
