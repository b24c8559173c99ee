"""Differential encoder fuzzing: a target's ``codec.encode`` against the spec oracle's encoding.

Hypothesis draws valid values of every kind from the spec (:func:`enginewire.fuzz.strategies.
messages`); the target encodes each (as the neutral value of the target contract) and so does
the oracle: the frames of ``frames.toml`` around the msgpack of
:func:`~enginewire.conformance.oracle.wire.expected_wire`, which msgspec writes the way vLLM
does (smallest integer forms, float64, struct fields in declaration order). The two must be
the same bytes, frame by frame. Where the spec leaves a choice open the oracle takes the
target's: a default that an ``omit_defaults`` map may leave out but the target writes, holding
exactly the default (``structs.map.omit-defaults``, a MAY), and the order of a set's elements
(``structs.set.array``).

A difference is a finding (:class:`~enginewire.fuzz.campaigns.Finding`, surface ``encoder``)
that names the kind, the struct and field, the ``$``-path of the first byte that differs, what
the oracle wrote and what the target wrote there, and the clause: ``structs.float.float64``
for a float not written as float64, ``tensors.*`` inside a tensor, ``request_types.byte-table``
for a type byte, ``frames.oob-count-matches`` for the frame count, else the clause of the
enclosing struct's encoding (``structs.array.field-order``, ``structs.map.keyed-by-field-
name``, ...). Besides the bytes, the oracle decodes the target's frames
(:func:`~enginewire.conformance.oracle.wire.from_wire`) and compares the result with the value
sent (problem ``misread``): an encoding that differs only where a decoder cannot tell is found
by the bytes, one that changes the value by both.

A decode-only fuzz campaign (:mod:`enginewire.fuzz.campaigns`) never calls ``encode``, so an
encoder that writes float32, orders map keys differently or drops a trailing field is visible
only here (and to the golden vectors and conformance checks that happen to cover it).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from enginewire.conformance.oracle.values import complete, differences, neutral
from enginewire.conformance.oracle.wire import (
    THRESHOLD_DEFAULT,
    OmittableMap,
    WireSet,
    compare_wire,
    expected_wire,
    from_wire,
    raw_decode,
)
from enginewire.fuzz.campaigns import Finding, Report
from enginewire.fuzz.strategies import messages
from enginewire.reference.codec import default_codec
from enginewire.spec import load
from enginewire.spec.schema import StructSpec
from enginewire.spec.types import TypeExpr, kind_of, members, parse_type

#: The fuzz kinds of a differential campaign by default: every message kind a codec encodes.
_QUIET = list(HealthCheck)


# --- the oracle's frames ---------------------------------------------------------------------


@dataclass
class OracleFrames:
    """What the oracle encodes for one value: the frames, the payload's type and wire form."""

    frames: list[bytes]
    payload_type: str | None
    #: Index of the msgpack payload frame (None for literal-only messages).
    payload_index: int | None
    wire: Any


def oracle_frames(kind: str, value: Any, spec: Any = None, *,
                  threshold: int = THRESHOLD_DEFAULT) -> OracleFrames:
    """The frames the spec prescribes for ``value`` (neutral) as a message ``kind`` (or the
    payload of a struct ``kind``: ``[msgpack, oob...]``)."""
    spec = spec or load()
    codec = default_codec()
    if kind in codec.message_kinds:
        layout = codec.layout(kind)
        prefix, payload_type = list(layout.prefix), layout.payload
    else:
        prefix, payload_type = [], kind
    if payload_type is None:
        return OracleFrames(prefix, None, None, None)
    if value is None and kind == "ready_response":
        return OracleFrames([*prefix, b""], payload_type, len(prefix), None)
    form = expected_wire(value, payload_type, spec, threshold=threshold)
    frames = [*prefix, encode_wire(form.value), *form.oob]
    return OracleFrames(frames, payload_type, len(prefix), form.value)


def plain(wire: Any) -> Any:
    """The oracle's wire form as builtins msgspec encodes (its marker classes dropped)."""
    if isinstance(wire, Mapping):
        return {k: plain(v) for k, v in wire.items()}
    if isinstance(wire, list):
        return [plain(v) for v in wire]
    return wire


#: msgspec writes the map header of an ``omit_defaults`` struct before it knows how many
#: fields it leaves out, sized for every field: a struct of 16 fields or more gets a map16
#: header (``de 0000`` for an empty one, as vLLM sends a default SamplingParams), a smaller
#: one a fixmap.
_FIXMAP_FIELDS = 16


