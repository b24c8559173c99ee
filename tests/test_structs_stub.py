"""The committed type stub of the spec-built structs (``enginewire stubs``) is fresh and
describes the classes :mod:`enginewire.reference.structs` builds."""

from __future__ import annotations

import ast
import inspect

import msgspec

from enginewire.reference import structs
from enginewire.reference.stubs import COMMAND, STUB_PATH, PythonType, render_stub, run_stubs
from enginewire.spec import load
from enginewire.spec.types import parse_type


def test_committed_stub_is_fresh() -> None:
    fresh = render_stub()
    committed = STUB_PATH.read_text(encoding="utf-8")
    assert committed == fresh, f"{STUB_PATH.name} is stale: run `{COMMAND}`"


def test_check_mode_fails_on_a_stale_stub(tmp_path, capsys) -> None:
    stale = tmp_path / "structs_generated.pyi"
    stale.write_text(render_stub().replace("request_id: str", "request_id: int", 1))
    assert run_stubs(stale, check=True) == 1
    assert COMMAND in capsys.readouterr().err
    run_stubs(stale)
    assert run_stubs(stale, check=True) == 0


def _stub_classes() -> dict[str, ast.ClassDef]:
    tree = ast.parse(render_stub())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def test_stub_declares_every_built_class_with_its_fields_in_order() -> None:
    built = structs.build()
    declared = _stub_classes()
    assert set(declared) == set(built.classes) | set(built.enums)
    for name, cls in built.classes.items():
        fields = [node.target.id for node in declared[name].body
                  if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)]
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
            assert fields == list(cls.__struct_fields__), name
            config = cls.__struct_config__
            options = {kw.arg for kw in declared[name].keywords}
            assert ("array_like" in options) == config.array_like, name
            assert ("omit_defaults" in options) == config.omit_defaults, name
            keyword_only = any(p.kind is inspect.Parameter.KEYWORD_ONLY
                               for p in inspect.signature(cls).parameters.values())
            assert ("kw_only" in options) == keyword_only, name
        else:
            assert fields == list(cls._fields), name
    for name, enum_cls in built.enums.items():
        members = [node.targets[0].id for node in declared[name].body
                   if isinstance(node, ast.Assign)]
        assert members == [m.name for m in enum_cls], name


def test_python_type_translates_every_constructor() -> None:
    annotate = PythonType(load().structs)
    cases = {
        "list[int]": "list[int]",
        "set[str]": "set[str]",
        "dict[str, any]": "dict[str, Any]",
        "tuple[int, ...]": "tuple[int, ...]",
        "tuple[str, bytes, float]": "tuple[str, bytes, float]",
        "none | tensor | ndarray": "Tensor | Ndarray | None",
        "nested_tensors | slice | bool": "NestedTensors | slice | bool",
        "FinishReason | none": "FinishReason | None",
        "SamplingParams": "SamplingParams",
    }
    for expression, annotation in cases.items():
        assert annotate.visit(parse_type(expression)) == annotation, expression


def test_stubs_command_checks_the_committed_stub(capsys) -> None:
    from enginewire.cli import main

    assert main(["stubs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out
