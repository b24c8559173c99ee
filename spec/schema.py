"""The schema of the spec files themselves.

Every file under ``spec/data/`` decodes into one of the structs below. A surface file
(``transport.toml``, ``frames.toml``, ...) holds a :class:`SurfaceHeader`, its clauses and the
tables particular to that surface; each struct file under ``spec/data/structs/`` holds one
:class:`StructSpec` (or :class:`EnumSpec`). Unknown keys are errors, so a typo in a spec file
cannot silently drop a fact.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Level = Literal["MUST", "SHOULD", "MAY"]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    pass


class Clause(_Strict, kw_only=True):
    """One normative statement: stable ID, level, one sentence, source reference."""

    id: str
    level: Level
    text: str
    #: ``path/in/vllm/wheel.py:LINE`` at the surface's reference version.
    source: str
    #: The vLLM versions in which the clause holds (defaults to the file's range).
    versions: str | None = None
    #: Where the reference vLLM itself deviates from the clause, and how.
    vllm_deviation: str | None = None
    #: Why the clause exists (a failure it prevents, an issue or PR it comes from).
    rationale: str | None = None


class SurfaceHeader(_Strict, kw_only=True):
    surface: str
    title: str
    summary: str
    versions: str
    #: Numeric bounds a decoder enforces on this surface (``name = value``); each is named by
    #: the clause that states it, and rendered in the surface's page.
    limits: dict[str, int] = msgspec.field(default_factory=dict)


# --- transport ---------------------------------------------------------------------------


class SocketEnd(_Strict, kw_only=True):
    role: str
    socket: str
    binds: bool
    #: Socket options set by this end: name -> value.
    options: dict[str, int | str | bool] = {}
    identity: str | None = None


class Channel(_Strict, kw_only=True):
    name: str
    purpose: str
    ends: list[SocketEnd]
    address_forms: list[str]
    source: str


class AddressForm(_Strict, kw_only=True):
    scheme: str
    pattern: str
    when: str


class TransportFile(SurfaceHeader, kw_only=True):
    channels: list[Channel]
    addresses: list[AddressForm]
    clauses: list[Clause]


# --- frames ------------------------------------------------------------------------------

FrameContent = Literal["identity", "type_byte", "msgpack", "oob", "literal"]


class Frame(_Strict, kw_only=True):
    name: str
    content: FrameContent
    description: str
    #: For ``msgpack`` frames: the type expression of the payload.
    payload: str | None = None
    #: For ``literal`` frames: the exact bytes, as hex. A ``type_byte`` frame leaves it out in
    #: the file (its byte is the message's ``request_type`` in ``request_types.toml``); the
    #: loader fills it in from there.
    literal_hex: str | None = None
    #: True for a frame that repeats zero or more times (out-of-band buffers).
    repeated: bool = False


class Message(_Strict, kw_only=True):
    """One message kind on one channel, as its frames travel between the two sockets."""

    kind: str
    channel: str
    sender: str
    description: str
    frames: list[Frame]
    source: str
    #: Request type name for messages on the input channel.
    request_type: str | None = None
    #: The ROUTER end sees one identity frame in front of ``frames``.
    routed: bool = False


class FramesFile(SurfaceHeader, kw_only=True):
    messages: list[Message]
    clauses: list[Clause]


# --- request types -----------------------------------------------------------------------


class RequestType(_Strict, kw_only=True):
    """One entry of vLLM's ``EngineCoreRequestType``: a name and its byte over ``versions``
    (the file's range where absent). A byte that changed meaning, or a name that moved to
    another byte, is one entry per range; ``load(version)`` keeps the entries of
    ``version``."""

    name: str
    byte: int
    on_wire: bool
    description: str
    source: str
    message: str | None = None
    #: The vLLM versions the entry holds for (defaults to the file's range).
    versions: str | None = None


class RequestTypesFile(SurfaceHeader, kw_only=True):
    types: list[RequestType]
    clauses: list[Clause]


# --- identity ----------------------------------------------------------------------------


class IdentityExample(_Strict, kw_only=True):
    rank: int
    hex: str


class IdentityFile(SurfaceHeader, kw_only=True):
    width: int
    byteorder: Literal["little", "big"]
    meaning: str
    examples: list[IdentityExample]
    clauses: list[Clause]


# --- handshake ---------------------------------------------------------------------------


class MapKey(_Strict, kw_only=True):
    name: str
    type: str
    required: bool
    description: str
    #: For a literal key such as ``status``: the value it must carry.
    value: str | None = None


class HandshakeMessage(_Strict, kw_only=True):
    name: str
    channel: str
    sender: str
    description: str
    keys: list[MapKey] = []
    #: A struct from ``structs/`` instead of an ad-hoc map.
    struct: str | None = None


class State(_Strict, kw_only=True):
    name: str
    description: str


class Transition(_Strict, kw_only=True):
    source: str
    event: str
    target: str
    action: str = ""


class StateMachine(_Strict, kw_only=True):
    role: str
    initial: str
    states: list[State]
    transitions: list[Transition]
    #: Clause violated by any event with no transition in the current state.
    illegal_event_clause: str


class HandshakeFile(SurfaceHeader, kw_only=True):
    messages: list[HandshakeMessage]
    machines: list[StateMachine]
    timeouts: dict[str, float]
    clauses: list[Clause]


# --- tensors -----------------------------------------------------------------------------


class ExtCode(_Strict, kw_only=True):
    code: int
    name: str
    allowed: str
    description: str


#: How an encoder writes a torch tensor or a numpy array (``history/constants.toml``
#: ``tensor_form``): ``tuple`` ([dtype, shape, data], a tensor's dtype the torch name),
#: ``numpy`` (the tuple of the tensor's numpy view: numpy's dtype.str), ``pickle`` (an extension
#: type wrapping a pickle stream).
TensorForm = Literal["tuple", "numpy", "pickle"]


class TensorsFile(SurfaceHeader, kw_only=True):
    tuple_fields: list[str]
    torch_dtypes: list[str]
    numpy_dtypes: list[str]
    #: None where the release's encoder has no inline threshold (the pickle form).
    threshold_default: int | None
    threshold_env: str
    #: The setting both ends turn on before pickle travels (extension types pickle and
    #: cloudpickle, the encoder's pickle fallback, a non-nil UtilityResult.type_info); the
    #: file gives the newest release's, the loader the release's own from the history
    #: (``[[pickle_opt_in]]``): None where the release pickles without any opt-in.
    pickle_opt_in: str | None
    inline_comparison: Literal["<", "<="]
    index_base: int
    ext_codes: list[ExtCode]
    clauses: list[Clause]
    #: Extension codes of earlier releases that the newest one no longer has (``tensor``);
    #: a loaded spec lists in ``ext_codes`` the codes of its own release.
    former_ext_codes: list[ExtCode] = []
    #: The form of a tensor and of an ndarray in the loaded release (the file gives the
    #: newest; the loader sets the release's own from the history).
    tensor_form: TensorForm = "tuple"
    ndarray_form: TensorForm = "tuple"
    #: False where the release's threshold is a module constant no setting changes.
    threshold_configurable: bool = True


# --- ring --------------------------------------------------------------------------------


class RingState(_Strict, kw_only=True):
    name: str
    pattern: str
    can_read: str
    can_write: bool
    description: str


class Step(_Strict, kw_only=True):
    order: int
    action: str
    clause: str | None = None
    fence: bool = False


class FramingField(_Strict, kw_only=True):
    name: str
    offset: str
    size: str
    byteorder: Literal["big", "little", "none"]
    description: str


class RingFile(SurfaceHeader, kw_only=True):
    layout: dict[str, str]
    states: list[RingState]
    writer_steps: list[Step]
    reader_steps: list[Step]
    framing: list[FramingField]
    constants: dict[str, int | float | str]
    clauses: list[Clause]
    #: The globals a reader's unpickler may load: ``module.name`` exactly, or ``module.*`` for
    #: any class under ``module`` (clause ring.payload.pickle-allow-list).
    pickle_allowed_globals: list[str] = msgspec.field(default_factory=list)


# --- structs -----------------------------------------------------------------------------

Encoding = Literal["array", "map", "dataclass", "tuple"]


class FieldSpec(_Strict, kw_only=True):
    name: str
    #: Type expression, see :mod:`enginewire.spec.types`.
    type: str
    #: Present in every encoding (no default).
    required: bool = False
    #: The default as a JSON literal (``"null"``, ``"0"``, ``"[]"``, ``"\"abc\""``).
    default: str | None = None
    #: ``list``, ``dict`` or ``set`` for a fresh empty container.
    default_factory: Literal["list", "dict", "set"] | None = None
    versions: str | None = None
    description: str = ""
    #: Fields with a leading underscore are private: msgspec still encodes them.
    source: str | None = None


class StructConstraint(_Strict, kw_only=True):
    """A rule over several fields of one struct that a type expression cannot say.

    ``exactly-one-of``: exactly one of ``fields`` is non-nil (the others are nil).
    """

    kind: Literal["exactly-one-of"]
    fields: list[str]
    clause: str


class TaggedUnion(_Strict, kw_only=True):
    """A field that travels as ``[tag, value]`` where the tag names the value's struct.

    ``tags`` maps each tag on the wire to the struct it selects; a decoder rejects any other
    tag (``clause``).
    """

    field: str
    clause: str
    source: str
    tags: dict[str, str]


class StructSpec(_Strict, kw_only=True):
    name: str
    kind: Literal["struct"] = "struct"
    encoding: Encoding
    versions: str
    source: str
    #: The Python class in vLLM (``module:QualName``), used by ``spec diff``.
    vllm_class: str
    description: str
    omit_defaults: bool = False
    fields: list[FieldSpec]
    #: Rules over several fields (``[[constraints]]``), each naming its clause.
    constraints: list[StructConstraint] = []
    #: Fields that travel as ``[tag, value]`` (``[[tagged_unions]]``).
    tagged_unions: list[TaggedUnion] = []


class EnumMember(_Strict, kw_only=True):
    name: str
    value: int | str
    versions: str | None = None


class EnumSpec(_Strict, kw_only=True):
    name: str
    kind: Literal["enum"] = "enum"
    #: How a member travels: ``int`` (IntEnum value), ``str`` (Enum of strings) or ``bytes``.
    wire: Literal["int", "str", "bytes"]
    versions: str
    source: str
    vllm_class: str
    description: str
    members: list[EnumMember]


class StructsFile(SurfaceHeader, kw_only=True):
    """``structs.toml``: the clauses of the struct surface; the layouts live beside it."""

    clauses: list[Clause]


SURFACE_SCHEMAS: dict[str, type[SurfaceHeader]] = {
    "transport": TransportFile,
    "frames": FramesFile,
    "request_types": RequestTypesFile,
    "identity": IdentityFile,
    "handshake": HandshakeFile,
    "tensors": TensorsFile,
    "ring": RingFile,
    "structs": StructsFile,
}
