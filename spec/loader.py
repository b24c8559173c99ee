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
- steps, transitions and state machines refer only to clauses and states that exist.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec

from .schema import (
    SURFACE_SCHEMAS,
    Clause,
    EnumSpec,
    FieldSpec,
    StructSpec,
    SurfaceHeader,
)
from .types import TypeExpr, TypeSyntaxError, parse_type
from .versions import VersionError, VersionRange

#: The vLLM release the spec files describe completely.
REFERENCE_VLLM_VERSION = "0.33.0"

DATA_DIR = Path(__file__).parent / "data"

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

    def clause(self, clause_id: str) -> Clause:
        try:
            return self.clauses[clause_id].clause
        except KeyError:
            raise KeyError(f"no clause {clause_id!r} in the spec") from None

    def surface(self, name: str) -> Any:
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
    shown = json.dumps(value)
    if expr.name == "union":
        if any(_default_problem(value, arg, structs) is None for arg in expr.args):
            return None
        return f"{shown} fits no member of '{expr}'"
    name = expr.name
    if name == "any":
        return None
    if value is None:
        return None if name == "none" else f"null for type '{expr}', which does not include none"
    number = isinstance(value, int | float) and not isinstance(value, bool)
    simple = {
        "none": False,
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": number,
        "str": isinstance(value, str),
    }
    if name in simple:
        return None if simple[name] else f"{shown} is not of type {name}"
    if name in ("bytes", "tensor", "ndarray", "slice"):
        return f"no JSON literal but null stands for a {name}"
    if name == "nested_tensors":
        if number:
            return None
        if isinstance(value, list):
            return next((p for v in value if (p := _default_problem(v, expr, structs))), None)
        return f"{shown} is not a number or an array of numbers"
    if name in ("list", "set", "tuple"):
        if not isinstance(value, list):
            return f"{shown} is not an array"
        if name == "tuple" and not expr.variadic:
            if len(value) != len(expr.args):
                return f"{shown} does not have the {len(expr.args)} elements of '{expr}'"
            pairs = list(zip(value, expr.args, strict=True))
        else:
            pairs = [(v, expr.args[0]) for v in value]
        return next((p for v, a in pairs if (p := _default_problem(v, a, structs))), None)
    if name == "dict":
        if not isinstance(value, dict):
            return f"{shown} is not an object"
        if value and expr.args[0].without_none().name not in ("str", "any"):
            return f"JSON object keys are strings, the key type is '{expr.args[0]}'"
        return next((p for v in value.values()
                     if (p := _default_problem(v, expr.args[1], structs))), None)
    item = structs.get(name)
    if isinstance(item, EnumSpec):
        values = [m.value for m in item.members]
        if isinstance(value, bool) or value not in values:
            return f"{shown} is not a value of enum {name} ({values})"
        return None
    if isinstance(item, StructSpec):
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
            return f"{name} has no fields {unknown}"
        missing = sorted(f.name for f in item.fields if f.required and f.name not in given)
        if missing:
            return f"{name} needs its required fields {missing}"
        return next((p for key, v in given.items()
                     if (p := _default_problem(v, parse_type(fields[key].type), structs))), None)
    return None


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
    seen: set[str] = set()
    defaulted_before: str | None = None
    for index, fld in enumerate(spec.fields):
        where = f"fields[{index}] ({fld.name})"
        if fld.name in seen:
            raise SpecError(file, "duplicate field name", field=where)
        seen.add(fld.name)
        _check_range(file, fld.versions, clause=None, field=where + ".versions")
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
                defaulted_before = defaulted_before or fld.name
            elif defaulted_before is not None:
                raise SpecError(
                    file,
                    f"required field after defaulted field {defaulted_before!r} in an array "
                    "encoding",
                    field=where,
                )


def _restrict(spec: StructSpec | EnumSpec, version: str) -> StructSpec | EnumSpec:
    if isinstance(spec, EnumSpec):
        members = [m for m in spec.members if _in_range(m.versions, version)]
        return msgspec.structs.replace(spec, members=members)
    fields: list[FieldSpec] = [f for f in spec.fields if _in_range(f.versions, version)]
    return msgspec.structs.replace(spec, fields=fields)


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
    return _load_cached(version, str(Path(data_dir) if data_dir else DATA_DIR))


@lru_cache(maxsize=8)
def _load_cached(version: str, data_dir: str) -> Spec:
    root = Path(data_dir)
    surfaces: dict[str, SurfaceHeader] = {}
    seen_clauses: dict[str, str] = {}
    clause_refs: dict[str, ClauseRef] = {}
    for surface, schema in SURFACE_SCHEMAS.items():
        path = root / f"{surface}.toml"
        if not path.exists():
            raise SpecError(path.name, "surface file is missing")
        raw = _read_toml(path)
        parsed = _decode(path, raw, schema)
        if parsed.surface != surface:
            raise SpecError(path.name, f"surface must be {surface!r}", field="surface")
        _check_range(path.name, parsed.versions, clause=None, field="versions")
        _check_clauses(path.name, surface, parsed.clauses, seen_clauses)
        active = [c for c in parsed.clauses if _in_range(c.versions, version)]
        surfaces[surface] = msgspec.structs.replace(parsed, clauses=active)
        for clause in active:
            clause_refs[clause.id] = ClauseRef(surface, path.name, clause)

    structs: dict[str, StructSpec | EnumSpec] = {}
    struct_files: dict[str, str] = {}
    for path in sorted((root / "structs").glob("*.toml")):
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

    all_ids = set(seen_clauses)
    for surface in surfaces.values():
        _check_surface_refs(f"{surface.surface}.toml", surface, all_ids)

    active_structs = {
        name: _restrict(s, version) for name, s in structs.items() if _in_range(s.versions, version)
    }
    return Spec(version=version, surfaces=surfaces, structs=active_structs, clauses=clause_refs)
