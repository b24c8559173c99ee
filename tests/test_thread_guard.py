"""The thread guard in tests/conftest.py fails what leaves a thread running, and only that.

A test file that leaks threads on purpose runs under a copy of the project's conftest in a
child pytest (so its failures stay there); its per-test outcomes are asserted here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

LEAKY = '''
import threading
import time

import pytest

forever = threading.Event()


def test_leaks_a_daemon_thread():
    threading.Thread(target=forever.wait, name="leaked daemon", daemon=True).start()


def test_leaks_a_non_daemon_thread():
    threading.Thread(target=time.sleep, args=(1.5,), name="leaked worker").start()


@pytest.fixture
def stopped_thread():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="stopped at teardown", daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join(5.0)


def test_stops_its_thread_in_teardown(stopped_thread):
    assert stopped_thread.is_alive()


def test_a_thread_ending_within_the_grace_period_passes():
    threading.Thread(target=time.sleep, args=(0.1,), name="short", daemon=True).start()


def test_a_daemon_thread_a_library_started_is_not_counted():
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(1, thread_name_prefix="library pool")
    pool.submit(forever.wait, 0.1).result()
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def module_thread():
    threading.Thread(target=forever.wait, name="module fixture thread", daemon=True).start()


def test_uses_a_leaky_module_fixture(module_thread):
    pass
'''


def test_the_guard_fails_tests_that_leave_threads_and_passes_the_rest(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    # A shorter grace period than the project's 2 s, so the three leaks cost less to prove.
    conftest = CONFTEST.read_text()
    assert "\nTHREAD_GRACE_S = 2.0\n" in conftest
    (tests / "conftest.py").write_text(conftest.replace("\nTHREAD_GRACE_S = 2.0\n",
                                                        "\nTHREAD_GRACE_S = 0.5\n"))
    (tests / "test_leaky.py").write_text(LEAKY)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
         "-q", "tests/test_leaky.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    outcomes = {(kind, name) for kind, name in re.findall(
        r"^(PASSED|FAILED|ERROR) tests/test_leaky\.py::(\w+)", out, re.MULTILINE)}
    assert outcomes == {
        ("ERROR", "test_leaks_a_daemon_thread"),
        ("PASSED", "test_leaks_a_daemon_thread"),
        ("ERROR", "test_leaks_a_non_daemon_thread"),
        ("PASSED", "test_leaks_a_non_daemon_thread"),
        ("PASSED", "test_stops_its_thread_in_teardown"),
        ("PASSED", "test_a_thread_ending_within_the_grace_period_passes"),
        ("PASSED", "test_a_daemon_thread_a_library_started_is_not_counted"),
        ("PASSED", "test_uses_a_leaky_module_fixture"),
        ("ERROR", "test_uses_a_leaky_module_fixture"),
    }, out
    assert "threads left running after the test: 'leaked daemon' (daemon" in out
    assert "threads left running after the test: 'leaked worker' (non-daemon" in out
    # The module's check names every thread its tests and fixtures left, its fixture's too.
    assert re.search(r"threads left running after the module: .*'module fixture thread'", out)
