"""The type-expression grammar of struct fields and frame payloads (``enginewire.spec.types``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginewire.spec import TypeExpr, parse_type
from enginewire.spec.types import BUILTINS, TypeSyntaxError


def test_builtin_name() -> None:
    assert parse_type("int") == TypeExpr("int")
    assert parse_type("  bytes  ") == TypeExpr("bytes")


def test_none_has_two_spellings() -> None:
    assert parse_type("None") == parse_type("none") == TypeExpr("none")


def test_struct_name_is_a_reference() -> None:
    expr = parse_type("SamplingParams")
    assert expr == TypeExpr("SamplingParams")
    assert expr.names() == {"SamplingParams"}


def test_generics() -> None:
    assert parse_type("list[int]") == TypeExpr("list", (TypeExpr("int"),))
    assert parse_type("set[str]") == TypeExpr("set", (TypeExpr("str"),))
    assert parse_type("dict[str, any]") == TypeExpr("dict", (TypeExpr("str"), TypeExpr("any")))
    assert parse_type("tuple[int, str, bytes]").args == (
        TypeExpr("int"), TypeExpr("str"), TypeExpr("bytes"),
    )


def test_variadic_tuple() -> None:
    expr = parse_type("tuple[int, ...]")
    assert expr == TypeExpr("tuple", (TypeExpr("int"),), variadic=True)
    assert str(expr) == "tuple[int, ...]"


def test_union_and_nullability() -> None:
    expr = parse_type("LogprobsLists | none")
    assert expr.name == "union"
    assert expr.args == (TypeExpr("LogprobsLists"), TypeExpr("none"))
    assert expr.nullable
    assert expr.without_none() == TypeExpr("LogprobsLists")
    assert parse_type("none").nullable
    assert not parse_type("int").nullable
    assert not parse_type("list[int | none]").nullable  # the elements are, the list is not


def test_without_none_keeps_a_union_of_the_rest() -> None:
    expr = parse_type("int | str | none").without_none()
    assert expr == TypeExpr("union", (TypeExpr("int"), TypeExpr("str")))
    assert parse_type("int").without_none() == TypeExpr("int")


def test_names_collects_struct_references_at_any_depth() -> None:
    expr = parse_type("dict[str, list[EngineCoreEvent] | FinishReason] | tuple[LoRARequest, ...]")
    assert expr.names() == {"EngineCoreEvent", "FinishReason", "LoRARequest"}
    assert parse_type("dict[str, list[tuple[int, float]]] | none").names() == set()


@pytest.mark.parametrize(
    "text",
    [
        "int",
        "none",
        "list[int]",
        "dict[str, any]",
        "tuple[int, ...]",
        "tuple[int, str, bytes]",
        "int | str | none",
        "list[int | none] | none",
        "dict[str, list[tuple[int, float]]]",
        "EngineCoreRequest | list[EngineCoreOutput]",
    ],
)
def test_str_round_trip(text: str) -> None:
    expr = parse_type(text)
    assert str(expr) == text
    assert parse_type(str(expr)) == expr


def test_str_normalizes_spacing_and_none() -> None:
    assert str(parse_type("dict[ str ,int ]|None")) == "dict[str, int] | none"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a name"),
        ("list[int", "expected ]"),
        ("list[int]]", "trailing text"),
        ("list", "list needs type arguments"),
        ("dict[str]", "dict takes 2 type argument"),
        ("set[int, str]", "set takes 1 type argument"),
        ("int[str]", "int takes no type arguments"),
        ("list[int, ...]", "only allowed as tuple"),
        ("tuple[int, str, ...]", "only allowed as tuple"),
        ("tuple[...]", "expected a type name"),
        ("int |", "expected a name"),
        ("| int", "expected a type name"),
        ("int str", "trailing text"),
        ("list[]", "expected a type name"),
        ("list[int,]", "expected a type name"),
        ("Optional(int)", "unexpected character"),
        ("1int", "unexpected character"),
        ("int & str", "unexpected character"),
    ],
)
def test_syntax_errors(text: str, message: str) -> None:
    with pytest.raises(TypeSyntaxError, match=message.replace("[", r"\[")) as caught:
        parse_type(text)
    assert repr(text) in str(caught.value)


def test_syntax_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_type("list[")


# Random well-formed expressions survive printing and parsing unchanged.
_names = st.sampled_from(sorted(BUILTINS - {"none"}) + ["none", "SamplingParams", "Kind"])


def _extend(inner: st.SearchStrategy[TypeExpr]) -> st.SearchStrategy[TypeExpr]:
    return st.one_of(
        st.builds(lambda t: TypeExpr("list", (t,)), inner),
        st.builds(lambda t: TypeExpr("set", (t,)), inner),
        st.builds(lambda k, v: TypeExpr("dict", (k, v)), inner, inner),
        st.builds(lambda t: TypeExpr("tuple", (t,), variadic=True), inner),
        st.builds(lambda ts: TypeExpr("tuple", tuple(ts)), st.lists(inner, min_size=1, max_size=3)),
        st.builds(
            lambda ts: TypeExpr("union", tuple(ts)),
            st.lists(inner.filter(lambda t: t.name != "union"), min_size=2, max_size=3),
        ),
    )


_types = st.recursive(st.builds(TypeExpr, _names), _extend, max_leaves=8)


@given(_types)
def test_round_trip_property(expr: TypeExpr) -> None:
    assert parse_type(str(expr)) == expr
