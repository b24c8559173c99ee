"""Integer formulas of the spec (the ring's ``layout`` table), evaluated without ``eval``.

A formula is a Python-like arithmetic expression over names, for example
``"metadata_offset + chunk * (1 + n_reader)"``. Only integer literals, names, parentheses, unary
``+``/``-`` and the binary operators ``+ - * // % **`` are allowed; ``/`` is accepted only where
it divides exactly, so a formula can never produce a fraction of a byte. Anything else (calls,
attributes, comparisons, floats, strings) is a :class:`FormulaError`.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import cast

#: Largest exponent ``**`` accepts: enough for sizes such as ``2 ** 20``, small enough that a
#: mistyped formula cannot make the evaluator build a number with millions of digits.
MAX_EXPONENT = 64


class FormulaError(ValueError):
    """A formula is not integer arithmetic over names, or a name in it has no value."""


def _exact_div(left: int, right: int) -> int:
    if right == 0:
        raise ZeroDivisionError("division by zero")
    quotient, remainder = divmod(left, right)
    if remainder:
        raise FormulaError(f"{left} / {right} is not a whole number; write // to round down")
    return quotient


def _power(base: int, exponent: int) -> int:
    if not 0 <= exponent <= MAX_EXPONENT:
        raise FormulaError(f"exponent {exponent} is outside 0..{MAX_EXPONENT}")
    result: int = base**exponent
    return result


_BINARY: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: _exact_div,
    ast.Pow: _power,
}
_UNARY: dict[type[ast.unaryop], Callable[[int], int]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def parse_formula(text: str) -> ast.expr:
    """Parse ``text`` and check that it uses only the allowed syntax; return its AST."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"formula {text!r} is not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Expression | ast.Name | ast.Load | ast.operator | ast.unaryop):
            if isinstance(node, ast.operator) and type(node) not in _BINARY:
                raise FormulaError(
                    f"operator {type(node).__name__} is not allowed in formula {text!r}"
                )
            if isinstance(node, ast.unaryop) and type(node) not in _UNARY:
                raise FormulaError(
                    f"operator {type(node).__name__} is not allowed in formula {text!r}"
                )
            continue
        if isinstance(node, ast.BinOp | ast.UnaryOp):
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int:
            continue
        raise FormulaError(
            f"formula {text!r} may hold only integers, names and + - * / // % ** ( ), "
            f"got {ast.unparse(node)!r}"
        )
    return tree.body


def formula_names(text: str) -> set[str]:
    """The names ``text`` refers to."""
    return {node.id for node in ast.walk(parse_formula(text)) if isinstance(node, ast.Name)}


def evaluate_formula(text: str, names: Mapping[str, int]) -> int:
    """Evaluate ``text`` with ``names`` supplying the value of every name; return an int.

    Raise :class:`FormulaError` for disallowed syntax or a name missing from ``names``.
    """
    return _evaluate(parse_formula(text), names, text)


def _evaluate(node: ast.expr, names: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Constant):
        return int(cast(int, node.value))
    if isinstance(node, ast.Name):
        try:
            value = names[node.id]
        except KeyError:
            raise FormulaError(f"name {node.id!r} in formula {text!r} has no value") from None
        if type(value) is not int:
            raise FormulaError(f"name {node.id!r} in formula {text!r} is {value!r}, not an int")
        return value
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand, names, text))
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, names, text)
        right = _evaluate(node.right, names, text)
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise FormulaError(f"formula {text!r} divides by zero") from None
    raise FormulaError(f"cannot evaluate {ast.unparse(node)!r} in formula {text!r}")


class FormulaTable:
    """A table of named formulas that may refer to each other and to parameters.

    ``value(name, extra)`` evaluates one entry; names that are neither entries nor parameters
    come from ``extra`` (index variables such as a chunk number). ``free_names(name)`` lists the
    names an entry needs beyond the table and the parameters, following references between
    entries, so a caller can tell a constant (``metadata_offset``) from a per-chunk position.
    """

    def __init__(self, formulas: Mapping[str, str], parameters: Mapping[str, int]) -> None:
        self.formulas = dict(formulas)
        self.parameters = dict(parameters)

    def free_names(self, name: str, _stack: tuple[str, ...] = ()) -> set[str]:
        if name in _stack:
            raise FormulaError(f"formulas refer to each other in a cycle: {' -> '.join(_stack)}")
        free: set[str] = set()
        for used in formula_names(self.formulas[name]):
            if used in self.formulas:
                free |= self.free_names(used, (*_stack, name))
            elif used not in self.parameters:
                free.add(used)
        return free

    def value(self, name: str, extra: Mapping[str, int] | None = None) -> int:
        return self._value(name, dict(extra or {}), ())

    def _value(self, name: str, extra: dict[str, int], stack: tuple[str, ...]) -> int:
        if name in stack:
            chain = " -> ".join((*stack, name))
            raise FormulaError(f"formulas refer to each other in a cycle: {chain}")
        return evaluate_formula(self.formulas[name], _Scope(self, extra, (*stack, name)))


class _Scope(Mapping[str, int]):
    """Name lookup for one evaluation: other entries first, then parameters, then ``extra``."""

    def __init__(self, table: FormulaTable, extra: dict[str, int], stack: tuple[str, ...]) -> None:
        self.table = table
        self.extra = extra
        self.stack = stack

    def __getitem__(self, key: str) -> int:
        if key in self.table.formulas:
            return self.table._value(key, self.extra, self.stack)
        if key in self.table.parameters:
            return self.table.parameters[key]
        return self.extra[key]

    def __iter__(self) -> Iterator[str]:
        return iter({**self.extra, **self.table.parameters, **self.table.formulas})

    def __len__(self) -> int:
        return len({**self.extra, **self.table.parameters, **self.table.formulas})
