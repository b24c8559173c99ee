"""Load and validate the spec files into typed objects.

``load()`` reads every file under ``spec/data/`` (or a directory you pass), checks it against
:mod:`enginewire.spec.schema` and the cross-file rules below, and returns a :class:`Spec`.
Every problem raises :class:`SpecError` naming the file, the clause (where there is one) and the
field, so ``enginewire spec check`` can point at the exact line to fix.

Cross-file rules:

- clause IDs are unique, start with their surface's name, and use ``[a-z0-9_.-]``;
- every ``source`` is ``vllm/<path>.py:<line>`` (several joined by ``", "``);
- every version range parses;
- struct fields parse as type expressions, name only known structs and enums, keep required
  fields before defaulted ones, and carry JSON-literal defaults that fit their type (null only
  for a nullable type, numbers for int and float, booleans for bool, strings for str, arrays
  and objects for containers and structs, an enum default among the enum's values) and a
  default_factory that builds the field's container type;
- steps, transitions and state machines refer only to clauses and states that exist;
- a struct's ``[[constraints]]`` name its own fields and an existing clause, and its
  ``[[tagged_unions]]`` a ``tuple[str, A | B ...]`` field whose members are exactly the tagged
  structs;
- a ``type_byte`` frame carries no bytes of its own: its message names an on-wire request type
  and the loader fills ``literal_hex`` from ``request_types.toml`` (the one place each byte is
  written);
- request type entries carry version ranges like struct fields: at any release a name has one
  byte and a byte one name (``load(version)`` keeps the entries of ``version``; a message whose
  request type the release lacks keeps its type frame's ``literal_hex`` unset, and
  ``release_facts.message_gap`` says the message does not exist there).

Every rule a consumer needs is read through :class:`Spec` (``ext_code``,
``request_type_byte``, ``chunk_states``, ``ring_constant``, ``constraints``, ``tagged_union``),
never restated:
``tests/test_spec_single_source.py`` scans the consumers for restated values.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

import msgspec

from .schema import (
    SURFACE_SCHEMAS,
    Clause,
    EnumSpec,
    FieldSpec,
    FramesFile,
    HandshakeFile,
    IdentityFile,
    RequestType,
    RequestTypesFile,
    RingFile,
    RingState,
    StructConstraint,
    StructsFile,
    StructSpec,
    SurfaceHeader,
    TaggedUnion,
    TensorsFile,
    TransportFile,
)
from .types import TypeExpr, TypeSyntaxError, TypeVisitor, parse_type
from .versions import VersionError, VersionRange, parse_version

#: The vLLM release the spec files describe completely.
REFERENCE_VLLM_VERSION = "0.33.0"

DATA_DIR = Path(__file__).parent / "data"

#: The kinds a ring constant has (``[constants]`` of ``ring.toml``).
_Constant = TypeVar("_Constant", int, float, str)

_CLAUSE_ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")
_SOURCE = re.compile(r"^vllm/[A-Za-z0-9_/]+\.py:\d+(-\d+)?$")


class SpecError(ValueError):
    """A spec file breaks the schema or a cross-file rule."""

    def __init__(
        self, file: str, message: str, *, clause: str | None = None, field: str | None = None
    ) -> None:
        self.file = file
        self.clause = clause
        self.field = field
        self.message = message
        where = file
        if clause:
            where += f" clause {clause}"
        if field:
            where += f" field {field}"
        super().__init__(f"{where}: {message}")


class UnknownVersionError(SpecError):
    """The version asked for is not one of the releases the spec was derived from."""


@dataclass(frozen=True)
class ClauseRef:
    """A clause together with the surface and file it was read from."""

    surface: str
    file: str
    clause: Clause


@dataclass
class Spec:
    """The whole spec, restricted to one vLLM version."""

    version: str
    surfaces: dict[str, SurfaceHeader]
    structs: dict[str, StructSpec | EnumSpec]
    clauses: dict[str, ClauseRef] = field(default_factory=dict)
    #: Every clause ID of the spec files, this version's and those of other versions (a
    #: clause of an earlier release's form is absent from ``clauses`` but no unknown ID).
    all_clause_ids: frozenset[str] = frozenset()

    def clause(self, clause_id: str) -> Clause:
        try:
            return self.clauses[clause_id].clause
        except KeyError:
            raise KeyError(f"no clause {clause_id!r} in the spec") from None

    # ``surfaces`` maps each name of ``SURFACE_SCHEMAS`` to an instance of that name's file
    # class; ``surface`` reads one with its own type.
    @overload
    def surface(self, name: Literal["transport"]) -> TransportFile: ...
    @overload
    def surface(self, name: Literal["frames"]) -> FramesFile: ...
    @overload
    def surface(self, name: Literal["request_types"]) -> RequestTypesFile: ...
    @overload
    def surface(self, name: Literal["identity"]) -> IdentityFile: ...
    @overload
    def surface(self, name: Literal["handshake"]) -> HandshakeFile: ...
    @overload
    def surface(self, name: Literal["tensors"]) -> TensorsFile: ...
    @overload
    def surface(self, name: Literal["ring"]) -> RingFile: ...
    @overload
    def surface(self, name: Literal["structs"]) -> StructsFile: ...
    @overload
    def surface(self, name: str) -> SurfaceHeader: ...

    def surface(self, name: str) -> SurfaceHeader:
        """The surface file ``name`` (a key of ``SURFACE_SCHEMAS``), typed as that surface's
        file class when ``name`` is a literal."""
        return self.surfaces[name]

    def struct(self, name: str) -> StructSpec:
        found = self.structs.get(name)
        if not isinstance(found, StructSpec):
            raise KeyError(f"no struct {name!r} in the spec")
        return found

    def enum(self, name: str) -> EnumSpec:
        found = self.structs.get(name)
        if not isinstance(found, EnumSpec):
            raise KeyError(f"no enum {name!r} in the spec")
        return found

    # --- rules read by every consumer (one source: the spec files) ---------------------

    def ext_code(self, name: str) -> int:
        """The msgpack extension type code named ``name`` in the tensors surface's
        ``ext_codes`` (``pickle``, ``cloudpickle``, ``raw_view``)."""
        tensors = self.surface("tensors")
        for ext in tensors.ext_codes:
            if ext.name == name:
                return ext.code
        known = [ext.name for ext in tensors.ext_codes]
        raise KeyError(f"no extension code {name!r} in the tensors surface (known: {known})")

    def inline_threshold(self) -> int:
        """The tensors surface's default inline threshold in bytes; ValueError for a release
        that has none (vLLM 0.7.3-0.8.3 pickle a tensor into an extension type)."""
        threshold = self.surface("tensors").threshold_default
        if threshold is None:
            raise ValueError(f"vLLM {self.version} has no inline threshold for tensors "
                             f"(tensor_form {self.surface('tensors').tensor_form!r})")
        return threshold

    def request_type_byte(self, name: str) -> bytes:
        """The one-byte frame of request type ``name`` (``ADD``, ``ABORT``, ...) at this
        release (``UTILITY`` is 0x02 up to vLLM 0.8.2, 0x03 from 0.8.3); KeyError naming the
        release's table where the release has no such type."""
        table = self.surface("request_types")
        for request_type in table.types:
            if request_type.name == name:
                return bytes([request_type.byte])
        known = ", ".join(f"{t.name} 0x{t.byte:02x}" for t in table.types)
        raise KeyError(f"no request type {name!r} in request_types.toml at vLLM "
                       f"{self.version} (its table: {known})")

    def chunk_states(self) -> list[RingState]:
        """The states of a ring chunk's metadata row, in the order the ring surface lists
        them."""
        return list(self.surface("ring").states)

    def ring_constant(self, name: str, kind: type[_Constant]) -> _Constant:
        """The ring surface's constant ``name`` (its ``[constants]`` table), which must be of
        ``kind`` (``int``, ``float`` or ``str``; an integer is accepted as a float)."""
        constants = self.surface("ring").constants
        try:
            value = constants[name]
        except KeyError:
            raise KeyError(f"no constant {name!r} in the ring surface "
                           f"(known: {sorted(constants)})") from None
        if kind is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kind):
            raise TypeError(f"ring constant {name!r}: expected {kind.__name__}, "
                            f"got {type(value).__name__} {value!r}")
        return value

    def constraints(self, struct: str, kind: str | None = None) -> list[StructConstraint]:
        """The multi-field rules of ``struct`` (all, or only those of ``kind``)."""
        return [c for c in self.struct(struct).constraints if kind is None or c.kind == kind]

    def tagged_union(self, struct: str, field_name: str) -> TaggedUnion:
        """The tag table of ``struct``'s field ``field_name``."""
        for union in self.struct(struct).tagged_unions:
            if union.field == field_name:
                return union
        raise KeyError(f"{struct}.{field_name} is not a tagged union in the spec")

    def to_builtins(self) -> dict[str, Any]:
        """The whole spec as plain JSON-ready data (``enginewire spec export``).

        Every key of the schema is present, defaults included (``null`` for an absent optional
        value), so a consumer in another language needs no knowledge of the schema's defaults:
        ``kind`` tells a struct from an enum, ``required`` is always a boolean.
        """
        return {
            "format": "enginewire-spec/1",
            "vllm_version": self.version,
            "surfaces": {name: _complete(s) for name, s in self.surfaces.items()},
            "structs": {name: _complete(s) for name, s in self.structs.items()},
            "wire_encoding": _wire_facts(),
        }


