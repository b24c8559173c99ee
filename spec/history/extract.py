"""Read struct, enum and constant definitions from a vLLM wheel by ``ast``, never importing it.

:class:`WheelSource` opens a wheel (a zip) and parses the modules it is asked about.
:meth:`WheelSource.describe_class` returns a :class:`ClassFacts`: the kind of class (msgspec
``array``/``map`` struct, ``dataclass``, ``tuple`` for a NamedTuple, ``enum``), its fields in
declaration order (base classes first) with each annotation translated into the spec's type
grammar (:mod:`enginewire.spec.types`), or kept raw where it cannot be, and enum members.

Translation contract (:func:`translate`): builtins and ``typing`` generics map as the grammar's
table says; ``torch.Tensor`` is ``tensor``, numpy arrays are ``ndarray``; vLLM names the
encoder writes itself map as :data:`enginewire.spec.drift.ENC_HOOK_TYPES` and
:data:`~enginewire.spec.drift.TYPE_ALIASES` say; any other name must be a struct or enum the
spec knows (``known``), else :class:`Untranslatable` is raised with the raw annotation.
"""

from __future__ import annotations

import ast
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..drift import ENC_HOOK_TYPES, TYPE_ALIASES

_SIMPLE = {"str": "str", "int": "int", "float": "float", "bool": "bool", "bytes": "bytes",
           "None": "none", "NoneType": "none", "Any": "any", "object": "any",
           "Tensor": "tensor", "ndarray": "ndarray", "NDArray": "ndarray", "slice": "slice"}
_LISTS = {"List": "list", "list": "list", "Sequence": "list", "MutableSequence": "list",
          "Set": "set", "set": "set", "FrozenSet": "set", "frozenset": "set",
          "AbstractSet": "set"}
_DICTS = {"Dict", "dict", "Mapping", "MutableMapping"}
_ENC_HOOK = {q.split(":")[1]: text for q, (text, _refs) in ENC_HOOK_TYPES.items()}
_ALIASES = {q.split(":")[1]: name for q, name in TYPE_ALIASES.items()}


class Untranslatable(ValueError):
    """An annotation that the spec's type grammar cannot express; ``raw`` is its source."""

    def __init__(self, raw: str, why: str) -> None:
        self.raw = raw
        super().__init__(f"annotation {raw!r} is not in the spec's type grammar: {why}")


@dataclass(frozen=True)
class FieldFacts:
    """One field as a release defines it."""

    name: str
    #: The type in the spec grammar, or None where ``raw_type`` could not be translated.
    type: str | None
    raw_type: str
    required: bool
    #: JSON literal of the default, or None.
    default: str | None = None
    default_factory: str | None = None
    #: The default's source where it is no JSON literal (a call, an unknown constant).
    raw_default: str | None = None


@dataclass
class ClassFacts:
    """A class as one release defines it: where, what kind, fields or members."""

    name: str
    module: str
    line: int
    kind: str
    omit_defaults: bool = False
    fields: list[FieldFacts] = field(default_factory=list)
    members: list[tuple[str, int | str]] = field(default_factory=list)


def _last_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _last_name(node.value)
    if isinstance(node, ast.Call):
        return _last_name(node.func)
    return ""


def _union(parts: list[str]) -> str:
    found: list[str] = []
    for part in parts:
        for member in part.split(" | "):
            if member not in found:
                found.append(member)
    if "none" in found:  # the spec writes none last
        found.remove("none")
        found.append("none")
    return " | ".join(found)


