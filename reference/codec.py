"""The sans-IO message codec: values to ZMQ frames and back, exactly as the spec lays them out.

No sockets here: callers hand in and take out lists of frames. Every violation raises a
:class:`~enginewire.reference.errors.ProtocolError` subclass carrying the clause it breaks.

API
---
``encode(kind, value) -> list[bytes | memoryview]`` and ``decode(kind, frames) -> value``, where
``kind`` is either

- a message kind from ``spec/data/frames.toml``: ``hello``, ``init``, ``ready`` (handshake);
  ``ready_response``, ``add``, ``abort``, ``utility`` (input); ``outputs``, ``utility_reply``,
  ``engine_core_dead`` (output); ``coordinator_subscribe``, ``coordinator_unsubscribe``,
  ``coordinator_ready``, ``start_dp_wave``, ``coordinator_outputs``, ``stats_subscribe``,
  ``stats_unsubscribe``, ``stats_update``, ``scale_elastic_ep`` (coordinator). The frames are
  those the sending socket writes (type byte first on the input channel), without the ROUTER's
  identity frame; or
- a struct name from ``spec/data/structs/`` (``EngineCoreRequest``, ``EngineCoreOutputs``, ...):
  just the payload, the msgpack frame followed by its out-of-band frames.

Values: struct kinds take the classes of :mod:`enginewire.reference.structs`; ``abort`` a list
of request ids; ``utility`` ``(client_index, call_id, method, args)`` (``(call_id, method,
args)`` up to 0.9.0: the spec loaded for the release carries its payload type); ``init`` the
EngineHandshakeMetadata, or at 0.9.0 a plain map of ``output_socket_address`` and
``parallel_config``; ``start_dp_wave``
``(new_wave, exclude_engine_index)``; ``hello``/``ready`` a dict; literal-only kinds
(``engine_core_dead``, subscriptions and unsubscriptions, ``coordinator_ready``) ``None``;
``ready_response`` ``None`` for the empty frame older engines send (vLLM 0.8.4 and 0.8.5
send the literal frame ``READY``: a codec of those releases writes and reads it as ``None``).

The module functions take :class:`Codec` options as keywords (``encode(kind, value,
threshold=0)``). ``MESSAGE_PAYLOADS`` maps each message kind to its payload type expression.

Routing and identity: ``encode_routed(kind, value, rank)`` /
``decode_routed(kind, frames) -> (rank, value)`` add and strip the identity frame;
``decode_message(channel, frames, sender=None) -> Message`` tells the kinds of one channel
apart; ``encode_identity(rank)`` / ``decode_identity(frame)``.

:class:`Codec` holds the options (``threshold``, ``allow_insecure``, ``copy``, ``tensors``,
``ipc_handles``, ``version``); the module functions use a default instance. A frame may be
``bytes``, ``bytearray``, ``memoryview`` or anything with a ``.buffer`` (a ``zmq.Frame``).
Tensors decode as torch tensors where torch is installed (``tensors="auto"``) and as
:class:`~enginewire.reference.tensors.WireTensor` otherwise. Out-of-band frames are views of the
value's memory unless ``copy=True``: keep the value unchanged until the send completes
(frames.oob-not-mutated-in-flight).
"""

from __future__ import annotations

import functools
import importlib.util
import operator
import pickle
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, NoReturn

import msgspec
import numpy as np

from enginewire.spec import load
from enginewire.spec.history.release_facts import (
    INIT_MAP_OUTPUT_KEY,
    handshake_message_at,
    init_message_at,
)
from enginewire.spec.loader import REFERENCE_VLLM_VERSION, Spec
from enginewire.spec.schema import EnumSpec, StructConstraint, StructSpec
from enginewire.spec.types import TypeExpr, TypeVisitor, UnknownTypeError, kind_of, parse_type

from .errors import FramingError, PayloadError, ProtocolError, TensorError
from .structs import NdarraySlot, NestedTensorsSlot, StructSet, TensorSlot, UnionSlot, build
from .tensors import (
    EncodeScratch,
    TensorIpcHandle,
    Vocabulary,
    WireTensor,
    check_nested_tensors,
    decode_nested_tensors,
    decode_value,
    encode_hook,
    encode_ndarray,
    encode_tensor,
    encode_wire_tensor,
    is_torch_tensor,
    numpy_view,
    pickle_array,
    tensor_from_array,
    unpickle_array,
    vocabulary,
)

Frame = Any  # bytes | bytearray | memoryview | an object with a ``.buffer`` (zmq.Frame)

#: msgpack extension types of the insecure fallbacks (tensors surface, ext_codes).
PICKLE_EXT: int = load().ext_code("pickle")
CLOUDPICKLE_EXT: int = load().ext_code("cloudpickle")

#: Kinds whose empty payload frame stands for None (handshake.ready-response-empty-accepted).
_EMPTY_MEANS_NONE = frozenset({"ready_response"})


#: What :class:`Codec` reads to encode or decode a struct kind or a message kind with a struct
#: payload: its fixed frames, the struct class, the rules the kind adds, whether out-of-band
#: frames may follow, the payload type.
_StructPlan = tuple[tuple[bytes, ...], type, "Callable[[str, Any], None] | None", bool, str]


def _ready_literal(version: str) -> bytes:
    """The frame that stands for None in a ready response of ``version``: ``b"READY"`` where
    the release sends that literal (``history/constants.toml`` ``ready_response``), else the
    empty frame."""
    from enginewire.spec.history.release_facts import ready_response_at

    return b"READY" if ready_response_at(version) == "READY" else b""


class Message(NamedTuple):
    """A decoded message: its kind (from frames.toml) and its value."""

    kind: str
    value: Any


@dataclass(frozen=True)
class Layout:
    """The frames of one message kind, read from frames.toml."""

    kind: str
    channel: str
    sender: str
    routed: bool
    #: Fixed frames in front of the payload (type byte or literals), as bytes.
    prefix: tuple[bytes, ...]
    #: ``type_byte`` or ``literal`` for each prefix frame.
    prefix_content: tuple[str, ...]
    #: Type expression of the msgpack frame; None for literal-only messages.
    payload: str | None
    #: Out-of-band frames may follow the msgpack frame.
    oob: bool
    request_type: str | None


def _layouts(spec: Spec) -> dict[str, Layout]:
    """The layout of every message kind of ``spec``'s release; a kind whose request type the
    release lacks (its type frame has no byte at that release: START_DP_WAVE before vLLM
    0.8.5) is none of its kinds."""
    found: dict[str, Layout] = {}
    for message in spec.surface("frames").messages:
        if any(f.content == "type_byte" and f.literal_hex is None for f in message.frames):
            continue
        prefix: list[bytes] = []
        contents: list[str] = []
        payload: str | None = None
        oob = False
        for frame in message.frames:
            if frame.content in ("type_byte", "literal"):
                if payload is not None:
                    raise ValueError(f"{message.kind}: fixed frame after the payload")
                prefix.append(bytes.fromhex(frame.literal_hex or ""))
                contents.append(frame.content)
            elif frame.content == "msgpack":
                payload = frame.payload
            elif frame.content == "oob":
                oob = True
            else:
                raise ValueError(f"{message.kind}: frame content {frame.content!r} not in payload")
        found[message.kind] = Layout(
            kind=message.kind,
            channel=message.channel,
            sender=message.sender,
            routed=message.routed,
            prefix=tuple(prefix),
            prefix_content=tuple(contents),
            payload=payload,
            oob=oob,
            request_type=message.request_type,
        )
    return found


