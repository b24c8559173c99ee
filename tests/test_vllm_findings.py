"""The vLLM findings (docs/vllm-findings/): every runnable reproduction still reproduces.

Each ``NNN-name.py`` there is a standalone script that exits 1 while its bug reproduces on the
installed vLLM, 0 once fixed, 2 when the reproduction itself failed. These tests import vLLM
once in a subprocess that forks a child per script (``run_all.run_forked``, JOBS at a time:
about 25 s) and assert exit 1 for each; and, for the findings in STAND_IN_FIXES, exit 0 with a
stand-in fix patched into vLLM in the child, so no script is wired to exit 1. A finding that
stops reproducing fails here: move it to "fixed in" (see docs/vllm-findings/index.md). Each
script in a fresh interpreter, as a vLLM developer runs it (10 to 30 s of import per script,
too slow for the default suite), is ``bash scripts/vllm-findings.sh``, a CI step. The index
and the reports are checked against the scripts and the spec without vLLM.
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
#: Forked reproductions run at once. Most of a run is waiting (a reproduction watches for
#: 3 s that something does not happen), so more than the cores: 8 took ~13 s for the 34
#: runs on 2 loaded cores where 4 took ~17 s, each run no slower.
JOBS = 8

#: The runnable reproductions; a finding vLLM fixed keeps its script as NNN-name.fixed.py.
SCRIPTS = sorted(p for p in FINDINGS.glob("[0-9][0-9][0-9]-*.py")
                 if not p.name.endswith(".fixed.py"))
FIXED = sorted(FINDINGS.glob("[0-9][0-9][0-9]-*.fixed.py"))
REPORTS = sorted(FINDINGS.glob("[0-9][0-9][0-9]-*.md"))


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


@pytest.mark.vllm
@pytest.mark.parametrize("script", SCRIPTS, ids=_ids(SCRIPTS))
def test_reproduces_forked(runs: dict[str, Any], script: Path) -> None:
    outcome = runs["as is"][script.name]
    assert outcome["code"] == 1, (
        f"{script.name}: {outcome['verdict']} (exit {outcome['code']}, expected 1: the bug "
        f"reproduces). Exit 0 means the installed vLLM fixed it: record the version in "
        f"{script.stem}.md and index.md.\n{outcome['output'][-3000:]}")
    assert re.search(r"^BUG: ", outcome["output"], re.MULTILINE), outcome["output"][-3000:]


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


# --- each reproduction can also say "fixed" ------------------------------------------------
# A stand-in fix for some findings, patched into vLLM in the forked child before the script
# runs: the script must then exit 0. This proves the scripts are not wired to exit 1.

_FIX_STRAY_REPLY = """
from vllm.v1.engine import core_client
_original = core_client._process_utility_output
def _process_utility_output(output, utility_results):
    if output.call_id in utility_results:  # a stray reply is dropped
        _original(output, utility_results)
core_client._process_utility_output = _process_utility_output
"""

_FIX_WAIT_UNTIL_READY = """
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
_original = MessageQueue.wait_until_ready
def wait_until_ready(self, timeout=None):
    if timeout is not None and self._is_writer:
        if not self.local_socket.poll(int(timeout * 1000)):
            raise TimeoutError("no reader subscribed")
    return _original(self)
MessageQueue.wait_until_ready = wait_until_ready
"""

_FIX_MM_FACTORY = """
from vllm.v1.serial_utils import MsgpackDecoder
_original = MsgpackDecoder._decode_mm_field_elem
def _decode_mm_field_elem(self, obj):
    if obj["field"][0] not in ("batched", "flat", "shared"):
        raise ValueError(f"unknown multimodal field factory {obj['field'][0]!r}")
    return _original(self, obj)
MsgpackDecoder._decode_mm_field_elem = _decode_mm_field_elem
"""

_FIX_TENSOR_CHECKS = """
import numpy as np
import torch
from vllm.v1.serial_utils import MsgpackDecoder
_TORCH = {str(d).removeprefix("torch."): d for d in vars(torch).values()
          if isinstance(d, torch.dtype)}
def _check(self, arr, numpy):
    dtype, shape, data = arr
    if numpy:
        try:
            ok = isinstance(dtype, str) and np.dtype(dtype).str == dtype
        except TypeError:
            ok = False
    else:
        ok = dtype in _TORCH
    if not ok:
        raise ValueError(f"dtype {dtype!r}")
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
        raise ValueError(f"shape {shape!r}")
    if type(data) is int:
        if not 1 <= data < len(self.aux_buffers):
            raise ValueError(f"index {data!r}")
    elif not isinstance(data, (memoryview, dict)):
        raise ValueError(f"data of type {type(data).__name__}")
