"""What the target did during one check, so that a verdict rests on evidence.

The runner opens an :class:`Evidence` record per check and hands a codec check a
:class:`GuardedCodec` instead of the target's codec. The guard

- counts the calls into the target: a codec check that passes without one consulted only the
  spec, and is reported SPEC ONLY (counted apart from the target's passes);
- refuses, without calling the target, an operation outside the codec's ``role`` (the
  check becomes NOT APPLICABLE) or one the codec declares ``unsupported`` (NOT IMPLEMENTED);
- notes every ``NotImplementedError`` the target raises: the check becomes NOT IMPLEMENTED
  whatever it made of the exception (a check that catches "any error" as a rejection can no
  longer pass on it).

Targets outside the codec surface report their gaps by raising ``NotImplementedError`` (the
external programs' ``"unsupported"`` answer becomes ``contract.Unsupported``, one); the
runner finds it anywhere in the cause chain of a check's verdict, and a layer above may note
one with :func:`note_not_implemented` (the checks do, for one raised on a thread of their own).
Once one is noted the verdict is NOT IMPLEMENTED whatever follows, so a suite peer waiting for
the target stops waiting (:func:`refused`).
See ``targets.contract`` ("Rejections are evidence only...", "Roles").
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from enginewire.conformance.framework.registry import NotInRelease
from enginewire.conformance.targets.contract import (
    CODEC_ROLES,
    OutsideRole,
    TargetError,
    Unsupported,
)
from enginewire.spec.loader import REFERENCE_VLLM_VERSION
from enginewire.spec.types import TypeExpr, kind_of, members, parse_type


@dataclass
class Evidence:
    """The target's calls, missing operations and out-of-role operations in one check."""

    calls: int = 0
    not_implemented: list[str] = field(default_factory=list)
    outside_role: list[str] = field(default_factory=list)
    #: Calls into the target that :func:`refused` makes while a suite peer waits (a running
    #: peer's ``alive``): one raising ``NotImplementedError`` is noted as missing.
    probes: list[tuple[str, Callable[[], Any]]] = field(default_factory=list)
    #: The target's program failed to start during the check (:func:`note_start_failure`):
    #: the runner stops the run with it, whatever the check made of it.
    start_failure: TargetError | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def called(self) -> None:
        with self._lock:
            self.calls += 1

    def missing(self, what: str) -> None:
        with self._lock:
            if what not in self.not_implemented:
                self.not_implemented.append(what)

    def out_of_role(self, what: str) -> None:
        with self._lock:
            if what not in self.outside_role:
                self.outside_role.append(what)


_CURRENT: Evidence | None = None


def begin() -> Evidence:
    """Open the record of the check about to run (checks run one at a time)."""
    global _CURRENT
    _CURRENT = Evidence()
    return _CURRENT


def end() -> None:
    global _CURRENT
    _CURRENT = None


def note_not_implemented(what: str) -> None:
    """The target said it has no code for ``what``: the running check is NOT IMPLEMENTED."""
    if _CURRENT is not None:
        _CURRENT.missing(what)


def note_start_failure(failure: TargetError) -> None:
    """The target's program failed to start (``contract.TargetStartError``): the running
    check has no verdict and the run stops with ``failure``, even if the check caught it."""
    current = _CURRENT
    if current is not None:
        with current._lock:
            if current.start_failure is None:
                current.start_failure = failure


def start_failure() -> TargetError | None:
    """The start failure of the running check (noted by a call into the target or by a probe
    that :func:`refused` asked), or None."""
    current = _CURRENT
    if current is None:
        return None
    return current.start_failure


def probe_while_waiting(what: str, probe: Callable[[], Any]) -> None:
    """Have :func:`refused` call ``probe`` (a call into the target, such as a running peer's
    ``alive``) while the running check waits for the target; its return value is ignored."""
    if _CURRENT is not None:
        with _CURRENT._lock:
            _CURRENT.probes.append((what, probe))


def refused() -> str | None:
    """The first operation the target said it has no code for in the running check (noted, or
    raised now by a probe of :func:`probe_while_waiting`), or None. Once there is one the check
    is NOT IMPLEMENTED whatever else happens, so a suite peer waiting for the target may stop
    waiting. A noted start failure (:func:`note_start_failure`) ends the waits too."""
    current = _CURRENT
    if current is None:
        return None
    with current._lock:
        probes = list(current.probes)
    for what, probe in probes:
        try:
            probe()
        except NotImplementedError as exc:
            current.missing(f"{what} ({type(exc).__name__}: {exc})")
        except TargetError as exc:
            note_start_failure(exc)
        except Exception:  # noqa: BLE001 - a probe only looks for a refusal
            pass
    if current.start_failure is not None:
        return f"anything: {current.start_failure}"
    return current.not_implemented[0] if current.not_implemented else None


def _cause_of(exc: BaseException | None, cls: type[BaseException]) -> BaseException | None:
    """The first exception of class ``cls`` in ``exc``'s cause/context chain, or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, cls):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def not_implemented_cause(exc: BaseException | None) -> BaseException | None:
    """The first ``NotImplementedError`` in ``exc``'s cause/context chain, or None."""
    return _cause_of(exc, NotImplementedError)


