"""Codec mutants: the reference codec (:class:`ReferenceCodec`) with one thing broken.

Each class overrides one step of encoding or decoding and says, in its docstring, which real
failure it models. They are conformance ``codec`` surfaces; the mutant catalogue
(:mod:`enginewire.fuzz.mutants`) wraps each in a target.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgspec

from enginewire.conformance.targets.reference import ReferenceCodec
from enginewire.spec import load

Ext = msgspec.msgpack.Ext

#: Frame index of the ``EngineCoreRequest`` msgpack body, by kind.
_REQUEST_BODY = {"add": 1, "EngineCoreRequest": 0}


def _raw(frame: Any) -> Any:
    """A msgpack frame as builtins, extension values kept as :class:`Ext`."""
    return msgspec.msgpack.decode(bytes(frame), ext_hook=lambda code, data: Ext(code, bytes(data)))


class InclusiveInlineThreshold(ReferenceCodec):
    """Keeps a tensor of exactly ``threshold`` bytes inline: ``<=`` where the spec says ``<``.

    The comparison of vLLM's ``MsgpackEncoder._encode_tensor``
    (``vllm/v1/serial_utils.py``) is strict; an inclusive one changes the frame count of every
    message with a tensor of exactly that size.
    """

    def __init__(self, threshold: int | None = None, insecure: bool = False) -> None:
        self.nominal = load().inline_threshold() if threshold is None else threshold
        super().__init__(self.nominal + 1, insecure)
        self.threshold = self.nominal

    def with_threshold(self, threshold: int) -> InclusiveInlineThreshold:
        return InclusiveInlineThreshold(threshold, self.insecure)

    def with_insecure_serialization(self) -> InclusiveInlineThreshold:
        return InclusiveInlineThreshold(self.nominal, insecure=True)


class SwappedTypeBytes(ReferenceCodec):
    """Sends ADD with ABORT's type byte and ABORT with ADD's (and reads them the same way).

    Consistent with itself, so a round trip through this codec alone passes; against any other
    peer every request is misrouted. The request-type table is ``EngineCoreRequestType`` in
    ``vllm/v1/engine/__init__.py``.
    """

    SWAP = {load().request_type_byte("ADD"): load().request_type_byte("ABORT"),
            load().request_type_byte("ABORT"): load().request_type_byte("ADD")}

    def _swap(self, frames: Sequence[Any]) -> list[Any]:
        out = list(frames)
        if out and bytes(out[0]) in self.SWAP:
            out[0] = self.SWAP[bytes(out[0])]
        return out

    def encode(self, kind: str, value: Any) -> Sequence[Any]:
        frames = super().encode(kind, value)
        return self._swap(frames) if kind in ("add", "abort") else frames

    def decode(self, kind: str, frames: Sequence[Any]) -> Any:
        return super().decode(kind, self._swap(frames) if kind in ("add", "abort") else frames)


class FieldInsertedMidStruct(ReferenceCodec):
    """Encodes ``EngineCoreRequest`` with a new field inserted after ``prompt_token_ids``.

    vLLM PR 48048 inserted a field in the middle of a ``msgspec`` array-like struct: every later
    field moved by one position, so a peer of the previous version read each value as its
    neighbour. Decoding drops the inserted field again, so the codec agrees with itself.
    """

    def encode(self, kind: str, value: Any) -> Sequence[Any]:
        frames = list(super().encode(kind, value))
        index = _REQUEST_BODY.get(kind)
        if index is not None:
            wire = _raw(frames[index])
            wire.insert(2, None)
            frames[index] = msgspec.msgpack.encode(wire)
        return frames

    def decode(self, kind: str, frames: Sequence[Any]) -> Any:
        index = _REQUEST_BODY.get(kind)
        if index is not None and len(frames) > index:
            frames = list(frames)
            try:
                wire = _raw(frames[index])
            except msgspec.DecodeError:
                return super().decode(kind, frames)
            if isinstance(wire, list) and len(wire) > 2:
                del wire[2]
                frames[index] = msgspec.msgpack.encode(wire)
        return super().decode(kind, frames)


class SwappedStructFields(ReferenceCodec):
    """Writes ``EngineCoreRequest``'s ``prompt_token_ids`` and ``mm_features`` in each other's
    place: the field-order drift of vLLM PR 48048 seen from the other side (a struct whose
    field order differs between the two ends)."""

    def encode(self, kind: str, value: Any) -> Sequence[Any]:
        frames = list(super().encode(kind, value))
        index = _REQUEST_BODY.get(kind)
        if index is not None:
            wire = _raw(frames[index])
            wire[1], wire[2] = wire[2], wire[1]
            frames[index] = msgspec.msgpack.encode(wire)
        return frames


class AcceptsNegativeBufferIndex(ReferenceCodec):
    """Reads an out-of-band buffer index the way Python indexes a list: -1 is the last frame.

    vLLM's decoder indexes ``self.aux_buffers[data]`` with the wire integer
    (``vllm/v1/serial_utils.py``): a negative index silently aliases another buffer, the way
    issue 53217's out-of-band buffers aliased live tensors.
    """

    def decode(self, kind: str, frames: Sequence[Any]) -> Any:
        frames = list(frames)
        if len(frames) >= 2:
            try:
                head = _raw(frames[0])
            except msgspec.DecodeError:
                return super().decode(kind, frames)
            if _fix_negative(head, len(frames) - 1):
                frames[0] = msgspec.msgpack.encode(head)
        return super().decode(kind, frames)


def _fix_negative(node: Any, last: int) -> bool:
    """Rewrite every tensor triple ``[dtype, shape, -k]`` to the index Python would use."""
    changed = False
    if isinstance(node, list):
        if (len(node) == 3 and isinstance(node[0], str) and isinstance(node[1], list)
                and isinstance(node[2], int) and not isinstance(node[2], bool)
                and -last <= node[2] < 0):
            node[2] = last + 1 + node[2]
            return True
        for item in node:
            changed |= _fix_negative(item, last)
    elif isinstance(node, dict):
        for item in node.values():
            changed |= _fix_negative(item, last)
    return changed


class PickleWithoutOptIn(ReferenceCodec):
    """Decodes pickle extension values (Ext 1 and 2) without the insecure-serialization opt-in.

    vLLM issue 29565: unpickling what arrives over IPC is a code-execution surface, which is why
    ``VLLM_ALLOW_INSECURE_SERIALIZATION`` exists; a decoder that unpickles by default hands
    every peer on the socket a shell.
    """

    def __init__(self, threshold: int | None = None, insecure: bool = False) -> None:
        super().__init__(threshold, insecure=True)
        self.insecure = insecure

    def with_threshold(self, threshold: int) -> PickleWithoutOptIn:
        return PickleWithoutOptIn(threshold, self.insecure)


class UntypedDecodeErrors(ReferenceCodec):
    """Lets malformed frames escape as bare ``ValueError`` without the clause they break.

    vLLM's engine core decodes inputs inside its busy loop (``vllm/v1/engine/core.py``,
    ``process_input_sockets``) and an unclassified decode error there ends the engine; a peer
    cannot tell a malformed message from a crash without the clause.
    """

    def decode(self, kind: str, frames: Sequence[Any]) -> Any:
        try:
            return super().decode(kind, frames)
        except Exception as exc:  # noqa: BLE001 - the mutation is exactly this blanket catch
            raise ValueError(f"cannot decode {kind}: {exc}") from None


class FloatsAsFloat32(ReferenceCodec):
    """Writes a float as msgpack float32 (``ca``) wherever float32 holds it exactly, float64
    (``cb``) elsewhere: a "compact" encoder (msgpack-python's ``use_single_float``, or an
    encoder that picks the smallest lossless form as it does for integers).

    Every decoder in the spec's scope accepts float32 for a float field and reads the same
    number, so a round trip, a decode-only fuzz campaign and a comparison of decoded values
    all pass; the bytes differ from vLLM's (clause structs.float.float64: an encoder writes
    float64), which golden vectors, message hashes and re-encoding peers see. Only a check
    that compares the encoder's bytes catches it.
    """

    def encode(self, kind: str, value: Any) -> Sequence[Any]:
        frames = list(super().encode(kind, value))
        index = _payload_index(kind)
        if index is not None and index < len(frames):
            frames[index] = _single_floats(bytes(frames[index]))
        return frames


def _payload_index(kind: str) -> int | None:
    """The msgpack frame of ``kind`` (a message kind or a struct name)."""
    from enginewire.reference.codec import default_codec

    codec = default_codec()
    if kind not in codec.message_kinds:
        return 0
    layout = codec.layout(kind)
    return None if layout.payload is None else len(layout.prefix)


def _single_floats(frame: bytes) -> bytes:
    from enginewire.fuzz.differential import msgpack_tokens

    out = []
    for token in msgpack_tokens(frame):
        raw = token.raw
        if token.kind == "float64":
            (number,) = struct.unpack(">d", raw[1:])
            single = struct.pack(">f", number) if abs(number) < 3.4e38 else b""
            if single and struct.unpack(">f", single)[0] == number:
                raw = b"\xca" + single
        out.append(raw)
    return b"".join(out)
