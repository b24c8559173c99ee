"""One walk over type expressions: every walker is a TypeVisitor, and a constructor no walker
handles fails in all of them at once."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import enginewire.conformance.oracle.samples as samples
import enginewire.conformance.oracle.values as values
import enginewire.conformance.oracle.wire as wire
import enginewire.conformance.targets.vllm.objects as vllm_objects
import enginewire.fuzz.mutations as mutations
import enginewire.fuzz.strategies as strategies
import enginewire.reference.codec as codec
import enginewire.reference.stubs as stubs
import enginewire.spec.classes as structs
import enginewire.spec.loader as loader
import enginewire.spec.render as render
import enginewire.spec.types as types
from enginewire.spec import load
from enginewire.spec.types import (
    KINDS,
    TypeExpr,
    TypeVisitor,
    UnknownTypeError,
    constructors,
    container_type,
    kind_of,
    members,
    missing_handlers,
    parse_type,
    scalar_type,
)

SPEC = load()

#: Every walker of the project, by its module: the test fails if one is dropped or renamed
#: without updating this list (and so without being looked at).
WALKERS = {
    "enginewire.conformance.oracle.wire": {"_ToWire", "_FromWire"},
    "enginewire.conformance.oracle.values": {"_Complete", "_Build"},
    "enginewire.conformance.oracle.samples": {"Sampler"},
    "enginewire.fuzz.strategies": {"_StrategyOf"},
    "enginewire.fuzz.mutations": {"_Inside", "_MsgpackKinds"},
    "enginewire.conformance.targets.vllm.objects": {"_Convert"},
    "enginewire.spec.classes": {"_Annotation"},
    "enginewire.reference.codec": {"_Child"},
    "enginewire.spec.loader": {"_DefaultProblem"},
    "enginewire.spec.render": {"_TypeCell"},
    "enginewire.spec.types": {"_Kind"},
    "enginewire.reference.stubs": {"PythonType"},
}


def _visitors() -> list[type]:
    found: list[type] = []
    pending = list(TypeVisitor.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_walker_is_a_complete_visitor() -> None:
    by_module: dict[str, set[str]] = {}
    for cls in _visitors():
        if cls.__module__.startswith("enginewire."):
            by_module.setdefault(cls.__module__, set()).add(cls.__name__)
            assert missing_handlers(cls) == [], cls
    for module, names in WALKERS.items():
        assert names <= by_module.get(module, set()), (module, by_module.get(module))


def test_a_visitor_missing_a_handler_fails_when_defined() -> None:
    with pytest.raises(UnknownTypeError, match="visit_dict"):
        class Partial(TypeVisitor[int]):  # noqa: F841 - defining it is the test
            def _one(self, expr: TypeExpr, *args: Any) -> int:
                return 1

            visit_str = visit_int = visit_float = visit_bool = visit_bytes = _one
            visit_none = visit_any = visit_slice = visit_tensor = visit_ndarray = _one
            visit_nested_tensors = visit_list = visit_set = visit_tuple = visit_union = _one
            visit_struct = visit_enum = _one


def test_a_new_builtin_is_missing_from_every_visitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a built-in name leaves every walker without a handler for it."""
    monkeypatch.setattr(types, "BUILTINS", types.BUILTINS | {"uuid"})
    assert "uuid" in constructors()
    ours = [cls for cls in _visitors() if cls.__module__.startswith("enginewire.")]
    assert len(ours) >= sum(len(names) for names in WALKERS.values())
    for cls in ours:
        assert "visit_uuid" in missing_handlers(cls), cls


def _entry_points() -> dict[str, Callable[[TypeExpr], Any]]:
    """Each walker's public way in, called on one type expression."""
    gen = strategies.generator()
    struct_set = structs.build(SPEC.version)

    class _Objects:
        spec = SPEC

    return {
        "wire.expected_wire": lambda e: wire.expected_wire(1, e, SPEC),
        "wire.from_wire": lambda e: wire.from_wire(1, e, SPEC),
        "values.complete": lambda e: values.complete(1, e, SPEC),
        "values.build": lambda e: values.build(1, e, SPEC, lambda name: None),
        "samples.Sampler": lambda e: samples.Sampler(SPEC).value(e),
        "strategies": lambda e: gen._build(e, 0),
        "mutations.walk": lambda e: list(mutations._Inside(SPEC).visit(e, 1, ())),
        "mutations.msgpack_kinds": lambda e: mutations.msgpack_kinds(e, SPEC),
        "vllm_objects.convert": lambda e: vllm_objects._Convert(_Objects()).visit(e, 1),
        "structs.type_of": lambda e: struct_set.type_of(e),
        "codec._Child": lambda e: codec._Child(SPEC.structs).visit(e, 0),
        "loader.default_problem": lambda e: loader._default_problem(1, e, SPEC.structs),
        "render.type_cell": lambda e: render._Page(SPEC, "structs")._type(e),
        "types.kind_of": lambda e: types.kind_of(e, SPEC.structs),
        "stubs.PythonType": lambda e: stubs.PythonType(SPEC.structs).visit(e),
    }


