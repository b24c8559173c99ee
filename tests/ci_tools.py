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


#: Where chromium keeps the shared memory it means to unlink at once: a chromium process
#: killed, or ending, between creating and unlinking a segment leaves it behind.
_SHM_DIR = "/dev/shm"
_CHROMIUM_SHM_PREFIX = ".org.chromium.Chromium."


def chromium_segments() -> set[str]:
    """The chromium segments in /dev/shm now."""
    try:
        return {name for name in os.listdir(_SHM_DIR) if name.startswith(_CHROMIUM_SHM_PREFIX)}
    except OSError:
        return set()


def remove_chromium_leftovers(before: set[str]) -> list[str]:
    """Unlink the chromium segments made since ``before`` that no live process maps (call it
    once the browser's processes have ended); the names removed. A segment another browser
    still maps stays, so a test run beside this one keeps its own."""
    new = chromium_segments() - before
    if not new:
        return []
    mapped: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                text = maps.read()
        except OSError:
            continue
        mapped.update(name for name in new if f"/dev/shm/{name}" in text)
    removed = []
    for name in sorted(new - mapped):
        try:
            os.unlink(os.path.join(_SHM_DIR, name))
        except FileNotFoundError:
            continue
        removed.append(name)
    return removed
