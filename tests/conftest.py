"""Project-wide test configuration.

- Says loudly, at the top and at the end of the run, when vLLM is not installed: the interop
  and drift tests then skip, and a green run proves much less.
- Fails the session if it leaves shared-memory segments or enginewire ipc socket files behind.
- Fails a test (and a module, for its module-scoped fixtures) that leaves a thread alive after
  its teardown: a non-daemon thread, whoever started it, or any thread this repository's code
  started (``_leftover_threads``).
- Runs vLLM on its CPU platform (``VLLM_TARGET_DEVICE=cpu``).
- Runs the tests on as many pytest-xdist workers as the process may use cores, at most
  :data:`WORKERS_AT_MOST` (``-n auto`` in pyproject.toml's addopts). Every check above holds
  per worker: each worker's session has its own ``TMPDIR`` for ipc files, and a segment
  another worker still maps is not counted as leaked.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM_DIR = Path("/dev/shm")
REPO = Path(__file__).resolve().parent.parent
#: Seconds a thread gets to end after the teardown that should have stopped it.
THREAD_GRACE_S = 2.0

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


#: Most workers ``-n auto`` starts: each may load torch and vLLM (more than 1 GiB) and start
#: engine and reader processes of its own.
WORKERS_AT_MOST = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), WORKERS_AT_MOST))


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


# --- threads left running ------------------------------------------------------------------
# Every thread records where it was started (the file of Thread.start's caller), so a thread
# the project's code started is told from one a library (vLLM, zmq, asyncio) keeps for itself.
_thread_start = threading.Thread.start


def _recording_start(self: threading.Thread) -> None:
    self._enginewire_started_in = sys._getframe(1).f_code.co_filename  # type: ignore[attr-defined]
    _thread_start(self)


threading.Thread.start = _recording_start  # type: ignore[method-assign]


def _started_by_project(thread: threading.Thread) -> bool:
    started_in = getattr(thread, "_enginewire_started_in", "")
    return started_in.startswith(str(REPO)) and not started_in.startswith(str(REPO / ".venv"))


def _leftover_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads started since ``before`` that are still alive ``THREAD_GRACE_S`` later and
    are either non-daemon (they would hold the interpreter's exit) or started by this
    repository's code (a peer, a check, a cell or a test that did not stop its thread)."""
    deadline = time.monotonic() + THREAD_GRACE_S
    suspects = [t for t in threading.enumerate()
                if t not in before and (not t.daemon or _started_by_project(t))]
    for thread in suspects:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in suspects if t.is_alive()]


def _describe(threads: list[threading.Thread]) -> str:
    return ", ".join(
        f"{t.name!r} ({'daemon' if t.daemon else 'non-daemon'}, started in "
        f"{getattr(t, '_enginewire_started_in', '?')})" for t in threads)


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Fail a test that leaves a thread running after its teardown (see _leftover_threads)."""
    before = set(threading.enumerate())
    yield
    left = _leftover_threads(before)
    assert not left, f"threads left running after the test: {_describe(left)}"


@pytest.fixture(scope="module", autouse=True)
def no_thread_left_by_module() -> Iterator[None]:
    """The same for a module's fixtures, after the module's last test."""
    before = set(threading.enumerate())
    yield
    left = _leftover_threads(before)
    assert not left, f"threads left running after the module: {_describe(left)}"