_tensor, _ndarray = MsgpackDecoder._decode_tensor, MsgpackDecoder._decode_ndarray
def _decode_tensor(self, arr):
    _check(self, arr, False)
    return _tensor(self, arr)
def _decode_ndarray(self, arr):
    _check(self, arr, True)
    return _ndarray(self, arr)
MsgpackDecoder._decode_tensor, MsgpackDecoder._decode_ndarray = _decode_tensor, _decode_ndarray
"""

_FIX_UTILITY_TENSORS = """
import torch
from vllm.v1.engine.core_client import AsyncMPClient
_original = AsyncMPClient._call_utility_async
async def _call_utility_async(self, method, *args, engine):
    if any(isinstance(arg, torch.Tensor) for arg in args):
        raise TypeError("utility arguments cannot carry tensors")
    return await _original(self, method, *args, engine=engine)
AsyncMPClient._call_utility_async = _call_utility_async
"""

_FIX_DROP_BAD_OUTPUT = """
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.serial_utils import MsgpackDecoder
_original = MsgpackDecoder.decode
def decode(self, bufs):
    try:
        return _original(self, bufs)
    except Exception:
        if self.decoder.type is EngineCoreOutputs:
            return EngineCoreOutputs()  # the bad message is dropped; the task goes on
        raise
MsgpackDecoder.decode = decode
"""

_FIX_FRAME_ACCOUNTING = """
from vllm.v1.serial_utils import MsgpackDecoder
_tensor, _ndarray, _decode = (MsgpackDecoder._decode_tensor, MsgpackDecoder._decode_ndarray,
                              MsgpackDecoder.decode)
def _note(self, arr):
    if type(arr[2]) is int:
        if arr[2] in self._used:
            raise ValueError(f"frame {arr[2]} named twice")
        self._used.append(arr[2])
def _decode_tensor(self, arr):
    _note(self, arr)
    return _tensor(self, arr)
def _decode_ndarray(self, arr):
    _note(self, arr)
    return _ndarray(self, arr)
def decode(self, bufs):
    self._used = []
    value = _decode(self, bufs)
    if isinstance(bufs, (list, tuple)) and sorted(self._used) != list(range(1, len(bufs))):
        raise ValueError(f"frames {sorted(set(range(1, len(bufs))) - set(self._used))} unused")
    return value
MsgpackDecoder._decode_tensor, MsgpackDecoder._decode_ndarray = _decode_tensor, _decode_ndarray
MsgpackDecoder.decode = decode
"""

_FIX_DECODER_ASSERTS = """
from vllm.v1.serial_utils import MsgpackDecoder
_tensor, _nested = MsgpackDecoder._decode_tensor, MsgpackDecoder._decode_nested_tensors
def _decode_tensor(self, arr):
    if isinstance(arr[2], dict) and self.oob_tensor_provider is None:
        raise ValueError("a tensor IPC handle, and this decoder has no tensor queue")
    return _tensor(self, arr)
def _decode_nested_tensors(self, obj):
    if isinstance(obj, bool):
        raise TypeError("a bool is not a nested_tensors value")
    return _nested(self, obj)
MsgpackDecoder._decode_tensor = _decode_tensor
MsgpackDecoder._decode_nested_tensors = _decode_nested_tensors
"""

_FIX_GUARD_PORT_HOLDER = """
import psutil
from vllm.entrypoints.launchers import launcher
_original = launcher.find_process_using_port
class _Guarded:  # serve_http's process.cmdline(), guarded
    def __init__(self, process):
        self._process = process
    def __str__(self):
        return str(self._process)
    def cmdline(self):
        try:
            return self._process.cmdline()
        except psutil.Error:
            return ["(exited)"]
def find_process_using_port(port):
    process = _original(port)
    return None if process is None else _Guarded(process)