def encode_wire(wire: Any) -> bytes:
    """The bytes msgspec (so vLLM) writes for the oracle's wire form ``wire``: the smallest
    form of every value and header, except the map header of an omit_defaults struct
    (:data:`_FIXMAP_FIELDS`)."""
    if isinstance(wire, Mapping):
        count = len(wire)
        if isinstance(wire, OmittableMap) and len(wire.order) >= _FIXMAP_FIELDS and count < 2**16:
            head = b"\xde" + count.to_bytes(2, "big")
        else:
            head = _header(count, 0x80, b"\xde", b"\xdf")
        return head + b"".join(encode_wire(k) + encode_wire(v) for k, v in wire.items())
    if isinstance(wire, list):
        return _header(len(wire), 0x90, b"\xdc", b"\xdd") + b"".join(map(encode_wire, wire))
    return msgspec.msgpack.encode(wire)


def _header(count: int, fix: int, sixteen: bytes, thirty_two: bytes) -> bytes:
    if count < 16:
        return bytes((fix | count,))
    if count < 2**16:
        return sixteen + count.to_bytes(2, "big")
    return thirty_two + count.to_bytes(4, "big")


def aligned(expected: Any, actual: Any) -> Any:
    """``expected`` with the choices the spec leaves to the encoder taken as in ``actual``:
    a default an omit_defaults map left out is put back (in declaration order) where
    ``actual`` holds exactly that default, and a set takes ``actual``'s order when it holds
    the same elements."""
    if isinstance(expected, OmittableMap) and isinstance(actual, Mapping):
        out = OmittableMap()
        out.order = expected.order
        for key in expected.order:
            if key in expected:
                out[key] = aligned(expected[key], actual.get(key))
            elif key in expected.omitted and key in actual and not compare_wire(
                    expected.omitted[key], actual[key]):
                out[key] = actual[key]
        return out
    if isinstance(expected, WireSet) and isinstance(actual, list):
        if sorted(map(_packed, expected)) == sorted(map(_packed, actual)):
            return list(actual)
        return list(expected)
    if isinstance(expected, OmittableMap):
        return expected
    if isinstance(expected, Mapping):
        other = actual if isinstance(actual, Mapping) else {}
        return {k: aligned(v, other.get(k)) for k, v in expected.items()}
    if isinstance(expected, list):
        other_list = actual if isinstance(actual, list) else []
        return [aligned(v, other_list[i] if i < len(other_list) else None)
                for i, v in enumerate(expected)]
    return expected


def _packed(value: Any) -> bytes:
    return encode_wire(value)


