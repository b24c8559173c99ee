"""The check registry: every conformance check, its clause IDs, surface and time limit.

A check is a function decorated with :func:`check`::

    @check("codec/tensor/inline-threshold-exact",
           clauses=["tensors.inline-below-threshold"], surface="codec")
    def _(codec, ctx):
        frames = codec.encode("EngineCoreOutput", value)
        if len(frames) != 2:
            raise CheckFailure("a tensor of exactly threshold bytes must go out of band",
                               Reproduction(sent=..., received=frames))

It receives the implementation of its surface from the target under test (``codec``, ``ring``,
``engine`` or ``frontend``, see :mod:`enginewire.conformance.targets.contract`) and a
:class:`~enginewire.conformance.framework.context.CheckContext` (timeouts, temporary directory,
spec, clean-up). It passes by returning; it fails by raising :class:`CheckFailure`, whose
:class:`Reproduction` holds the minimal evidence: the frames sent, in hex, and what came back.
Any other exception out of a check also fails it (the report shows the traceback), except
:class:`CheckSkip` (the check cannot run here: a data file or optional package is missing) and
:class:`NotImplementedSurface` (the target lacks the surface or an optional capability).

The level of a check (MUST, SHOULD, MAY) is the strongest level among its clauses, read from
the spec; a check whose level is not MUST runs only with ``--strict`` (h2spec's rule).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from enginewire.conformance.framework.memory_log import MemoryLog

#: The surfaces a target can implement, in report order.
SURFACES = ("codec", "ring", "engine", "frontend")

#: Seconds a check may run unless it sets its own ``timeout``.
DEFAULT_TIMEOUT_S = 10.0

#: A check ID: its surface, then parts separated by ``/`` (``ring/writer/chunk-framing``).
#: Clause IDs separate their parts with ``.`` (``ring.writer.fence-before-check``), so the two
#: never look alike: a check ID with a dot is refused.
CHECK_ID_SEPARATOR = "/"
_CHECK_ID = re.compile(r"^[a-z0-9_]+(/[a-z0-9_-]+)+$")
_LEVEL_ORDER = {"MUST": 0, "SHOULD": 1, "MAY": 2}


def hexdump(data: bytes | bytearray | memoryview, limit: int = 256) -> str:
    """``data`` as lowercase hex, cut after ``limit`` bytes with the full length noted."""
    raw = bytes(data)
    if len(raw) <= limit:
        return raw.hex()
    return f"{raw[:limit].hex()}... ({len(raw)} bytes)"


@dataclass
class Reproduction:
    """What a failing check did and saw, small enough to replay by hand.

    ``sent`` holds the frames (or ring chunk bytes) the suite gave the target, ``received``
    what came back (frames, a decoded value, an exception text), ``notes`` any extra fact a
    reader needs (the threshold in force, the chunk size, the reader rank). A note may be
    typed: a :class:`~.memory_log.MemoryLog` (note ``memory_log``) renders as one text line
    per event here and in JSON/JUnit, as a swimlane in the HTML report.
    """

    sent: Sequence[bytes | bytearray | memoryview] | None = None
    received: Any = None
    notes: dict[str, Any] = field(default_factory=dict)

    def to_builtins(self) -> dict[str, Any]:
        """JSON-ready form: frames become lists of hex strings, values their ``repr``."""
        out: dict[str, Any] = {}
        if self.sent is not None:
            out["sent_hex"] = [hexdump(frame) for frame in self.sent]
        if self.received is not None:
            out["received"] = _describe(self.received)
        if self.notes:
            out["notes"] = {key: _describe(value) for key, value in self.notes.items()}
        return out

    def render(self) -> str:
        """Multi-line text for terminals and report bodies."""
        lines: list[str] = []
        data = self.to_builtins()
        for index, frame in enumerate(data.get("sent_hex", [])):
            lines.append(f"sent frame {index}: {frame or '(empty)'}")
        if "received" in data:
            received = data["received"]
            if isinstance(received, list):
                for index, item in enumerate(received):
                    lines.append(f"received {index}: {item}")
            else:
                lines.append(f"received: {received}")
        for key, value in data.get("notes", {}).items():
            if isinstance(self.notes.get(key), MemoryLog):
                lines.append(f"{key}:")
                lines += [f"  {line}" for line in value]
            else:
                lines.append(f"{key}: {value}")
        return "\n".join(lines)


def _describe(value: Any) -> Any:
    if isinstance(value, MemoryLog):
        return value.text_lines()
    if isinstance(value, bytes | bytearray | memoryview):
        return hexdump(value)
    if isinstance(value, list | tuple) and all(
        isinstance(v, bytes | bytearray | memoryview) for v in value
    ):
        return [hexdump(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    text = repr(value)
    return text if len(text) <= 2000 else text[:2000] + "..."


class CheckFailure(AssertionError):
    """The target broke the check's clause(s). ``message`` says what was expected and what came."""

    def __init__(self, message: str, reproduction: Reproduction | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reproduction = reproduction


class CheckSkip(Exception):
    """The check cannot run in this environment (say why); it is neither passed nor failed."""


class NotInRelease(Exception):
    """What the check exercises does not exist in the vLLM release the suite follows (a field,
    struct or feature added later): the check is NOT APPLICABLE, with this reason."""


def require_field(spec: Any, struct: str, *fields: str) -> None:
    """Raise :class:`NotInRelease` unless ``struct`` has every one of ``fields`` in ``spec``
    (the spec of the release the suite follows)."""
    item = spec.structs.get(struct)
    names = {f.name for f in getattr(item, "fields", [])}
    missing = [f for f in fields if f not in names]
    if item is None or missing:
        what = f"{struct}" if item is None else f"{struct}.{', '.join(missing)}"
        raise NotInRelease(f"vLLM {spec.version} has no {what}")


class NotImplementedSurface(Exception):
    """The target does not implement the surface or optional capability the check needs."""


@dataclass(frozen=True)
class Check:
    """One registered check."""

    id: str
    clauses: tuple[str, ...]
    surface: str
    func: Callable[[Any, Any], None]
    description: str
    #: Optional capabilities of the surface the check needs (see ``targets.CAPABILITIES``).
    requires: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_S

    @property
    def primary_clause(self) -> str:
        return self.clauses[0]

    def level(self, spec: Any) -> str:
        """The strongest level among the check's clauses; MUST for a clause the spec lacks."""
        levels = []
        for clause_id in self.clauses:
            ref = spec.clauses.get(clause_id)
            levels.append(ref.clause.level if ref is not None else "MUST")
        return min(levels, key=_LEVEL_ORDER.__getitem__)


_REGISTRY: dict[str, Check] = {}
_LOADED = False


def check(
    check_id: str,
    *,
    clauses: Sequence[str],
    surface: str,
    requires: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_S,
    description: str | None = None,
) -> Callable[[Callable[[Any, Any], None]], Callable[[Any, Any], None]]:
    """Register the decorated function as check ``check_id``.

    ``check_id`` starts with ``surface`` and separates its parts with ``/`` (never ``.``, the
    clause IDs' separator), each part of ``[a-z0-9_-]``; ``clauses`` names at least
    one spec clause; the first is the check's primary clause (the JUnit classname). The
    description defaults to the first line of the function's docstring.
    """

    def decorate(func: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        doc = (func.__doc__ or "").strip().splitlines()
        register(
            Check(
                id=check_id,
                clauses=tuple(clauses),
                surface=surface,
                func=func,
                description=description or (doc[0] if doc else check_id),
                requires=tuple(requires),
                timeout=timeout,
            )
        )
        return func

    return decorate


def register(item: Check) -> Check:
    """Add ``item`` to the registry; checks that the ID, surface and clauses are well formed."""
    if "." in item.id:
        raise ValueError(
            f"check ID {item.id!r} looks like a clause ID: check IDs separate their parts with "
            f"'/' (e.g. {item.id.replace('.', '/')!r}), clause IDs with '.'"
        )
    if not _CHECK_ID.match(item.id):
        raise ValueError(
            f"check ID {item.id!r}: expected parts of [a-z0-9_-] separated by '/', two or more"
        )
    if item.surface not in SURFACES:
        raise ValueError(
            f"check {item.id}: surface must be one of {SURFACES}, not {item.surface!r}"
        )
    if item.id.split("/", 1)[0] != item.surface:
        raise ValueError(f"check {item.id}: its ID must start with '{item.surface}/'")
    if not item.clauses:
        raise ValueError(f"check {item.id}: name at least one clause")
    if item.id in _REGISTRY and _REGISTRY[item.id].func is not item.func:
        raise ValueError(f"check {item.id} is registered twice")
    _REGISTRY[item.id] = item
    return item


def unregister(check_ids: Iterable[str]) -> None:
    """Remove checks registered at run time (``--vectors``), e.g. when a test is done."""
    for check_id in check_ids:
        _REGISTRY.pop(check_id, None)


def load_checks() -> None:
    """Import every module of :mod:`enginewire.conformance.checks` (each registers its checks)."""
    global _LOADED
    if _LOADED:
        return
    package = importlib.import_module("enginewire.conformance.checks")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
    _LOADED = True


def all_checks() -> list[Check]:
    """Every registered check, by surface (in :data:`SURFACES` order) then ID."""
    load_checks()
    return sorted(_REGISTRY.values(), key=lambda c: (SURFACES.index(c.surface), c.id))


def select(
    checks: Iterable[Check],
    *,
    surfaces: Sequence[str] | None = None,
    patterns: Sequence[str] | None = None,
) -> list[Check]:
    """Checks on ``surfaces`` (all when empty) whose ID matches one of the glob ``patterns``."""
    import fnmatch

    chosen = []
    for item in checks:
        if surfaces and item.surface not in surfaces:
            continue
        if patterns and not any(fnmatch.fnmatchcase(item.id, p) for p in patterns):
            continue
        chosen.append(item)
    return chosen
