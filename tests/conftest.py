"""Project-wide test configuration.

- Says loudly, at the top and at the end of the run, when vLLM is not installed: the interop
  and drift tests then skip, and a green run proves much less.
- Fails the session if it leaves shared-memory segments or enginewire ipc socket files behind.
- Runs vLLM on its CPU platform (``VLLM_TARGET_DEVICE=cpu``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM_DIR = Path("/dev/shm")

# vLLM resolves its platform once, the first time any of its modules asks; its engine core runs
# on the CPU platform (conformance/targets/vllm/engine_core.py), so say so before any test
# imports vLLM.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _vllm_version() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return "unknown"


_MISSING_VLLM = (
    "vLLM IS NOT INSTALLED: every interop and drift test (marked 'vllm') is SKIPPED. "
    "Install it with: bash scripts/install-vllm.sh"
)


def pytest_report_header(config: pytest.Config) -> str:
    found = _vllm_version()
    return f"vllm: {found}" if found else f"!!! {_MISSING_VLLM}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _vllm_version() is None:
        terminalreporter.write_sep("!", _MISSING_VLLM, red=True, bold=True)


def _shm_segments() -> set[str]:
    if not SHM_DIR.is_dir():
        return set()
    return {name for name in os.listdir(SHM_DIR) if not name.startswith("sem.")}


def _mapped_shm_segments() -> set[str]:
    """Names of /dev/shm segments that a live process other than this one still maps."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if maps.parent.name == str(os.getpid()):
            continue
        try:
            text = maps.read_text()
        except OSError:
            continue
        mapped.update(m.group(1) for m in re.finditer(r" /dev/shm/(\S+)", text))
    return mapped


def _orphaned_new_segments(before: set[str]) -> list[str]:
    """New segments that no live process maps, still there after a short grace period.

    A segment another test run on the same machine is using is mapped by that run's processes,
    so it is not counted against this run; one nobody maps is a leak, whoever made it.
    """
    suspects = _shm_segments() - before
    for _ in range(3):
        if not suspects:
            break
        suspects &= _shm_segments()
        suspects -= _mapped_shm_segments()
        time.sleep(0.2)
    return sorted(suspects & _shm_segments())


def _ipc_files(root: Path) -> set[str]:
    return {p.name for p in root.glob("enginewire-*") if p.is_socket()}


@pytest.fixture(scope="session", autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fail the run if shared memory or ipc socket files outlive the tests that made them.

    The session gets a temp directory of its own (``TMPDIR``, inherited by child processes), so
    ipc files are counted for this run only, even while another test run shares the machine.
    """
    session_tmp = Path(tempfile.mkdtemp(prefix="ew-"))
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(session_tmp)
    tempfile.tempdir = None
    shm_before = _shm_segments()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved
        tempfile.tempdir = None
    leaked_shm = _orphaned_new_segments(shm_before)
    leaked_ipc = sorted(_ipc_files(session_tmp))
    if not leaked_ipc:
        shutil.rmtree(session_tmp, ignore_errors=True)
    assert not leaked_shm, f"shared-memory segments left in /dev/shm: {leaked_shm}"
    assert not leaked_ipc, f"ipc socket files left behind: {leaked_ipc}"