# --- the first byte that differs ---------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    """One msgpack token: a scalar, or the header of an array or map (``kind`` says which);
    ``path`` is the position of the value it starts (``$.field[2]``)."""

    path: str
    kind: str
    raw: bytes


def msgpack_tokens(data: bytes) -> list[Token]:
    """``data`` (one msgpack object) as tokens in order, each with its ``$``-path; map keys
    are tokens of kind ``key`` at the map's path. Raises ValueError on bytes that are not
    msgpack."""
    out: list[Token] = []
    end = _walk(memoryview(data), 0, "$", out)
    if end != len(data):
        raise ValueError(f"{len(data) - end} byte(s) after the msgpack object")
    return out


_FIXED = {0xc0: ("nil", 0), 0xc2: ("bool", 0), 0xc3: ("bool", 0), 0xca: ("float32", 4),
          0xcb: ("float64", 8), 0xcc: ("uint8", 1), 0xcd: ("uint16", 2), 0xce: ("uint32", 4),
          0xcf: ("uint64", 8), 0xd0: ("int8", 1), 0xd1: ("int16", 2), 0xd2: ("int32", 4),
          0xd3: ("int64", 8), 0xd4: ("fixext1", 2), 0xd5: ("fixext2", 3),
          0xd6: ("fixext4", 5), 0xd7: ("fixext8", 9), 0xd8: ("fixext16", 17)}
_SIZED = {0xc4: ("bin", 1), 0xc5: ("bin", 2), 0xc6: ("bin", 4), 0xd9: ("str", 1),
          0xda: ("str", 2), 0xdb: ("str", 4), 0xc7: ("ext", 1), 0xc8: ("ext", 2),
          0xc9: ("ext", 4)}


def _walk(data: memoryview, pos: int, path: str, out: list[Token]) -> int:
    if pos >= len(data):
        raise ValueError(f"msgpack ends early at byte {pos}")
    head = data[pos]
    count = None
    if head <= 0x7f or head >= 0xe0:
        out.append(Token(path, "int", bytes(data[pos:pos + 1])))
        return pos + 1
    if 0xa0 <= head <= 0xbf:
        end = pos + 1 + (head & 0x1f)
        out.append(Token(path, "str", bytes(data[pos:end])))
        return end
    if 0x90 <= head <= 0x9f:
        kind, count, start = "array", head & 0x0f, pos + 1
    elif 0x80 <= head <= 0x8f:
        kind, count, start = "map", head & 0x0f, pos + 1
    elif head in (0xdc, 0xdd, 0xde, 0xdf):
        width = 2 if head in (0xdc, 0xde) else 4
        kind = "array" if head in (0xdc, 0xdd) else "map"
        count, start = int.from_bytes(data[pos + 1:pos + 1 + width], "big"), pos + 1 + width
    elif head in _FIXED:
        kind, size = _FIXED[head]
        end = pos + 1 + size
        out.append(Token(path, kind, bytes(data[pos:end])))
        return end
    elif head in _SIZED:
        kind, width = _SIZED[head]
        length = int.from_bytes(data[pos + 1:pos + 1 + width], "big")
        end = pos + 1 + width + (1 if kind == "ext" else 0) + length
        out.append(Token(path, kind, bytes(data[pos:end])))
        return end
    else:
        raise ValueError(f"byte {pos}: 0x{head:02x} is not a msgpack type")
    out.append(Token(path, kind, bytes(data[pos:start])))
    pos = start
    for index in range(count):
        if kind == "array":
            pos = _walk(data, pos, f"{path}[{index}]", out)
            continue
        keys: list[Token] = []
        key_end = _walk(data, pos, path, keys)
        key = keys[0]
        try:
            name = msgspec.msgpack.decode(key.raw) if len(keys) == 1 else None
        except msgspec.DecodeError:
            name = None
        out.append(Token(path, "key", bytes(data[pos:key_end])))
        pos = _walk(data, key_end, f"{path}.{name}" if isinstance(name, str)
                    else f"{path}[{name!r}]", out)
    return pos


def describe_token(token: Token) -> str:
    if token.kind in ("float32", "float64"):
        (number,) = struct.unpack(">f" if token.kind == "float32" else ">d", token.raw[1:])
        return f"{token.kind} {number!r} ({token.raw.hex()})"
    if token.kind == "key":
        return f"key {msgspec.msgpack.decode(token.raw)!r}"
    if token.kind in ("array", "map"):
        return f"{token.kind} header {token.raw.hex()}"
    text = token.raw.hex()
    return f"{token.kind} {text[:40]}{'...' if len(text) > 40 else ''}"


def first_difference(expected: bytes, actual: bytes) -> tuple[Token | None, Token | None]:
    """The first token where ``actual`` differs from ``expected`` (None past an end)."""
    want, got = msgpack_tokens(expected), msgpack_tokens(actual)
    for index in range(max(len(want), len(got))):
        a = want[index] if index < len(want) else None
        b = got[index] if index < len(got) else None
        if a != b:
            return a, b
    return None, None


# --- where a path lies in the spec ------------------------------------------------------------


def struct_at(type_text: str, path: str, spec: Any) -> tuple[StructSpec | None, str | None,
                                                              TypeExpr | None]:
    """The innermost struct (and its field) that the ``$``-path runs through inside a value
    of ``type_text``, with the type at the path's end (None where the path leaves the
    types)."""
    from enginewire.reference.codec import path_steps

    steps = path_steps(path) or []
    expr: TypeExpr | None = parse_type(type_text)
    found: tuple[StructSpec | None, str | None] = (None, None)
    for step in steps:
        resolved = _resolve(expr, step, spec)
        if resolved is None:
            expr = None
            break
        item, fld, expr = resolved
        if item is not None:
            found = (item, fld)
    return found[0], found[1], expr


def _resolve(expr: TypeExpr | None, step: str | int,
             spec: Any) -> tuple[StructSpec | None, str | None, TypeExpr] | None:
    if expr is None:
        return None
    for member in members(expr):
        kind = kind_of(member, spec.structs)
        if kind == "struct":
            item = spec.structs[member.name]
            fields = item.fields
            if isinstance(step, int) and item.encoding in ("array", "tuple") and step < len(fields):
                return item, fields[step].name, parse_type(fields[step].type)
            if isinstance(step, str):
                for fld in fields:
                    if fld.name == step:
                        return item, fld.name, parse_type(fld.type)
        elif kind in ("sequence", "mapping") and member.args:
            inner = member.args[-1] if not member.fixed_tuple else (
                member.args[step] if isinstance(step, int) and step < len(member.args) else None)
            if inner is not None:
                return None, None, inner
    return None


_ENCODING_CLAUSE = {"array": "structs.array.field-order", "map": "structs.map.keyed-by-field-name",
                    "dataclass": "structs.dataclass.all-fields", "tuple": "structs.tuple.array"}


def clause_of(item: StructSpec | None, at: TypeExpr | None, want: Token | None,
              got: Token | None, spec: Any) -> str:
    """The clause a byte difference at one position breaks (see the module docstring):
    ``item`` is the struct the path runs through, ``at`` the type at the path's end."""
    if want is not None and want.kind == "float64" and (got is None or got.kind != "float64"):
        return "structs.float.float64"
    kinds = {kind_of(m, spec.structs): m for m in members(at)} if at is not None else {}
    if "tensor" in kinds or "ndarray" in kinds or (
            want is not None and got is not None and "ext" in want.kind + got.kind):
        return "tensors.data-form"
    if "enum" in kinds:
        return "structs.enum.value"
    headers = want is not None and got is not None and {want.kind, got.kind} <= {"array", "map"}
    if "struct" in kinds and headers and want is not None and got is not None:
        item = spec.structs[kinds["struct"].name]
        if item.encoding in ("array", "tuple") and want.kind == got.kind == "array":
            return ("structs.array.append-only" if _count(got.raw) > _count(want.raw)
                    else "structs.array.every-field-written")
    if item is None:
        return "frames.payload-matches-type"
    return _ENCODING_CLAUSE.get(item.encoding, "frames.payload-matches-type")