def not_in_release_cause(exc: BaseException | None) -> BaseException | None:
    """The first :class:`NotInRelease` in ``exc``'s cause/context chain, or None."""
    return _cause_of(exc, NotInRelease)


def for_release(value: Any, kind: str, spec: Any) -> tuple[Any, list[str]]:
    """A neutral ``value`` (of message kind or struct ``kind``, written for the newest layout)
    as the release ``spec`` describes it: keys the release has no field for are dropped where
    they carry nothing (:func:`_filler`: a template's filler), and listed as
    ``Struct.field`` where they carry a value (then what the check exercises does not exist
    in the release). A field only the release has, required and nullable there, is set to
    nil. A UTILITY payload takes the release's items (no client_index up to 0.9.0) and an
    init message its form (0.9.0's plain map: history/constants.toml)."""
    from enginewire.spec.history.release_facts import (
        UTILITY_ITEMS,
        init_message_at,
        init_message_value,
        utility_value,
    )

    if kind == "utility" and isinstance(value, list | tuple) and len(value) == len(UTILITY_ITEMS):
        return utility_value(spec.version, **dict(zip(UTILITY_ITEMS, value, strict=True))), []
    if (kind == "init" and isinstance(value, dict) and "addresses" in value
            and init_message_at(spec.version).get("form") == "map"):
        addresses = value["addresses"]
        if not (isinstance(addresses, dict) and addresses.get("outputs")):
            # Nothing the release's map can carry: the value needs the struct it lacks.
            return value, ["EngineHandshakeMetadata"]
        return init_message_value(spec.version, inputs=list(addresses.get("inputs") or []),
                                  outputs=list(addresses["outputs"]),
                                  parallel_config=value.get("parallel_config")), []
    payload = kind if kind in spec.structs else None
    for message in spec.surface("frames").messages:
        if message.kind == kind:
            payload = next((f.payload for f in message.frames if f.content == "msgpack"), None)
    if payload is None or value is None:
        return value, []
    expr = parse_type(payload)
    absent = [name for name in _type_names(expr)
              if name not in spec.structs and name[:1].isupper()]
    if absent:
        return value, absent
    found: list[str] = []
    out = _walk_fields(parse_type(payload), value, spec, found, 0)
    return out, sorted(set(found))


def in_release(value: Any, kind: str, spec: Any) -> Any:
    """``value`` (written for the newest layout) as release ``spec`` lays out ``kind``
    (:func:`for_release`); raises :class:`NotInRelease` naming what the release lacks where
    the value carries something the release has no field or struct for. At the newest
    release the value is returned unchanged. Checks that build a wire value or an expected
    value themselves use it, so that what they compare is what the release sends."""
    if spec.version == REFERENCE_VLLM_VERSION:
        return value
    out, unknown = for_release(value, kind, spec)
    if unknown:
        raise NotInRelease(f"vLLM {spec.version} has no {', '.join(unknown)}")
    return out


def _type_names(expr: TypeExpr) -> list[str]:
    """Every named type in a type expression."""
    return [expr.name, *(n for a in expr.args for n in _type_names(a))]


def _newest_default(struct: str, name: str) -> Any:
    import json

    from enginewire.spec.loader import load

    item = load().structs.get(struct)
    fld = next((f for f in getattr(item, "fields", []) if f.name == name), None)
    if fld is None or fld.required:
        return _NO_DEFAULT
    if fld.default_factory:
        return {"list": [], "dict": {}, "set": set()}[fld.default_factory]
    return json.loads(fld.default) if fld.default is not None else None


_NO_DEFAULT = object()


def _filler(value: Any, struct: str, name: str) -> bool:
    """Whether a value carries nothing: nil, an empty or false builtin (a template's filler),
    or the newest release's default of that field."""
    if value is None:
        return True
    if type(value) not in (bool, int, float, str, list, dict, set, tuple):
        return False
    if not value:
        return True
    try:
        return bool(value == _newest_default(struct, name))
    except (TypeError, ValueError):
        return False


def _walk_fields(expr: TypeExpr, value: Any, spec: Any, found: list[str], depth: int) -> Any:
    if depth > 12 or value is None:
        return value
    family = kind_of(expr, spec.structs)
    if family == "union":
        for member in members(expr):
            if kind_of(member, spec.structs) == "struct" and isinstance(value, Mapping):
                return _walk_fields(member, value, spec, found, depth + 1)
        return value
    if family == "struct" and isinstance(value, Mapping):
        item = spec.structs[expr.name]
        names = {f.name: f for f in item.fields}
        out = {}
        for key, inner in value.items():
            if key in names:
                out[key] = _walk_fields(parse_type(names[key].type), inner, spec, found,
                                        depth + 1)
            elif _filler(inner, item.name, key):
                continue
            else:
                found.append(f"{item.name}.{key}")
        for fld in item.fields:
            # A field the release requires and the newest layout does not have: nil where the
            # release's type allows it (the template would have left it unset).
            field_type = parse_type(fld.type)
            if fld.required and fld.name not in out \
                    and (field_type.nullable or kind_of(field_type) == "any") \
                    and _newest_default(item.name, fld.name) is _NO_DEFAULT:
                out[fld.name] = None
        return out
    if expr.args and isinstance(value, list | tuple) and not isinstance(value, str):
        return type(value)(_walk_fields(expr.args[0], v, spec, found, depth + 1)
                           for v in value)
    if len(expr.args) == 2 and isinstance(value, Mapping):
        return {k: _walk_fields(expr.args[1], v, spec, found, depth + 1)
                for k, v in value.items()}
    return value


