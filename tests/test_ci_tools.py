"""A program the tests need: skipped loudly on a developer's machine, a failure under
``.ci/run`` (``ENGINEWIRE_REQUIRE_TOOLS=1``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ci_tools import ENV, require_tool


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


def test_present_tool_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "node"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(ENV, "1")
    assert require_tool("node", why="untested") == str(tool)
