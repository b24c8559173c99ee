"""The spec loader: the package spec loads, and every kind of malformed spec file is refused.

Each negative test copies ``spec/data`` into a temporary directory, breaks exactly one thing
and checks that :func:`enginewire.spec.load` raises a :class:`SpecError` naming the file, the
clause (where there is one) and the field, so ``enginewire spec check`` points at the line to
fix. A probe struct written by the fixture keeps the struct tests independent of the struct
files in the package.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from enginewire.spec import Spec, SpecError, load
from enginewire.spec.loader import DATA_DIR
from enginewire.spec.schema import SURFACE_SCHEMAS, EnumSpec, StructSpec

PROBE_STRUCT = """\
name = "ZzProbe"
encoding = "array"
versions = "0.8.0+"
source = "vllm/v1/engine/__init__.py:1"
vllm_class = "vllm.v1.engine:ZzProbe"
description = "A struct that exists only in the loader tests."

[[fields]]
name = "request_id"
type = "str"
required = true

[[fields]]
name = "count"
type = "int"
default = "0"
"""

PROBE_CLAUSE = """
[[clauses]]
id = "identity.probe"
level = "MUST"
text = "A clause that exists only in the loader tests."
source = "vllm/v1/engine/core.py:1"
"""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enginewire", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A private copy of the package's spec files, plus the valid probe struct."""
    copy = tmp_path / "data"
    shutil.copytree(DATA_DIR, copy)
    (copy / "structs" / "ZzProbe.toml").write_text(PROBE_STRUCT)
    return copy


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path.name} for this test"
    path.write_text(text.replace(old, new))


# --- the package spec ----------------------------------------------------------------------


def test_package_spec_loads_every_surface() -> None:
    spec = load()
    assert isinstance(spec, Spec)
    assert list(spec.surfaces) == list(SURFACE_SCHEMAS)
    for name, surface in spec.surfaces.items():
        assert surface.surface == name
        assert isinstance(surface, SURFACE_SCHEMAS[name])
    for clause_id, ref in spec.clauses.items():
        assert clause_id.startswith(ref.surface + ".")
        assert ref.file == f"{ref.surface}.toml"
        assert spec.clause(clause_id) is ref.clause


def test_package_spec_lookups() -> None:
    spec = load()
    assert spec.clause("identity.width-two-bytes").level == "MUST"
    with pytest.raises(KeyError, match="no clause 'identity.nope'"):
        spec.clause("identity.nope")
    for name, found in spec.structs.items():
        if isinstance(found, StructSpec):
            assert spec.struct(name) is found
            with pytest.raises(KeyError, match="no enum"):
                spec.enum(name)
        else:
            assert isinstance(found, EnumSpec)
            assert spec.enum(name) is found
            with pytest.raises(KeyError, match="no struct"):
                spec.struct(name)


def test_surface_returns_each_surface_file() -> None:
    spec = load()
    for name, schema in SURFACE_SCHEMAS.items():
        assert isinstance(spec.surface(name), schema)
    with pytest.raises(KeyError):
        spec.surface("nope")


def test_ring_constant_checks_the_kind() -> None:
    spec = load()
    constants = spec.surface("ring").constants
    assert spec.ring_constant("max_chunks_default", int) == constants["max_chunks_default"]
    assert spec.ring_constant("ready_message", str) == constants["ready_message"]
    # An integer in the table serves as a float; the value is a float then.
    as_float = spec.ring_constant("max_chunks_default", float)
    assert isinstance(as_float, float)
    assert as_float == constants["max_chunks_default"]
    with pytest.raises(TypeError, match="'ready_message': expected int, got str"):
        spec.ring_constant("ready_message", int)
    with pytest.raises(TypeError, match="expected str, got int"):
        spec.ring_constant("max_chunks_default", str)
    with pytest.raises(KeyError, match="no constant 'nope' in the ring surface"):
        spec.ring_constant("nope", int)


