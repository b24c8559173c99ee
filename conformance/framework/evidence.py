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
one with :func:`note_not_implemented`.
See ``targets.contract`` ("Rejections are evidence only...", "Roles").
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from enginewire.conformance.targets.contract import CODEC_ROLES, OutsideRole, Unsupported


@dataclass
class Evidence:
    """The target's calls, missing operations and out-of-role operations in one check."""

    calls: int = 0
    not_implemented: list[str] = field(default_factory=list)
    outside_role: list[str] = field(default_factory=list)
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


def not_implemented_cause(exc: BaseException | None) -> BaseException | None:
    """The first ``NotImplementedError`` in ``exc``'s cause/context chain, or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


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