def translate(node: ast.expr, known: set[str], raw: str | None = None) -> str:
    """``node`` (an annotation) in the spec's type grammar; raise :class:`Untranslatable`."""
    raw = raw if raw is not None else ast.unparse(node)

    def fail(why: str) -> Untranslatable:
        return Untranslatable(raw, why)

    def go(n: ast.expr) -> str:
        if isinstance(n, ast.Constant):
            if n.value is None:
                return "none"
            if isinstance(n.value, str):  # a forward reference
                return go(ast.parse(n.value, mode="eval").body)
            if n.value is Ellipsis:
                raise fail("a bare '...'")
            raise fail(f"the literal {n.value!r}")
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
            return _union([go(n.left), go(n.right)])
        if isinstance(n, ast.Name | ast.Attribute):
            name = _last_name(n)
            if name in _SIMPLE:
                return _SIMPLE[name]
            if name in _ALIASES:
                return _ALIASES[name]
            if name in _ENC_HOOK:
                return _ENC_HOOK[name]
            if name in _LISTS:
                return f"{_LISTS[name]}[any]"
            if name in _DICTS:
                return "dict[any, any]"
            if name in ("Tuple", "tuple"):
                return "tuple[any, ...]"
            if name in known:
                return name
            raise fail(f"{name!r} is no struct or enum of the spec")
        if isinstance(n, ast.Subscript):
            head = _last_name(n.value)
            args = list(n.slice.elts) if isinstance(n.slice, ast.Tuple) else [n.slice]
            if head == "Optional":
                return _union([go(args[0]), "none"])
            if head == "Union":
                return _union([go(a) for a in args])
            if head in ("Annotated", "Final", "Required", "NotRequired"):
                return go(args[0])
            if head == "ClassVar":
                raise fail("a ClassVar")
            if head == "Literal":
                kinds = []
                for a in args:
                    value = a.value if isinstance(a, ast.Constant) else None
                    kinds.append({bool: "bool", int: "int", str: "str", bytes: "bytes",
                                  type(None): "none"}.get(type(value), "any"))
                return _union(kinds)
            if head in ("NDArray", "ndarray"):
                return "ndarray"
            if head in _LISTS:
                return f"{_LISTS[head]}[{go(args[0])}]"
            if head in _DICTS:
                return f"dict[{go(args[0])}, {go(args[1])}]"
            if head in ("Tuple", "tuple"):
                if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is ...:
                    return f"tuple[{go(args[0])}, ...]"
                return "tuple[" + ", ".join(go(a) for a in args) + "]"
            raise fail(f"the generic {head!r}")
        raise fail(f"the expression {ast.unparse(n)!r}")

    return go(node)


