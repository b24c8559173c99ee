"""The package layout: no import cycles, the layer order, unique module file names, and a
docstring in every package ``__init__`` that says what lives there and what it may import.

Imports are read with :mod:`ast` from every module of the five layers and the command line,
counting imports inside functions and under ``if TYPE_CHECKING:`` as well as module-level ones:
a lazy import hides a cycle from the interpreter, not from the design.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Top-level folder -> package name, lowest layer first. A layer may import its own package and
#: the layers before it, never one after it.
LAYERS: tuple[tuple[str, str], ...] = (
    ("spec", "enginewire.spec"),
    ("reference", "enginewire.reference"),
    ("conformance", "enginewire.conformance"),
    ("fuzz", "enginewire.fuzz"),
    ("bench", "enginewire.bench"),
    ("tap", "enginewire.tap"),
    ("enginewire", "enginewire"),
)

#: Modules below every layer: argument parsing every package's ``commands.py`` shares. They
#: may import nothing of the project, and every layer may import them.
BASE_MODULES = frozenset({"enginewire.cliargs"})

#: File names that may repeat across the layers: package markers and the per-package
#: ``commands.py`` that contributes subcommands to ``enginewire`` (see ``enginewire/cli.py``).
SHARED_FILE_NAMES = {"__init__.py", "commands.py"}


def _modules() -> dict[str, Path]:
    """Every module's dotted name -> its file."""
    found: dict[str, Path] = {}
    for folder, package in LAYERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


@functools.cache
def _imports(name: str, path: Path) -> tuple[str, ...]:
    """The enginewire modules ``name`` imports anywhere in its body (resolved to modules:
    ``from pkg import sub`` counts as importing ``pkg.sub`` when that is a module). Each file
    is parsed once per session: the tests below walk the same files."""
    return tuple(_walk_imports(name, path))


def _walk_imports(name: str, path: Path) -> Iterator[str]:
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield sub if sub in MODULES else module
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            # importlib.import_module("enginewire.x"): a load by string is still an import.
            yield node.args[0].value


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for imported in _imports(name, path):
            if imported in MODULES and imported != name:
                graph[name].add(imported)
    return graph


def _layer(module: str) -> int:
    if module in BASE_MODULES:
        return -1
    best = -1
    for index, (_, package) in enumerate(LAYERS):
        if module == package or module.startswith(package + "."):
            if package == "enginewire" and any(
                module == p or module.startswith(p + ".") for _, p in LAYERS[:-1]
            ):
                continue
            best = index
    return best


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(MODULES, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = grey
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if color[nxt] == grey:
                return stack[stack.index(nxt):] + [nxt]
            if color[nxt] == white:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        color[node] = black
        return None

    for node in sorted(MODULES):
        if color[node] == white:
            found = visit(node)
            if found:
                return found
    return None


def test_the_walker_sees_lazy_imports_and_finds_a_cycle() -> None:
    graph = _graph()
    # A function-level import the interpreter only runs on demand is still an edge.
    assert "enginewire.conformance.targets.vllm.target" in graph[
        "enginewire.conformance.targets.resolve"]
    broken = {name: set(edges) for name, edges in graph.items()}
    broken["enginewire.conformance.targets.contract"] = {"enginewire.conformance.targets.resolve"}
    cycle = _find_cycle(broken)
    assert cycle is not None and cycle[0] == cycle[-1]


def test_no_import_cycles() -> None:
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_layer_imports_a_higher_one() -> None:
    names = {index: package for index, (_, package) in enumerate(LAYERS)}
    names[-1] = "base"
    wrong = [
        f"{module} ({names[_layer(module)]}) imports {imported} ({names[_layer(imported)]})"
        for module, edges in sorted(_graph().items())
        for imported in sorted(edges)
        if _layer(imported) > _layer(module)
    ]
    assert not wrong, "layer order spec <- reference <- conformance <- fuzz <- bench <- cli:\n" \
        + "\n".join(wrong)


def test_module_file_names_are_unique_across_layers() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for folder, _ in LAYERS[:-1]:
        for path in (ROOT / folder).rglob("*.py"):
            if path.name not in SHARED_FILE_NAMES:
                where[path.name].append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not repeated, f"module file names used twice: {repeated}"


@pytest.mark.parametrize("path", sorted(p for p in MODULES.values() if p.name == "__init__.py"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_says_what_lives_there_and_what_it_may_import(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert len(doc.split()) >= 12, f"{path}: the package docstring is missing or too short"
    assert "may import" in doc, f"{path}: the docstring does not say what the package may import"


def _layer_of(module: str) -> str | None:
    """The layer package (``enginewire.spec``, ... ``enginewire``) a module belongs to."""
    for _, package in sorted(LAYERS, key=lambda item: -len(item[1])):
        if module == package or module.startswith(package + "."):
            return package
    return None


@pytest.mark.parametrize("path", sorted(p for p in MODULES.values() if p.name == "__init__.py"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_layer_a_package_imports_is_named_in_its_docstring(path: Path) -> None:
    """The "may import" statement is true: each lower layer the package's modules import is
    named in it (the command line's "every other enginewire package" names them all)."""
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split())
    package = next(name for name, found in MODULES.items() if found == path)
    own = _layer_of(package)
    imported = {
        _layer_of(target)
        for name, module_path in MODULES.items()
        if name == package or name.startswith(package + ".")
        for target in _imports(name, module_path)
        if target not in BASE_MODULES
    }
    every = "every other enginewire package" in doc
    undeclared = sorted(layer for layer in imported - {own, None}
                        if f"``{layer}``" not in doc and not every)
    assert not undeclared, f"{path}: imports {undeclared} but its docstring does not name them"
