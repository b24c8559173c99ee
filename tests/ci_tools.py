"""Programs some tests drive (node for the JavaScript codec, chromium for the HTML report),
and the compiled part of the package (the ring's flag section, built where a C compiler is).

On a developer's machine a missing program or an extension not built skips its tests, loudly
(a warning and a skip reason that says SKIPPED LOUDLY). ``.ci/run`` makes sure the programs
are installed and sets ``ENGINEWIRE_REQUIRE_TOOLS=1``: then anything missing fails the test
instead, so CI never passes with those tests skipped.
"""

from __future__ import annotations

import os
import shutil
import warnings
from typing import NoReturn

import pytest

ENV = "ENGINEWIRE_REQUIRE_TOOLS"


def require_tool(*names: str, why: str) -> str:
    """The path of the first of ``names`` on PATH; else a failure when ``.ci/run`` requires
    the tools, a loud skip otherwise. ``why``: what goes untested without it."""
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    _missing(f"{' / '.join(names)} is not installed", why)


def require_built(built: bool, extension: str, why: str) -> None:
    """Nothing where ``built``; else, for the compiled ``extension`` (a C file that ``pip
    install`` builds where it finds a compiler), what :func:`require_tool` does for a program."""
    if not built:
        _missing(f"{extension} was not built (no C compiler at install time?)", why)


def _missing(what: str, why: str) -> NoReturn:
    if os.environ.get(ENV) == "1":
        pytest.fail(f"{what} and {ENV}=1 requires it: {why}")
    warnings.warn(f"{what}: {why}", stacklevel=3)
    pytest.skip(f"SKIPPED LOUDLY: {what}: {why}")


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
