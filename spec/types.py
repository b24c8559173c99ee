"""Type expressions used by struct fields and frame payloads.

The grammar is a small subset of Python's annotation syntax, so a reader already knows it::

    type   := member ("|" member)*
    member := NAME | NAME "[" type ("," type)* ("," "...")? "]"

Built-in names and what they are on the wire (msgpack):

==================  ==============================================================
``str``             str
``int``             int (any width msgpack allows)
``float``           float (msgpack float64)
``bool``            bool
``bytes``           bin
``none``            nil (spelled ``None`` too)
``any``             any msgpack value
``slice``           array ``[start, stop, step]``
``tensor``          a torch tensor as the tensors surface's ``(dtype, shape, data)``
``ndarray``         a numpy array, same tuple with a numpy dtype string
``nested_tensors``  a tensor tuple, an int or float, or an array of nested_tensors; an
                    array whose first element is a string is a tensor tuple (vLLM's
                    ``NestedTensors``, the data of a multimodal field)
``list[T]``         array
``set[T]``          array (order unspecified)
``tuple[A, B]``     fixed-length array
``tuple[T, ...]``   array
``dict[K, V]``      map
==================  ==============================================================

Any other name refers to a struct or enum under ``spec/data/structs/``.

Every walk over a type expression is a :class:`TypeVisitor`: one ``visit_<constructor>``
method per built-in name, generic and ``union``, plus ``visit_struct`` and ``visit_enum``. A
subclass that lacks a handler fails when its class is created, and :meth:`TypeVisitor.visit`
raises :class:`UnknownTypeError` naming a type no handler covers, so a new constructor added to
:data:`BUILTINS` or :data:`GENERICS` fails loudly in every walker at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

BUILTINS = frozenset(
    {"str", "int", "float", "bool", "bytes", "none", "any", "slice", "tensor", "ndarray",
     "nested_tensors"}
)
GENERICS = {"list": 1, "set": 1, "tuple": -1, "dict": 2}

_TOKEN = re.compile(r"\s*(?:(\.\.\.)|([A-Za-z_][A-Za-z0-9_]*)|([\[\],|]))")


class TypeSyntaxError(ValueError):
    """A type expression does not follow the grammar above."""


@dataclass(frozen=True)
class TypeExpr:
    """A parsed type: ``name`` with ``args``; a union has ``name == "union"``."""

    name: str
    args: tuple[TypeExpr, ...] = ()
    #: ``tuple[T, ...]``: one element type, any length.
    variadic: bool = False

    @property
    def fixed_tuple(self) -> bool:
        """``tuple[A, B, ...]`` with one type per position (not ``tuple[T, ...]``)."""
        return self.name == "tuple" and not self.variadic

    @property
    def nullable(self) -> bool:
        return self.name == "none" or (
            self.name == "union" and any(a.name == "none" for a in self.args)
        )

    def without_none(self) -> TypeExpr:
        """The type with ``None`` removed from a union (a one-member union collapses)."""
        if self.name != "union":
            return self
        rest = tuple(a for a in self.args if a.name != "none")
        return rest[0] if len(rest) == 1 else TypeExpr("union", rest)

    def names(self) -> set[str]:
        """Every struct or enum name the expression refers to."""
        found = set() if self.name in BUILTINS or self.name in GENERICS else {self.name}
        found.discard("union")
        for arg in self.args:
            found |= arg.names()
        return found

    def __str__(self) -> str:
        if self.name == "union":
            return " | ".join(str(a) for a in self.args)
        if not self.args:
            return self.name
        inner = ", ".join(str(a) for a in self.args)
        return f"{self.name}[{inner}, ...]" if self.variadic else f"{self.name}[{inner}]"


def parse_type(text: str) -> TypeExpr:
    """Parse a type expression; raise :class:`TypeSyntaxError` naming the offending text."""
    tokens: list[str] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        match = _TOKEN.match(stripped, pos)
        if not match:
            raise TypeSyntaxError(f"unexpected character at {pos} in type {text!r}")
        tokens.append(match.group(1) or match.group(2) or match.group(3))
        pos = match.end()
    parser = _Parser(tokens, text)
    result = parser.union()
    if parser.pos != len(tokens):
        raise TypeSyntaxError(f"trailing text {tokens[parser.pos:]} in type {text!r}")
    return result


class _Parser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise TypeSyntaxError(
                f"expected {expected or 'a name'} at token {self.pos} in type {self.text!r}, "
                f"got {token!r}"
            )
        self.pos += 1
        return token

    def union(self) -> TypeExpr:
        members = [self.member()]
        while self.peek() == "|":
            self.take("|")
            members.append(self.member())
        return members[0] if len(members) == 1 else TypeExpr("union", tuple(members))

    def member(self) -> TypeExpr:
        name = self.take()
        if not re.match(r"[A-Za-z_]", name):
            raise TypeSyntaxError(f"expected a type name in {self.text!r}, got {name!r}")
        if name == "None":
            name = "none"
        if self.peek() != "[":
            if name in GENERICS:
                raise TypeSyntaxError(f"{name} needs type arguments in {self.text!r}")
            return TypeExpr(name)
        if name not in GENERICS:
            raise TypeSyntaxError(f"{name} takes no type arguments in {self.text!r}")
        self.take("[")
        args = [self.union()]
        variadic = False
        while self.peek() == ",":
            self.take(",")
            if self.peek() == "...":
                self.take("...")
                variadic = True
                break
            args.append(self.union())
        self.take("]")
        arity = GENERICS[name]
        if variadic and (name != "tuple" or len(args) != 1):
            raise TypeSyntaxError(f"'...' is only allowed as tuple[T, ...] in {self.text!r}")
        if arity > 0 and len(args) != arity:
            raise TypeSyntaxError(
                f"{name} takes {arity} type argument(s), got {len(args)} in {self.text!r}"
            )
        return TypeExpr(name, tuple(args), variadic)


# --- the one walk over type expressions --------------------------------------------------

T = TypeVar("T")


class UnknownTypeError(TypeError):
    """A type expression names a constructor a walker has no handler for."""


def constructors() -> tuple[str, ...]:
    """Every name a :class:`TypeVisitor` dispatches on besides structs and enums: the built-in
    names, the generics and ``union``."""
    return (*sorted(BUILTINS), *sorted(GENERICS), "union")


def missing_handlers(cls: type) -> list[str]:
    """The ``visit_*`` methods a visitor class lacks (empty for a complete visitor)."""
    return [f"visit_{name}" for name in (*constructors(), "struct", "enum")
            if not callable(getattr(cls, f"visit_{name}", None))]


class TypeVisitor(Generic[T]):
    """One walk over a type expression: subclasses define ``visit_<name>(expr, *args)`` for
    each name of :func:`constructors` (the same function may serve several names), and
    ``visit_struct(expr, spec, *args)`` and ``visit_enum(expr, spec, *args)`` for the names of
    ``structs`` (a spec's ``structs`` mapping). ``*args`` are passed through unchanged (a
    value, a path, a depth).

    A concrete subclass missing a handler raises :class:`UnknownTypeError` when it is defined
    (set ``abstract = True`` in a partial base).
    """

    abstract = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("abstract", False):
            return
        missing = missing_handlers(cls)
        if missing:
            raise UnknownTypeError(f"type visitor {cls.__qualname__} has no {', '.join(missing)}")

    def __init__(self, structs: Mapping[str, Any]) -> None:
        self.structs = structs

    def visit(self, expr: TypeExpr, *args: Any) -> T:
        """Dispatch ``expr`` to its handler."""
        name = expr.name
        if name in BUILTINS or name in GENERICS or name == "union":
            handler = getattr(self, f"visit_{name}", None)
            if handler is None:
                raise UnknownTypeError(
                    f"type visitor {type(self).__qualname__} has no visit_{name} for type "
                    f"'{expr}'")
            result: T = handler(expr, *args)
            return result
        item = self.structs.get(name)
        kind = getattr(item, "kind", None)
        if kind == "struct":
            return self.visit_struct(expr, item, *args)  # type: ignore[attr-defined,no-any-return]
        if kind == "enum":
            return self.visit_enum(expr, item, *args)  # type: ignore[attr-defined,no-any-return]
        raise UnknownTypeError(
            f"type visitor {type(self).__qualname__}: unknown type {name!r} in '{expr}' (not a "
            f"built-in {sorted(BUILTINS)}, a generic {sorted(GENERICS)}, nor a struct or enum "
            "of the spec)")


# --- coarse classification, for code that needs the family of a type, not a walk ------------

#: The families :func:`kind_of` sorts type expressions into.
KINDS = ("nil", "scalar", "any", "slice", "tensor", "nested_tensors", "sequence", "mapping",
         "union", "struct", "enum")


class _Kind(TypeVisitor[str]):
    """A type expression's family: ``scalar`` (str, int, float, bool, bytes), ``tensor``
    (tensor, ndarray), ``sequence`` (list, set, tuple), ``mapping`` (dict), ``nil`` (none),
    or its own name for the rest."""

    def _scalar(self, expr: TypeExpr) -> str:
        return "scalar"

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = _scalar

    def visit_none(self, expr: TypeExpr) -> str:
        return "nil"

    def visit_any(self, expr: TypeExpr) -> str:
        return "any"

    def visit_slice(self, expr: TypeExpr) -> str:
        return "slice"

    def _tensor(self, expr: TypeExpr) -> str:
        return "tensor"

    visit_tensor = visit_ndarray = _tensor

    def visit_nested_tensors(self, expr: TypeExpr) -> str:
        return "nested_tensors"

    def _sequence(self, expr: TypeExpr) -> str:
        return "sequence"

    visit_list = visit_set = visit_tuple = _sequence

    def visit_dict(self, expr: TypeExpr) -> str:
        return "mapping"

    def visit_union(self, expr: TypeExpr) -> str:
        return "union"

    def visit_struct(self, expr: TypeExpr, item: object) -> str:
        return "struct"

    def visit_enum(self, expr: TypeExpr, item: object) -> str:
        return "enum"


class _NoStructs(dict[str, Any]):
    """The ``structs`` of a classification without a spec: every other name is a struct."""

    def get(self, key: str, default: Any = None) -> Any:
        return _STRUCT_MARK


@dataclass(frozen=True)
class _StructMark:
    kind: str = "struct"


_STRUCT_MARK = _StructMark()


def kind_of(expr: TypeExpr, structs: Mapping[str, Any] | None = None) -> str:
    """The family (one of :data:`KINDS`) of ``expr``. With a spec's ``structs`` mapping a
    name is told apart as ``struct`` or ``enum`` (an unknown one raises
    :class:`UnknownTypeError`); without it every non-built-in name is ``struct``."""
    return _Kind(_NoStructs() if structs is None else structs).visit(expr)


def tensor_family(expr: TypeExpr) -> str | None:
    """``tensor`` (a torch tensor) or ``ndarray`` (a numpy array) for those two types, which
    travel in forms of their own; None for every other type."""
    return expr.name if kind_of(expr) == "tensor" else None


def scalar_type(expr: TypeExpr) -> type | None:
    """The Python type of a scalar expression (``str`` -> ``str``...); None for the rest."""
    return _SCALAR_TYPES.get(expr.name) if kind_of(expr) == "scalar" else None


_SCALAR_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool,
                                  "bytes": bytes}


def members(expr: TypeExpr) -> tuple[TypeExpr, ...]:
    """The non-nil members of a union, or ``(expr,)`` for any other non-nil type; ``()`` for
    ``none``."""
    if kind_of(expr) == "union":
        return tuple(a for a in expr.args if kind_of(a) != "nil")
    return () if kind_of(expr) == "nil" else (expr,)


_CONTAINER_TYPES: dict[str, type] = {"list": list, "set": set, "tuple": tuple, "dict": dict}


def container_type(expr: TypeExpr) -> type | None:
    """The Python container of a sequence or mapping expression (``list``, ``set``,
    ``tuple``, ``dict``); None for the rest."""
    return _CONTAINER_TYPES[expr.name] if kind_of(expr) in ("sequence", "mapping") else None
