"""The runs ``.ci/run`` makes once, read back by the tests that check them.

``.ci/run`` runs the expensive commands (the vLLM conformance run, the mutant catalogue) once
and keeps, under the folder it names in ``ENGINEWIRE_CI_REPORTS``, each one's output
(``NAME.out``), exit status (``NAME.rc``) and the reports it wrote. A test of such a run calls
:func:`recorded`: with the variable set it gets that run; without it (a developer's
``pytest``) it gets None and runs the command itself. A variable that names a folder without
the run is an error, never a silent rerun.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "ENGINEWIRE_CI_REPORTS"
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Recorded:
    """One recorded command: its exit status, its output (stdout and stderr) and the folder
    holding the reports it wrote, spelled as ``.ci/run`` passed it."""

    returncode: int
    output: str
    folder: str

    def path(self, name: str) -> Path:
        """A report the command wrote into the folder."""
        return REPO / self.folder / name


def recorded(name: str) -> Recorded | None:
    """The run ``.ci/run`` recorded as ``name``, or None when no reports folder is given."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    out, rc = REPO / folder / f"{name}.out", REPO / folder / f"{name}.rc"
    if not (out.is_file() and rc.is_file()):
        pytest.fail(f"{ENV}={folder} but {out.name} and {rc.name} are not there: run .ci/run, "
                    f"or unset {ENV} to let the test run the command itself")
    return Recorded(int(rc.read_text().strip()), out.read_text(encoding="utf-8"), folder)