def _count(header: bytes) -> int:
    """The element count of an array or map header."""
    if len(header) == 1:
        return header[0] & 0x0F
    return int.from_bytes(header[1:], "big")


# --- one value -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """How a target's encoding of one value differs from the oracle's."""

    problem: str
    clause: str
    where: str
    message: str


def compare_encoding(encode: Callable[[str, Any], Sequence[Any]], kind: str, value: Any,
                     spec: Any = None, *, threshold: int = THRESHOLD_DEFAULT) -> Difference | None:
    """The first difference between ``encode(kind, value)`` and the oracle's frames, None
    when they are the same bytes. A difference is ``misread`` when the oracle reads the
    target's frames back as another value than the one sent, else ``encoding-differs``."""
    spec = spec or load()
    value = neutral(value, keep_tensors=True)
    oracle = oracle_frames(kind, value, spec, threshold=threshold)
    frames = [bytes(f) for f in encode(kind, value)]
    want_frames = list(oracle.frames)
    index = oracle.payload_index
    if index is not None and oracle.wire is not None and index < len(frames):
        try:
            actual = raw_decode(frames[index])
        except Exception:  # noqa: BLE001 - reported below as a byte difference
            actual = None
        want_frames[index] = encode_wire(aligned(oracle.wire, actual))
    found = _byte_difference(kind, oracle, want_frames, frames, spec)
    if found is None:
        return None
    clause, where, message = found
    misread = ("a receiver reads another request type" if clause == "request_types.byte-table"
               else _misread(value, oracle, want_frames, frames, spec))
    if misread is None:
        return Difference("encoding-differs", clause, where,
                          message + "; the oracle reads the target's frames as the same value")
    return Difference("misread", clause, where,
                      message + f"; the oracle reads the target's frames as another value: "
                      f"{misread}")


def _byte_difference(kind: str, oracle: OracleFrames, want_frames: list[bytes],
                     frames: list[bytes], spec: Any) -> tuple[str, str, str] | None:
    """(clause, where, what) of the first frame and token that differ."""
    index = oracle.payload_index
    for position, (want, got) in enumerate(zip(want_frames, frames, strict=False)):
        if want == got:
            continue
        if position != index or oracle.payload_type is None:
            clause = ("request_types.byte-table" if index is not None and position < index
                      else "frames.oob-count-matches" if index is not None and position > index
                      else "frames.frame-count")
            return (clause, f"frame {position}", f"frame {position} is {got[:32].hex()}, the "
                    f"oracle's is {want[:32].hex()}")
        try:
            a, b = first_difference(want, got)
        except ValueError as exc:
            return ("frames.payload-msgpack-first", f"frame {position}",
                    f"frame {position} is not msgpack: {exc}")
        token = a if a is not None else b
        path = token.path if token is not None else "$"
        item, fld, at = struct_at(oracle.payload_type, path, spec)
        where = f"{item.name}.{fld}" if item is not None and fld is not None else kind
        return (clause_of(item, at, a, b, spec), f"{where} at {path}",
                f"frame {position} at {path} ({where}): the oracle writes "
                f"{describe_token(a) if a else 'nothing'}, the target "
                f"{describe_token(b) if b else 'nothing'}")
    if len(frames) != len(want_frames):
        return ("frames.oob-count-matches", "frame count",
                f"{len(frames)} frames, the oracle's message has {len(want_frames)}")
    return None