@pytest.mark.parametrize("entry", sorted(_entry_points()))
def test_an_unknown_name_raises_from_every_walker(entry: str) -> None:
    with pytest.raises(UnknownTypeError, match="'Nonexistent'"):
        _entry_points()[entry](TypeExpr("Nonexistent"))


@pytest.mark.parametrize("entry", sorted(_entry_points()))
def test_a_builtin_without_handler_raises_from_every_walker(
        entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(types, "BUILTINS", types.BUILTINS | {"uuid"})
    with pytest.raises(UnknownTypeError, match="visit_uuid"):
        _entry_points()[entry](TypeExpr("uuid"))


def test_dispatch_reaches_structs_and_enums() -> None:
    class Kind(TypeVisitor[str]):
        def _builtin(self, expr: TypeExpr, *args: Any) -> str:
            return f"builtin {expr.name}"

        for _name in constructors():
            locals()[f"visit_{_name}"] = _builtin

        def visit_struct(self, expr: TypeExpr, item: Any) -> str:
            return f"struct {item.name}"

        def visit_enum(self, expr: TypeExpr, item: Any) -> str:
            return f"enum {item.name}"

    kind = Kind(SPEC.structs)
    assert kind.visit(parse_type("EngineCoreRequest")) == "struct EngineCoreRequest"
    assert kind.visit(parse_type("FinishReason")) == "enum FinishReason"
    assert kind.visit(parse_type("list[int]")) == "builtin list"
    assert kind.visit(parse_type("int | None")) == "builtin union"


def test_kind_of_sorts_every_constructor_into_a_family() -> None:
    expected = {
        "str": "scalar", "int": "scalar", "float": "scalar", "bool": "scalar",
        "bytes": "scalar", "none": "nil", "any": "any", "slice": "slice",
        "tensor": "tensor", "ndarray": "tensor", "nested_tensors": "nested_tensors",
        "list[int]": "sequence", "set[int]": "sequence", "tuple[int, ...]": "sequence",
        "tuple[int, str]": "sequence", "dict[str, int]": "mapping", "int | None": "union",
        "EngineCoreRequest": "struct", "FinishReason": "enum",
    }
    for text, kind in expected.items():
        assert kind_of(parse_type(text), SPEC.structs) == kind, text
    assert set(expected.values()) == set(KINDS)
    # Without a spec every other name is a struct; with one, an unknown name fails loudly.
    assert kind_of(parse_type("FinishReason")) == "struct"
    with pytest.raises(UnknownTypeError, match="Nonexistent"):
        kind_of(TypeExpr("Nonexistent"), SPEC.structs)


def test_members_scalar_and_container_helpers() -> None:
    assert members(parse_type("int | None | str")) == (parse_type("int"), parse_type("str"))
    assert members(parse_type("none")) == ()
    assert members(parse_type("list[int]")) == (parse_type("list[int]"),)
    assert [scalar_type(parse_type(t)) for t in ("str", "float", "int | None", "list[int]")] == [
        str, float, None, None]
    assert [container_type(parse_type(t)) for t in ("list[int]", "set[str]", "tuple[int, ...]",
                                                    "dict[str, int]", "int")] == [
        list, set, tuple, dict, None]
    assert parse_type("tuple[int, str]").fixed_tuple
    assert not parse_type("tuple[int, ...]").fixed_tuple
    assert not parse_type("list[int]").fixed_tuple


#: Modules still comparing type-expression names directly, each to be ported to the helpers
#: above (their default and tagged-union checks predate them).
UNPORTED = {"spec/loader.py"}


def test_no_module_compares_type_constructor_names_outside_spec_types() -> None:
    """``expr.name == "union"`` (or ``in ("list", "set")``) bypasses the visitor: a new
    constructor would slip past it. Only spec/types.py may spell constructor names."""
    root = Path(__file__).resolve().parents[1]
    names = set(constructors())
    found: list[str] = []
    for folder in ("spec", "reference", "conformance", "fuzz", "bench", "tap", "enginewire"):
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative == "spec/types.py" or relative in UNPORTED:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                if not any(isinstance(side, ast.Attribute) and side.attr == "name"
                           for side in sides):
                    continue
                constants = {c.value for side in sides for c in ast.walk(side)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if constants & names:
                    found.append(f"{relative}:{node.lineno}")
    assert found == []
