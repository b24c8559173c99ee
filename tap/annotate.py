"""Decoding and checking one message the tap saw (sans-IO), and its readable and JSON forms.

:class:`Annotator` decodes each :class:`~.capture.Record` with the reference codec of one
release (:func:`.releases.codec_for`): the codec checks the frame layout, the payload against
the release's types and the value rules, and raises a
:class:`~enginewire.reference.errors.ProtocolError` naming the clause a message breaks. The
annotator turns that into a :class:`Violation` (clause, path inside the payload, the field the
spec has at that path, the message) and asks :func:`.releases.explain` which other releases'
layouts would decode the frames. It never raises for a bad message: a tap shows everything.

:func:`line` prints an :class:`Annotation` as one readable line (violations on indented lines
below it); :func:`to_json` gives the JSON-lines form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from enginewire.reference.codec import Codec, path_steps
from enginewire.reference.errors import ProtocolError
from enginewire.reference.session import get_field
from enginewire.spec.schema import StructSpec
from enginewire.spec.types import TypeExpr, kind_of, parse_type

from .capture import Record
from .releases import DEFAULT_RELEASE, codec_for, explain, known_releases

#: The "clause" of a message the chosen release has no layout for (a kind or struct added in a
#: later release): not a spec clause, the release is the wrong one to read it with.
NOT_IN_RELEASE = "not-in-release"


@dataclass(frozen=True)
class Violation:
    """A clause one message breaks."""

    clause: str
    path: str | None
    field: str | None
    message: str
    #: Releases whose layouts decode the same frames (the skew's other half).
    explained_by: tuple[str, ...] = ()
    #: For each of those releases, the field it has at ``path`` (None: none there).
    explained_fields: tuple[str | None, ...] = ()


@dataclass
class Annotation:
    """What the tap knows about one message."""

    record: Record
    release: str
    kind: str | None = None
    rank: int | None = None
    request_ids: list[str] = field(default_factory=list)
    tokens: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    value: Any = None

    @property
    def ok(self) -> bool:
        return not self.violations


def _identity_rank(codec: Codec, identity: bytes | None) -> tuple[int | None, Violation | None]:
    if identity is None:
        return None, None
    try:
        return codec.decode_identity(identity), None
    except ProtocolError as exc:
        return None, Violation(exc.clause, None, None, str(exc))


def field_at(codec: Codec, payload: str, steps: list[str | int]) -> str | None:
    """``Struct.field (position N)`` of the last struct field on ``steps`` inside a payload of
    type ``payload``, as the codec's release lays it out; None where the path leaves the
    spec's structs."""
    expr: TypeExpr = parse_type(payload)
    named: str | None = None
    for step in steps:
        resolved = expr.without_none()
        if kind_of(resolved) == "union":
            return named
        item = codec.spec.structs.get(resolved.name)
        if isinstance(item, StructSpec):
            if isinstance(step, int) and item.encoding in ("array", "tuple"):
                if step >= len(item.fields):
                    return f"{item.name}[{step}] (past its {len(item.fields)} fields)"
                fld = item.fields[step]
                named = f"{item.name}.{fld.name} (position {step})"
            elif isinstance(step, str):
                matches = [f for f in item.fields if f.name == step]
                if not matches:
                    return named
                fld = matches[0]
                named = f"{item.name}.{fld.name}"
            else:
                return named
            expr = parse_type(fld.type)
        elif isinstance(step, int) and resolved.args:
            if kind_of(resolved) == "sequence" and not resolved.fixed_tuple:
                expr = resolved.args[0]
            elif step < len(resolved.args):
                expr = resolved.args[step]
            else:
                return named
        elif step == "..." and kind_of(resolved) == "mapping":
            expr = resolved.args[1]
        else:
            return named
    return named


