"""A program the tests need: skipped loudly on a developer's machine, a failure under
``.ci/run`` (``ENGINEWIRE_REQUIRE_TOOLS=1``); what a killed chromium leaves in /dev/shm is
removed, what a live process maps stays."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ci_tools import (
    ENV,
    chromium_segments,
    remove_chromium_leftovers,
    require_built,
    require_tool,
)


def test_missing_tool_fails_when_required(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="ENGINEWIRE_REQUIRE_TOOLS=1 requires it"):
        require_tool("node", why="untested")


def test_missing_tool_skips_loudly_otherwise(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(ENV, raising=False)
    with pytest.warns(UserWarning, match="not installed"), \
            pytest.raises(pytest.skip.Exception, match="SKIPPED LOUDLY"):
        require_tool("node", why="untested")


def test_an_extension_not_built_fails_when_required_and_skips_loudly_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="was not built.*requires it"):
        require_built(False, "_express_flags", why="untested")
    require_built(True, "_express_flags", why="untested")  # built: nothing happens
    monkeypatch.delenv(ENV)
    with pytest.warns(UserWarning, match="was not built"), \
            pytest.raises(pytest.skip.Exception, match="SKIPPED LOUDLY"):
        require_built(False, "_express_flags", why="untested")


def test_present_tool_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "node"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(ENV, "1")
    assert require_tool("node", why="untested") == str(tool)


SHM = Path("/dev/shm")


def _segment(name: str) -> Path:
    path = SHM / name
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    return path


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this system")
def test_an_unmapped_new_segment_is_removed_and_an_old_one_kept() -> None:
    old = _segment(f".org.chromium.Chromium.ew-old-{os.getpid()}")
    try:
        before = chromium_segments()
        new = _segment(f".org.chromium.Chromium.ew-new-{os.getpid()}")
        assert remove_chromium_leftovers(before) == [new.name]
        assert not new.exists() and old.exists()
    finally:
        old.unlink(missing_ok=True)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this system")
def test_a_segment_a_live_process_maps_stays() -> None:
    before = chromium_segments()
    held = _segment(f".org.chromium.Chromium.ew-held-{os.getpid()}")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import mmap, sys, time\n"
         f"f = open({str(held)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 0)\n"
         "print('mapped', flush=True); time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mapped"
        assert remove_chromium_leftovers(before) == []
        assert held.exists()
    finally:
        holder.kill()
        holder.wait(timeout=10)
        held.unlink(missing_ok=True)