def _misread(value: Any, oracle: OracleFrames, want_frames: list[bytes], frames: list[bytes],
             spec: Any) -> str | None:
    """The first way the oracle reads the target's frames back as another value than
    ``value``; None when it reads the same value, or cannot judge (it does not read its own
    frames back as ``value`` either)."""
    index, payload_type = oracle.payload_index, oracle.payload_type
    if index is None or payload_type is None or oracle.wire is None:
        return None

    def read(source: list[bytes]) -> list[str]:
        back = from_wire(raw_decode(source[index]), payload_type, spec, source[index + 1:])
        return differences(sent, back)

    try:
        sent = complete(neutral(value), payload_type, spec)
        if read(want_frames):
            return None
    except Exception:  # noqa: BLE001 - the oracle cannot read its own frames: no verdict
        return None
    try:
        found = read(frames)
    except Exception as exc:  # noqa: BLE001 - unreadable as the spec's type
        return f"unreadable as {payload_type}: {exc}"
    return found[0] if found else None


# --- the campaign ---------------------------------------------------------------------------------


@dataclass
class EncoderCampaign:
    """Settings of one differential campaign (see :func:`fuzz_encoder`)."""

    max_examples: int = 100
    seed: int | None = None
    threshold: int = THRESHOLD_DEFAULT
    progress: Callable[[str], None] | None = None


def encoder_kinds(codec: Any) -> list[str]:
    """The message kinds ``codec`` encodes (its ``role`` and ``unsupported`` honoured)."""
    from enginewire.conformance.targets.contract import CODEC_ROLES

    role = getattr(codec, "role", "both")
    unsupported = set(getattr(codec, "unsupported", ()) or ())
    if "encode:*" in unsupported:
        return []
    kinds = []
    for kind in default_codec().message_kinds:
        sender = default_codec().layout(kind).sender
        if role != "both" and role in CODEC_ROLES and sender != role:
            continue
        if f"encode:{kind}" not in unsupported:
            kinds.append(kind)
    return kinds


def fuzz_encoder(encode: Callable[[str, Any], Sequence[Any]], kind_names: Iterable[str],
                 campaign: EncoderCampaign) -> Report:
    """Compare ``encode(kind, value)`` with the oracle on drawn values of every kind; one
    finding per kind, problem and clause (the smallest value's frames kept)."""
    spec = load()
    report = Report()
    for kind in kind_names:
        found: dict[tuple[str, str], Finding] = {}
        counts = {"cases": 0}
        refused: list[str] = []
        check = _checker(encode, kind, spec, campaign, found, counts, refused)
        explore = settings(max_examples=campaign.max_examples, deadline=None, database=None,
                           suppress_health_check=_QUIET, phases=[Phase.generate])(
            given(messages(kind))(check))
        if campaign.seed is not None:
            explore = hypothesis_seed(campaign.seed)(explore)
        explore()
        report.cases += counts["cases"]
        if refused and not found:
            report.notes.append(f"{kind}: the target does not encode it ({refused[0]})")
        report.findings.extend(found.values())
        if campaign.progress:
            campaign.progress(f"{kind}: {counts['cases']} values, {len(found)} findings")
    return report


def _checker(encode: Callable[[str, Any], Sequence[Any]], kind: str, spec: Any,
             campaign: EncoderCampaign, found: dict[tuple[str, str], Finding],
             counts: dict[str, int], refused: list[str]) -> Callable[[Any], None]:
    """The body of one kind's Hypothesis test: compare, and record a new finding."""

    def check(value: Any) -> None:
        counts["cases"] += 1
        try:
            difference = compare_encoding(encode, kind, value, spec,
                                          threshold=campaign.threshold)
        except NotImplementedError as exc:
            refused.append(f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a valid value refused is a finding
            difference = Difference("refused", "frames.payload-matches-type", kind,
                                    f"encode raised {type(exc).__name__}: {exc}"[:300])
        if difference is None:
            return
        key = (difference.problem, difference.clause)
        current = found.get(key)
        if current is not None:
            current.hits += 1
            return
        frames: tuple[bytes, ...] = ()
        try:
            frames = tuple(bytes(f) for f in encode(kind, neutral(value, keep_tensors=True)))
        except Exception:  # noqa: BLE001 - the refusal is the finding
            pass
        found[key] = Finding(
            surface="encoder", kind=kind, problem=difference.problem, mutation="differential",
            expected=(difference.clause,), got=difference.where, message=difference.message,
            frames=[frames], description=f"valid value {repr(value)[:160]}")

    return check