def _buffer(frame: Frame) -> Any:
    # bytes first: a frame as a socket's copying receive gives it (getattr of an attribute a
    # value lacks raises and catches an AttributeError inside).
    return frame if type(frame) is bytes else getattr(frame, "buffer", frame)


def _frame_bytes(frame: Frame) -> bytes:
    return bytes(_buffer(frame))


# --- msgspec validation errors -> clauses ---------------------------------------------------
#
# msgspec says what it expected and what came, and where (``- at `$[0].field[2]```); the clause
# depends on what the spec declares at that place, so the path is walked through the spec.

PAYLOAD_TYPE = "frames.payload-matches-type"
ARRAY_TYPE = "structs.array.type-checked"

_AT_PATH = re.compile(r" - at (`key` in )?`(\$[^`]*)`$")
_PATH_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")
_ARRAY_LENGTH = re.compile(
    r"^Expected `array` of (at least )?length (\d+)(?: to (\d+))?, got (\d+)"
)
_TYPE_MISMATCH = re.compile(r"^Expected `[^`]*`, got `([^`]*)`")


@dataclass(frozen=True)
class _Position:
    """What the spec declares at a path of a payload: the type there (None where a union of
    several types leaves it open) and the struct whose field the position is, if any."""

    declared: TypeExpr | None
    owner: StructSpec | None = None
    #: The field of ``owner`` the position is.
    field: str | None = None

    @property
    def where(self) -> str:
        """``Struct.field`` of the position, or ""."""
        return f"{self.owner.name}.{self.field}" if self.owner and self.field else ""


