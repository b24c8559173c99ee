"""The capture file format (sans-IO): what ``enginewire tap --record`` writes and ``--read`` reads.

A capture file is a sequence of records, each a 4-byte big-endian unsigned length followed by
that many bytes of msgpack. The first record is the header, a map::

    {"format": "enginewire-tap", "format_version": 1, "release": "0.33.0",
     "started": <unix time, float seconds>}

Every later record is one message, an array::

    [t_ns, channel, sender, identity, frames]

- ``t_ns``: nanoseconds since ``started`` (monotonic clock) when the tap's capture read the
  message's copy, after forwarding it (copies are read in batches), int;
- ``channel``: ``handshake``, ``input``, ``output`` or a coordinator channel (the spec's
  names);
- ``sender``: ``frontend``, ``engine`` or ``coordinator`` (the DP coordinator);
- ``identity``: the routing identity of the engine at the ROUTER end (bin), or nil where the
  channel has none (output);
- ``frames``: array of bin, the message as the sending socket wrote it, without the routing
  identity (exactly what :meth:`Codec.decode_message` takes). On the handshake channel, the
  init message is recorded as the front end sent it (before the tap rewrote its addresses).

A reader rejects a file whose header names another format or a newer ``format_version``. A
file cut short (the tap killed mid-write) ends at the last whole record.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec

FORMAT = "enginewire-tap"
FORMAT_VERSION = 1
_LENGTH = struct.Struct(">I")


class CaptureError(ValueError):
    """A capture file that is not one, or of a format version this reader does not know."""


@dataclass(frozen=True)
class Record:
    """One message seen by the tap."""

    t_ns: int
    channel: str
    sender: str
    identity: bytes | None
    frames: tuple[bytes, ...]

    @property
    def size(self) -> int:
        return sum(len(f) for f in self.frames)


@dataclass(frozen=True)
class Header:
    release: str
    started: float = field(default_factory=time.time)
    format_version: int = FORMAT_VERSION

    def to_map(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": self.format_version,
                "release": self.release, "started": self.started}


_encoder = msgspec.msgpack.Encoder()


def encode_record(record: Record) -> bytes:
    """One length-prefixed message record."""
    body = _encoder.encode(
        [record.t_ns, record.channel, record.sender, record.identity, list(record.frames)]
    )
    return _LENGTH.pack(len(body)) + body


def encode_header(header: Header) -> bytes:
    body = _encoder.encode(header.to_map())
    return _LENGTH.pack(len(body)) + body


def _bodies(data: bytes) -> Iterator[bytes]:
    pos = 0
    while pos + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, pos)
        end = pos + _LENGTH.size + length
        if end > len(data):
            return  # cut short: the last record was not written in full
        yield data[pos + _LENGTH.size:end]
        pos = end


def parse(data: bytes) -> tuple[Header, list[Record]]:
    """The header and records of a whole capture file's bytes."""
    bodies = _bodies(data)
    first = next(bodies, None)
    if first is None:
        raise CaptureError(f"expected a {FORMAT} header record, got {len(data)} bytes")
    try:
        head = msgspec.msgpack.decode(first)
    except msgspec.DecodeError as exc:
        raise CaptureError(f"the header record is not msgpack: {exc}") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise CaptureError(f"expected a header with format {FORMAT!r}, got {head!r}")
    version = head.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CaptureError(
            f"expected format_version <= {FORMAT_VERSION}, got {version!r}"
        )
    header = Header(str(head.get("release")), float(head.get("started", 0.0)), version)
    records: list[Record] = []
    for index, body in enumerate(bodies, start=1):
        try:
            t_ns, channel, sender, identity, frames = msgspec.msgpack.decode(body)
        except (msgspec.DecodeError, ValueError, TypeError) as exc:
            raise CaptureError(
                f"record {index}: expected [t_ns, channel, sender, identity, frames], {exc}"
            ) from None
        records.append(Record(int(t_ns), str(channel), str(sender),
                              None if identity is None else bytes(identity),
                              tuple(bytes(f) for f in frames)))
    return header, records


def read(path: str) -> tuple[Header, list[Record]]:
    """The header and records of the capture file at ``path``."""
    with open(path, "rb") as handle:
        return parse(handle.read())


class Writer:
    """Appends records to an open binary file; the header goes first."""

    def __init__(self, handle: IO[bytes], header: Header) -> None:
        self._handle = handle
        self.header = header
        handle.write(encode_header(header))

    def write(self, record: Record) -> None:
        self._handle.write(encode_record(record))

    def flush(self) -> None:
        self._handle.flush()