def test_spec_check_command_passes() -> None:
    result = run_cli("spec", "check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("spec ok for vLLM 0.33.0: 8 surfaces")


def test_copied_data_with_probe_struct_loads(data_dir: Path) -> None:
    """The baseline for every negative test below: before anything is broken, it loads."""
    spec = load(data_dir=data_dir)
    probe = spec.struct("ZzProbe")
    assert [f.name for f in probe.fields] == ["request_id", "count"]


def test_version_selects_clauses_and_fields(data_dir: Path) -> None:
    releases = data_dir / "history" / "releases.toml"
    releases.write_text(releases.read_text().replace('releases = [', 'releases = [\n    "0.34.0",'))
    append(data_dir / "identity.toml", PROBE_CLAUSE + 'versions = "0.34.0+"\n')
    append(data_dir / "structs" / "ZzProbe.toml",
           '\n[[fields]]\nname = "late"\ntype = "int"\ndefault = "1"\nversions = "0.34.0+"\n')
    old = load("0.33.0", data_dir)
    new = load("0.34.0", data_dir)
    assert "identity.probe" not in old.clauses
    assert new.clause("identity.probe").versions == "0.34.0+"
    assert [f.name for f in old.struct("ZzProbe").fields] == ["request_id", "count"]
    assert [f.name for f in new.struct("ZzProbe").fields] == ["request_id", "count", "late"]


def test_defaults_that_fit_their_types_load(data_dir: Path) -> None:
    fields = {
        "an_int": ("int", "-3"), "a_float_from_int": ("float", "2"), "a_float": ("float", "0.5"),
        "a_bool": ("bool", "false"), "a_str": ("str", '"x"'), "nullable": ("str | none", "null"),
        "any_value": ("any", '{"k": [1, null]}'), "a_list": ("list[int | none]", "[1, null]"),
        "a_map": ("dict[str, float]", '{"a": 1}'), "a_pair": ("tuple[int, str]", '[1, "b"]'),
        "an_enum": ("FinishReason", "1"), "a_union": ("int | str | none", '"s"'),
        "a_struct": ("PrefixCacheStats", '{"hits": 3}'),
        "numbers": ("nested_tensors", "[1, [2.5]]"),
    }
    text = PROBE_STRUCT + "".join(
        f"\n[[fields]]\nname = {name!r}\ntype = {kind!r}\ndefault = {default!r}\n"
        for name, (kind, default) in fields.items()
    ) + '\n[[fields]]\nname = "ids"\ntype = "set[int] | none"\ndefault_factory = "set"\n'
    (data_dir / "structs" / "ZzProbe.toml").write_text(text)
    probe = load(data_dir=data_dir).struct("ZzProbe")
    assert [f.name for f in probe.fields][2:] == [*fields, "ids"]


# --- malformed spec files ------------------------------------------------------------------

Breaker = Callable[[Path], None]


def _probe_clause(extra: str = "", **overrides: str) -> Breaker:
    """Append the probe clause to identity.toml with keys overridden or added."""

    def breaker(data: Path) -> None:
        text = PROBE_CLAUSE
        for key, value in overrides.items():
            text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        append(data / "identity.toml", text + extra)

    return breaker


def _probe_fields(fields: str) -> Breaker:
    """Replace the probe struct's fields."""

    def breaker(data: Path) -> None:
        path = data / "structs" / "ZzProbe.toml"
        head = PROBE_STRUCT.split("[[fields]]", 1)[0]
        path.write_text(head + fields)

    return breaker


def _toml_syntax(data: Path) -> None:
    append(data / "identity.toml", "\nthis line = = is not TOML\n")


def _duplicate_id(data: Path) -> None:
    _probe_clause(id='"identity.width-two-bytes"')(data)


def _missing_surface(data: Path) -> None:
    (data / "identity.toml").unlink()


def _name_not_file_name(data: Path) -> None:
    replace_once(data / "structs" / "ZzProbe.toml", 'name = "ZzProbe"', 'name = "ZzOther"')


def _duplicate_enum_value(data: Path) -> None:
    (data / "structs" / "ZzProbeKind.toml").write_text(
        'name = "ZzProbeKind"\nkind = "enum"\nwire = "int"\nversions = "0.8.0+"\n'
        'source = "vllm/v1/engine/__init__.py:1"\nvllm_class = "vllm.v1.engine:ZzProbeKind"\n'
        'description = "d"\n\n[[members]]\nname = "A"\nvalue = 0\n\n'
        '[[members]]\nname = "B"\nvalue = 0\n'
    )


# (breaker, file, clause, field pattern, message pattern)
MALFORMED: dict[str, tuple[Breaker, str, str | None, str | None, str]] = {
    "toml syntax error": (_toml_syntax, "identity.toml", None, None, "not valid TOML"),
    "unknown key": (
        _probe_clause(extra='colour = "red"\n'),
        "identity.toml", "identity.probe", r"clauses\[\d+\]\.colour", "unknown field `colour`",
    ),
    "missing key": (
        lambda data: replace_once(data / "identity.toml", 'meaning = "', '# meaning = "'),
        "identity.toml", None, "meaning", "missing required field `meaning`",
    ),
    "bad level": (
        _probe_clause(level='"MUSTNT"'),
        "identity.toml", "identity.probe", r"clauses\[\d+\]\.level", "MUSTNT",
    ),
    "duplicate clause id": (
        _duplicate_id, "identity.toml", "identity.width-two-bytes", "id", "duplicate clause ID",
    ),
    "id with wrong surface prefix": (
        _probe_clause(id='"ring.probe"'),
        "identity.toml", "ring.probe", "id", "start with 'identity.'",
    ),
    "id with bad characters": (
        _probe_clause(id='"identity.Probe Clause"'),
        "identity.toml", "identity.Probe Clause", "id", r"\[a-z0-9_.-\]",
    ),
    "bad source format": (
        _probe_clause(source='"core.py:12"'),
        "identity.toml", "identity.probe", "source", "vllm/<path>.py:<line>",
    ),
    "source without line": (
        _probe_clause(source='"vllm/v1/engine/core.py:1, vllm/v1/engine/core.py"'),
        "identity.toml", "identity.probe", "source", "vllm/v1/engine/core.py'",
    ),
    "bad version range": (
        _probe_clause(extra='versions = "0.10.0-0.9.0"\n'),
        "identity.toml", "identity.probe", "versions", "ends before it starts",
    ),
    "unparsable version": (
        _probe_clause(extra='versions = "latest"\n'),
        "identity.toml", "identity.probe", "versions", "expected a version",
    ),
    "unknown type name in a struct field": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "list[NoSuchStruct] | none"\n'
                      'default = "null"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.type", "NoSuchStruct",
    ),
    "bad type syntax": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "list[int"\nrequired = true\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.type", "list\\[int",
    ),
    "required field after a defaulted one in an array struct": (
        _probe_fields('[[fields]]\nname = "a"\ntype = "int"\ndefault = "0"\n\n'
                      '[[fields]]\nname = "b"\ntype = "int"\nrequired = true\n'),
        "structs/ZzProbe.toml", None, r"fields\[1\] \(b\)", "after defaulted field 'a'",
    ),
    "default not JSON": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "int | none"\ndefault = "None"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default", "not a JSON literal",
    ),
    "null default for a type without none": (
        lambda data: replace_once(data / "structs" / "KVEventsConfig.toml",
                                  'default = "\\"null\\""', 'default = "null"'),
        "structs/KVEventsConfig.toml", None, r"fields\[1\] \(publisher\)\.default",
        "null for type 'str', which does not include none",
    ),
    "string default for an int": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "int"\ndefault = "\\"7\\""\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default", '"7" is not of type int',
    ),
    "float default for an int": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "int | none"\ndefault = "1.5"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default",
        "1.5 fits no member of 'int \\| none'",
    ),
    "bool default for a float": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "float"\ndefault = "true"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default", "true is not of type float",
    ),
    "object default for a list": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "list[int]"\ndefault = "{}"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default", "is not an array",
    ),
    "wrong element in a list default": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "list[str]"\ndefault = "[\\"a\\", 1]"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default", "1 is not of type str",
    ),
    "enum default outside the enum": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "FinishReason"\ndefault = "99"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default",
        "99 is not a value of enum FinishReason",
    ),
    "struct default with an unknown field": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "PrefixCacheStats"\n'
                      'default = "{\\"nope\\": 1}"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default",
        "PrefixCacheStats has no fields \\['nope'\\]",
    ),
    "default_factory for another container": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "list[int]"\ndefault_factory = "dict"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.default_factory",
        "default_factory 'dict' does not build type 'list\\[int\\]'",
    ),
    "required field with a default": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "int"\nrequired = true\ndefault = "0"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)", "required field cannot have",
    ),
    "optional field without a default": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "int"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)", "needs default",
    ),
    "bad key type in a struct field": (
        _probe_fields('[[fields]]\nname = "x"\ntype = "int"\nrequired = "yes"\n'),
        "structs/ZzProbe.toml", None, r"fields\[0\] \(x\)\.required", "Expected `bool`",
    ),
    "struct name differs from file name": (
        _name_not_file_name, "structs/ZzProbe.toml", None, "name", "must match the file name",
    ),
    "duplicate enum value": (
        _duplicate_enum_value, "structs/ZzProbeKind.toml", None, "members", "duplicate enum",
    ),
    "missing surface file": (
        _missing_surface, "identity.toml", None, None, "surface file is missing",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_spec_is_refused(data_dir: Path, case: str) -> None:
    breaker, file, clause, field_pattern, message_pattern = MALFORMED[case]
    breaker(data_dir)
    with pytest.raises(SpecError) as caught:
        load(data_dir=data_dir)
    error = caught.value
    assert error.file == file, str(error)
    assert error.clause == clause, str(error)
    if field_pattern is None:
        assert error.field is None, str(error)
    else:
        assert error.field is not None and re.fullmatch(field_pattern, error.field), str(error)
    assert re.search(message_pattern, error.message), str(error)
    # The one-line form names everything too, for `spec check` on stderr.
    assert str(error).startswith(file)
    if clause:
        assert f"clause {clause}" in str(error)
    if error.field:
        assert f"field {error.field}" in str(error)


def test_spec_check_command_reports_bad_data_dir(data_dir: Path) -> None:
    _probe_clause(level='"MUSTNT"')(data_dir)
    result = run_cli("spec", "check", "--data-dir", str(data_dir))
    assert result.returncode != 0
    assert result.stdout == ""
    assert "identity.toml clause identity.probe field clauses[" in result.stderr
    assert "MUSTNT" in result.stderr


def test_spec_check_command_reports_missing_data_dir(tmp_path: Path) -> None:
    result = run_cli("spec", "check", "--data-dir", str(tmp_path / "nowhere"))
    assert result.returncode == 2  # a directory that does not exist is a usage error
    assert "not a directory" in result.stderr
    (tmp_path / "empty").mkdir()
    result = run_cli("spec", "check", "--data-dir", str(tmp_path / "empty"))
    assert result.returncode == 1  # spec data that is not there is a spec data error
    assert "surface file is missing" in result.stderr
