"""Integer formulas of the spec (``enginewire.spec.formulas``): safe, exact, and referential."""

from __future__ import annotations

import pytest

from enginewire.spec.formulas import (
    FormulaError,
    FormulaTable,
    evaluate_formula,
    formula_names,
)

RING = {"n_reader": 2, "max_chunks": 3, "max_chunk_bytes": 16}


@pytest.mark.parametrize(
    ("formula", "value"),
    [
        ("0", 0),
        ("max_chunks * max_chunk_bytes", 48),
        ("max_chunks * (max_chunk_bytes + 1 + n_reader)", 57),
        ("-n_reader + 3", 1),
        ("+n_reader", 2),
        ("max_chunk_bytes // 3", 5),
        ("max_chunk_bytes % 3", 1),
        ("max_chunk_bytes / 4", 4),
        ("2 ** 20", 1 << 20),
        ("  1 + 1  ", 2),
    ],
)
def test_evaluate(formula: str, value: int) -> None:
    result = evaluate_formula(formula, RING)
    assert result == value
    assert type(result) is int


@pytest.mark.parametrize(
    ("formula", "message"),
    [
        ("__import__('os')", "may hold only integers"),
        ("n_reader.bit_length()", "may hold only integers"),
        ("max_chunks if n_reader else 0", "may hold only integers"),
        ("n_reader < 3", "may hold only integers"),
        ("1.5 * n_reader", "may hold only integers"),
        ("True + 1", "may hold only integers"),
        ("'a' * 3", "may hold only integers"),
        ("[n_reader][0]", "may hold only integers"),
        ("n_reader & 1", "operator BitAnd is not allowed"),
        ("~n_reader", "operator Invert is not allowed"),
        ("max_chunk_bytes / 3", "not a whole number"),
        ("n_reader // 0", "divides by zero"),
        ("2 ** 65", "exponent 65 is outside"),
        ("2 ** -1", "exponent -1 is outside"),
        ("missing + 1", "name 'missing'"),
        ("1 +", "is not an expression"),
        ("", "is not an expression"),
    ],
)
def test_rejected(formula: str, message: str) -> None:
    with pytest.raises(FormulaError, match=message):
        evaluate_formula(formula, RING)


def test_a_non_int_value_is_rejected() -> None:
    with pytest.raises(FormulaError, match="not an int"):
        evaluate_formula("x + 1", {"x": True})  # type: ignore[dict-item]


def test_formula_names() -> None:
    assert formula_names("metadata_offset + chunk * (1 + n_reader)") == {
        "metadata_offset", "chunk", "n_reader",
    }
    assert formula_names("16") == set()


def test_table_resolves_references_and_free_names() -> None:
    table = FormulaTable(
        {
            "metadata_size": "1 + n_reader",
            "metadata_offset": "max_chunks * max_chunk_bytes",
            "written": "metadata_offset + chunk * metadata_size",
            "read": "written + 1 + reader",
        },
        RING,
    )
    assert table.free_names("metadata_offset") == set()
    assert table.free_names("written") == {"chunk"}
    assert table.free_names("read") == {"chunk", "reader"}
    assert table.value("metadata_offset") == 48
    assert table.value("read", {"chunk": 2, "reader": 1}) == 56
    with pytest.raises(FormulaError, match="name 'reader'"):
        table.value("read", {"chunk": 0})


def test_table_detects_cycles() -> None:
    table = FormulaTable({"a": "b + 1", "b": "c", "c": "a"}, {})
    with pytest.raises(FormulaError, match="cycle"):
        table.free_names("a")
    with pytest.raises(FormulaError, match="cycle: a -> b -> c -> a"):
        table.value("a")


def test_entries_shadow_parameters() -> None:
    table = FormulaTable({"n_reader": "5", "x": "n_reader * 2"}, RING)
    assert table.value("x") == 10
