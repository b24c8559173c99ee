"""``enginewire mutants --catalogue pkg.mod:attr``: a project's own mutants through the same
kill matrix (conformance, fuzz and explorer columns)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from enginewire.cli import main

CATALOGUE = textwrap.dedent('''
    from enginewire.fuzz.mutants import Mutant
    from enginewire.fuzz.mutants.ring_mutants import MutantRing, WrittenBeforeReadFlagsCleared

    MINE = [
        Mutant("my-flag-order", "written flag before the read flags are cleared", "my issue 1",
               "ring", lambda: MutantRing(writer_cls=WrittenBeforeReadFlagsCleared),
               ("ring/memory/read-flags-cleared-before-written",),
               writer_cls=WrittenBeforeReadFlagsCleared),
    ]
    NOT_MUTANTS = ["just a string"]
''')


@pytest.fixture
def catalogue_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_mutants.py").write_text(CATALOGUE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_mutants"


def test_an_outside_catalogue_runs_through_every_column(
        catalogue_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "matrix.json"
    code = main(["mutants", "--catalogue", f"{catalogue_module}:MINE", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    (row,) = json.loads(out.read_text())["mutants"]
    assert row["name"] == "my-flag-order" and row["killed"]
    assert row["columns"]["conformance"]["kills"] == [
        "ring/memory/read-flags-cleared-before-written"]
    assert row["columns"]["explorer"]["kills"]
    assert row["kills"] == 2
    assert "1 of 1 mutants killed" in printed


def test_a_catalogue_of_something_else_is_a_usage_error(
        catalogue_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutants", "--catalogue", f"{catalogue_module}:NOT_MUTANTS", "--list"]) == 2
    assert "expected a non-empty dict or iterable of" in capsys.readouterr().err
    assert main(["mutants", "--catalogue", "no_such_module_here:X"]) == 2
