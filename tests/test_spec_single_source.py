"""Every rule lives once, in the spec data: no consumer restates one.

The detector parses the source of every spec consumer (``reference``, ``conformance``, ``fuzz``,
``bench`` and the spec's own tools) and reports a value of the spec data written as a literal
where it acts as a rule:

- an extension code (tensors ``ext_codes``) as the code of an ``Ext(...)`` call, compared with
  an ``.code`` attribute, or bound to a module-level name;
- a multimodal factory tag (``MultiModalFieldElem.field``'s tagged union) as a dict key or
  value, or in a comparison;
- a ring chunk state's flag pattern anywhere but a docstring;
- a request type byte (one-byte ``bytes``) in a comparison, as a dict key or value, or bound to
  a module-level name;
- the fields of an exactly-one-of constraint, all of them together in one comparison or one
  tuple, list or set literal.

Sample data (a list holding a factory tag or a type byte to send) is not a rule and is not
reported; ``ALLOWED`` names the few places where a literal that looks like a rule is another
thing. ``test_detector_fires_*`` prove the detector's power on injected restatements.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

from enginewire.reference.ring.protocol import ChunkState, classify
from enginewire.spec import load

ROOT = Path(__file__).resolve().parents[1]
CONSUMERS = ("reference", "conformance", "fuzz", "bench", "spec", "enginewire")
#: (path relative to the root, enclosing function or assigned name): what the literal is there.
#: Empty now: every literal the detector finds is read from the spec instead. An entry is for a
#: literal that only looks like a rule, e.g. ``("pkg/mod.py", "NAME"): "why it is another
#: thing"``.
ALLOWED: dict[tuple[str, str], str] = {
    ("enginewire/cliargs.py", "text_file_problem"):
        "a NUL byte marks a binary file, not a type byte",
    ("fuzz/explore/execution.py", "_program_store"): "a one-byte flag store of 1 (set), not ABORT",
    ("fuzz/explore/execution.py", "_notify"): "a written flag stored as 1 (set), not ABORT",
    ("fuzz/explore/execution.py", "framing_problem"):
        "the in-ring chunk's overflow byte 0 (not overflowed), not ADD",
    ("bench/textbook_bench.py", "_stream"): "the pipe reader's one-byte confirmation, not ADD",
    ("bench/textbook_bench.py", "body"): "the shared-memory handshake byte on a pipe, not ABORT",
    ("bench/textbook_bench.py", "_shm_handshake"):
        "the shared-memory handshake byte on a pipe, not ABORT",
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    scope: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.scope}): {self.what}"


@dataclass(frozen=True)
class Rules:
    """The literal values the spec data owns."""

    ext_codes: frozenset[int]
    factory_tags: frozenset[str]
    chunk_patterns: frozenset[str]
    type_bytes: frozenset[bytes]
    exclusive_groups: tuple[frozenset[str], ...]

    @classmethod
    def from_spec(cls) -> Rules:
        spec = load()
        return cls(
            ext_codes=frozenset(e.code for e in spec.surface("tensors").ext_codes),
            factory_tags=frozenset(
                spec.tagged_union("MultiModalFieldElem", "field").tags),
            chunk_patterns=frozenset(s.pattern for s in spec.chunk_states()),
            type_bytes=frozenset(bytes([t.byte]) for t in spec.surface("request_types").types),
            exclusive_groups=tuple(
                frozenset(c.fields) for name, item in spec.structs.items()
                if not hasattr(item, "members") for c in spec.constraints(name)
                if c.kind == "exactly-one-of"),
        )


def _constants(side: ast.AST) -> list[ast.Constant]:
    """The literals a comparison side is: itself, or the elements of a literal collection
    (``x in (1, 2)``); not indexes or arguments inside it."""
    items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
    return [n for n in items if isinstance(n, ast.Constant)]


def _names_in(node: ast.AST) -> set[str]:
    """Field names a node mentions: attribute names and string constants."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
    return found