class _HookError(ValueError):
    """A ProtocolError out of a msgspec hook, wrapped so that msgspec adds its ``$``-path
    (it does for a ValueError out of ``dec_hook``); unwrapped again with the path."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(str(error))
        self.error = error


def _with_path(error: ProtocolError, path: str, where: str) -> ProtocolError:
    """``error`` again, its message led by ``path`` and ``Struct.field`` as the suite's
    reports write them (`` `$[1][0][12]` (EngineCoreOutput.routed_experts): ...``)."""
    place = f"`{path}`" + (f" ({where})" if where else "")
    again = type(error)(error.clause, f"{place}: {error.message}", expected=error.expected,
                        got=error.got)
    again.path = path
    again.field = where or None
    return again


def _single(expr: TypeExpr) -> TypeExpr | None:
    """The one non-nil member of ``expr``; None for a union of several."""
    rest = expr.without_none()
    return None if kind_of(rest) == "union" else rest


class _Child(TypeVisitor["tuple[TypeExpr, StructSpec | None] | None"]):
    """The type one path step (a field name, an index, or ``...`` for a map value) leads to
    inside a value of a (non-union) type, with the struct that owns it; None where the step
    does not fit the type."""

    def visit_struct(self, expr: TypeExpr, item: StructSpec,
                     step: str | int) -> tuple[TypeExpr, StructSpec | None] | None:
        if isinstance(step, int) and item.encoding in ("array", "tuple"):
            fields = item.fields[step: step + 1]
        elif isinstance(step, str) and item.encoding in ("map", "dataclass"):
            fields = [f for f in item.fields if f.name == step]
        else:
            fields = []
        return (parse_type(fields[0].type), item) if fields else None

    def visit_list(self, expr: TypeExpr,
                   step: str | int) -> tuple[TypeExpr, StructSpec | None] | None:
        if not isinstance(step, int):
            return None
        if expr.fixed_tuple:
            return (expr.args[step], None) if step < len(expr.args) else None
        return expr.args[0], None

    visit_set = visit_tuple = visit_list

    def visit_dict(self, expr: TypeExpr,
                   step: str | int) -> tuple[TypeExpr, StructSpec | None] | None:
        return (expr.args[1], None) if step == "..." else None

    def _leaf(self, expr: TypeExpr, step: str | int,
              *_: Any) -> tuple[TypeExpr, StructSpec | None] | None:
        return None

    visit_str = visit_int = visit_float = visit_bool = visit_bytes = visit_none = _leaf
    visit_any = visit_slice = visit_tensor = visit_ndarray = visit_nested_tensors = _leaf
    visit_union = _leaf

    def visit_enum(self, expr: TypeExpr, item: EnumSpec,
                   step: str | int) -> tuple[TypeExpr, StructSpec | None] | None:
        return None


def _split_path(message: str) -> tuple[str, list[str | int] | None, bool]:
    """``(text, steps, key)`` of a msgspec message: its text without the location, the path
    as field names and indexes (``"..."`` for any map value; None where the path does not
    parse), and whether the error is about a map key at that path."""
    match = _AT_PATH.search(message)
    if match is None:
        return message, [], False
    return message[: match.start()], path_steps(match.group(2)), bool(match.group(1))


def path_steps(path: str) -> list[str | int] | None:
    """The field names and indexes of a ``$``-path (``"..."`` for any map value); None where
    the path does not parse."""
    steps: list[str | int] = []
    pos = 1
    while pos < len(path):
        step = _PATH_STEP.match(path, pos)
        if step is None:
            return None
        name, index = step.groups()
        steps.append(name if name is not None else index if index == "..." else int(index))
        pos = step.end()
    return steps


class _ThreadCodec(EncodeScratch):
    """One thread's msgspec encoder and decoders, with the scratch space their hooks read (one
    encode or decode at a time). msgspec hands a hook no context, so each thread's hooks are
    bound to that thread's scratch: a plain object, read without a thread-local look-up on
    every access."""

    __slots__ = ("frames", "used", "encoder", "decoders", "dec_hook", "_codec")

    def __init__(self, codec: Codec) -> None:
        super().__init__()
        self.frames: Sequence[Frame] = ()
        self.used: set[int] | None = None
        # Tensors and arrays out of band are written in the hook itself; every other value
        # the hook meets goes to the codec's writer for its type.
        if codec.tensor_form == "tuple":
            self.encoder = msgspec.msgpack.Encoder(enc_hook=encode_hook(
                self, threshold=codec.threshold, copy=codec.copy, vocab=codec._vocab,
                other=codec._write_value))
        else:
            # An earlier release's tensor form: every value through the codec's writers.
            self.encoder = msgspec.msgpack.Encoder(enc_hook=self._write)
            self._codec = codec
        self.dec_hook: Callable[[Any, Any], Any] = functools.partial(Codec._dec_hook, codec, self)
        #: payload type expression -> decoder (:meth:`Codec._decoder`).
        self.decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}

    def _write(self, value: Any) -> Any:
        aux = self.aux
        if aux is None:
            raise RuntimeError("enc_hook outside an encode call")
        return self._codec._write_value(value, aux)


class Codec:
    """Encodes and decodes every message kind and struct of one vLLM version.

    Options:

    - ``threshold``: tensors and arrays of fewer bytes travel inline (default: the release's
      threshold_default, 256 from vLLM 0.8.5 on; none where the release has no inline form);
    - ``allow_insecure``: accept and produce extension types 1 (pickle) and 2 (cloudpickle),
      and a non-nil UtilityResult.type_info, like vLLM with VLLM_ALLOW_INSECURE_SERIALIZATION=1;
      a release without that opt-in (the tensors surface's ``pickle_opt_in`` is None: vLLM
      0.7.3-0.8.5, tensors.pickle-without-opt-in) pickles and unpickles without it;
    - ``copy``: out-of-band frames are copies (not views of the value's memory) and decoded
      tensors and arrays own their memory (not views of the received frames);
    - ``tensors``: ``"torch"``, ``"wire"`` (:class:`WireTensor`) or ``"auto"`` (torch when
      installed) for decoded tensor fields;
    - ``ipc_handles``: accept tensor IPC handles (a map in the data position) as
      :class:`TensorIpcHandle`, for peers that share vLLM's tensor IPC queue;
    - ``version``: the vLLM version whose spec to follow (default: the reference version).

    A Codec is safe to share between threads.
    """

    def __init__(
        self,
        *,
        threshold: int | None = None,
        allow_insecure: bool = False,
        copy: bool = False,
        tensors: Literal["auto", "torch", "wire"] = "auto",
        ipc_handles: bool = False,
        version: str | None = None,
    ) -> None:
        self.spec: Spec = load(version)
        self.structs: StructSet = build(self.spec.version)
        surface = self.spec.surface("tensors")
        self.threshold = (surface.threshold_default or 0) if threshold is None else threshold
        #: How this release writes a tensor and an ndarray (``tuple``, ``numpy``, ``pickle``:
        #: the tensors surface's tensor_form and ndarray_form).
        self.tensor_form: str = surface.tensor_form
        self.ndarray_form: str = surface.ndarray_form
        codes = {ext.name: ext.code for ext in surface.ext_codes}
        self._raw_view_ext = codes.get("raw_view")
        self._tensor_ext = codes.get("tensor")
        self._pickle_ext = codes.get("pickle", PICKLE_EXT)
        #: None where the release has no cloudpickle code: a function is pickled.
        self._cloudpickle_ext = codes.get("cloudpickle") if codes else CLOUDPICKLE_EXT
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.allow_insecure = allow_insecure
        #: The release's opt-in setting (None: it has none) and whether this codec pickles
        #: and unpickles: with ``allow_insecure``, or always where the release has no opt-in.
        self.pickle_opt_in: str | None = surface.pickle_opt_in
        self.pickle_allowed = allow_insecure or surface.pickle_opt_in is None
        self.copy = copy
        if tensors == "auto":
            tensors = "torch" if importlib.util.find_spec("torch") is not None else "wire"
        if tensors not in ("torch", "wire"):
            raise ValueError(f"tensors must be 'auto', 'torch' or 'wire', got {tensors!r}")
        self.tensor_mode: Literal["torch", "wire"] = tensors
        self.ipc_handles = ipc_handles
        self._vocab: Vocabulary = vocabulary(self.spec.version)
        self._layouts = _layouts(self.spec)
        #: Message kinds of frames.toml this release lacks, with their request type.
        self._absent_kinds = {m.kind: m.request_type for m in self.spec.surface("frames").messages
                              if m.kind not in self._layouts}
        #: The keys of the init message where the release reads it as a plain map (0.9.0;
        #: history/constants.toml [[init_message]]); None: the EngineHandshakeMetadata struct.
        init = init_message_at(self.spec.version) \
            if self.spec.version != REFERENCE_VLLM_VERSION else {"form": "struct"}
        self._init_map_keys: tuple[str, ...] | None = None
        if init.get("form") == "map" and "init" in self._layouts:
            # The loaded spec types its payload a map (enginewire.spec.load).
            self._init_map_keys = tuple(init.get("keys", ()))
        identity = self.spec.surface("identity")
        self._identity_width: int = identity.width
        self._identity_order: Literal["little", "big"] = identity.byteorder
        self._internal_type_bytes = frozenset(
            bytes([t.byte]) for t in self.spec.surface("request_types").types if not t.on_wire
        )
        #: vLLM's multimodal field factories and the field struct each builds (the tagged
        #: union MultiModalFieldElem.field).
        self._mm_factories = self.spec.tagged_union("MultiModalFieldElem", "field")
        self._ready_literal = b"" if self.spec.version == REFERENCE_VLLM_VERSION \
            else _ready_literal(self.spec.version)
        #: vLLM 0.10.1 carries its multimodal items as maps of elements in mm_kwargs.
        self._mm_kwargs = any(f.name == "mm_kwargs"
                              for f in self.spec.struct("EngineCoreRequest").fields)
        #: HELLO and READY keys of the codec's release (handshake_message_at: the handshake
        #: surface's at the reference release, the history's elsewhere).
        self._handshake_keys = {
            m.name.lower(): m.keys for m in self.spec.surface("handshake").messages if m.keys
        }
        for status in ("HELLO", "READY"):
            release_message = handshake_message_at(self.spec, status)
            if release_message is not None:
                self._handshake_keys[status.lower()] = release_message.keys
        self._validators = self._kind_validators()
        #: message kind -> the struct class its payload is (None: a payload type of another
        #: kind).
        self._payload_structs: dict[str, type | None] = {
            kind: self._payload_struct(layout.payload)
            for kind, layout in self._layouts.items() if layout.payload is not None
        }
        #: Every struct kind (a struct's name: its payload alone), and every message kind whose
        #: payload is a struct and never an empty frame -> its fixed frames, its payload's
        #: struct class, the rules the kind adds (None: none), whether out-of-band frames may
        #: follow, and its payload type: what an encode or a decode of such a kind reads, in
        #: one look-up (the per-message path of the peers and the codec bench's).
        self._struct_plans: dict[str, _StructPlan] = {
            name: ((), cls, self._validators.get(name), True, name)
            for name, cls in self.structs.classes.items()
        }
        self._struct_plans.update({
            kind: (layout.prefix, cls, self._validators.get(kind), layout.oob,
                   layout.payload or "")
            for kind, layout in self._layouts.items()
            if (cls := self._payload_structs.get(kind)) is not None
            and kind not in _EMPTY_MEANS_NONE
        })
        #: Message kinds that travel through a ROUTER, and the identities encoded so far.
        self._routed_kinds = frozenset(k for k, layout in self._layouts.items() if layout.routed)
        self._identities: dict[int, bytes] = {}
        self._channel_cache: dict[
            tuple[str, str | None],
            tuple[list[Layout], list[Layout], list[Layout], frozenset[bytes], frozenset[int]]] = {}
        #: exact type -> how the msgspec hook writes its values (:meth:`_value_encoder`).
        self._value_encoders: dict[type, Callable[[Any, list[Any]], Any]] = {}
        self._local = threading.local()

    # --- public API -----------------------------------------------------------------------

    @property
    def message_kinds(self) -> tuple[str, ...]:
        """Every message kind of frames.toml, in file order."""
        return tuple(self._layouts)

    def layout(self, kind: str) -> Layout:
        """The frame layout of a message kind."""
        try:
            return self._layouts[kind]
        except KeyError:
            self._require_kind(kind)
            raise KeyError(f"unknown message kind {kind!r}") from None

    def _require_kind(self, kind: str) -> None:
        """KeyError where ``kind`` is a message kind of frames.toml this release lacks."""
        if kind in self._absent_kinds:
            raise KeyError(f"vLLM {self.spec.version} has no {kind} message: its request type "
                           f"table has no {self._absent_kinds[kind]} (request_types.toml)")

    def encode(self, kind: str, value: Any) -> list[bytes | memoryview]:
        """The frames of ``value`` as a message of ``kind`` (or the payload of a struct)."""
        plan = self._struct_plans.get(kind)
        if plan is not None:  # a struct, or a message kind with a struct payload
            prefix, payload_class, rules, oob, _ = plan
            if type(value) is not payload_class:
                self._check_instance(kind, payload_class, value)
            if rules is not None:
                rules(kind, value)
            frames = self._encode_payload(value, oob)
            return [*prefix, *frames] if prefix else frames
        layout = self._layouts.get(kind)
        if layout is None:  # a struct class built since (KeyError for an unknown kind)
            self._require_kind(kind)
            self._struct_plans[kind] = ((), self._struct_class(kind), self._validators.get(kind),
                                        True, kind)
            return self.encode(kind, value)
        if layout.payload is None:
            if value is not None:
                raise PayloadError(
                    "frames.frame-count",
                    f"{kind} is a fixed frame and carries no value",
                    got=type(value).__name__,
                )
            return list(layout.prefix)
        if value is None and kind in _EMPTY_MEANS_NONE:
            return [*layout.prefix, self._ready_literal]
        payload_struct = self._payload_structs[kind]
        if payload_struct is None:
            self._check_payload_value(layout, value)
        elif type(value) is not payload_struct:
            self._check_instance(kind, payload_struct, value)
        validator = self._validators.get(kind)
        if validator is not None:
            validator(kind, value)
        return [*layout.prefix, *self._encode_payload(value, layout.oob)]

    def decode(self, kind: str, frames: Sequence[Frame]) -> Any:
        """The value of a message of ``kind`` (or a struct payload) from its frames."""
        plan = self._struct_plans.get(kind)
        if plan is not None:
            # A struct, or a message kind with a struct payload whose fixed frames came as the
            # very bytes expected (the common case): its payload decoded at once. Anything
            # else (a fixed frame as another bytes-like value, a wrong one, a frame missing)
            # takes the general path below, which says what is wrong.
            prefix, _, rules, oob, payload_type = plan
            count = len(prefix)
            if len(frames) > count and (not count or tuple(frames[:count]) == prefix):
                value = self._decode_payload(
                    payload_type, frames[count:] if count else frames, oob=oob, kind=kind)
                if rules is not None:
                    rules(kind, value)
                return value
        layout = self._layouts.get(kind)
        if layout is None:
            self._require_kind(kind)
            if kind not in self.structs.classes:
                self._struct_class(kind)
            if not frames:
                raise FramingError("frames.frame-count", f"{kind} has no msgpack frame", got=0)
            value = self._decode_payload(kind, frames, oob=True, kind=kind)
            validator = self._validators.get(kind)
            if validator is not None:
                validator(kind, value)
            return value
        count = len(layout.prefix)
        for index, expected in enumerate(layout.prefix):
            if index >= len(frames):
                raise FramingError(
                    "frames.frame-count",
                    f"{kind} is missing its fixed frame {index}",
                    expected=expected,
                    got=f"{len(frames)} frames",
                )
            got = frames[index]
            if got != expected:  # a frame that is no bytes-like value is read as bytes first
                self._check_fixed(layout, index, _frame_bytes(got))
        if layout.payload is None:
            if len(frames) != count:
                clause = (
                    "frames.engine-core-dead-literal"
                    if kind == "engine_core_dead"
                    else "frames.frame-count"
                )
                raise FramingError(
                    clause, f"{kind} is exactly {count} frame(s)", expected=count, got=len(frames)
                )
            return None
        payload = frames[count:]
        if not payload:
            raise FramingError(
                "frames.frame-count", f"{kind} has no msgpack frame", got=len(frames)
            )
        if kind in _EMPTY_MEANS_NONE and len(payload) == 1 and (
                len(_buffer(payload[0])) == 0
                or (self._ready_literal and _frame_bytes(payload[0]) == self._ready_literal)):
            return None
        value = self._decode_payload(layout.payload, payload, oob=layout.oob, kind=kind)
        validator = self._validators.get(kind)
        if validator is not None:
            validator(kind, value)
        return value

    def express_decoder(self, kind: str) -> Callable[[Sequence[Frame]], Any]:
        """The decode of the common message of struct kind ``kind`` in one call, for the
        peers' express paths (:class:`~.connection.FrontendConnection` and
        :class:`~.connection.EngineConnection`): a function of a message's frames that returns
        what :meth:`decode` returns where the frames are exactly the kind's fixed frames (at
        most one) as the very bytes expected and one msgpack frame as ``bytes`` that refers to
        no out-of-band frame, and the value keeps the kind's rules; None for anything else,
        without raising: :meth:`decode` of the same frames then says what is wrong (it decodes
        them again: a decode has no side effects)."""
        plan = self._struct_plans.get(kind)
        if plan is None or len(plan[0]) > 1:
            raise ValueError(f"{kind!r} is no struct kind with at most one fixed frame")
        prefix, _, rules, _, payload_type = plan
        count = len(prefix) + 1
        head = prefix[0] if prefix else None
        local = self._local

        def decode(frames: Sequence[Frame]) -> Any:
            if len(frames) != count or (head is not None and frames[0] != head):
                return None
            body = frames[-1]
            if type(body) is not bytes:
                return None
            state = getattr(local, "codec", None) or self._thread()
            decoder = state.decoders.get(payload_type) or self._decoder(state, payload_type)
            used: set[int] = set()
            state.frames, state.used = frames, used
            try:
                value = decoder.decode(body)
                if rules is not None:
                    rules(kind, value)
            except Exception:  # every failure is the general path's to report
                return None
            finally:
                state.frames, state.used = (), None
            return None if used else value

        return decode

    def encode_routed(self, kind: str, value: Any, rank: int) -> list[bytes | memoryview]:
        """The frames a ROUTER sends: the identity of ``rank``, then the message."""
        if kind not in self._routed_kinds:
            self._require_routed(kind)
        identity = self._identities.get(rank) if type(rank) is int else None
        if identity is None:
            identity = self.encode_identity(rank)
            self._identities[rank] = identity
        return [identity, *self.encode(kind, value)]

    def decode_routed(self, kind: str, frames: Sequence[Frame]) -> tuple[int, Any]:
        """``(rank, value)`` from the frames a ROUTER received (identity first)."""
        self._require_routed(kind)
        if not frames:
            raise FramingError("frames.routed-identity-first", "no identity frame", got=0)
        return self.decode_identity(frames[0]), self.decode(kind, frames[1:])

    def decode_message(
        self, channel: str, frames: Sequence[Frame], *, sender: str | None = None
    ) -> Message:
        """Tell which kind of ``channel`` the frames are (optionally only kinds sent by
        ``sender``) and decode them. Routed frames must come without their identity."""
        kinds = self._channel_cache.get((channel, sender))
        candidates, prefixed, bare, heads, head_sizes = kinds or self._channel_kinds(
            channel, sender)
        first = frames[0] if frames else None
        if type(first) is bytes and bare and (len(first) not in head_sizes or first not in heads):
            # A bytes first frame that starts no kind with fixed frames (an EngineCoreOutputs'
            # msgpack frame, say): only the kinds without fixed frames can match. Its size is
            # compared first: a set look-up hashes the whole frame (about 15 µs for the 40 KB
            # of a 256-request step).
            prefixed = []
        # Longest fixed prefix first; a frame is compared (and copied) only where its length
        # matches the prefix frame's, so a payload frame is never copied to be compared.
        for layout in prefixed:
            prefix = layout.prefix
            if len(frames) < len(prefix):
                continue
            for frame, head in zip(frames, prefix, strict=False):  # frames may be longer
                if frame != head and (
                        len(_buffer(frame)) != len(head) or _frame_bytes(frame) != head):
                    break
            else:
                return Message(layout.kind, self.decode(layout.kind, frames))
        if not bare:
            width = max(len(c.prefix) for c in candidates)
            self._reject_unknown_head(candidates, [_frame_bytes(f) for f in frames[:width]])
        first_error: ProtocolError | None = None
        for layout in bare:
            try:
                return Message(layout.kind, self.decode(layout.kind, frames))
            except ProtocolError as exc:
                first_error = first_error or exc
        assert first_error is not None
        raise first_error

    def _channel_kinds(
        self, channel: str, sender: str | None
    ) -> tuple[list[Layout], list[Layout], list[Layout], frozenset[bytes], frozenset[int]]:
        """The kinds of ``channel`` from ``sender`` (every sender: None), and of those the
        ones with fixed frames in front, longest prefix first, the ones without, the first
        fixed frames of the former and their sizes (cached: the layouts are fixed per
        codec)."""
        key = (channel, sender)
        found = self._channel_cache.get(key)
        if found is None:
            candidates = [
                layout
                for layout in self._layouts.values()
                if layout.channel == channel and (sender is None or layout.sender == sender)
            ]
            if not candidates:
                raise KeyError(f"no message kinds on channel {channel!r} from sender {sender!r}")
            prefixed = sorted((c for c in candidates if c.prefix), key=lambda c: -len(c.prefix))
            heads = frozenset(c.prefix[0] for c in prefixed)
            found = (candidates, prefixed, [c for c in candidates if not c.prefix], heads,
                     frozenset(len(head) for head in heads))
            self._channel_cache[key] = found
        return found

    def encode_identity(self, rank: int) -> bytes:
        """The routing identity of the engine with index ``rank`` (identity surface)."""
        if type(rank) is not int or not 0 <= rank < 1 << (8 * self._identity_width):
            raise FramingError(
                "identity.width-two-bytes",
                f"an engine index fits in {self._identity_width} unsigned bytes",
                got=rank,
            )
        return rank.to_bytes(self._identity_width, self._identity_order)

    def decode_identity(self, frame: Frame) -> int:
        """The engine index of a routing identity frame."""
        raw = _frame_bytes(frame)
        if len(raw) != self._identity_width:
            raise FramingError(
                "identity.width-two-bytes",
                "an engine identity has a fixed width",
                expected=self._identity_width,
                got=len(raw),
            )
        return int.from_bytes(raw, self._identity_order)

    # --- payloads -------------------------------------------------------------------------

    def _thread(self) -> _ThreadCodec:
        """This thread's encoder, decoders and hook scratch (made on first use)."""
        found: _ThreadCodec | None = getattr(self._local, "codec", None)
        if found is None:
            found = self._local.codec = _ThreadCodec(self)
        return found

    def _encode_payload(self, value: Any, oob: bool) -> list[bytes | memoryview]:
        state = getattr(self._local, "codec", None) or self._thread()
        aux: list[Any] = [b""]
        state.aux = aux
        try:
            aux[0] = state.encoder.encode(value)
        except TypeError as exc:
            raise PayloadError("frames.payload-matches-type", str(exc)) from None
        except RecursionError:
            raise PayloadError(
                "frames.nesting-depth", "the value nests too deep to encode"
            ) from None
        finally:
            state.aux = None
        if not oob and len(aux) > 1:
            raise PayloadError(
                "frames.untyped-payload-no-oob",
                "this payload is decoded untyped: a tensor or array in it must stay below the "
                "inline threshold",
                got=f"{len(aux) - 1} out-of-band buffer(s)",
            )
        return aux

    def _decode_payload(
        self, payload: str, frames: Sequence[Frame], *, oob: bool, kind: str
    ) -> Any:
        if not oob and len(frames) > 1:
            raise FramingError(
                "frames.untyped-payload-no-oob",
                f"{kind} carries no out-of-band frames",
                expected=1,
                got=len(frames),
            )
        state = getattr(self._local, "codec", None) or self._thread()
        decoder = state.decoders.get(payload) or self._decoder(state, payload)
        used: set[int] = set()
        state.frames = frames
        state.used = used
        try:
            first = frames[0]
            value = decoder.decode(first if type(first) is bytes else _buffer(first))
        except msgspec.ValidationError as exc:
            text = str(exc)
            path_match = _AT_PATH.search(text)
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, _HookError):
                if path_match is None:
                    raise cause.error from None
                raise _with_path(cause.error, path_match.group(2),
                                 self._where(payload, text)) from None
            where = self._where(payload, text)
            if path_match is not None:
                text = (f"`{path_match.group(2)}`" + (f" ({where})" if where else "")
                        + f": {text[: path_match.start()]}")
            error = PayloadError(
                self._validation_clause(payload, str(exc)), f"{kind}: {text}", expected=payload
            )
            if path_match is not None:
                error.path, error.field = path_match.group(2), where or None
            raise error from None
        except msgspec.DecodeError as exc:
            raise PayloadError(
                "frames.payload-matches-type", f"{kind}: {exc}", expected=payload
            ) from None
        except RecursionError:
            raise PayloadError(
                "frames.nesting-depth", f"{kind}: the msgpack frame nests too deep to decode"
            ) from None
        finally:
            state.frames = ()
            state.used = None
        if len(used) != len(frames) - 1:
            raise FramingError(
                "frames.oob-count-matches",
                f"{kind}: out-of-band frames that no value refers to",
                expected=len(used),
                got=len(frames) - 1,
            )
        return value

    def _validation_clause(self, payload: str, message: str) -> str:
        """The clause a msgspec ValidationError ``message`` breaks, for a payload of type
        ``payload``: decided by what the spec declares where the error is."""
        text, steps, key = _split_path(message)
        if text.startswith("Object missing required field"):
            return "structs.map.absent-key-default"
        if text.startswith("Invalid enum value"):
            return "structs.enum.value"
        if steps is None:
            return PAYLOAD_TYPE
        position = self._position(parse_type(payload), steps, key)
        declared = position.declared
        resolved = _single(declared) if declared is not None else None
        target = self.spec.structs.get(resolved.name) if resolved is not None else None
        target = target if isinstance(target, StructSpec) else None
        length = _ARRAY_LENGTH.match(text)
        if length is not None:
            at_least, low, high, got = length.groups()
            if target is not None and target.encoding == "array" and at_least:
                return "structs.array.missing-required-rejected"
            if target is not None and target.encoding == "tuple":
                if int(got) < int(low):
                    return "structs.tuple.array"
                if int(got) > int(high or low):
                    return "structs.tuple.extra-elements-rejected"
            return PAYLOAD_TYPE
        mismatch = _TYPE_MISMATCH.match(text)
        if mismatch is None:
            return PAYLOAD_TYPE
        if mismatch.group(1) in ("None", "null") and (steps or key) and (
            declared is None or not declared.nullable
        ):
            return "structs.none.nil"
        # An array-encoded struct that is no array, or one of its fields of the wrong type.
        if target is not None and target.encoding == "array":
            return ARRAY_TYPE
        if position.owner is not None and position.owner.encoding == "array":
            return ARRAY_TYPE
        return PAYLOAD_TYPE

    def _where(self, payload: str, message: str) -> str:
        """``Struct.field`` at the path of msgspec ``message`` inside a ``payload``, or ""."""
        _, steps, key = _split_path(message)
        if not steps:
            return ""
        return self._position(parse_type(payload), steps, key).where

    def _position(self, expr: TypeExpr, steps: list[str | int], key: bool) -> _Position:
        """What the spec declares at ``steps`` inside a value of type ``expr`` (or at the key
        of the map there, with ``key``)."""
        owner: StructSpec | None = None
        field: str | None = None
        child = _Child(self.spec.structs)
        for step in steps:
            resolved = _single(expr)
            if resolved is None:
                return _Position(None)
            found = child.visit(resolved, step)
            if found is None:
                return _Position(None)
            expr, owner = found
            field = None
            if owner is not None:
                field = owner.fields[step].name if isinstance(step, int) else str(step)
        if key:
            resolved = _single(expr)
            if resolved is None or kind_of(resolved) != "mapping":
                return _Position(None)
            return _Position(resolved.args[0])
        return _Position(expr, owner, field)

    def _decoder(self, state: _ThreadCodec, payload: str) -> msgspec.msgpack.Decoder[Any]:
        """The decoder of a payload type for the thread of ``state`` (made on first use)."""
        found = state.decoders.get(payload)
        if found is None:
            found = msgspec.msgpack.Decoder(
                self.structs.type_of(payload), dec_hook=state.dec_hook, ext_hook=self._ext_hook
            )
            state.decoders[payload] = found
        return found

    # --- msgspec hooks --------------------------------------------------------------------

    def _write_value(self, value: Any, aux: list[Any]) -> Any:
        """What the encoder's hook (:func:`~.tensors.encode_hook`) writes for ``value``, a
        value msgspec cannot encode by itself, found by its exact type."""
        encoder = self._value_encoders.get(type(value))
        if encoder is None:
            encoder = self._value_encoder(value)
            self._value_encoders[type(value)] = encoder
        return encoder(value, aux)

    def _value_encoder(self, value: Any) -> Callable[[Any, list[Any]], Any]:
        """How to write a value of ``type(value)`` that msgspec hands to the hook (decided
        once per type: the hook looks it up by the value's exact type)."""
        if isinstance(value, np.ndarray):
            return self._encode_ndarray
        if is_torch_tensor(value):
            return self._encode_tensor
        if isinstance(value, WireTensor):
            return self._encode_wire_tensor
        if isinstance(value, TensorIpcHandle):
            return self._encode_ipc_handle
        if isinstance(value, slice):
            return _encode_slice
        if self.pickle_allowed:
            return lambda value, _aux: self._pickle(value)
        return _no_wire_form

    def _encode_ndarray(self, value: np.ndarray, aux: list[Any]) -> Any:
        if value.dtype.kind in ("O", "V") and self.pickle_allowed:
            return self._pickle(value)
        if self.ndarray_form == "pickle":
            # No ndarray form of its own: the pickle fallback (tensors.ndarray-pickle-fallback),
            # the stream as vLLM's pickle.dumps writes it.
            if not self.pickle_allowed:
                return _no_wire_form(value, aux)
            return msgspec.msgpack.Ext(self._pickle_ext, pickle_array(value))
        return encode_ndarray(
            value, aux, threshold=self.threshold, copy=self.copy, vocab=self._vocab
        )

    # (Methods, not functools.partial with keywords: a partial merges its keywords into a new
    # dict on every call, which costs more than the call itself.)

    def _encode_tensor(self, value: Any, aux: list[Any]) -> Any:
        if self.tensor_form != "tuple":
            return self._encode_earlier_tensor(value, aux)
        return encode_tensor(
            value, aux, threshold=self.threshold, copy=self.copy, vocab=self._vocab
        )

    def _encode_earlier_tensor(self, value: Any, aux: list[Any]) -> Any:
        """A tensor (or WireTensor) in the form of an earlier release: the tuple of its numpy
        view (tensors.numpy-form) or an extension type wrapping its pickled numpy view
        (tensors.pickle-form)."""
        if self.tensor_form == "pickle":
            array = numpy_view(value, "tensors.pickle-form")
            assert self._tensor_ext is not None, "the pickle form has a tensor code"
            return msgspec.msgpack.Ext(self._tensor_ext, pickle_array(array))
        return encode_ndarray(numpy_view(value, "tensors.numpy-form"), aux,
                              threshold=self.threshold, copy=self.copy, vocab=self._vocab)

    def _encode_wire_tensor(self, value: WireTensor, aux: list[Any]) -> Any:
        if self.tensor_form != "tuple":
            return self._encode_earlier_tensor(value, aux)
        return encode_wire_tensor(
            value, aux, threshold=self.threshold, copy=self.copy, vocab=self._vocab
        )

    def _encode_ipc_handle(self, value: TensorIpcHandle, _aux: list[Any]) -> Any:
        if not self.ipc_handles:
            raise TensorError(
                "tensors.ipc-handle-needs-side-channel",
                "tensor IPC handles need a codec created with ipc_handles=True",
            )
        return value.dtype, value.shape, value.meta

    def _pickle(self, value: Any) -> msgspec.msgpack.Ext:
        import types

        if isinstance(value, types.FunctionType) and self._cloudpickle_ext is not None:
            try:
                import cloudpickle
            except ImportError:
                raise PayloadError(
                    "tensors.insecure-function-cloudpickle",
                    "sending a function needs the cloudpickle package",
                ) from None
            return msgspec.msgpack.Ext(self._cloudpickle_ext, cloudpickle.dumps(value))
        pickled = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return msgspec.msgpack.Ext(self._pickle_ext, pickled)

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == self._raw_view_ext:
            return data
        if code == self._tensor_ext:
            # The pickle form: the tensor itself, in a tensor field and anywhere else.
            return tensor_from_array(unpickle_array(data), self.tensor_mode,
                                     "tensors.pickle-form")
        if code == self._pickle_ext or code == self._cloudpickle_ext:
            if not self.pickle_allowed:
                raise TensorError(
                    "tensors.ext-pickle-opt-in",
                    f"extension type {code} (pickle) needs allow_insecure=True",
                    got=code,
                )
            # cloudpickle writes ordinary pickle streams: pickle.loads reads both.
            return pickle.loads(data)
        raise TensorError(
            "tensors.ext-codes-known",
            "unknown msgpack extension type",
            expected=sorted(e.code for e in self.spec.surface("tensors").ext_codes),
            got=code,
        )

    def _dec_hook(self, state: _ThreadCodec, target: Any, raw: Any) -> Any:
        try:
            used = state.used
            if used is None:
                raise RuntimeError("dec_hook outside a decode call")
            if target is TensorSlot and self.tensor_form != "tuple":
                return self._decode_earlier_tensor(state, raw)
            if target is TensorSlot or target is NdarraySlot:
                return decode_value(
                    raw,
                    "tensor" if target is TensorSlot else "ndarray",
                    state.frames,
                    used,
                    mode=self.tensor_mode,
                    copy=self.copy,
                    vocab=self._vocab,
                    ipc_handles=self.ipc_handles,
                )
            return self._dec_hook_body(state, target, raw)
        except _HookError:
            raise
        except ProtocolError as exc:
            raise _HookError(exc) from exc

    def _decode_earlier_tensor(self, state: _ThreadCodec, raw: Any) -> Any:
        """A tensor field in the form of an earlier release: the tensor the ext hook built
        from the pickle form's extension type, or the numpy form's tuple read as an array
        and turned into a tensor."""
        if self.tensor_form == "pickle":
            if isinstance(raw, WireTensor) or is_torch_tensor(raw):
                return raw
            raise TensorError("tensors.pickle-form", "a tensor travels as msgpack extension "
                              f"type {self._tensor_ext} (a pickled numpy array)",
                              got=type(raw).__name__)
        assert state.used is not None
        array = decode_value(raw, "ndarray", state.frames, state.used, mode=self.tensor_mode,
                             copy=True, vocab=self._vocab, ipc_handles=False)
        return tensor_from_array(array, self.tensor_mode, "tensors.numpy-form")

    def _dec_hook_body(self, state: _ThreadCodec, target: Any, raw: Any) -> Any:
        if target is NestedTensorsSlot:
            assert state.used is not None
            return decode_nested_tensors(
                raw,
                state.frames,
                state.used,
                mode=self.tensor_mode,
                copy=self.copy,
                vocab=self._vocab,
                ipc_handles=self.ipc_handles,
            )
        if target is slice:
            if (
                isinstance(raw, list)
                and len(raw) == 3
                and all(v is None or type(v) is int for v in raw)
            ):
                return slice(*raw)
            raise PayloadError(
                "structs.slice.triple", "a slice is [start, stop, step] of ints or nil", got=raw
            )
        if isinstance(target, type) and issubclass(target, UnionSlot):
            return self._decode_union(state, target, raw)
        raise PayloadError("frames.payload-matches-type", f"no decoder for {target!r}")

    def _decode_union(self, state: _ThreadCodec, target: type[UnionSlot], raw: Any) -> Any:
        used = state.used
        before = set(used) if used is not None else set()
        failures: list[str] = []
        for member in target.members:
            try:
                return msgspec.convert(raw, member, dec_hook=state.dec_hook)
            except (msgspec.ValidationError, ProtocolError) as exc:
                failures.append(str(exc))
                if used is not None:
                    used.clear()
                    used.update(before)
        # A nil that no member accepts breaks the nil rule, whatever else the union allows.
        clause = "structs.none.nil" if raw is None else "frames.payload-matches-type"
        raise PayloadError(
            clause,
            f"value matches no member of {target.expr}: " + "; ".join(failures),
        )

    # --- checks ---------------------------------------------------------------------------

    def _struct_class(self, kind: str) -> Any:
        try:
            return self.structs.classes[kind]
        except KeyError:
            raise KeyError(f"unknown message kind or struct {kind!r}") from None

    def _check_instance(self, kind: str, cls: Any, value: Any) -> None:
        if not isinstance(value, cls):
            raise PayloadError(
                "frames.payload-matches-type",
                f"{kind} takes an instance of enginewire.reference.structs.{cls.__name__}",
                got=type(value).__name__,
            )

    def _payload_struct(self, payload: str) -> type | None:
        """The struct class a payload type expression names; None for any other type, and for
        one this release's spec lacks (encoding such a kind raises as it always did)."""
        try:
            return _struct_type(self.structs.type_of(payload))
        except UnknownTypeError:
            return None

    def _check_payload_value(self, layout: Layout, value: Any) -> None:
        assert layout.payload is not None
        target = self.structs.type_of(layout.payload)
        if isinstance(target, type) and issubclass(target, msgspec.Struct):
            self._check_instance(layout.kind, target, value)
            return
        try:
            msgspec.convert(value, target, dec_hook=_pass_through)
        except msgspec.ValidationError as exc:
            raise PayloadError(
                "frames.payload-matches-type", f"{layout.kind}: {exc}", expected=layout.payload
            ) from None

    def _check_fixed(self, layout: Layout, index: int, got: bytes) -> None:
        expected = layout.prefix[index]
        if got == expected:
            return
        if layout.prefix_content[index] == "type_byte":
            if len(got) != 1:
                clause = "request_types.one-byte-frame"
            elif got in self._internal_type_bytes:
                clause = "request_types.sentinels-never-on-wire"
            else:
                clause = "request_types.unknown-byte-rejected"
            raise FramingError(clause, f"{layout.kind} type frame", expected=expected, got=got)
        clause = (
            "frames.engine-core-dead-literal" if layout.kind == "engine_core_dead"
            else "frames.frame-count"
        )
        raise FramingError(clause, f"{layout.kind} literal frame", expected=expected, got=got)

    def _reject_unknown_head(self, candidates: list[Layout], heads: list[bytes]) -> None:
        head = heads[0] if heads else None
        if any(c.prefix_content[:1] == ("type_byte",) for c in candidates):
            if head is not None and len(head) == 1:
                clause = (
                    "request_types.sentinels-never-on-wire"
                    if head in self._internal_type_bytes
                    else "request_types.unknown-byte-rejected"
                )
            else:
                clause = "request_types.one-byte-frame"
            raise FramingError(
                clause,
                "first frame is not a known request type",
                expected=sorted(c.prefix[0] for c in candidates if c.prefix),
                got=head,
            )
        raise FramingError(
            "frames.frame-count",
            "first frame matches no message of this channel",
            expected=sorted(c.prefix[0] for c in candidates if c.prefix),
            got=head,
        )

    def _validate(self, kind: str, value: Any) -> None:
        """The rules a kind adds to its payload type (run on encode and on decode)."""
        validator = self._validators.get(kind)
        if validator is not None:
            validator(kind, value)

    def _kind_validators(self) -> dict[str, Callable[[str, Any], None]]:
        """Kind -> the rules it adds to its payload type, decided once per codec (a kind
        with none is absent)."""
        found: dict[str, Callable[[str, Any], None]] = dict.fromkeys(
            self._handshake_keys, self._validate_handshake_map)
        found.update(dict.fromkeys(("add", "EngineCoreRequest"), self._request_validator()))
        found.update(dict.fromkeys(
            ("utility_reply", "coordinator_outputs", "EngineCoreOutputs"),
            self._validate_outputs))
        found["outputs"] = self._validate_request_outputs
        if self._init_map_keys is not None:
            found["init"] = self._validate_init_map
        found["MultiModalFeatureSpec"] = lambda _kind, value: self._validate_mm_item(value.data)
        found["MultiModalFieldElem"] = lambda _kind, value: self._validate_mm_element("", value)
        found["UtilityOutput"] = lambda _kind, value: self._validate_utility_result(value.result)
        found["UtilityResult"] = lambda _kind, value: self._validate_utility_result(value)
        return found

    def _request_validator(self) -> Callable[[str, Any], None]:
        """The rules of EngineCoreRequest: its exactly-one-of constraints (spec data) and its
        multimodal items. A closure over what it reads: every request encoded or decoded
        runs it."""
        # (getter of the fields' values, how many of them must be None, the constraint)
        rules = tuple(
            (_values_getter(c.fields), len(c.fields) - 1, c)
            for c in self.spec.struct("EngineCoreRequest").constraints
            if c.kind == "exactly-one-of"
        )
        # Releases before 0.10.2 carry no mm_features (the spec of the codec's version).
        has_mm = any(f.name == "mm_features" for f in self.spec.struct("EngineCoreRequest").fields)
        has_mm_kwargs = self._mm_kwargs
        violated, check_item = self._violated, self._validate_mm_item

        if len(rules) == 1 and len(rules[0][2].fields) == 2 and not has_mm_kwargs:
            # The reference release: one rule over two fields (sampling_params or
            # pooling_params), checked without a loop or a tuple as "exactly one is None".
            constraint = rules[0][2]
            first, second = (operator.attrgetter(name) for name in constraint.fields)

            def validate_pair(_kind: str, value: Any) -> None:
                if (first(value) is None) is (second(value) is None):
                    violated(constraint, value)
                if has_mm and value.mm_features:
                    for feature in value.mm_features:
                        check_item(feature.data)

            return validate_pair

        def validate(_kind: str, value: Any) -> None:
            for values, nones, constraint in rules:
                if values(value).count(None) != nones:
                    violated(constraint, value)
            if has_mm and value.mm_features:
                for feature in value.mm_features:
                    check_item(feature.data)
            if has_mm_kwargs and value.mm_kwargs:
                for item in value.mm_kwargs:
                    check_item(item)

        return validate

    def _validate_request_outputs(self, _kind: str, value: Any) -> None:
        """The ``outputs`` kind's rule (every engine step sends one): no utility output."""
        if value.utility_output is not None:
            raise PayloadError(
                "frames.utility-reply", "a utility reply is the utility_reply kind, not outputs"
            )

    def _validate_outputs(self, kind: str, value: Any) -> None:
        """The rules of the other EngineCoreOutputs kinds (and of the struct itself: a utility
        output's result)."""
        utility = value.utility_output
        if kind == "utility_reply" and (utility is None or value.outputs):
            raise PayloadError(
                "frames.utility-reply",
                "a utility reply has utility_output set and no request outputs",
            )
        if kind == "coordinator_outputs" and (value.outputs or utility is not None):
            raise PayloadError(
                "frames.coordinator-outputs-single-frame",
                "outputs for the coordinator carry no request outputs and no utility output",
            )
        if utility is not None:
            self._validate_utility_result(utility.result)

    def _validate_utility_result(self, result: Any) -> None:
        # Before 0.10.1 a utility result is any value, with no type_info.
        type_info = getattr(result, "type_info", None)
        if result is not None and type_info is not None and not self.pickle_allowed:
            raise PayloadError(
                "structs.utility-result.type-info-insecure-only",
                "UtilityResult.type_info is nil unless insecure serialization is on",
                got=type_info,
            )

    @staticmethod
    def _violated(constraint: StructConstraint, value: Any) -> NoReturn:
        """Raise the clause of an ``exactly-one-of`` constraint (spec data) ``value`` breaks."""
        present = [name for name in constraint.fields if getattr(value, name) is not None]
        raise PayloadError(
            constraint.clause,
            f"exactly one of {' and '.join(constraint.fields)} is set",
            got=" and ".join(present) if present else "neither",
        )

    def _validate_mm_item(self, item: dict[str, Any] | None) -> None:
        for key, element in (item or {}).items():
            self._validate_mm_element(key, element)

    def _validate_mm_element(self, key: str, element: Any) -> None:
        name, field = element.field
        factories = self._mm_factories
        expected = factories.tags.get(name)
        if expected is None or type(field).__name__ != expected:
            raise PayloadError(
                factories.clause,
                f"multimodal item {key!r}: field factory {name!r} with a "
                f"{type(field).__name__}",
                expected=factories.tags,
                got=name,
            )
        if element.data is not None:
            check_nested_tensors(element.data)

    def _validate_init_map(self, kind: str, value: Any) -> None:
        """The init map of a release that reads it by key (0.9.0): every key of
        [[init_message]], a str output address and a map parallel_config."""
        keys = self._init_map_keys or ()
        if not isinstance(value, dict) or any(k not in value for k in keys):
            raise PayloadError(
                "handshake.init-addresses",
                f"vLLM {self.spec.version}'s init message is a map of {', '.join(keys)}",
                expected=list(keys), got=sorted(value) if isinstance(value, dict) else value,
            )
        if INIT_MAP_OUTPUT_KEY in keys and not isinstance(value[INIT_MAP_OUTPUT_KEY], str):
            raise PayloadError(
                "handshake.init-addresses", f"{INIT_MAP_OUTPUT_KEY} is an address string",
                expected="str", got=value[INIT_MAP_OUTPUT_KEY],
            )
        if "parallel_config" in keys and not isinstance(value["parallel_config"], dict):
            raise PayloadError(
                "handshake.init-parallel-config", "parallel_config is a map",
                expected="map", got=type(value["parallel_config"]).__name__,
            )

    def _validate_handshake_map(self, kind: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise PayloadError("handshake.message-keys", f"{kind} is a map", got=type(value))
        for key in self._handshake_keys[kind]:
            if key.name not in value:
                if key.required:
                    raise PayloadError(
                        "handshake.message-keys", f"{kind} lacks the key {key.name!r}"
                    )
                continue
            got = value[key.name]
            if key.value is not None and got != key.value:
                raise PayloadError(
                    "handshake.message-keys",
                    f"{kind} key {key.name!r}",
                    expected=key.value,
                    got=got,
                )
            try:
                msgspec.convert(got, self.structs.type_of(key.type), strict=True)
            except msgspec.ValidationError as exc:
                raise PayloadError(
                    "handshake.message-keys", f"{kind} key {key.name!r}: {exc}", got=got
                ) from None

    def _require_routed(self, kind: str) -> None:
        if not self.layout(kind).routed:
            raise KeyError(f"{kind} does not travel through a ROUTER")


def _struct_type(annotation: Any) -> type | None:
    """``annotation`` if it is a struct class, else None."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    return None


def _pass_through(_target: Any, value: Any) -> Any:
    return value


def _values_getter(fields: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A getter of the values of ``fields`` as a tuple (``attrgetter`` of one name returns the
    bare value)."""
    if len(fields) == 1:
        single = operator.attrgetter(fields[0])
        return lambda value: (single(value),)
    return operator.attrgetter(*fields)


def _encode_slice(value: slice, _aux: list[Any]) -> tuple[int | None, ...]:
    bounds = (value.start, value.stop, value.step)
    return tuple(None if v is None else int(v) for v in bounds)


def _no_wire_form(value: Any, _aux: list[Any]) -> Any:
    raise PayloadError(
        "structs.no-implicit-pickle",
        f"a value of type {type(value).__module__}.{type(value).__qualname__} has no wire form"
        " (pickle needs allow_insecure=True)",
    )


_CODECS: dict[tuple[tuple[str, Any], ...], Codec] = {}
_CODECS_LOCK = threading.Lock()


def default_codec(**options: Any) -> Codec:
    """The shared Codec for these options (none: the defaults) that the module functions use."""
    key = tuple(sorted(options.items()))
    found = _CODECS.get(key)
    if found is None:
        with _CODECS_LOCK:
            found = _CODECS.get(key)
            if found is None:
                found = Codec(**options)
                _CODECS[key] = found
    return found


#: Message kind -> type expression of its msgpack frame (None for literal-only kinds).
MESSAGE_PAYLOADS: dict[str, str | None] = {
    kind: layout.payload for kind, layout in _layouts(load()).items()
}


def encode(kind: str, value: Any, **options: Any) -> list[bytes | memoryview]:
    """:meth:`Codec.encode`; ``options`` are :class:`Codec` keywords (``threshold=0``...)."""
    return default_codec(**options).encode(kind, value)


def decode(kind: str, frames: Sequence[Frame], **options: Any) -> Any:
    """:meth:`Codec.decode`; ``options`` are :class:`Codec` keywords."""
    return default_codec(**options).decode(kind, frames)


def encode_routed(kind: str, value: Any, rank: int, **options: Any) -> list[bytes | memoryview]:
    """:meth:`Codec.encode_routed`; ``options`` are :class:`Codec` keywords."""
    return default_codec(**options).encode_routed(kind, value, rank)


def decode_routed(kind: str, frames: Sequence[Frame], **options: Any) -> tuple[int, Any]:
    """:meth:`Codec.decode_routed`; ``options`` are :class:`Codec` keywords."""
    return default_codec(**options).decode_routed(kind, frames)


def decode_message(
    channel: str, frames: Sequence[Frame], *, sender: str | None = None, **options: Any
) -> Message:
    """:meth:`Codec.decode_message`; ``options`` are :class:`Codec` keywords."""
    return default_codec(**options).decode_message(channel, frames, sender=sender)


def encode_identity(rank: int) -> bytes:
    """The 2-byte little-endian routing identity of engine ``rank``."""
    return default_codec().encode_identity(rank)


def decode_identity(frame: Frame) -> int:
    """The engine index of a routing identity frame."""
    return default_codec().decode_identity(frame)