def _summarise(annotation: Annotation, kind: str, value: Any) -> None:
    details = annotation.details
    if kind == "add":
        annotation.request_ids = [get_field(value, "request_id")]
        prompt = get_field(value, "prompt_token_ids")
        annotation.tokens = len(prompt) if prompt is not None else None
        params = get_field(value, "sampling_params")
        if params is not None:
            details["max_tokens"] = get_field(params, "max_tokens")
    elif kind == "abort":
        annotation.request_ids = [str(r) for r in value]
    elif kind == "utility":
        details.update(client_index=value[0], call_id=value[1], method=value[2])
    elif kind in ("outputs", "utility_reply"):
        details["engine_index"] = get_field(value, "engine_index")
        outputs = get_field(value, "outputs") or ()
        annotation.request_ids = [get_field(o, "request_id") for o in outputs]
        annotation.tokens = sum(len(get_field(o, "new_token_ids") or ()) for o in outputs)
        finished = [get_field(o, "request_id") for o in outputs
                    if get_field(o, "finish_reason") is not None]
        if finished:
            details["finished"] = finished
        if get_field(value, "finished_requests"):
            details["finished_requests"] = sorted(get_field(value, "finished_requests"))
        utility = get_field(value, "utility_output")
        if utility is not None:
            details["call_id"] = get_field(utility, "call_id")
            if get_field(utility, "failure_message") is not None:
                details["failure"] = get_field(utility, "failure_message")
    elif kind == "init":
        addresses = get_field(value, "addresses")
        details["inputs"] = list(get_field(addresses, "inputs"))
        details["outputs"] = list(get_field(addresses, "outputs"))
    elif kind in ("hello", "ready") and isinstance(value, dict):
        details.update({k: v for k, v in value.items() if isinstance(v, str | int | bool)})
    elif kind == "ready_response" and value is not None:
        details["vllm_version"] = get_field(value, "vllm_version")
        details["max_model_len"] = get_field(value, "max_model_len")


#: ``--version auto``: follow the release an engine's ready response names.
AUTO = "auto"


class Annotator:
    """Decodes and checks messages with the layouts of ``release``.

    With ``release="auto"`` it starts with the reference release and, from the first ready
    response whose ``vllm_version`` is a release the spec knows, decodes with that release's
    layouts (the ready response itself is read with the release before it).
    """

    def __init__(self, release: str | None = None, *, explain_skew: bool = True) -> None:
        self.auto = release == AUTO
        self.release = DEFAULT_RELEASE if self.auto or not release else release
        self.codec = codec_for(self.release)
        self.explain_skew = explain_skew
        self._explained: dict[tuple[Any, ...], tuple[tuple[str, ...],
                                                     tuple[str | None, ...]]] = {}

    def _follow(self, annotation: Annotation) -> None:
        version = annotation.details.get("vllm_version")
        if (self.auto and annotation.kind == "ready_response" and isinstance(version, str)
                and version != self.release and version in known_releases()):
            self.release, self.codec = version, codec_for(version)
            annotation.details["decoding_as"] = version

    def annotate(self, record: Record) -> Annotation:
        annotation = Annotation(record, self.release)
        annotation.rank, bad_identity = _identity_rank(self.codec, record.identity)
        if bad_identity is not None:
            annotation.violations.append(bad_identity)
        try:
            message = self.codec.decode_message(record.channel, record.frames,
                                                sender=record.sender)
        except KeyError as exc:
            annotation.violations.append(
                Violation("frames.frame-count", None, None, str(exc.args[0]))
            )
            return annotation
        except ProtocolError as exc:
            annotation.violations.append(self._violation(record, exc))
            return annotation
        except Exception as exc:  # the release's spec cannot describe this message at all
            annotation.violations.append(Violation(
                NOT_IN_RELEASE, None, None,
                f"release {self.release} cannot decode a {record.channel} message from the "
                f"{record.sender}: {exc}"))
            return annotation
        annotation.kind, annotation.value = message.kind, message.value
        _summarise(annotation, message.kind, message.value)
        self._follow(annotation)
        return annotation

    def _violation(self, record: Record, exc: ProtocolError) -> Violation:
        steps = path_steps(exc.path) if exc.path else None
        path = None
        named = None
        if steps:
            path = "$" + "".join(f"[{s}]" if isinstance(s, int) or s == "..." else f".{s}"
                                 for s in steps)
            payload = self._payload_type(record)
            if payload is not None:
                named = field_at(self.codec, payload, steps)
        explained: tuple[str, ...] = ()
        fields: tuple[str | None, ...] = ()
        if self.explain_skew:
            # Asked once per (channel, sender, clause, path, release): a skewed peer breaks
            # the same clause at the same place in every message, and asking every release
            # costs a decode each.
            key = (record.channel, record.sender, exc.clause, path, self.release)
            cached = self._explained.get(key)
            if cached is None:
                explained = tuple(explain(record.channel, record.frames, record.sender,
                                          self.release))
                payload = self._payload_type(record)
                fields = tuple(
                    field_at(codec_for(r), payload, steps) if steps and payload else None
                    for r in explained)
                self._explained[key] = (explained, fields)
            else:
                explained, fields = cached
        return Violation(exc.clause, path, named, exc.message, explained, fields)

    def _payload_type(self, record: Record) -> str | None:
        """The payload type of the kind the record's fixed frames name (the only kind of its
        channel and sender, or the one whose prefix matches)."""
        layouts = [self.codec.layout(k) for k in self.codec.message_kinds]
        layouts = [lay for lay in layouts
                   if lay.channel == record.channel and lay.sender == record.sender]
        for layout in sorted(layouts, key=lambda lay: -len(lay.prefix)):
            if tuple(record.frames[: len(layout.prefix)]) == layout.prefix:
                return layout.payload
        return None