class _Detector(ast.NodeVisitor):
    def __init__(self, rules: Rules, path: str) -> None:
        self.rules = rules
        self.path = path
        self.scope = ["<module>"]
        self.findings: list[Finding] = []
        self.docstrings: set[int] = set()

    def report(self, node: ast.AST, what: str) -> None:
        scope = self.scope[-1]
        if (self.path, scope) in ALLOWED:
            return
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), scope, what))

    # scopes and docstrings
    def _scoped(self, node: ast.AST, name: str) -> None:
        body = getattr(node, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            self.docstrings.add(id(body[0].value))
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Module(self, node: ast.Module) -> None:
        self._scoped(node, "<module>")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped(node, node.name)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node, node.name)

    # module-level bindings
    def _visit_binding(self, node: ast.Assign | ast.AnnAssign, value: ast.AST | None) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        at_module = self.scope[-1] == "<module>"
        if at_module and names and isinstance(value, ast.Constant):
            self.scope.append(names[0])
            if value.value in self.rules.ext_codes and type(value.value) is int and (
                    "EXT" in names[0].upper() or "PICKLE" in names[0].upper()
                    or "RAW_VIEW" in names[0].upper()):
                self.report(node, f"extension code {value.value} bound to {names[0]}")
            if isinstance(value.value, bytes) and value.value in self.rules.type_bytes:
                self.report(node, f"type byte {value.value!r} bound to {names[0]}")
            self.scope.pop()
        if at_module and names:
            self.scope.append(names[0])
            self.generic_visit(node)
            self.scope.pop()
        else:
            self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._visit_binding(node, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._visit_binding(node, node.value)

    # the rule shapes
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "Ext" and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in self.rules.ext_codes:
            self.report(node, f"Ext({node.args[0].value}, ...) restates an extension code")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        with_code = any(isinstance(s, ast.Attribute) and s.attr == "code" for s in sides)
        for const in (c for side in sides for c in _constants(side)):
            value = const.value
            if with_code and type(value) is int and value in self.rules.ext_codes:
                self.report(node, f"compares .code with extension code {value}")
            if isinstance(value, str) and value in self.rules.factory_tags:
                self.report(node, f"compares with factory tag {value!r}")
            if isinstance(value, bytes) and value in self.rules.type_bytes:
                self.report(node, f"compares with type byte {value!r}")
        mentioned = _names_in(node)
        for group in self.rules.exclusive_groups:
            if group <= mentioned:
                self.report(node, f"restates the exactly-one-of rule over {sorted(group)}")
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for item in (*node.keys, *node.values):
            if isinstance(item, ast.Constant):
                if isinstance(item.value, str) and item.value in self.rules.factory_tags:
                    self.report(node, f"factory tag {item.value!r} in a mapping")
                if isinstance(item.value, bytes) and item.value in self.rules.type_bytes:
                    self.report(node, f"type byte {item.value!r} in a mapping")
        self.generic_visit(node)

    def _visit_sequence(self, node: ast.Tuple | ast.List | ast.Set) -> None:
        strings = {e.value for e in node.elts
                   if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        for group in self.rules.exclusive_groups:
            if group <= strings:
                self.report(node, f"lists the exactly-one-of fields {sorted(group)}")
        self.generic_visit(node)

    visit_Tuple = visit_List = visit_Set = _visit_sequence  # type: ignore[assignment]

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) not in self.docstrings and isinstance(node.value, str) \
                and node.value in self.rules.chunk_patterns:
            self.report(node, f"chunk state pattern {node.value!r}")


def scan_source(source: str, path: str, rules: Rules) -> list[Finding]:
    detector = _Detector(rules, path)
    detector.visit(ast.parse(source))
    return detector.findings


def consumer_files() -> list[Path]:
    files: list[Path] = []
    for package in CONSUMERS:
        files.extend(sorted((ROOT / package).rglob("*.py")))
    return files


@pytest.fixture(scope="module")
def rules() -> Rules:
    return Rules.from_spec()


def test_rules_are_not_empty(rules: Rules) -> None:
    assert rules.ext_codes and rules.factory_tags and rules.chunk_patterns
    assert rules.type_bytes and rules.exclusive_groups


def test_no_consumer_restates_a_rule(rules: Rules) -> None:
    files = consumer_files()
    assert len(files) > 50, "the consumer packages were not found"
    findings = [f for path in files
                for f in scan_source(path.read_text(), str(path.relative_to(ROOT)), rules)]
    assert not findings, "restated spec values (read them from the spec loader):\n" + "\n".join(
        map(str, findings))


INJECTED = {
    "ext-call": "import msgspec\nx = msgspec.msgpack.Ext(3, b'')\n",
    "ext-compare": "def f(v):\n    return v.code == 1\n",
    "ext-binding": "PICKLE_EXT = 1\n",
    "factory-map": "FACTORIES = {'batched': 'MultiModalBatchedField'}\n",
    "factory-inverse": "NAMES = {'MultiModalFlatField': 'flat'}\n",
    "factory-compare": "def f(name):\n    return name == 'shared'\n",
    "chunk-state": "import enum\nclass S(enum.Enum):\n    READ_BY_ALL = '1111'\n",
    "type-byte-compare": "def f(frames):\n    return frames[0] != b'\\x00'\n",
    "type-byte-map": "KINDS = {'abort': b'\\x01'}\n",
    "type-byte-binding": "ADD = b'\\x00'\n",
    "exclusive-compare": ("def f(v):\n    return (v.sampling_params is None) == "
                          "(v.pooling_params is None)\n"),
    "exclusive-tuple": "GROUP = ('sampling_params', 'pooling_params')\n",
}


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_detector_fires_on_an_injected_restatement(name: str, rules: Rules,
                                                   tmp_path: Path) -> None:
    module = tmp_path / f"restated_{name.replace('-', '_')}.py"
    module.write_text(INJECTED[name])
    findings = scan_source(module.read_text(), "fuzz/injected.py", rules)
    assert findings, f"the detector missed {name}: {INJECTED[name]!r}"


def test_detector_ignores_docstrings_and_samples(rules: Rules) -> None:
    source = ('"""Chunk 1111 is read-by-all; written 1000."""\n'
              'def f():\n    """State \'1111\'."""\n'
              '    return [b"\\x00", {"field": ["batched", {}]}]\n')
    assert scan_source(source, "fuzz/sample.py", rules) == []


def test_allow_list_entries_exist() -> None:
    """An allow-list entry whose file is gone is stale."""
    for path, _scope in ALLOWED:
        assert (ROOT / path).exists(), f"stale ALLOWED entry {path}"


def test_chunk_states_follow_their_patterns() -> None:
    """ChunkState is built from ring.toml's states table, and classify() puts every row a
    pattern matches (n_reader = 3, '.' any flag, '?' either) in that pattern's state."""
    spec_states = load().chunk_states()
    assert [s.value for s in ChunkState] == [s.pattern for s in spec_states]
    assert [m.can_write for m in ChunkState] == [s.can_write for s in spec_states]
    for row in itertools.product((0, 1), repeat=4):
        matching = [s for s in spec_states if _matches(s.pattern, row)]
        assert classify(bytes(row)).value in {s.pattern for s in matching}, row


def _matches(pattern: str, row: tuple[int, ...]) -> bool:
    if pattern.endswith("..."):
        return str(row[0]) == pattern[0]
    if "?" in pattern:
        # partly read: written, some but not all read flags set
        return row[0] == 1 and 0 < sum(row[1:]) < len(row) - 1
    return "".join(map(str, row)) == pattern


def test_clause_text_names_what_the_data_holds() -> None:
    """The prose of a constraint's or tagged union's clause names every field or tag the
    data lists, so the human text cannot drift from the data."""
    spec = load()
    checked = 0
    for name, item in spec.structs.items():
        for rule in getattr(item, "constraints", []):
            text = spec.clause(rule.clause).text
            assert all(f in text for f in rule.fields), (name, rule.clause, rule.fields)
            checked += 1
        for union in getattr(item, "tagged_unions", []):
            text = spec.clause(union.clause).text
            assert all(f"'{tag}'" in text for tag in union.tags), (name, union.clause)
            checked += 1
    assert checked >= 2


def test_byte_table_clause_matches_the_request_types() -> None:
    """request_types.byte-table spells each on-wire byte; it must be the table's byte."""
    spec = load()
    text = spec.clause("request_types.byte-table").text
    for request_type in spec.surface("request_types").types:
        if request_type.on_wire:
            spelled = f"{request_type.name} 0x{request_type.byte:02X}"
            assert spelled in text, (spelled, text)