class WheelSource:
    """The Python modules of one vLLM wheel, parsed on demand."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._zip = zipfile.ZipFile(self.path)
        self._names = set(self._zip.namelist())
        self._folders: dict[str, list[str]] = {}
        for name in sorted(self._names):
            if name.endswith(".py"):
                self._folders.setdefault(name.rsplit("/", 1)[0], []).append(name)
        self._trees: dict[str, ast.Module] = {}
        self._texts: dict[str, str] = {}

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> WheelSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self._names:
                return candidate
        return None

    def text(self, filename: str) -> str:
        found = self._texts.get(filename)
        if found is None:
            found = self._zip.read(filename).decode("utf-8")
            self._texts[filename] = found
        return found

    def tree(self, filename: str) -> ast.Module:
        found = self._trees.get(filename)
        if found is None:
            found = ast.parse(self.text(filename), filename=filename)
            self._trees[filename] = found
        return found

    def files_in(self, folder: str) -> list[str]:
        """The ``.py`` files directly in ``folder`` (``vllm/v1/engine``), sorted."""
        return list(self._folders.get(folder, []))

    def has_module(self, module: str) -> bool:
        return self.module_file(module) is not None

    def find_class(self, name: str, hints: list[str]) -> tuple[str, ast.ClassDef] | None:
        """The module file and definition of class ``name``.

        Looked for in the hinted modules, following ``from X import name`` re-exports, then in
        the hinted modules' sibling modules and their parent packages' modules (also where a
        hinted module is missing from the wheel). A class
        elsewhere is not found (a full scan of a wheel takes seconds; the hints come from the
        spec's ``vllm_class`` and from where the neighbouring release keeps the class).
        """
        files = [f for f in (self.module_file(m) for m in hints) if f]
        seen: set[str] = set()
        queue = list(files)
        while queue:
            filename = queue.pop(0)
            if filename in seen:
                continue
            seen.add(filename)
            found = self._class_in(filename, name)
            if found is not None:
                return filename, found
            queue.extend(self._import_sources(filename, name))
        pattern = re.compile(rf"^class {re.escape(name)}\b", re.MULTILINE)
        for filename in self._neighbours(hints):
            if filename not in seen and pattern.search(self.text(filename)):
                found = self._class_in(filename, name)
                if found is not None:
                    return filename, found
        return None

    def _import_sources(self, filename: str, name: str) -> list[str]:
        """Files that ``filename`` imports ``name`` from."""
        package = filename.rsplit("/", 1)[0].replace("/", ".")
        out: list[str] = []
        text = self.text(filename)
        if not re.search(rf"\b{re.escape(name)}\b", text):
            return out
        statements = re.findall(r"^from [.\w]+ import (?:\([^)]*\)|[^\n]*)", text, re.MULTILINE)
        nodes = [n for s in statements if re.search(rf"\b{re.escape(name)}\b", s)
                 for n in ast.parse(s).body]
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
                module = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = parts[: len(parts) - node.level + 1]
                    module = ".".join([*base, module] if module else base)
                found = self.module_file(module)
                if found:
                    out.append(found)
        return out

    def _neighbours(self, hints: list[str]) -> list[str]:
        """The modules beside each hinted module and in its parent package, whether or not
        the hinted module itself is in this wheel (vLLM 0.9.1 kept EngineHandshakeMetadata in
        ``vllm/v1/utils.py``, before ``vllm/v1/engine/utils.py`` existed)."""
        dirs: set[str] = set()
        for module in hints:
            filename = self.module_file(module) or module.replace(".", "/") + ".py"
            folder = filename.rsplit("/", 1)[0]
            dirs.add(folder)
            if "/" in folder:
                dirs.add(folder.rsplit("/", 1)[0])
        return [n for folder in sorted(dirs) for n in self._folders.get(folder, [])]

    def _class_in(self, filename: str, name: str) -> ast.ClassDef | None:
        """The top-level class ``name`` of ``filename``. Only the class's own lines are parsed
        (decorators above it to the next top-level statement): whole modules take ten times
        longer. A chunk that does not parse falls back to the whole module."""
        text = self.text(filename)
        match = re.search(rf"^class {re.escape(name)}\b", text, re.MULTILINE)
        if match is None:
            return None
        start = match.start()
        while True:  # take the decorators along
            previous = text.rfind("\n", 0, max(start - 1, 0))
            line = text[previous + 1:start - 1] if start else ""
            if start and line.startswith("@"):
                start = previous + 1
                continue
            break
        after = re.compile(r"^[A-Za-z_@]", re.MULTILINE).search(text, match.end())
        chunk = text[start:after.start() if after else len(text)]
        offset = text.count("\n", 0, start)
        try:
            module = ast.parse(chunk)
            ast.increment_lineno(module, offset)
            body = module.body
        except SyntaxError:
            body = self.tree(filename).body
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None

    def module_constant(self, module: str, name: str) -> Any:
        """The literal value of a module-level ``name = <literal>``, or None."""
        filename = self.module_file(module)
        if filename is None:
            return None
        found = re.search(rf"^{re.escape(name)}\s*(?::[^=\n]*)?=[^\n]*$", self.text(filename),
                          re.MULTILINE)
        if found is None:
            return None
        for node in ast.parse(found.group(0)).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                assert isinstance(node, (ast.Assign, ast.AnnAssign))
                if node.value is None:  # ``name: T`` alone: no value
                    return None
                try:
                    return ast.literal_eval(node.value)
                except ValueError:
                    return None
        return None

    # --- classes ------------------------------------------------------------------------

    def describe_class(self, name: str, hints: list[str], known: set[str],
                       enums: dict[str, dict[str, int | str]] | None = None) -> ClassFacts | None:
        """The class ``name`` as this wheel defines it, or None where it has none."""
        located = self.find_class(name, hints)
        if located is None:
            return None
        filename, node = located
        module = filename.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        facts = ClassFacts(name=name, module=module, line=node.lineno, kind="")
        bases = [_last_name(b) for b in node.bases]
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        decorators = [_last_name(d) for d in node.decorator_list]
        if any(b in ("Enum", "IntEnum", "StrEnum", "IntFlag") for b in bases):
            facts.kind = "enum"
            facts.members = _enum_members(node)
            return facts
        if "dataclass" in decorators or "TypedDict" in bases:
            facts.kind = "dataclass"
        elif "NamedTuple" in bases:
            facts.kind = "tuple"
        elif "Struct" in bases or any(self._is_struct(b, hints) for b in bases):
            array_like = _truthy(keywords.get("array_like"))
            facts.kind = "array" if array_like else "map"
            facts.omit_defaults = _truthy(keywords.get("omit_defaults"))
        else:
            facts.kind = "class"
        inherited: list[FieldFacts] = []
        for base in bases:
            if base in ("Struct", "NamedTuple", "object", "Generic", "Protocol") or not base:
                continue
            parent = self.describe_class(base, [module, *hints], known, enums)
            if parent is not None and parent.kind in ("array", "map", "dataclass", "tuple"):
                inherited.extend(parent.fields)
                if facts.kind in ("array", "map") and "array_like" not in keywords:
                    facts.kind = parent.kind
                if "omit_defaults" not in keywords:
                    facts.omit_defaults = facts.omit_defaults or parent.omit_defaults
        own = _fields(node, known, enums or {})
        names = {f.name for f in own}
        facts.fields = [f for f in inherited if f.name not in names] + own
        return facts

    def _is_struct(self, base: str, hints: list[str]) -> bool:
        located = self.find_class(base, hints) if base and base[0].isupper() else None
        if located is None:
            return False
        bases = [_last_name(b) for b in located[1].bases]
        return "Struct" in bases or any(self._is_struct(b, hints) for b in bases if b != base)


def _truthy(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _enum_members(node: ast.ClassDef) -> list[tuple[str, int | str]]:
    members: list[tuple[str, int | str]] = []
    last = 0
    for stmt in node.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            continue
        target = stmt.targets[0].id
        if target.startswith("_"):
            continue
        value: Any
        if isinstance(stmt.value, ast.Call) and _last_name(stmt.value.func) == "auto":
            value = last + 1
        else:
            try:
                value = ast.literal_eval(stmt.value)
            except ValueError:
                continue
        if isinstance(value, bytes):
            value = value[0] if len(value) == 1 else value.decode("latin-1")
        if isinstance(value, bool) or not isinstance(value, int | str):
            continue
        if isinstance(value, int):
            last = value
        members.append((target, value))
    return members


def _fields(node: ast.ClassDef, known: set[str],
            enums: dict[str, dict[str, int | str]]) -> list[FieldFacts]:
    found: list[FieldFacts] = []
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        raw = ast.unparse(stmt.annotation)
        if raw.startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar")):
            continue
        try:
            type_text: str | None = translate(stmt.annotation, known, raw)
        except Untranslatable:
            type_text = None
        default, factory, raw_default, required = None, None, None, True
        value = stmt.value
        if value is not None:
            required = False
            if isinstance(value, ast.Call) and _last_name(value.func) == "field":
                keywords = {k.arg: k.value for k in value.keywords}
                if "default_factory" in keywords:
                    factory = _last_name(keywords["default_factory"])
                    if factory not in ("list", "dict", "set"):
                        raw_default = ast.unparse(keywords["default_factory"]) + "()"
                        factory = None
                    value = None
                elif "default" in keywords:
                    value = keywords["default"]
                else:
                    required = True
                    value = None
            if value is not None:
                default, raw_default = _default_json(value, enums)
        if default == "null" and type_text is not None and type_text != "any" \
                and "none" not in type_text.split(" | "):
            type_text += " | none"  # a None default travels as nil whatever the annotation
        found.append(FieldFacts(stmt.target.id, type_text, raw, required, default, factory,
                                raw_default))
    return found


def _default_json(node: ast.expr, enums: dict[str, dict[str, int | str]]
                  ) -> tuple[str | None, str | None]:
    """(JSON literal, None) for a literal or enum-member default; (None, source) otherwise."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
            members = enums.get(_last_name(node.value))
            if members and node.attr in members:
                return json.dumps(members[node.attr]), None
        if isinstance(node, ast.Call) and not node.args and not node.keywords:
            name = _last_name(node.func)
            if name in ("list", "dict", "set"):
                return ("[]" if name != "dict" else "{}"), None
        return None, ast.unparse(node)
    if isinstance(value, tuple | set | frozenset):
        value = list(value)
    if isinstance(value, bytes):
        return None, ast.unparse(node)
    try:
        return json.dumps(value), None
    except TypeError:
        return None, ast.unparse(node)