def _wire_facts() -> dict[str, Any]:
    from enginewire.spec.wire_facts import wire_facts

    return wire_facts()


def _complete(value: Any) -> Any:
    """``value`` as JSON-ready builtins with every struct field written out, defaults too."""
    if isinstance(value, msgspec.Struct):
        return {
            f.encode_name: _complete(getattr(value, f.name)) for f in msgspec.structs.fields(value)
        }
    if isinstance(value, list | tuple):
        return [_complete(item) for item in value]
    if isinstance(value, dict):
        return {key: _complete(item) for key, item in value.items()}
    return value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(_display_name(path), f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(_display_name(path), f"not UTF-8 text: {exc.reason} at byte "
                                             f"{exc.start}") from None
    except RecursionError:
        raise SpecError(_display_name(path), "nests too deep to read") from None
    except OSError as exc:
        raise SpecError(_display_name(path), f"cannot be read: {exc.strerror}") from None


def _decode(path: Path, raw: dict[str, Any], schema: type) -> Any:
    try:
        return msgspec.convert(raw, schema)
    except msgspec.ValidationError as exc:
        message = str(exc)
        clause_id = None
        match = re.search(r"at `\$\.clauses\[(\d+)\]", message)
        if match:
            index = int(match.group(1))
            clauses = raw.get("clauses", [])
            if index < len(clauses) and isinstance(clauses[index], dict):
                clause_id = clauses[index].get("id")
        field_path = _error_field(message)
        field_match = re.match(r"fields\[(\d+)\]", field_path or "")
        if field_path and field_match:
            index = int(field_match.group(1))
            fields = raw.get("fields", [])
            if index < len(fields) and isinstance(fields[index], dict) and "name" in fields[index]:
                name = fields[index]["name"]
                field_path = f"{field_match.group(0)} ({name}){field_path[field_match.end():]}"
        raise SpecError(_display_name(path), message, clause=clause_id, field=field_path) from None


def _error_field(message: str) -> str | None:
    """The field a msgspec validation message is about, as ``clauses[0].level``.

    msgspec names the object that holds an unknown or missing key, not the key: append it.
    """
    path_match = re.search(r"at `\$\.?([^`]*)`", message)
    where = path_match.group(1) if path_match else ""
    key_match = re.search(r"(?:unknown|missing required) field `([^`]*)`", message)
    if key_match:
        where = f"{where}.{key_match.group(1)}" if where else key_match.group(1)
    return where or None


def _display_name(path: Path) -> str:
    """A spec file as error messages name it: ``ring.toml`` or ``structs/Name.toml``."""
    return f"structs/{path.name}" if path.parent.name == "structs" else path.name


def _check_range(file: str, text: str | None, *, clause: str | None, field: str) -> None:
    if text is None:
        return
    try:
        VersionRange.parse(text)
    except VersionError as exc:
        raise SpecError(file, str(exc), clause=clause, field=field) from None


def _check_source(file: str, text: str, *, clause: str | None, field: str = "source") -> None:
    for part in text.split(", "):
        if not _SOURCE.match(part):
            raise SpecError(
                file,
                f"expected 'vllm/<path>.py:<line>' (several joined by ', '), got {part!r}",
                clause=clause,
                field=field,
            )


def _check_request_types(file: str, surface: RequestTypesFile) -> None:
    """Each entry's source and range parse, its byte is one byte, and no two entries of one
    name or of one byte overlap (at any release a name has one byte and a byte one name; an
    entry without ``versions`` holds for the file's range)."""
    seen: list[tuple[int, RequestType, VersionRange]] = []
    for index, entry in enumerate(surface.types):
        where = f"types[{index}] ({entry.name})"
        _check_source(file, entry.source, clause=None, field=where + ".source")
        _check_range(file, entry.versions, clause=None, field=where + ".versions")
        if not 0 <= entry.byte <= 0xFF:
            raise SpecError(file, f"a request type is one byte, got {entry.byte}",
                            field=where + ".byte")
        rng = VersionRange.parse(entry.versions or surface.versions)
        for other_index, other, other_rng in seen:
            if (other.name == entry.name or other.byte == entry.byte) and rng.overlaps(other_rng):
                raise SpecError(file, f"overlaps types[{other_index}] ({other.name} "
                                f"0x{other.byte:02x}, {other_rng}): at a release a name has "
                                f"one byte and a byte one name", field=where + ".versions")
        seen.append((index, entry, rng))


def _request_types_at(surface: RequestTypesFile, version: str) -> RequestTypesFile:
    """The request type table of release ``version``: the entries whose range holds it."""
    return msgspec.structs.replace(
        surface, types=[t for t in surface.types if _in_range(t.versions, version)])


def _in_range(versions: str | None, version: str) -> bool:
    return versions is None or version in VersionRange.parse(versions)


def _check_clauses(file: str, surface: str, clauses: list[Clause], seen: dict[str, str]) -> None:
    for clause in clauses:
        if not _CLAUSE_ID.match(clause.id):
            raise SpecError(file, "clause IDs use [a-z0-9_.-] and have two or more parts",
                            clause=clause.id, field="id")
        if clause.id.split(".", 1)[0] != surface:
            raise SpecError(file, f"clause IDs in this file start with '{surface}.'",
                            clause=clause.id, field="id")
        if clause.id in seen:
            raise SpecError(file, f"duplicate clause ID (first in {seen[clause.id]})",
                            clause=clause.id, field="id")
        seen[clause.id] = file
        if not clause.text.strip():
            raise SpecError(file, "empty clause text", clause=clause.id, field="text")
        _check_source(file, clause.source, clause=clause.id)
        _check_range(file, clause.versions, clause=clause.id, field="versions")


#: The container types each default_factory builds.
_FACTORY_TYPES = {"list": ("list", "set", "tuple"), "dict": ("dict",), "set": ("set",)}


def _default_problem(
    value: Any, expr: TypeExpr, structs: dict[str, StructSpec | EnumSpec]
) -> str | None:
    """Why the JSON ``value`` cannot be the default of a field of type ``expr``; None if it
    fits."""
    return _DefaultProblem(structs).check(expr, value)


class _DefaultProblem(TypeVisitor["str | None"]):
    """Why a JSON value does not fit a type (None when it does)."""

    def check(self, expr: TypeExpr, value: Any) -> str | None:
        if value is None and expr.name not in ("union", "any"):
            return None if expr.name == "none" else (
                f"null for type '{expr}', which does not include none")
        return self.visit(expr, value)

    def visit_union(self, expr: TypeExpr, value: Any) -> str | None:
        if any(self.check(arg, value) is None for arg in expr.args):
            return None
        return f"{json.dumps(value)} fits no member of '{expr}'"

    def visit_any(self, expr: TypeExpr, value: Any) -> str | None:
        return None

    def visit_none(self, expr: TypeExpr, value: Any) -> str | None:
        return f"{json.dumps(value)} is not of type none"

    def visit_bool(self, expr: TypeExpr, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"{json.dumps(value)} is not of type bool"

    def visit_int(self, expr: TypeExpr, value: Any) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool):
            return None
        return f"{json.dumps(value)} is not of type int"

    def visit_float(self, expr: TypeExpr, value: Any) -> str | None:
        if _is_number(value):
            return None
        return f"{json.dumps(value)} is not of type float"

    def visit_str(self, expr: TypeExpr, value: Any) -> str | None:
        return None if isinstance(value, str) else f"{json.dumps(value)} is not of type str"

    def _no_literal(self, expr: TypeExpr, value: Any) -> str | None:
        return f"no JSON literal but null stands for a {expr.name}"

    visit_bytes = visit_tensor = visit_ndarray = visit_slice = _no_literal

    def visit_nested_tensors(self, expr: TypeExpr, value: Any) -> str | None:
        if _is_number(value):
            return None
        if isinstance(value, list):
            return next((p for v in value if (p := self.check(expr, v))), None)
        return f"{json.dumps(value)} is not a number or an array of numbers"

    def visit_list(self, expr: TypeExpr, value: Any) -> str | None:
        if not isinstance(value, list):
            return f"{json.dumps(value)} is not an array"
        if expr.name == "tuple" and not expr.variadic:
            if len(value) != len(expr.args):
                return f"{json.dumps(value)} does not have the {len(expr.args)} elements of " \
                       f"'{expr}'"
            pairs = list(zip(value, expr.args, strict=True))
        else:
            pairs = [(v, expr.args[0]) for v in value]
        return next((p for v, a in pairs if (p := self.check(a, v))), None)

    visit_set = visit_tuple = visit_list

    def visit_dict(self, expr: TypeExpr, value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"{json.dumps(value)} is not an object"
        if value and expr.args[0].without_none().name not in ("str", "any"):
            return f"JSON object keys are strings, the key type is '{expr.args[0]}'"
        return next((p for v in value.values() if (p := self.check(expr.args[1], v))), None)

    def visit_enum(self, expr: TypeExpr, item: EnumSpec, value: Any) -> str | None:
        values = [m.value for m in item.members]
        if isinstance(value, bool) or value not in values:
            return f"{json.dumps(value)} is not a value of enum {expr.name} ({values})"
        return None

    def visit_struct(self, expr: TypeExpr, item: StructSpec, value: Any) -> str | None:
        shown = json.dumps(value)
        if item.encoding in ("array", "tuple"):
            if not isinstance(value, list) or len(value) > len(item.fields):
                return f"{shown} is not an array of at most {len(item.fields)} elements"
            given = dict(zip((f.name for f in item.fields), value, strict=False))
        elif isinstance(value, dict):
            given = value
        else:
            return f"{shown} is not an object"
        fields = {f.name: f for f in item.fields}
        unknown = sorted(set(given) - set(fields))
        if unknown:
            return f"{expr.name} has no fields {unknown}"
        missing = sorted(f.name for f in item.fields if f.required and f.name not in given)
        if missing:
            return f"{expr.name} needs its required fields {missing}"
        return next((p for key, v in given.items()
                     if (p := self.check(parse_type(fields[key].type), v))), None)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_default(file: str, where: str, fld: FieldSpec, expr: TypeExpr,
                   structs: dict[str, StructSpec | EnumSpec]) -> None:
    if fld.default_factory is not None:
        built = _FACTORY_TYPES[fld.default_factory]
        members = expr.args if expr.name == "union" else (expr,)
        if not any(m.name in built and (m.name != "tuple" or m.variadic) for m in members):
            raise SpecError(file, f"default_factory {fld.default_factory!r} does not build "
                                  f"type '{fld.type}'", field=where + ".default_factory")
    if fld.default is None:
        return
    try:
        value = json.loads(fld.default)
    except json.JSONDecodeError as exc:
        raise SpecError(file, f"default is not a JSON literal: {exc}",
                        field=where + ".default") from None
    problem = _default_problem(value, expr, structs)
    if problem is not None:
        raise SpecError(file, f"default {fld.default} does not fit type '{fld.type}': {problem}",
                        field=where + ".default")


def _check_struct(file: str, spec: StructSpec | EnumSpec,
                  structs: dict[str, StructSpec | EnumSpec]) -> None:
    _check_range(file, spec.versions, clause=None, field="versions")
    _check_source(file, spec.source, clause=None)
    if isinstance(spec, EnumSpec):
        values = [m.value for m in spec.members]
        if len(set(values)) != len(values):
            raise SpecError(file, "duplicate enum values", field="members")
        return
    seen: dict[str, list[VersionRange]] = {}
    defaulted_before: list[FieldSpec] = []
    for index, fld in enumerate(spec.fields):
        where = f"fields[{index}] ({fld.name})"
        _check_range(file, fld.versions, clause=None, field=where + ".versions")
        own = _field_range(spec, fld)
        if any(own.overlaps(other) for other in seen.get(fld.name, [])):
            raise SpecError(file, "duplicate field name (entries of one name need versions "
                                  "ranges that do not overlap)", field=where)
        seen.setdefault(fld.name, []).append(own)
        if fld.source is not None:
            _check_source(file, fld.source, clause=None, field=where + ".source")
        try:
            expr = parse_type(fld.type)
        except TypeSyntaxError as exc:
            raise SpecError(file, str(exc), field=where + ".type") from None
        unknown = expr.names() - set(structs)
        if unknown:
            raise SpecError(file, f"unknown type name(s) {sorted(unknown)}", field=where + ".type")
        has_default = fld.default is not None or fld.default_factory is not None
        if fld.required and has_default:
            raise SpecError(file, "a required field cannot have a default", field=where)
        if not fld.required and not has_default:
            raise SpecError(file, "an optional field needs default or default_factory",
                            field=where)
        _check_default(file, where, fld, expr, structs)
        if spec.encoding == "array":
            if has_default:
                defaulted_before.append(fld)
            else:
                clash = next((d for d in defaulted_before
                              if _field_range(spec, d).overlaps(own)), None)
                if clash is not None:
                    raise SpecError(
                        file,
                        f"required field after defaulted field {clash.name!r} in an array "
                        "encoding",
                        field=where,
                    )


def _field_range(spec: StructSpec, fld: FieldSpec) -> VersionRange:
    return VersionRange.parse(fld.versions or spec.versions)


def _check_struct_rules(file: str, spec: StructSpec | EnumSpec,
                        structs: dict[str, StructSpec | EnumSpec], clause_ids: set[str]) -> None:
    """``[[constraints]]`` and ``[[tagged_unions]]`` name real fields, structs and clauses."""
    if isinstance(spec, EnumSpec):
        return
    fields = {f.name: f for f in spec.fields}
    for index, constraint in enumerate(spec.constraints):
        where = f"constraints[{index}]"
        if constraint.clause not in clause_ids:
            raise SpecError(file, f"refers to unknown clause {constraint.clause!r}",
                            field=where + ".clause")
        unknown = sorted(set(constraint.fields) - set(fields))
        if unknown or len(constraint.fields) < 2:
            raise SpecError(file, f"exactly-one-of needs two or more fields of {spec.name}, "
                                  f"got {constraint.fields} (unknown: {unknown})",
                            field=where + ".fields")
        not_nullable = [n for n in constraint.fields if not parse_type(fields[n].type).nullable]
        if not_nullable:
            raise SpecError(file, f"exactly-one-of fields must be nullable, {not_nullable} are "
                                  "not", field=where + ".fields")
    for index, union in enumerate(spec.tagged_unions):
        where = f"tagged_unions[{index}]"
        if union.clause not in clause_ids:
            raise SpecError(file, f"refers to unknown clause {union.clause!r}",
                            field=where + ".clause")
        _check_source(file, union.source, clause=None, field=where + ".source")
        if union.field not in fields:
            raise SpecError(file, f"{spec.name} has no field {union.field!r}",
                            field=where + ".field")
        expr = parse_type(fields[union.field].type)
        value = expr.args[1] if expr.name == "tuple" and len(expr.args) == 2 else None
        if value is None or expr.args[0].name != "str":
            raise SpecError(file, f"a tagged union field has type tuple[str, A | B ...], got "
                                  f"'{expr}'", field=where + ".field")
        members = {a.name for a in value.args} if value.name == "union" else {value.name}
        tagged = set(union.tags.values())
        if members != tagged or len(tagged) != len(union.tags):
            raise SpecError(file, f"tags {union.tags} must name each member of '{value}' "
                                  "exactly once", field=where + ".tags")
        missing = sorted(n for n in tagged if not isinstance(structs.get(n), StructSpec))
        if missing:
            raise SpecError(file, f"tags name unknown structs {missing}", field=where + ".tags")


#: The type of each UTILITY payload item (history/constants.toml [[utility_payload]] names
#: the items of a release, in order).
UTILITY_ITEM_TYPES = {"client_index": "int", "call_id": "int", "method": "str",
                      "args": "tuple[any, ...]"}


def _release_payloads(frames: FramesFile, version: str, root: Path) -> FramesFile:
    """``frames`` with the payloads the history records for release ``version`` where they
    differ from the reference release's: the UTILITY payload's items (history/constants.toml
    ``[[utility_payload]]``: no client_index up to 0.9.0) and the init message's form (a
    plain map where the release reads it by key, ``[[init_message]]``: 0.9.0). At the
    reference release, and without a history row, ``frames`` as it is."""
    from .history.constants import constants_at

    if version == REFERENCE_VLLM_VERSION:
        return frames
    payloads: dict[str, str] = {}
    items = constants_at(version, "utility_payload", root).get("items")
    if isinstance(items, list):
        payloads["utility"] = f"tuple[{', '.join(UTILITY_ITEM_TYPES[str(i)] for i in items)}]"
    if constants_at(version, "init_message", root).get("form") == "map":
        payloads["init"] = "dict[str, any]"
    messages = []
    for message in frames.messages:
        if message.kind in payloads:
            message = msgspec.structs.replace(message, frames=[
                msgspec.structs.replace(f, payload=payloads[message.kind])
                if f.content == "msgpack" else f for f in message.frames])
        messages.append(message)
    return msgspec.structs.replace(frames, messages=messages)


def _fill_type_bytes(frames: FramesFile, request_types: RequestTypesFile,
                     every_release: RequestTypesFile) -> FramesFile:
    """``frames`` with each ``type_byte`` frame's ``literal_hex`` read from the release's
    request type table (``request_types``), the one place a type byte is written. A message
    whose request type is in the file (``every_release``) but not in the release's table
    keeps ``literal_hex`` unset: the message does not exist at that release."""
    by_name = {t.name: t for t in request_types.types}
    of_other_releases = {t.name for t in every_release.types if t.on_wire} - set(by_name)
    messages = []
    for index, message in enumerate(frames.messages):
        new_frames = []
        for f_index, frame in enumerate(message.frames):
            if frame.content == "type_byte":
                where = f"messages[{index}].frames[{f_index}]"
                if frame.literal_hex is not None:
                    raise SpecError("frames.toml", "a type_byte frame takes its byte from "
                                    "request_types.toml; leave literal_hex out",
                                    field=where + ".literal_hex")
                request_type = by_name.get(message.request_type or "")
                if request_type is None and message.request_type in of_other_releases:
                    new_frames.append(frame)
                    continue
                if request_type is None or not request_type.on_wire:
                    raise SpecError("frames.toml", f"message {message.kind!r} has a type_byte "
                                    f"frame but names no on-wire request type "
                                    f"(got {message.request_type!r})",
                                    field=f"messages[{index}].request_type")
                frame = msgspec.structs.replace(frame, literal_hex=f"{request_type.byte:02x}")
            new_frames.append(frame)
        messages.append(msgspec.structs.replace(message, frames=new_frames))
    return msgspec.structs.replace(frames, messages=messages)


def _restrict(spec: StructSpec | EnumSpec, version: str) -> StructSpec | EnumSpec:
    if isinstance(spec, EnumSpec):
        members = [m for m in spec.members if _in_range(m.versions, version)]
        return msgspec.structs.replace(spec, members=members)
    fields: list[FieldSpec] = [f for f in spec.fields if _in_range(f.versions, version)]
    names = {f.name for f in fields}
    # A rule about fields a release does not have does not hold in that release.
    constraints = [c for c in spec.constraints if set(c.fields) <= names]
    tagged_unions = [u for u in spec.tagged_unions if u.field in names]
    return msgspec.structs.replace(spec, fields=fields, constraints=constraints,
                                   tagged_unions=tagged_unions)


def _check_surface_refs(file: str, surface: SurfaceHeader, clause_ids: set[str]) -> None:
    def need(clause_id: str | None, where: str) -> None:
        if clause_id is not None and clause_id not in clause_ids:
            raise SpecError(file, f"refers to unknown clause {clause_id!r}", field=where)

    for attr in ("writer_steps", "reader_steps"):
        for index, step in enumerate(getattr(surface, attr, []) or []):
            need(step.clause, f"{attr}[{index}].clause")
    for index, machine in enumerate(getattr(surface, "machines", []) or []):
        need(machine.illegal_event_clause, f"machines[{index}].illegal_event_clause")
        states = {s.name for s in machine.states}
        if machine.initial not in states:
            raise SpecError(file, f"initial state {machine.initial!r} is not a state",
                            field=f"machines[{index}].initial")
        for t_index, transition in enumerate(machine.transitions):
            for end in (transition.source, transition.target):
                if end not in states:
                    raise SpecError(file, f"transition names unknown state {end!r}",
                                    field=f"machines[{index}].transitions[{t_index}]")


def load(version: str | None = None, data_dir: Path | str | None = None) -> Spec:
    """Load, validate and return the spec as it stands for ``version`` of vLLM.

    ``version`` defaults to :data:`REFERENCE_VLLM_VERSION`. Clauses, fields and enum members
    whose version range excludes ``version`` are left out of the result.
    """
    version = version or REFERENCE_VLLM_VERSION
    root = Path(data_dir) if data_dir else DATA_DIR
    _check_known_version(root, version)
    return _load_cached(version, str(root))


def _check_known_version(root: Path, version: str) -> None:
    """Raise :class:`UnknownVersionError` unless ``version`` is one of the releases listed in
    ``history/releases.toml`` (a data directory without that file accepts any version).

    A version found known is remembered with the file's modification time and size, so a
    repeated ``load()`` costs a ``stat``, not a TOML parse."""
    from .history.wheels import RELEASES_FILE, read_releases

    try:
        status = (root / RELEASES_FILE).stat()
        stamp: tuple[int, int] | None = (status.st_mtime_ns, status.st_size)
    except OSError:
        stamp = None
    if stamp is not None and _KNOWN_VERSIONS.get((str(root), version)) == stamp:
        return
    try:
        wanted = parse_version(version)
    except VersionError as exc:
        raise UnknownVersionError(str(RELEASES_FILE), str(exc)) from None
    releases = read_releases(root)
    if releases and wanted not in {parse_version(r) for r in releases}:
        raise UnknownVersionError(
            str(RELEASES_FILE),
            f"vLLM {version} is not a release the spec was derived from "
            f"({releases[0]} to {releases[-1]}, {len(releases)} releases: "
            "`enginewire spec releases` lists them)")
    _KNOWN_VERSIONS[(str(root), version)] = stamp


#: (data directory, version) -> modification time and size of the releases file when the
#: version was found known in it.
_KNOWN_VERSIONS: dict[tuple[str, str], tuple[int, int] | None] = {}


@lru_cache(maxsize=8)
def _load_cached(version: str, data_dir: str) -> Spec:
    root = Path(data_dir)
    surfaces: dict[str, SurfaceHeader] = {}
    clause_refs: dict[str, ClauseRef] = {}
    surface_paths = [root / f"{surface}.toml" for surface in SURFACE_SCHEMAS]
    for path in surface_paths:
        if not path.exists():
            raise SpecError(path.name, "surface file is missing")
    surface_stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                          for p in surface_paths)
    parsed_surfaces, seen_clauses = _parsed_surfaces(data_dir, surface_stamp)
    for surface, parsed in parsed_surfaces.items():
        path = root / f"{surface}.toml"
        active = [c for c in parsed.clauses if _in_range(c.versions, version)]
        surfaces[surface] = msgspec.structs.replace(parsed, clauses=active)
        for clause in active:
            clause_refs[clause.id] = ClauseRef(surface, path.name, clause)

    paths = sorted((root / "structs").glob("*.toml"))
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    structs = _parsed_structs(data_dir, stamp)

    all_ids = set(seen_clauses)
    for header in surfaces.values():
        _check_surface_refs(f"{header.surface}.toml", header, all_ids)
    for name, parsed in structs.items():
        _check_struct_rules(f"structs/{name}.toml", parsed, structs, all_ids)
    every_release = cast(RequestTypesFile, surfaces["request_types"])
    surfaces["request_types"] = _request_types_at(every_release, version)
    surfaces["frames"] = _release_payloads(_fill_type_bytes(
        cast(FramesFile, surfaces["frames"]), cast(RequestTypesFile, surfaces["request_types"]),
        every_release), version, root)

    surfaces["tensors"] = _tensors_at(cast(TensorsFile, surfaces["tensors"]), version, root)

    active_structs = {
        name: _restrict(s, version) for name, s in structs.items() if _in_range(s.versions, version)
    }
    return Spec(version=version, surfaces=surfaces, structs=active_structs, clauses=clause_refs,
                all_clause_ids=frozenset(seen_clauses))


def request_types_of_other_versions(spec: Spec, data_dir: Path | str | None = None
                                    ) -> list[RequestType]:
    """The request type entries whose version range leaves out ``spec``'s version (the bytes
    of earlier releases), in file order; the rendered pages list them apart."""
    root = Path(data_dir) if data_dir else DATA_DIR
    path = root / "request_types.toml"
    parsed = _decode(path, _read_toml(path), RequestTypesFile)
    return [t for t in parsed.types if not _in_range(t.versions, spec.version)]


def clauses_of_other_versions(spec: Spec, surface: str,
                              data_dir: Path | str | None = None) -> list[Clause]:
    """The clauses of surface ``surface`` whose version range leaves out ``spec``'s version
    (those of an earlier release's form), in file order; the rendered pages list them apart."""
    root = Path(data_dir) if data_dir else DATA_DIR
    path = root / f"{surface}.toml"
    parsed = _decode(path, _read_toml(path), SURFACE_SCHEMAS[surface])
    return [c for c in parsed.clauses if not _in_range(c.versions, spec.version)]


#: The extension types that carry pickle streams of arbitrary values (tensors surface).
PICKLE_EXT_NAMES = ("pickle", "cloudpickle")
#: Their ``allowed`` in a release without the opt-in (history/constants.toml
#: ``[[pickle_opt_in]]``).
NO_OPT_IN_ALLOWED = "always: the release has no insecure-serialization opt-in"


def _tensors_at(tensors: TensorsFile, version: str, root: Path) -> TensorsFile:
    """The tensors surface as release ``version`` has it: its extension codes, inline
    threshold, the form of a tensor and an array and the pickle opt-in, read from
    ``history/constants.toml`` (``ext_codes``, ``tensor_threshold``, ``tensor_form``,
    ``pickle_opt_in``); unchanged where the history has no row for the release (a data
    directory without history)."""
    from .history.constants import constants_at

    codes = constants_at(version, "ext_codes", root)
    threshold = constants_at(version, "tensor_threshold", root)
    form = constants_at(version, "tensor_form", root)
    opt_in = constants_at(version, "pickle_opt_in", root)
    if opt_in:
        setting = opt_in.get("setting")
        tensors = msgspec.structs.replace(
            tensors, pickle_opt_in=setting if isinstance(setting, str) and setting != "none"
            else None)
    if not (codes or threshold or form):
        return tensors
    described = {ext.name: ext for ext in (*tensors.former_ext_codes, *tensors.ext_codes)}
    ext_codes = list(tensors.ext_codes)
    if codes:
        ext_codes = []
        for name, code in sorted(codes.items(), key=lambda item: item[1]):
            known = described.get(name)
            if known is None:
                raise SpecError("tensors.toml", f"history/constants.toml gives vLLM {version} "
                                f"the extension code {name!r}, which neither ext_codes nor "
                                "former_ext_codes describes", field="former_ext_codes")
            ext_codes.append(msgspec.structs.replace(known, code=int(code)))
    if tensors.pickle_opt_in is None:
        # No opt-in at this release (tensors.pickle-without-opt-in): pickle travels freely.
        ext_codes = [msgspec.structs.replace(ext, allowed=NO_OPT_IN_ALLOWED)
                     if ext.name in PICKLE_EXT_NAMES else ext for ext in ext_codes]
    value = threshold.get("threshold_default", tensors.threshold_default)
    return msgspec.structs.replace(
        tensors, ext_codes=ext_codes,
        threshold_default=value if isinstance(value, int) else None,
        threshold_configurable=bool(threshold.get("configurable", isinstance(value, int))),
        tensor_form=form.get("tensor", tensors.tensor_form),
        ndarray_form=form.get("ndarray", tensors.ndarray_form))


@lru_cache(maxsize=4)
def _parsed_surfaces(data_dir: str, stamp: tuple[tuple[str, int, int], ...]
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """Every surface file, validated, and clause id -> file (``stamp`` keys the cache)."""
    surfaces: dict[str, Any] = {}
    seen_clauses: dict[str, str] = {}
    for surface, schema in SURFACE_SCHEMAS.items():
        path = Path(data_dir) / f"{surface}.toml"
        raw = _read_toml(path)
        parsed = _decode(path, raw, schema)
        if parsed.surface != surface:
            raise SpecError(path.name, f"surface must be {surface!r}", field="surface")
        _check_range(path.name, parsed.versions, clause=None, field="versions")
        _check_clauses(path.name, surface, parsed.clauses, seen_clauses)
        if isinstance(parsed, RequestTypesFile):
            _check_request_types(path.name, parsed)
        surfaces[surface] = parsed
    return surfaces, seen_clauses


@lru_cache(maxsize=4)
def _parsed_structs(data_dir: str, stamp: tuple[tuple[str, int, int], ...]
                    ) -> dict[str, StructSpec | EnumSpec]:
    """Every struct file of ``data_dir``, validated, for all versions at once (``stamp``, the
    files' names, mtimes and sizes, keys the cache: loading every release parses them once)."""
    structs: dict[str, StructSpec | EnumSpec] = {}
    struct_files: dict[str, str] = {}
    for name, _mtime, _size in stamp:
        path = Path(data_dir) / "structs" / name
        raw = _read_toml(path)
        schema = EnumSpec if raw.get("kind") == "enum" else StructSpec
        parsed = _decode(path, raw, schema)
        if parsed.name != path.stem:
            raise SpecError(f"structs/{path.name}", f"name must match the file name {path.stem!r}",
                            field="name")
        structs[parsed.name] = parsed
        struct_files[parsed.name] = f"structs/{path.name}"
    for name, parsed in structs.items():
        _check_struct(struct_files[name], parsed, structs)
    return structs
