"""Programs some tests drive (node for the JavaScript codec, chromium for the HTML report).

On a developer's machine a missing program skips its tests, loudly (a warning and a skip
reason that says SKIPPED LOUDLY). ``.ci/run`` makes sure the programs are installed and sets
``ENGINEWIRE_REQUIRE_TOOLS=1``: then a missing program fails the test instead, so CI never
passes with those tests skipped.
"""

from __future__ import annotations

import os
import shutil
import warnings

import pytest

ENV = "ENGINEWIRE_REQUIRE_TOOLS"


def require_tool(*names: str, why: str) -> str:
    """The path of the first of ``names`` on PATH; else a failure when ``.ci/run`` requires
    the tools, a loud skip otherwise. ``why``: what goes untested without it."""
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    missing = " / ".join(names)
    if os.environ.get(ENV) == "1":
        pytest.fail(f"{missing} is not installed and {ENV}=1 requires it: {why}")
    warnings.warn(f"{missing} is not installed: {why}", stacklevel=2)
    pytest.skip(f"SKIPPED LOUDLY: {missing} is not installed: {why}")
