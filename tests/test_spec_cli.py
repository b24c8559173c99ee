"""``enginewire spec export`` and ``enginewire spec show``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from enginewire.cli import main
from enginewire.spec import load
from enginewire.spec.loader import DATA_DIR
from enginewire.spec.schema import SURFACE_SCHEMAS


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enginewire", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_export_is_json_with_every_surface_and_struct() -> None:
    result = run_cli("spec", "export")
    assert result.returncode == 0, result.stderr
    exported = json.loads(result.stdout)
    spec = load()
    assert exported["format"] == "enginewire-spec/1"
    assert exported["vllm_version"] == spec.version
    assert list(exported["surfaces"]) == list(SURFACE_SCHEMAS)
    for name, surface in exported["surfaces"].items():
        assert surface["surface"] == name
        ids = [clause["id"] for clause in surface["clauses"]]
        assert ids == [c.id for c in spec.surfaces[name].clauses]
    assert set(exported["structs"]) == set(spec.structs)
    for name, struct in exported["structs"].items():
        assert struct["name"] == name
        # Every schema key is written out, so a consumer needs no knowledge of the defaults.
        if struct["kind"] == "struct":
            assert [f["name"] for f in struct["fields"]] == [
                f.name for f in spec.struct(name).fields
            ]
            assert isinstance(struct["omit_defaults"], bool)
            for field in struct["fields"]:
                assert set(field) == {"name", "type", "required", "default", "default_factory",
                                      "versions", "description", "source"}
                assert isinstance(field["required"], bool)
        else:
            assert struct["kind"] == "enum"
            assert [m["name"] for m in struct["members"]] == [
                m.name for m in spec.enum(name).members
            ]


def test_export_follows_data_dir_and_version(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    releases = data / "history" / "releases.toml"
    releases.write_text(releases.read_text().replace('releases = [', 'releases = [\n    "0.34.0",'))
    (data / "structs" / "ZzExported.toml").write_text(
        'name = "ZzExported"\nencoding = "array"\nversions = "0.34.0+"\n'
        'source = "vllm/v1/engine/__init__.py:1"\nvllm_class = "vllm.v1.engine:ZzExported"\n'
        'description = "d"\n\n[[fields]]\nname = "x"\ntype = "int"\nrequired = true\n'
    )
    assert main(["spec", "export", "--data-dir", str(data), "--version", "0.34.0"]) == 0
    newer = json.loads(capsys.readouterr().out)
    assert newer["vllm_version"] == "0.34.0"
    assert newer["structs"]["ZzExported"]["fields"] == [
        {"name": "x", "type": "int", "required": True, "default": None, "default_factory": None,
         "versions": None, "description": "", "source": None}
    ]
    assert main(["spec", "export", "--data-dir", str(data)]) == 0
    assert "ZzExported" not in json.loads(capsys.readouterr().out)["structs"]


def test_show_prints_the_clause(capsys) -> None:
    assert main(["spec", "show", "request_types.sentinels-never-on-wire"]) == 0
    out = capsys.readouterr().out
    clause = load().clause("request_types.sentinels-never-on-wire")
    assert out.splitlines()[0] == (
        "request_types.sentinels-never-on-wire  [MUST]  (request_types.toml)"
    )
    assert clause.text in out
    assert f"source: {clause.source} (vLLM 0.33.0)" in out
    assert clause.vllm_deviation and f"vLLM deviates: {clause.vllm_deviation}" in out


@pytest.mark.parametrize(
    ("wanted", "suggested"),
    [
        ("identity.width-two-byte", "identity.width-two-bytes"),
        ("identity.nothing-like-it", "identity.known-rank"),
        ("width-two-bytes", "identity.width-two-bytes"),
    ],
)
def test_show_unknown_clause_exits_2_with_suggestions(wanted: str, suggested: str) -> None:
    result = run_cli("spec", "show", wanted)
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"no clause {wanted!r}" in result.stderr
    assert "did you mean" in result.stderr
    assert suggested in result.stderr


def test_show_unknown_clause_without_anything_close(capsys) -> None:
    assert main(["spec", "show", "zzz"]) == 2
    err = capsys.readouterr().err
    assert "no clause 'zzz'" in err