# --- roles -------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def kind_senders(spec: Any) -> dict[str, set[str]]:
    """Every codec kind the spec names -> the sides that send it (``engine``, ``frontend``,
    ``coordinator``): message kinds by their ``sender``, structs by every message whose
    payload holds them (``SamplingParams`` travels inside the front end's
    ``EngineCoreRequest``). Structs no message holds are left out (any role may handle them)."""
    cached = getattr(spec, "_kind_senders", None)
    if cached is not None:
        return cached
    out: dict[str, set[str]] = {}

    def walk(type_text: str, sender: str, seen: set[str]) -> None:
        for name in _NAME.findall(type_text or ""):
            if name in spec.structs and name not in seen:
                seen.add(name)
                out.setdefault(name, set()).add(sender)
                for item in getattr(spec.structs[name], "fields", None) or ():
                    walk(item.type, sender, seen)

    for message in spec.surface("frames").messages:
        out.setdefault(message.kind, set()).add(message.sender)
        for frame in message.frames:
            walk(frame.payload or "", message.sender, set())
    for message in spec.surface("handshake").messages:
        out.setdefault(message.name.lower(), set()).add(message.sender)
        if message.struct:
            walk(message.struct, message.sender, set())
    try:
        spec._kind_senders = out
    except AttributeError:  # a frozen spec: compute again next time
        pass
    return out


def in_role(role: str, operation: str, kind: str, spec: Any) -> bool:
    """Whether a codec of ``role`` performs ``operation`` (``encode``/``decode``) on ``kind``."""
    if role == "both":
        return True
    senders = kind_senders(spec).get(kind)
    if not senders:
        return True
    if operation == "encode":
        return role in senders
    return senders != {role}


# --- the codec guard ---------------------------------------------------------------------


class GuardedCodec:
    """The target's codec as a check sees it (see the module doc); everything else passes
    through to the codec unchanged."""

    def __init__(self, codec: Any, evidence: Evidence, spec: Any) -> None:
        role = getattr(codec, "role", "both")
        if role not in CODEC_ROLES:
            raise ValueError(f"codec.role must be one of {CODEC_ROLES}, not {role!r}")
        self._codec = codec
        self._evidence = evidence
        self._spec = spec
        self._role = role
        self._unsupported = frozenset(getattr(codec, "unsupported", ()) or ())

    @property
    def inner(self) -> Any:
        """The target's own codec object."""
        return self._codec

    @property
    def run_spec(self) -> Any:
        """The spec the run checks against (the release of ``--version``)."""
        return self._spec

    def _admit(self, operation: str, kind: str) -> None:
        what = f"{operation}:{kind}"
        if what in self._unsupported or f"{operation}:*" in self._unsupported:
            self._evidence.missing(f"{what} (declared unsupported)")
            raise Unsupported(f"the codec declares {what} unsupported")
        if not in_role(self._role, operation, kind, self._spec):
            self._evidence.out_of_role(f"{what} (role {self._role})")
            raise OutsideRole(f"{what} lies outside the codec's role {self._role!r}")

    def _call(self, operation: str, kind: str, func: Callable[[], Any]) -> Any:
        self._admit(operation, kind)
        self._evidence.called()
        try:
            return func()
        except NotImplementedError as exc:
            self._evidence.missing(f"{operation}:{kind} ({type(exc).__name__}: {exc})")
            raise

    def encode(self, kind: str, value: Any) -> Any:
        if self._spec.version != REFERENCE_VLLM_VERSION:
            # A check written for the newest layout may set a field an older release lacks:
            # filler (nil, the default) is dropped; a value means the check does not apply to
            # the release (NOT APPLICABLE), and the target is not asked.
            value = in_release(value, kind, self._spec)
        return self._call("encode", kind, lambda: self._codec.encode(kind, value))

    def decode(self, kind: str, frames: Any) -> Any:
        return self._call("decode", kind, lambda: self._codec.decode(kind, frames))

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._codec, name)
        if name in ("with_threshold", "with_insecure_serialization") and callable(found):
            def derived(*args: Any, **kwargs: Any) -> GuardedCodec:
                self._evidence.called()
                try:
                    inner = found(*args, **kwargs)
                except NotImplementedError as exc:
                    self._evidence.missing(f"{name} ({type(exc).__name__}: {exc})")
                    raise
                return GuardedCodec(inner, self._evidence, self._spec)
            return derived
        return found