launcher.find_process_using_port = find_process_using_port
"""

#: Finding number -> the source of a stand-in fix.
STAND_IN_FIXES = {
    "002": _FIX_STRAY_REPLY, "003": _FIX_DROP_BAD_OUTPUT, "010": _FIX_WAIT_UNTIL_READY,
    "012": _FIX_MM_FACTORY, "014": _FIX_TENSOR_CHECKS, "015": _FIX_TENSOR_CHECKS,
    "016": _FIX_FRAME_ACCOUNTING, "017": _FIX_FRAME_ACCOUNTING, "018": _FIX_TENSOR_CHECKS,
    "020": _FIX_UTILITY_TENSORS, "024": _FIX_DECODER_ASSERTS, "025": _FIX_GUARD_PORT_HOLDER,
}

_RUN = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, sys.argv[1])
import run_all
run_all.preload()
scripts, fixes, timeout = json.loads(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
JOBS = int(sys.argv[5])
jobs = [("as is", name, None) for name in scripts] + [
    ("with a stand-in fix", name, source) for name, source in fixes.items()]

def run(job):
    kind, name, source = job
    prepare = None if source is None else (lambda: exec(source, {}))
    outcome = run_all.run_forked(run_all.HERE / name, timeout, prepare=prepare)
    return kind, name, {"code": outcome.code, "verdict": outcome.verdict,
                        "output": outcome.output}

outcomes = {"as is": {}, "with a stand-in fix": {}}
with ThreadPoolExecutor(max_workers=JOBS) as pool:
    for kind, name, outcome in pool.map(run, jobs):
        outcomes[kind][name] = outcome
print(json.dumps(outcomes))
"""


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    """Every script as is, and those with a stand-in fix patched into vLLM, in one process
    that imports vLLM once and forks a child per run (JOBS at a time):
    {"as is" | "with a stand-in fix": {script name: outcome}}."""
    fixes = {script.name: STAND_IN_FIXES[script.name[:3]] for script in SCRIPTS
             if script.name[:3] in STAND_IN_FIXES}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(FINDINGS), json.dumps([s.name for s in SCRIPTS]),
         json.dumps(fixes), str(TIMEOUT_S), str(JOBS)],
        capture_output=True, text=True, timeout=TIMEOUT_S * 3,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
@pytest.mark.parametrize("number", sorted(STAND_IN_FIXES))
def test_reproduction_exits_0_on_a_fixed_vllm(runs: dict[str, Any], number: str) -> None:
    fixed = runs["with a stand-in fix"]
    [name] = [n for n in fixed if n.startswith(number)]
    outcome = fixed[name]
    assert outcome["code"] == 0, f"{name} with a stand-in fix: exit {outcome['code']}\n" + \
        outcome["output"][-3000:]
    assert re.search(r"^fixed: ", outcome["output"], re.MULTILINE), outcome["output"][-3000:]


def test_index_explains_every_expected_vllm_failure() -> None:
    """Each check vLLM 0.33.0 is expected to fail names the finding that explains it."""
    expected = Path(__file__).resolve().parent.parent / "conformance" / "data" / "expected"
    index = (FINDINGS / "index.md").read_text()
    checks = [line.split("#")[0].strip()
              for line in (expected / "vllm-0.33.0.txt").read_text().splitlines()]
    checks = [check for check in checks if check]
    assert len(checks) >= 20, checks
    missing = [check for check in checks if f"`{check}`" not in index]
    assert not missing, f"index.md names no finding for the expected failures {missing}"


def _runner_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_findings_run_all", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("code", "status", "says"), [
    (1, 0, "1 of 1 reproductions reproduce"),
    (0, 1, "no longer reproduces on the installed vLLM: record that version"),
    (2, 1, "BROKEN (exit 2)"),
    (None, 1, "BROKEN (timed out)"),
])
def test_runner_passes_only_while_every_finding_reproduces(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        code: int | None, status: int, says: str) -> None:
    """run_all.py's verdicts, with each script's exit status stood in (no vLLM needed)."""
    run_all = _runner_module()
    script = SCRIPTS[0]
    monkeypatch.setattr(run_all, "run_fresh", lambda path, timeout, options=(): run_all.Outcome(
        path, code, 0.1, "BUG: stood in\n" if code == 1 else "fixed: stood in\n"))
    assert run_all.main([script.name[:3]]) == status
    assert says in capsys.readouterr().out


#: The engine findings whose scripts also run on vLLM's live engine core (``--launched``).
LAUNCHED = ("004", "005", "006", "007", "008", "019")


def test_launched_mode_is_offered_by_exactly_the_engine_findings() -> None:
    runner = _runner_module()
    offered = {p.name[:3] for p in SCRIPTS if runner.LAUNCHED_MARK in p.read_text()}
    assert offered == set(LAUNCHED)
    assert not (FINDINGS / "launched_engine.py").read_text().count("enginewire")


@pytest.mark.slow
@pytest.mark.vllm
def test_engine_findings_reproduce_on_a_launched_engine_core(tmp_path: Path) -> None:
    """Each of the six, with --launched, on vLLM's real engine core process (one launch per
    message, fork): exit 1 with a verdict naming the launched process."""
    report = tmp_path / "launched.json"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--fork", "--launched", "--jobs", "2", "--json",
         str(report)], capture_output=True, text=True, timeout=TIMEOUT_S * 3)
    outcomes = json.loads(report.read_text())
    assert sorted(name[:3] for name in outcomes) == list(LAUNCHED)
    for name, outcome in outcomes.items():
        assert outcome["code"] == 1, (name, outcome["output"][-3000:])
        assert re.search(r"^BUG: .*engine core process", outcome["output"], re.MULTILINE), \
            outcome["output"][-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:]
