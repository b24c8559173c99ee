"""Wire data read with vLLM 0.33.0's exact typing: what its typed msgspec decoder rejects.

vLLM decodes every payload with ``msgspec.msgpack.Decoder(T)`` for the struct ``T`` the
channel carries: a value whose msgpack type does not fit the field's declared type is
rejected (``Expected `array | null`, got `int` - at `$[1][0][12]```), ``nil`` only where the
type is optional, an integer where a ``float`` is declared is accepted, an array struct
shorter than its required fields is rejected and one longer ignores the extra tail, a map
struct ignores unknown keys and rejects a missing required one. :func:`type_problems` lists
every such difference of decoded wire data (:func:`~.wire.raw_decode`) from a spec type, each
with its ``$``-path (positions as msgspec names them), the struct and field it sits in, the
type the spec declares and the msgpack type that came. :func:`check_wire` raises the first as
a :class:`StrictWireError` naming the clause.

The suite's peers read everything a target sends through this (``peers.zmq_peers.decode``),
so a target whose messages vLLM would refuse fails the check that received them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from enginewire.conformance.oracle.wire import (
    EnumSpec,
    StructSpec,
    TypeExpr,
    WireShapeError,
    parse_type,
)
from enginewire.spec.history.release_facts import handshake_message_at
from enginewire.spec.types import TypeVisitor, kind_of, members, tensor_family


@dataclass(frozen=True)
class TypeProblem:
    """One position whose value vLLM's typed decoder rejects."""

    path: str
    expected: str
    got: str
    #: ``Struct.field`` where the position is a struct field, else "".
    field: str = ""
    #: "type" (the value has another type), "missing" (a required field is absent).
    kind: str = "type"

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        if self.kind == "missing":
            return f"`{self.path}`{where}: required field missing (type `{self.expected}`)"
        return f"`{self.path}`{where}: expected `{self.expected}`, got `{self.got}`"


class StrictWireError(WireShapeError):
    """Wire data vLLM's typed decoder rejects; ``clause``, ``problems`` (first: the one
    vLLM reports), ``path`` and ``field`` of the first."""

    def __init__(self, clause: str, what: str, problems: list[TypeProblem],
                 release: str = "0.33.0") -> None:
        self.clause = clause
        self.problems = problems
        first = problems[0]
        self.path = first.path
        self.field = first.field
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"[{clause}] {what} that vLLM {release} rejects: {first}{more}")


def msgpack_type(raw: Any) -> str:
    """The msgpack type name of a decoded value, as msgspec's errors spell it."""
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "bool"
    if isinstance(raw, int):
        return "int"
    if isinstance(raw, float):
        return "float"
    if isinstance(raw, str):
        return "str"
    if isinstance(raw, bytes | bytearray | memoryview):
        return "bytes"
    if isinstance(raw, list | tuple):
        return "array"
    if isinstance(raw, dict):
        return "object"
    if isinstance(raw, msgspec.msgpack.Ext):
        return f"ext {raw.code}"
    return type(raw).__name__


def type_text(expr: TypeExpr) -> str:
    """A spec type expression as text (``tensor | none``)."""
    if kind_of(expr) == "union":
        return " | ".join(type_text(a) for a in expr.args)
    if not expr.args:
        return expr.name
    inner = ", ".join(type_text(a) for a in expr.args)
    return f"{expr.name}[{inner}{', ...' if expr.variadic else ''}]"


def type_problems(raw: Any, type_expr: str | TypeExpr, spec: Any, path: str = "$",
                  field: str = "") -> list[TypeProblem]:
    """Every position of ``raw`` that vLLM's typed decoder of ``type_expr`` rejects, in wire
    order (the first is the one vLLM reports)."""
    expr = parse_type(type_expr) if isinstance(type_expr, str) else type_expr
    out: list[TypeProblem] = []
    _check(raw, expr, spec, path, field, out)
    return out


def check_wire(raw: Any, type_expr: str, spec: Any, *, clause: str, what: str) -> None:
    """Raise :class:`StrictWireError` when vLLM's typed decoder rejects ``raw``."""
    problems = type_problems(raw, type_expr, spec)
    if problems:
        raise StrictWireError(clause, what, problems, getattr(spec, "version", "0.33.0"))


def _fits(raw: Any, expr: TypeExpr, spec: Any) -> bool:
    probe: list[TypeProblem] = []
    _check(raw, expr, spec, "$", "", probe)
    return not probe


def _check(raw: Any, expr: TypeExpr, spec: Any, path: str, field: str,
           out: list[TypeProblem]) -> None:
    """Append to ``out`` every position of ``raw`` vLLM's typed decoder of ``expr`` rejects."""
    _Checker(spec, out).check(expr, raw, path, field)


