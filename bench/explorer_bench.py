"""The explorer bench: how fast ``enginewire explore`` searches the reference ring's schedules.

One search per memory model (sc, tso, weak) of the reference ring at 2 readers x 2 chunks x 3
messages, through the public entry point ``enginewire.fuzz.explore.explore`` (whatever the
search does inside, state-space reduction included), each in a fresh interpreter: the states it
visited, the time it took, and states per second. Beside it, the same search by the explorer of
the *previous release of the bench*: the revision that last changed ``docs/bench/results.json``
(the committed figures), unpacked from git into a temporary directory (``git archive``: the
repository and its worktrees are left alone) and imported from there. Its figures are measured
in the same run, search after search, so both see the same machine and the same load; the
committed results cannot serve, as they hold no explorer figures and were measured at another
time. Without git (an installed package) the previous release is skipped with a note.

States per second is a number to watch, not a goal: a search that visits fewer states (a better
reduction) may well visit them more slowly and still finish sooner, which the search time shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The models, in the order they run.
MODELS = ("sc", "tso", "weak")
#: The file whose last change marks the previous release of the bench.
RESULTS_FILE = "docs/bench/results.json"

_SCRIPT = """
import json, sys, time
from enginewire.fuzz.explore import RingConfig, explore
readers, chunks, messages, model, max_states = json.loads(sys.argv[1])
started = time.monotonic()
result = explore("reference", RingConfig(readers, chunks, messages), model=model,
                 max_states=max_states)
elapsed = time.monotonic() - started
print(json.dumps({"states": result.states, "executions": result.executions,
                  "complete": result.complete, "ok": result.ok, "elapsed_s": elapsed}))
"""


class ExplorerBenchError(RuntimeError):
    """A search could not be run or did not report."""


@dataclass
class Checkout:
    """An import root for one revision's ``enginewire`` (None: the one installed here)."""

    revision: str | None
    root: Path | None = None

    @property
    def label(self) -> str:
        return "this tree" if self.revision is None else self.revision[:12]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.root is not None:
            env["PYTHONPATH"] = str(self.root)
        return env


def repository_root() -> Path | None:
    """The git work tree this package runs from (None: not a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        found = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"],
                               capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(found.stdout.strip())


def previous_release(repo: Path) -> str | None:
    """The revision that last changed :data:`RESULTS_FILE` (None: no such revision)."""
    try:
        found = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%H", "HEAD",
                                "--", RESULTS_FILE],
                               capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None


def unpack(repo: Path, revision: str, into: Path) -> Checkout:
    """``revision``'s tree unpacked under ``into`` with an import root mapping its
    ``package-dir`` (``enginewire.reference`` -> ``reference/``, ...)."""
    tree = into / "tree"
    tree.mkdir()
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", revision],
                       stdout=out, timeout=120, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    with (tree / "pyproject.toml").open("rb") as handle:
        package_dir: dict[str, str] = tomllib.load(handle)["tool"]["setuptools"]["package-dir"]
    root = into / "root"
    top = root / "enginewire"
    shutil.copytree(tree / package_dir.get("enginewire", "enginewire"), top)
    for package, folder in package_dir.items():
        parts = package.split(".")
        if len(parts) == 2:
            link = top / parts[1]
            if link.exists():
                shutil.rmtree(link)
            link.symlink_to(tree / folder, target_is_directory=True)
    return Checkout(revision, root)


def search(checkout: Checkout, model: str, readers: int, chunks: int, messages: int,
           max_states: int | None, timeout: float) -> dict[str, Any]:
    """One search in a fresh interpreter; its figures, ``states_per_s`` added."""
    argument = json.dumps([readers, chunks, messages, model, max_states])
    try:
        done = subprocess.run([sys.executable, "-c", _SCRIPT, argument],
                              capture_output=True, text=True, timeout=timeout,
                              env=checkout.environment(), cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        raise ExplorerBenchError(f"{checkout.label}: the {model} search took over "
                                 f"{timeout:.0f} s") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ExplorerBenchError(f"{checkout.label}: the {model} search failed: {tail[0]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    elapsed = figures["elapsed_s"]
    figures["states_per_s"] = figures["states"] / elapsed if elapsed > 0 else 0.0
    return figures
