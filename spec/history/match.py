"""``enginewire spec match TARGET``: which releases a module's msgspec structs match.

For every ``msgspec.Struct`` class in the module whose name is a struct of the spec, the layout
(encoding, then each field's name and type in position order; the type translated into the
spec grammar as ``spec diff`` does) is compared with the struct's layout at every derived
release. The result names the releases it matches exactly, and, where it matches none, the
nearest release (the longest common prefix of positions, then the fewest differences) with the
first differing position and what each side means there.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..loader import DATA_DIR, load
from ..schema import StructSpec
from ..types import container_type, kind_of, parse_type, scalar_type
from .compat import _canonical, spec_for
from .wheels import read_releases

#: Probes a codec target (``--target`` text, ``--target-cmd`` commands, the struct names to
#: probe or None for all) and prints what it matches; returns the exit status. The conformance
#: suite, which owns targets, registers it (:mod:`enginewire.conformance.release_match`); the
#: spec cannot import targets itself.
CodecMatcher = Callable[[str, Sequence[str], Sequence[str] | None], int]
_CODEC_MATCHERS: list[CodecMatcher] = []


def register_codec_matcher(matcher: CodecMatcher) -> None:
    """Make ``enginewire spec match`` able to probe codec targets through ``matcher``."""
    _CODEC_MATCHERS[:] = [matcher]


def is_codec_target(target: str, commands: Sequence[str] = ()) -> bool:
    """Whether ``target`` names a codec target (``reference``, ``vllm``, ``none``,
    ``pkg.mod:attr``, a registered ``PREFIX:NAME``) rather than a module of msgspec structs."""
    return bool(commands) or target in ("reference", "vllm", "none") or ":" in target


@dataclass
class MatchResult:
    """How one class of the target compares with the history."""

    name: str
    matches: list[str] = field(default_factory=list)
    nearest: str | None = None
    position: int | None = None
    target_meaning: str | None = None
    spec_meaning: str | None = None


def describe_struct(cls: type) -> tuple[str, list[tuple[str, str]]]:
    """(encoding, [(field, type)]) of a msgspec Struct class, types in the spec grammar."""
    encoding = "array" if cls.__struct_config__.array_like else "map"  # type: ignore[attr-defined]
    fields = []
    for info in msgspec.structs.fields(cls):
        try:
            text = annotation_type(info.type)
        except TypeError:
            text = "any"
        fields.append((info.name, _canonical(parse_type(text))))
    return encoding, fields


def annotation_type(annotation: Any) -> str:
    """A runtime annotation in the spec grammar (no torch or numpy import: their array types
    are recognised by module and name)."""
    if annotation is None or annotation is type(None):
        return "none"
    if annotation is Any:
        return "any"
    simple = {str: "str", int: "int", float: "float", bool: "bool", bytes: "bytes",
              slice: "slice"}
    if annotation in simple:
        return simple[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(annotation_type(a) for a in args)
    if origin is typing.Annotated:
        return annotation_type(args[0])
    if origin in (list, set, frozenset):
        name = "list" if origin is list else "set"
        return f"{name}[{annotation_type(args[0]) if args else 'any'}]"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{annotation_type(args[0])}, ...]"
        return "tuple[" + ", ".join(annotation_type(a) for a in args) + "]" if args \
            else "tuple[any, ...]"
    if origin is dict:
        return f"dict[{annotation_type(args[0])}, {annotation_type(args[1])}]" if args \
            else "dict[any, any]"
    if annotation in (list, set, dict, tuple):
        return {list: "list[any]", set: "set[any]", dict: "dict[any, any]",
                tuple: "tuple[any, ...]"}[annotation]
    if isinstance(annotation, type):
        module = annotation.__module__.split(".")[0]
        if module == "torch" and annotation.__name__ == "Tensor":
            return "tensor"
        if module == "numpy" and annotation.__name__ == "ndarray":
            return "ndarray"
        return annotation.__name__
    raise TypeError(f"no spec type for annotation {annotation!r}")


def spec_layout(spec_struct: StructSpec) -> tuple[str, list[tuple[str, str]]]:
    encoding = "map" if spec_struct.encoding == "dataclass" else spec_struct.encoding
    return encoding, [(f.name, _canonical(parse_type(f.type))) for f in spec_struct.fields]


def match_class(name: str, layout: tuple[str, list[tuple[str, str]]],
                releases: list[str], data_dir: Path | None = None) -> MatchResult:
    result = MatchResult(name)
    best: tuple[int, int, str] | None = None
    encoding, fields = layout
    for version in releases:
        spec = spec_for(version, data_dir)
        found = spec.structs.get(name)
        if not isinstance(found, StructSpec):
            continue
        spec_encoding, spec_fields = spec_layout(found)
        if spec_encoding == encoding and len(spec_fields) == len(fields) and all(
                _same_field(a, b) for a, b in zip(fields, spec_fields, strict=True)):
            result.matches.append(version)
            continue
        prefix = next((i for i, (a, b) in enumerate(zip(fields, spec_fields, strict=False))
                       if not _same_field(a, b)), min(len(fields), len(spec_fields)))
        differences = sum(not _same_field(a, b)
                          for a, b in zip(fields, spec_fields, strict=False)) + abs(
            len(fields) - len(spec_fields)) + (spec_encoding != encoding) * 100
        key = (-prefix, differences, version)
        if best is None or key[:2] < best[:2]:
            best = key
            result.nearest = version
            result.position = prefix
            result.target_meaning = _meaning(fields, prefix)
            result.spec_meaning = _meaning(spec_fields, prefix)
    if result.matches:
        result.nearest = result.position = result.target_meaning = result.spec_meaning = None
    return result


def _same_field(target: tuple[str, str], spec: tuple[str, str]) -> bool:
    """Same name, and the same type where the target's type says something: a target type
    that is or contains ``any`` (a front end that leaves a nested value untyped) matches the
    spec's type of the same shape."""
    if target[0] != spec[0]:
        return False
    if target[1] == spec[1]:
        return True
    pattern = "^" + re.escape(target[1]).replace("any", "[^|]+?") + "$"
    return "any" in target[1] and re.match(pattern, spec[1]) is not None


