"""The vLLM findings (docs/vllm-findings/): every runnable reproduction still reproduces.

Each ``NNN-name.py`` there is a standalone script that exits 1 while its bug reproduces on the
installed vLLM, 0 once fixed, 2 when the reproduction itself failed. The fast test runs them
all through ``run_all.py --fork`` (vLLM imported once, one forked child per script, 4 at a
time: about a minute) and asserts exit 1 for each; the ``slow`` test runs each in a fresh
interpreter, exactly as a vLLM developer would (10 to 30 s of import per script). A finding
that stops reproducing fails here: move it to "fixed in" (see docs/vllm-findings/index.md).
The index and the reports are checked against the scripts without vLLM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "vllm-findings"
RUNNER = FINDINGS / "run_all.py"
#: Findings with a report but no runnable script, and why (the index says the same).
NOT_RUNNABLE = {"011": "weak memory model only: reproduced by enginewire explore, not on x86"}
#: Seconds one reproduction may take (importing vLLM on a loaded 2-core machine is slow).
TIMEOUT_S = 300

#: The runnable reproductions; a finding vLLM fixed keeps its script as NNN-name.fixed.py.
SCRIPTS = sorted(p for p in FINDINGS.glob("[0-9][0-9][0-9]-*.py")
                 if not p.name.endswith(".fixed.py"))
FIXED = sorted(FINDINGS.glob("[0-9][0-9][0-9]-*.fixed.py"))
REPORTS = sorted(FINDINGS.glob("[0-9][0-9][0-9]-*.md"))


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


@pytest.fixture(scope="module")
def forked_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``run_all.py --fork`` over every script; {script name: outcome}."""
    out = tmp_path_factory.mktemp("findings") / "outcomes.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--fork", "--jobs", "4", "--timeout", str(TIMEOUT_S),
         "--json", str(out)],
        capture_output=True, text=True, timeout=TIMEOUT_S * 3,
    )
    assert out.exists(), f"the runner wrote no outcomes:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(out.read_text())


@pytest.mark.vllm
@pytest.mark.parametrize("script", SCRIPTS, ids=_ids(SCRIPTS))
def test_reproduces_forked(forked_run: dict[str, Any], script: Path) -> None:
    outcome = forked_run[script.name]
    assert outcome["code"] == 1, (
        f"{script.name}: {outcome['verdict']} (exit {outcome['code']}, expected 1: the bug "
        f"reproduces). Exit 0 means the installed vLLM fixed it: record the version in "
        f"{script.stem}.md and index.md.\n{outcome['output'][-3000:]}")
    assert re.search(r"^BUG: ", outcome["output"], re.MULTILINE), outcome["output"][-3000:]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=_ids(SCRIPTS))
def test_reproduces_standalone(script: Path) -> None:
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 1, (
        f"{script.name} exited {proc.returncode}, expected 1:\n{proc.stdout}\n{proc.stderr}")


def test_every_report_has_a_script_or_a_reason() -> None:
    numbers = {p.name[:3] for p in SCRIPTS + FIXED}
    for report in REPORTS:
        number = report.name[:3]
        assert number in numbers or number in NOT_RUNNABLE, f"{report.name} has no script"
        if number in numbers:
            assert any((FINDINGS / f"{report.stem}{suffix}").exists()
                       for suffix in (".py", ".fixed.py")), f"{report.stem}.py is missing"
    stems = {p.name.removesuffix(".fixed.py").removesuffix(".py") for p in SCRIPTS + FIXED}
    assert stems <= {p.stem for p in REPORTS}, "a script has no report"


def test_reports_quote_clauses_cite_source_and_have_every_section() -> None:
    from enginewire.spec import load

    spec = load()
    for report in REPORTS:
        text = report.read_text()
        named = set(re.findall(r"^`([a-z_]+\.[a-z0-9_.-]+)` \((?:MUST|SHOULD|MAY)\):$", text,
                               re.MULTILINE))
        assert named, f"{report.name} quotes no spec clause"
        unknown = named - set(spec.clauses)
        assert not unknown, f"{report.name} names unknown clauses {unknown}"
        for clause_id in named:
            assert f"> {spec.clause(clause_id).text}" in text, (
                f"{report.name} does not quote the text of {clause_id} as the spec has it")
        for heading in ("## Expected behaviour", "## What vLLM 0.33.0 does", "## Impact",
                        "## Reproduction", "**Fixed in:**"):
            assert heading in text, f"{report.name} lacks {heading!r}"
        assert re.search(r"`[a-z0-9_/]+\.py:\d+", text), f"{report.name} cites no vLLM source line"


def test_index_lists_every_finding() -> None:
    index = (FINDINGS / "index.md").read_text()
    for report in REPORTS:
        assert f"]({report.name})" in index, f"index.md does not link {report.name}"
        if report.name[:3] in NOT_RUNNABLE:
            continue
        assert f"]({report.stem}.py)" in index or f"]({report.stem}.fixed.py)" in index, (
            f"index.md does not link {report.stem}.py")