class _Checker(TypeVisitor[None]):
    """The type check as one walk over the type expression (:class:`TypeVisitor`: a handler
    per type constructor, structs and enums from the spec), each handler given the decoded
    value, its ``$``-path and the ``Struct.field`` it sits in."""

    def __init__(self, spec: Any, out: list[TypeProblem]) -> None:
        super().__init__(spec.structs)
        self.spec = spec
        self.out = out

    def bad(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        self.out.append(TypeProblem(path, type_text(expr), msgpack_type(raw), field))

    def check(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        # nil fits only ``none``, ``any`` and a union holding one of them.
        if raw is None and kind_of(expr) not in ("nil", "any", "union"):
            self.bad(expr, raw, path, field)
            return
        self.visit(expr, raw, path, field)

    def visit_any(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        return

    def visit_none(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if raw is not None:
            self.bad(expr, raw, path, field)

    def visit_union(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if raw is None:
            if not any(kind_of(a) in ("nil", "any") for a in expr.args):
                self.bad(expr, raw, path, field)
            return
        candidates = members(expr)
        if any(_fits(raw, a, self.spec) for a in candidates):
            return
        # Report inside the member of the same msgpack shape, when one exists.
        same = [a for a in candidates if _shape_matches(raw, a, self.spec)]
        if len(same) == 1:
            self.check(same[0], raw, path, field)
        else:
            self.bad(expr, raw, path, field)

    def visit_struct(self, expr: TypeExpr, item: StructSpec, raw: Any, path: str,
                     field: str) -> None:
        _check_struct(raw, item, self.spec, path, field, self.out)

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, raw: Any, path: str,
                   field: str) -> None:
        values = {m.value for m in item.members}
        if isinstance(raw, bool) or raw not in values:
            self.out.append(TypeProblem(path, f"{expr.name} (one of {sorted(values, key=repr)})",
                                        f"{msgpack_type(raw)} {raw!r}", field))

    def visit_int(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not isinstance(raw, int) or isinstance(raw, bool):
            self.bad(expr, raw, path, field)

    def visit_float(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not isinstance(raw, int | float) or isinstance(raw, bool):
            self.bad(expr, raw, path, field)

    def visit_str(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not isinstance(raw, str):
            self.bad(expr, raw, path, field)

    def visit_bool(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not isinstance(raw, bool):
            self.bad(expr, raw, path, field)

    def visit_bytes(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not isinstance(raw, bytes | bytearray | memoryview):
            self.bad(expr, raw, path, field)

    def _tensor(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        tensors = self.spec.surface("tensors")
        form = tensors.tensor_form if tensor_family(expr) == "tensor" else tensors.ndarray_form
        if form == "pickle":  # the release's extension type wrapping a pickle stream
            codes = {e.name: e.code for e in tensors.ext_codes}
            if not (isinstance(raw, msgspec.msgpack.Ext) and raw.code == codes.get("tensor")):
                self.out.append(TypeProblem(path, f"{expr.name} [ext {codes.get('tensor')}]",
                                            msgpack_type(raw), field))
            return
        _check_tensor(raw, expr, path, field, self.out)

    visit_tensor = visit_ndarray = _tensor

    def visit_nested_tensors(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if isinstance(raw, list) and len(raw) == 3 and isinstance(raw[0], str):
            _check_tensor(raw, expr, path, field, self.out)
        elif isinstance(raw, list):
            for index, value in enumerate(raw):
                self.check(expr, value, f"{path}[{index}]", field)
        else:
            self.bad(expr, raw, path, field)

    def _items(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not isinstance(raw, list):
            self.bad(expr, raw, path, field)
            return
        for index, value in enumerate(raw):
            self.check(expr.args[0], value, f"{path}[{index}]", field)

    visit_list = visit_set = _items

    def visit_tuple(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if expr.variadic:
            self._items(expr, raw, path, field)
            return
        if not isinstance(raw, list) or len(raw) != len(expr.args):
            self.out.append(TypeProblem(path, type_text(expr),
                                        f"array of {len(raw)}" if isinstance(raw, list)
                                        else msgpack_type(raw), field))
            return
        for index, (value, arg) in enumerate(zip(raw, expr.args, strict=True)):
            self.check(arg, value, f"{path}[{index}]", field)

    def visit_dict(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not isinstance(raw, dict):
            self.bad(expr, raw, path, field)
            return
        for key, value in raw.items():
            self.check(expr.args[0], key, f"{path}[...]", field)
            self.check(expr.args[1], value, f"{path}[{key!r}]", field)

    def visit_slice(self, expr: TypeExpr, raw: Any, path: str, field: str) -> None:
        if not (isinstance(raw, list) and len(raw) == 3 and all(
                v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in raw)):
            self.bad(expr, raw, path, field)


def _shape_matches(raw: Any, expr: TypeExpr, spec: Any) -> bool:
    item = spec.structs.get(expr.name)
    if isinstance(item, StructSpec):
        return isinstance(raw, list) == (item.encoding in ("array", "tuple"))
    if kind_of(expr) in ("sequence", "tensor", "nested_tensors", "slice"):
        return isinstance(raw, list)
    if kind_of(expr) == "mapping":
        return isinstance(raw, dict)
    return False


def _check_tensor(raw: Any, expr: TypeExpr, path: str, field: str,
                  out: list[TypeProblem]) -> None:
    shape = "[dtype: str, shape: array[int], data: int | bytes | ext 3]"
    if not isinstance(raw, list) or len(raw) != 3:
        out.append(TypeProblem(path, f"{expr.name} {shape}", msgpack_type(raw)
                               if not isinstance(raw, list) else f"array of {len(raw)}", field))
        return
    dtype, dims, data = raw
    if not isinstance(dtype, str):
        out.append(TypeProblem(f"{path}[0]", "str", msgpack_type(dtype), field))
    if not isinstance(dims, list) or any(
            not isinstance(d, int) or isinstance(d, bool) for d in dims):
        out.append(TypeProblem(f"{path}[1]", "array[int]", msgpack_type(dims), field))
    if not (isinstance(data, bytes | msgspec.msgpack.Ext)
            or (isinstance(data, int) and not isinstance(data, bool))):
        out.append(TypeProblem(f"{path}[2]", "int | bytes | ext 3", msgpack_type(data), field))


def _check_struct(raw: Any, item: StructSpec, spec: Any, path: str, field: str,
                  out: list[TypeProblem]) -> None:
    fields = list(item.fields)
    if item.encoding in ("array", "tuple"):
        if not isinstance(raw, list):
            out.append(TypeProblem(path, f"{item.name} (array)", msgpack_type(raw), field))
            return
        for index, fld in enumerate(fields):
            where = f"{item.name}.{fld.name}"
            if index < len(raw):
                _check(raw[index], parse_type(fld.type), spec, f"{path}[{index}]", where, out)
            elif fld.required:
                out.append(TypeProblem(f"{path}[{index}]", fld.type, "nothing", where,
                                       "missing"))
        return
    if not isinstance(raw, dict):
        out.append(TypeProblem(path, f"{item.name} (object)", msgpack_type(raw), field))
        return
    for fld in fields:
        where = f"{item.name}.{fld.name}"
        if fld.name in raw:
            _check(raw[fld.name], parse_type(fld.type), spec, f"{path}.{fld.name}", where, out)
        elif fld.required:
            out.append(TypeProblem(f"{path}.{fld.name}", fld.type, "nothing", where, "missing"))


def handshake_problems(raw: Any, message: str, spec: Any) -> list[TypeProblem]:
    """Problems of a HELLO or READY map in ``spec``'s release: a required key missing (vLLM
    reads it with ``msg["key"]``: a KeyError) or a key's value of another type. The keys are
    the release's (:func:`~enginewire.spec.history.release_facts.handshake_message_at`)."""
    found = handshake_message_at(spec, message)
    if found is None:
        return [TypeProblem("$", f"no {message} in vLLM {spec.version}", msgpack_type(raw))]
    if not isinstance(raw, dict):
        return [TypeProblem("$", f"{message} (object)", msgpack_type(raw))]
    out: list[TypeProblem] = []
    for key in found.keys:
        where = f"{message}.{key.name}"
        if key.name not in raw:
            if key.required:
                out.append(TypeProblem(f"$.{key.name}", key.type, "nothing", where, "missing"))
            continue
        _check(raw[key.name], parse_type(key.type), spec, f"$.{key.name}", where, out)
    return out


def handshake_surplus(raw: Any, message: str, spec: Any) -> list[str]:
    """The keys of a HELLO or READY map that ``spec``'s release's message does not have (a
    key added in a later release, such as ``headless`` before 0.10.0, marks a map written
    for another release), sorted."""
    found = handshake_message_at(spec, message)
    if found is None or not isinstance(raw, dict):
        return []
    names = {k.name for k in found.keys}
    return sorted(str(k) for k in raw if k not in names)


def layout_releases(raw: Any, type_expr: str, spec: Any) -> list[str] | None:
    """The vLLM releases whose layout of ``type_expr`` the observed ``raw`` fits, or None
    while the spec carries no per-release history (hook: a spec with ``layout_history``, a
    callable ``(raw, type_expr) -> list[str]``, answers)."""
    history = getattr(spec, "layout_history", None)
    if history is None:
        return None
    return list(history(raw, type_expr))