def _meaning(fields: list[tuple[str, str]], position: int) -> str:
    if position >= len(fields):
        return "(no field: the array ends)"
    name, type_text = fields[position]
    return f"{name}: {type_text}"


def match_module(target: str, data_dir: Path | None = None) -> list[MatchResult]:
    module = importlib.import_module(target)
    releases = read_releases(Path(data_dir) if data_dir else DATA_DIR)
    known = set(load(data_dir=data_dir).structs)
    for version in releases:
        known |= set(spec_for(version, data_dir).structs)
    results = []
    for name, cls in inspect.getmembers(module, inspect.isclass):
        if issubclass(cls, msgspec.Struct) and cls.__module__ == module.__name__ and name in known:
            results.append(match_class(name, describe_struct(cls), releases, data_dir))
    return results


def release_ranges(matches: list[str], releases: list[str]) -> str:
    """``0.9.0-0.9.2, 0.11.0`` for a list of releases, runs joined."""
    index = {v: i for i, v in enumerate(releases)}
    runs: list[list[str]] = []
    for version in matches:
        if runs and index[version] == index[runs[-1][-1]] + 1:
            runs[-1].append(version)
        else:
            runs.append([version])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def run_match(target: str, data_dir: Path | None = None, commands: Sequence[str] = (),
              names: Sequence[str] | None = None) -> int:
    """Match a module of msgspec structs by layout, or probe a codec target."""
    if is_codec_target(target, commands):
        if data_dir is not None:
            print("enginewire spec match: error: --data-dir applies to a module of structs, "
                  "not to a codec target (probed against the package's spec)", file=sys.stderr)
            return 2
        if not _CODEC_MATCHERS:
            print(f"enginewire spec match: error: {target!r} is a codec target and the "
                  "conformance suite that probes codecs is not installed", file=sys.stderr)
            return 2
        return _CODEC_MATCHERS[0](target, commands, names or None)
    try:
        results = match_module(target, data_dir)
    except ImportError as exc:
        print(f"enginewire spec match: error: cannot import {target!r}: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"enginewire spec match: error: {target} defines no msgspec struct the spec "
              "knows by name", file=sys.stderr)
        return 2
    releases = read_releases(Path(data_dir) if data_dir else DATA_DIR)
    if names:
        results = [r for r in results if r.name in names]
    for result in results:
        if result.matches:
            print(f"{result.name}: matches {release_ranges(result.matches, releases)}")
        elif result.nearest is None:
            print(f"{result.name}: no release defines it with a comparable layout")
        else:
            print(f"{result.name}: matches no release; nearest {result.nearest}, first "
                  f"difference at position {result.position}: target has {result.target_meaning},"
                  f" {result.nearest} has {result.spec_meaning}")
    return 0 if all(r.matches for r in results) else 1


def layout_source(version: str, names: list[str], data_dir: Path | None = None) -> str:
    """Python source of msgspec structs with ``names``' layouts at ``version``: what a front
    end that mirrored that release would hold. A field whose type is another of ``names`` is
    typed with that class (so it encodes with that struct's layout); other structs, enums,
    tensors and arrays are ``Any``."""
    spec = load(version, data_dir)
    lines = ["from __future__ import annotations", "", "from typing import Any", "",
             "import msgspec", ""]
    for name in names:
        item = spec.struct(name)
        array = item.encoding == "array"
        lines.append(f"class {name}(msgspec.Struct, array_like={array}):")
        for fld in item.fields:
            lines.append(f"    {fld.name}: {_python_type(fld.type, set(names))}"
                         + _python_default(fld, set(names)))
        lines.append("")
    return "\n".join(lines)


def _python_default(fld: Any, known: set[str]) -> str:
    """`` = default`` as the spec gives it (a struct default of ``names`` built fresh)."""
    if fld.required:
        return ""
    if fld.default_factory:
        return f" = msgspec.field(default_factory={fld.default_factory})"
    value = None if fld.default is None else json.loads(fld.default)
    expr = parse_type(fld.type)
    if isinstance(value, dict) and expr.name in known and not expr.args:
        return f" = msgspec.field(default_factory=lambda: {expr.name}(**{value!r}))"
    if isinstance(value, (dict, list)):
        return f" = msgspec.field(default_factory=lambda: {value!r})"
    return f" = {value!r}"


def _python_type(text: str, known: set[str] | None = None) -> str:
    expr = parse_type(text)

    def go(e: Any) -> str:
        family = kind_of(e)
        if family == "union":
            return " | ".join(go(a) for a in e.args)
        if family == "nil":
            return "None"
        if known and e.name in known and not e.args:
            return str(e.name)
        scalar = scalar_type(e)
        if scalar is not None:
            return scalar.__name__
        container = container_type(e)
        if container in (list, set) and e.args:
            return f"{e.name}[{go(e.args[0])}]"
        if container is dict and e.args:
            return f"dict[{go(e.args[0])}, {go(e.args[1])}]"
        if container is tuple and e.args:
            inner = ", ".join(go(a) for a in e.args)
            return f"tuple[{inner}{', ...' if e.variadic else ''}]"
        return "Any"

    return go(expr)