# --- output forms ---------------------------------------------------------------------------

def _arrow(record: Record) -> str:
    if record.channel.startswith("coordinator"):
        return "E->C" if record.sender == "engine" else "C->E"
    return {"frontend": "F->E", "engine": "E->F"}.get(record.sender, record.sender)


def line(annotation: Annotation) -> str:
    """One readable line (and one indented line per violation)."""
    record = annotation.record
    parts = [
        f"{record.t_ns / 1e9:10.6f}",
        f"{record.channel:<9}",
        _arrow(record),
        f"id={annotation.rank if annotation.rank is not None else '-'}",
        annotation.kind or "?",
    ]
    if annotation.request_ids:
        shown = annotation.request_ids[:4]
        more = len(annotation.request_ids) - len(shown)
        parts.append("req=" + ",".join(str(r) for r in shown) + (f",+{more}" if more else ""))
    if annotation.tokens is not None:
        parts.append(f"tokens={annotation.tokens}")
    for key, val in annotation.details.items():
        parts.append(f"{key}={val}")
    parts.append(f"frames={len(record.frames)} bytes={record.size}")
    out = " ".join(parts)
    for violation in annotation.violations:
        out += f"\n    !! [{violation.clause}]"
        if violation.path:
            out += f" at {violation.path}"
        if violation.field:
            out += f" ({violation.field})"
        out += f": {violation.message}"
        for releases, named in _explanations(violation):
            out += f"\n       explained by release {releases} (told {annotation.release})"
            if named:
                out += f": {named} there"
    return out


def _explanations(violation: Violation) -> list[tuple[str, str | None]]:
    """The explaining releases grouped by the field they have at the path, each group as
    ranges of consecutive known releases (``0.16.0-0.19.1``)."""
    known = list(known_releases())
    groups: dict[str | None, list[str]] = {}
    for release, named in zip(violation.explained_by, violation.explained_fields
                              or (None,) * len(violation.explained_by), strict=True):
        groups.setdefault(named, []).append(release)
    found = []
    for named, releases in groups.items():
        spans: list[list[str]] = []
        for release in releases:
            if spans and release in known and spans[-1][-1] in known and \
                    known.index(release) == known.index(spans[-1][-1]) + 1:
                spans[-1].append(release)
            else:
                spans.append([release])
        text = ", ".join(s[0] if len(s) == 1 else f"{s[0]}-{s[-1]}" for s in spans)
        found.append((text, named))
    return found


def to_json(annotation: Annotation) -> str:
    """The JSON-lines form of one annotation."""
    record = annotation.record
    return json.dumps({
        "t": record.t_ns / 1e9,
        "channel": record.channel,
        "sender": record.sender,
        "identity": record.identity.hex() if record.identity is not None else None,
        "rank": annotation.rank,
        "release": annotation.release,
        "kind": annotation.kind,
        "request_ids": annotation.request_ids,
        "tokens": annotation.tokens,
        "details": annotation.details,
        "frame_sizes": [len(f) for f in record.frames],
        "violations": [
            {"clause": v.clause, "path": v.path, "field": v.field, "message": v.message,
             "explained_by": list(v.explained_by),
             "explained_fields": list(v.explained_fields)}
            for v in annotation.violations
        ],
    }, default=str)
