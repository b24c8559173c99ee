"""What one release's engine and front end say during start-up, read from the history.

The structs of a release come from :func:`enginewire.spec.load` (``load(version)``); the
handshake keys and the form of the ready response live in ``history/constants.toml``
(derived from the wheels by :mod:`.protocol_facts`). These functions answer for one release:

- :func:`handshake_keys_at`: the keys of the engine's HELLO or READY map, ``(required,
  optional)``, or None where the release has no HELLO/READY handshake;
- :func:`handshake_message_at`: the release's HELLO or READY as a typed message spec (the
  handshake surface's shape), what the engines and front ends of that release send and
  require;
- :func:`engine_handshake_map`: the HELLO or READY map an engine of the release sends;
- :func:`request_types_at`: the request type bytes the history records for the release, name
  -> byte (``load(version)``'s request_types surface is the same table: the spec check holds
  them together);
- :func:`ready_response_at`: the engine's first message on each input DEALER: ``struct`` (a
  msgpack ``EngineCoreReadyResponse``), ``empty`` (an empty frame), ``READY`` (the literal
  bytes) or ``none``;
- :func:`transport_at`: the input and output channels of the release (:class:`Transport`:
  each end's socket type, which end binds, whether the input carries the engine's identity,
  one socket pair per engine or per client, how the engine says it is ready), or None where
  the history has no row for it;
- :func:`conversation_gap`: why the reference peers and the suite's peers cannot hold a
  start-up conversation in a release's terms (None when they can): the release has no
  HELLO/READY handshake and signals readiness in no form the peers speak with addresses given
  directly (a process pipe and ``b"READY"`` on input they do), an init message that is no
  ``EngineHandshakeMetadata`` (0.9.0's plain map, :func:`init_message_at`), or a ready
  response that is neither a struct nor an empty frame;
- :func:`init_message_at`: how the release's engine reads the init message;
- :func:`handshake_gap`, :func:`wire_ready_gap`, :func:`ready_response_gap`,
  :func:`identity_gap`, :func:`clients_gap`: why a check of the handshake, of the ready
  message on the wire, of a ready response of its own (not READY), of the engine identity on
  the input channel or of several clients per engine does not apply at a release (None: it
  does), from its ``[[transport]]`` and ``[[ready_response]]`` rows;
- :func:`utility_payload_at`, :func:`utility_value`, :func:`utility_fields`: the UTILITY
  payload's items at a release (no client index up to 0.9.0) and a payload in that form;
- :func:`pickle_opt_in_since`, :func:`pickle_opt_in_gap`, :func:`pickle_free_gap`: the
  release that introduced the insecure-serialization opt-in (``[[pickle_opt_in]]``: 0.9.0),
  and why a check of the opt-in (a release without it) or of pickle without it (a release
  with it) does not apply;
- :func:`engine_core_dead_at`, :func:`dp_coordinator_at`, :func:`request_type_gap`,
  :func:`message_gap`: the sentinel a dying engine sends (``[[engine_core_dead]]``: 0.8.5
  on), the DP coordinator (``[[dp_coordinator]]``: 0.9.1 on), and why a message kind of the
  frames surface does not exist at a release (a request whose type the release's table
  lacks, START_DP_WAVE before 0.8.5; ENGINE_CORE_DEAD before its sentinel; every kind on a
  channel the DP coordinator owns before the coordinator);
- :func:`handshake_on_input`, :func:`init_message_value`, :func:`init_addresses`: a release
  that holds the handshake on its input socket (0.9.0: HELLO, a plain init map naming the
  output, READY as the ready response) and its init message in the release's form.

At the reference release (:data:`~enginewire.spec.loader.REFERENCE_VLLM_VERSION`) the
handshake and transport surfaces (``spec/data/handshake.toml``, ``transport.toml``) are
authoritative; the history's newest rows agree with them (:mod:`.consistency`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..loader import REFERENCE_VLLM_VERSION, UTILITY_ITEM_TYPES, load
from ..schema import HandshakeMessage, MapKey
from ..versions import format_version
from .constants import constant_rows, constants_at

#: The HELLO/READY keys whose values are the engine's own state (the message kind, where it
#: runs, whether it was started headless); every other key reports a value (READY's
#: num_gpu_blocks, parallel_config_hash, ...). ``headless`` came in 0.10.0.
STATE_KEYS = ("status", "local", "headless")


def handshake_keys_at(version: str, status: str) -> tuple[list[str], list[str]] | None:
    """``(required, optional)`` keys of the engine's ``status`` (``HELLO``/``READY``) map at
    ``version``, or None where the release sends no such map."""
    table = constants_at(version, "handshake")
    entry = table.get(status)
    if not entry:
        return None
    return list(entry.get("required", [])), list(entry.get("optional", []))


def handshake_message_at(spec: Any, status: str) -> HandshakeMessage | None:
    """The ``status`` (``HELLO``/``READY``) message of ``spec``'s release, or None where the
    release has no HELLO/READY handshake.

    At the reference release: the handshake surface's message. Elsewhere: the history's keys
    (:func:`handshake_keys_at`), each typed as the handshake surface types a key of that name
    in any message, or else as the reference ``EngineCoreReadyResponse`` field of that name
    (num_gpu_blocks and dp_stats_address: READY keys of 0.9.0-0.19.1 whose values moved into
    the ready response in 0.20.0)."""
    reference = load()
    messages = {m.name: m for m in reference.surface("handshake").messages}
    if spec.version == REFERENCE_VLLM_VERSION:
        return messages.get(status)
    keys = handshake_keys_at(spec.version, status)
    if keys is None:
        return None
    surface_keys = {k.name: k for m in messages.values() for k in m.keys}
    response = reference.struct("EngineCoreReadyResponse")
    fields = {f.name: f.type for f in response.fields}
    out: list[MapKey] = []
    for names, required in ((keys[0], True), (keys[1], False)):
        for name in names:
            known = surface_keys.get(name)
            if known is not None:
                value = status if name == "status" else known.value
                out.append(MapKey(name=name, type=known.type, required=required,
                                  description=known.description, value=value))
            elif name in fields:
                out.append(MapKey(name=name, type=fields[name], required=required,
                                  description=f"{status} key of vLLM {spec.version}, typed as "
                                  f"EngineCoreReadyResponse.{name}"))
            else:
                raise ValueError(f"vLLM {spec.version}'s {status} key {name!r} has no type: "
                                 "neither the handshake surface nor EngineCoreReadyResponse "
                                 "has it")
    template = messages[status]
    return HandshakeMessage(name=template.name, channel=template.channel,
                            sender=template.sender,
                            description=f"{status} of vLLM {spec.version} "
                            "(history/constants.toml [[handshake]])", keys=out)


def engine_handshake_map(message: HandshakeMessage, *, local: bool, headless: bool,
                         values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The map an engine sends for ``message`` (from :func:`handshake_message_at`): status,
    local, headless where the release has that key, then every other required key from
    ``values`` (a ``KeyError`` names a missing one) and the optional keys ``values`` holds."""
    state = {"status": message.name, "local": local, "headless": headless}
    values = values or {}
    out: dict[str, Any] = {}
    for key in message.keys:
        if key.name in STATE_KEYS:
            out[key.name] = state[key.name]
        elif key.required:
            if key.name not in values:
                raise KeyError(f"{message.description} requires the key {key.name!r}")
            out[key.name] = values[key.name]
        elif key.name in values:
            out[key.name] = values[key.name]
    return out


def request_types_at(version: str) -> dict[str, int]:
    """The release's EngineCoreRequestType table, name -> byte ({} where not derived)."""
    return {str(k): int(v) for k, v in constants_at(version, "request_types").items()}


def ready_response_at(version: str) -> str:
    """``struct``, ``empty``, ``READY`` or ``none`` (see the module docstring)."""
    return str(constants_at(version, "ready_response").get("payload", "none"))


#: Readiness forms of ``[[transport]]`` (see :mod:`.transport_facts`).
HANDSHAKE_READINESS = ("handshake", "handshake-on-input")


@dataclass(frozen=True)
class ChannelEnds:
    """One channel's two ends: the socket type of each and which one binds."""

    frontend: str
    engine: str
    #: ``frontend`` or ``engine``.
    binds: str

    def socket(self, role: str) -> str:
        """The socket type of ``role``'s end (``frontend`` or ``engine``)."""
        return self.frontend if role == "frontend" else self.engine

    def role_binds(self, role: str) -> bool:
        return self.binds == role


@dataclass(frozen=True)
class Transport:
    """A release's input and output channels (history/constants.toml ``[[transport]]``)."""

    version: str
    input: ChannelEnds
    output: ChannelEnds
    #: Whether the engine's input socket carries its 2-byte identity (a ROUTER routes by it).
    identity: bool
    #: ``per-client`` (an input/output pair per front-end client) or ``one``.
    clients: str
    #: ``handshake``, ``handshake-on-input``, ``input-literal``, ``pipe`` or ``none``.
    readiness: str

    @property
    def handshake(self) -> bool:
        """Whether the release runs the HELLO/READY handshake."""
        return self.readiness in HANDSHAKE_READINESS

    def channel(self, name: str) -> ChannelEnds:
        return self.input if name == "input" else self.output


def transport_at(version: str) -> Transport | None:
    """The release's :class:`Transport`, or None where the history has no row for it."""
    row = constants_at(version, "transport")
    if not row.get("input") or not row.get("output"):
        return None
    ends = {name: ChannelEnds(str(row[name]["frontend"]), str(row[name]["engine"]),
                              str(row[name]["binds"])) for name in ("input", "output")}
    return Transport(version, ends["input"], ends["output"],
                     bool(row["input"].get("identity")), str(row.get("clients", "one")),
                     str(row.get("readiness", "none")))


def init_message_at(version: str) -> dict[str, Any]:
    """How the release's engine reads the init message: ``{"form": "struct", "struct":
    name}``, ``{"form": "map", "keys": [...]}`` (0.9.0) or ``{"form": "none"}``
    (history/constants.toml [[init_message]])."""
    return dict(constants_at(version, "init_message")) or {"form": "none"}


def handshake_on_input(version: str) -> bool:
    """Whether the release's handshake runs on the input socket (0.9.0: the engine's input
    DEALER sends HELLO, reads the init map and sends READY, its ready response; the front end
    answers on its input ROUTER; history/constants.toml [[transport]] readiness
    ``handshake-on-input``)."""
    transport = transport_at(version)
    return transport is not None and transport.readiness == "handshake-on-input"


#: The init map's keys that name the engine's channels (the ``map`` form of
#: [[init_message]]); every other key is read as the ``parallel_config`` map.
INIT_MAP_OUTPUT_KEY = "output_socket_address"


def init_message_value(version: str, *, inputs: list[str], outputs: list[str],
                       parallel_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The init message a front end of ``version`` sends, as a plain value: the
    EngineHandshakeMetadata fields (``addresses`` of ``inputs`` and ``outputs``,
    ``parallel_config``) where the release decodes that struct, or the release's plain map
    (0.9.0: the first output address and ``parallel_config``; the input is the socket the
    handshake runs on)."""
    config = dict(parallel_config or {})
    init = init_message_at(version)
    if init.get("form") != "map":
        return {"addresses": {"inputs": list(inputs), "outputs": list(outputs)},
                "parallel_config": config}
    keys = list(init.get("keys", []))
    if INIT_MAP_OUTPUT_KEY not in keys or not outputs:
        raise ValueError(f"vLLM {version}'s init map has keys {keys}: no output address in "
                         f"{INIT_MAP_OUTPUT_KEY!r} (history/constants.toml [[init_message]])")
    values = {INIT_MAP_OUTPUT_KEY: outputs[0], "parallel_config": config}
    return {key: values[key] for key in keys}


def init_addresses(init: Mapping[str, Any], input_address: str | None) -> dict[str, list[Any]]:
    """The input and output addresses an engine reads from an init message of the ``map`` form
    (0.9.0): the socket the handshake ran on (``input_address``) and the map's output
    address."""
    return {"inputs": [input_address], "outputs": [init.get(INIT_MAP_OUTPUT_KEY)]}


#: The UTILITY payload's items at the reference release (the frames surface's utility).
UTILITY_ITEMS = ("client_index", "call_id", "method", "args")


def utility_payload_at(version: str) -> list[str]:
    """The UTILITY payload's items in order at ``version`` (history/constants.toml
    [[utility_payload]]): ``call_id, method, args`` up to 0.9.0, ``client_index`` first from
    0.9.1 (the reference release's where the history has no row)."""
    items = constants_at(version, "utility_payload").get("items")
    return [str(i) for i in items] if isinstance(items, list) else list(UTILITY_ITEMS)


def utility_payload_type(version: str) -> str:
    """The UTILITY payload's type expression at ``version`` (a tuple of its items' types; the
    loaded spec's frames surface carries it: :func:`enginewire.spec.load`)."""
    return f"tuple[{', '.join(UTILITY_ITEM_TYPES[i] for i in utility_payload_at(version))}]"


def utility_value(version: str, *, client_index: int, call_id: int, method: str,
                  args: Any) -> list[Any]:
    """The UTILITY payload a front end of ``version`` sends (its items, in its order)."""
    values = {"client_index": client_index, "call_id": call_id, "method": method,
              "args": args}
    return [values[item] for item in utility_payload_at(version)]


def utility_fields(version: str, payload: Any) -> dict[str, Any] | None:
    """A UTILITY payload of ``version`` by item name (``client_index`` 0 where the release
    sends none), or None where ``payload`` is no sequence of the release's item count."""
    items = utility_payload_at(version)
    if not isinstance(payload, list | tuple) or len(payload) != len(items):
        return None
    return {"client_index": 0, **dict(zip(items, payload, strict=True))}


def conversation_gap(spec: Any) -> str | None:
    """Why a start-up conversation in the terms of ``spec``'s release is not possible, or
    None. ``spec``: a loaded spec (``load(version)``)."""
    version = spec.version
    if handshake_keys_at(version, "HELLO") is None:
        return _direct_gap(version)
    init = init_message_at(version)
    if handshake_on_input(version) and init.get("form") == "map":
        return None  # 0.9.0: HELLO, the init map and READY on the input socket
    if "EngineHandshakeMetadata" not in spec.structs or init.get("form") != "struct":
        read = (f" (its init message is a plain map of {', '.join(init.get('keys', []))}, "
                "history/constants.toml [[init_message]])" if init.get("form") == "map" else "")
        where = (" and holds HELLO, init and READY on its input socket (history/constants.toml "
                 "[[ready_response]]: handshake)") if ready_response_at(version) == "handshake" \
            else ""
        return (f"vLLM {version} has no EngineHandshakeMetadata{read}{where}: the peers hold "
                "the handshake of a separate handshake socket and that struct")
    form = ready_response_at(version)
    if form not in ("struct", "empty"):
        return (f"vLLM {version}'s engine sends no ready response frame on its input DEALER "
                f"(history/constants.toml [[ready_response]]: {form})")
    return None


#: Readiness forms of a release without the handshake that the peers speak: given the input
#: and output addresses directly, an engine is ready once connected (``pipe``: the signal has
#: no wire form) or once its ``b"READY"`` came (``input-literal``).
DIRECT_READINESS = ("pipe", "input-literal")


def _direct_gap(version: str) -> str | None:
    """Why a release without the HELLO/READY handshake cannot be spoken with addresses given
    directly (None: it can)."""
    transport = transport_at(version)
    if transport is None or transport.readiness not in DIRECT_READINESS:
        form = transport.readiness if transport is not None else "no row"
        return (f"vLLM {version} has no HELLO/READY handshake, and its engine signals "
                f"readiness in no form the peers speak (history/constants.toml [[transport]]: "
                f"{form})")
    return None


def handshake_gap(version: str) -> str | None:
    """Why a check of the HELLO/READY handshake does not apply at ``version`` (None: it
    does)."""
    transport = transport_at(version)
    if transport is not None and not transport.handshake:
        how = {"pipe": "its engine signals readiness over a process pipe",
               "input-literal": 'its engine sends b"READY" on the input socket'}
        said = how.get(transport.readiness, transport.readiness)
        return (f"vLLM {version} has no HELLO/READY handshake ({said}; the front end gives "
                "it its addresses directly: history/constants.toml [[transport]])")
    return None


def wire_ready_gap(version: str) -> str | None:
    """Why a check of the engine's ready message on the input channel does not apply at
    ``version`` (None: the engine sends one)."""
    transport = transport_at(version)
    if transport is not None and transport.readiness == "pipe":
        return (f"vLLM {version}'s engine sends no ready message on the wire: it signals "
                "readiness to its parent process over a pipe (history/constants.toml "
                "[[transport]])")
    return None


def ready_response_gap(version: str) -> str | None:
    """Why a check of the engine's ready response as a message of its own (after READY, or
    without the handshake its ready message) does not apply at ``version`` (None: it does):
    no ready message on the wire (a pipe), or READY on the input socket is the ready response
    (0.9.0)."""
    gap = wire_ready_gap(version)
    if gap is None and ready_response_at(version) == "handshake":
        return (f"vLLM {version}'s engine sends no ready response of its own: its READY map on "
                "the input socket is its ready message (history/constants.toml "
                "[[ready_response]]: handshake)")
    return gap


def identity_gap(version: str) -> str | None:
    """Why a check of the engine identity on the input channel does not apply at
    ``version`` (None: the input carries it)."""
    transport = transport_at(version)
    if transport is not None and not transport.identity:
        return (f"vLLM {version}'s input channel carries no engine identity (front end "
                f"{transport.input.frontend}, engine {transport.input.engine}: "
                "history/constants.toml [[transport]])")
    return None


def clients_gap(version: str) -> str | None:
    """Why a check of several front-end clients per engine does not apply at ``version``
    (None: the engine opens an input/output pair per client)."""
    transport = transport_at(version)
    if transport is not None and transport.clients != "per-client":
        return (f"vLLM {version}'s engine opens one input and one output socket, not one pair "
                "per front-end client (history/constants.toml [[transport]])")
    return None


def pickle_opt_in_since() -> tuple[str, str] | None:
    """``(release, setting)``: the first release of the newest run of releases that guard
    pickle with an opt-in, and its setting (history/constants.toml ``[[pickle_opt_in]]``,
    newest range first); None where the newest release has none."""
    since: tuple[str, str] | None = None
    for versions, values in constant_rows("pickle_opt_in"):
        setting = values.get("setting")
        if not isinstance(setting, str) or setting == "none":
            break
        since = (format_version(versions.low), setting)
    return since


def pickle_opt_in_gap(spec: Any) -> str | None:
    """Why a check of the insecure-serialization opt-in (pickle refused without it) does not
    apply at ``spec``'s release (None: the release has the opt-in)."""
    if spec.surface("tensors").pickle_opt_in is not None:
        return None
    since = pickle_opt_in_since()
    came = (f"{since[1]} came in vLLM {since[0]}" if since is not None
            else "no release of the history has one")
    return (f"vLLM {spec.version} has no insecure-serialization opt-in ({came}): both ends "
            "pickle and unpickle without one (tensors.pickle-without-opt-in; "
            "history/constants.toml [[pickle_opt_in]])")


def pickle_free_gap(spec: Any) -> str | None:
    """Why a check that pickle travels without any opt-in does not apply at ``spec``'s
    release (None: it does, the release has no opt-in)."""
    setting = spec.surface("tensors").pickle_opt_in
    if setting is None:
        return None
    since = pickle_opt_in_since()
    came = f", from vLLM {since[0]} on" if since is not None else ""
    return (f"vLLM {spec.version} pickles only with the opt-in {setting}{came} "
            "(tensors.ext-pickle-opt-in; history/constants.toml [[pickle_opt_in]])")


def engine_core_dead_at(version: str) -> bytes | None:
    """The bytes a dying engine of ``version`` sends as its last message on every output
    socket (``b"ENGINE_CORE_DEAD"``), or None where it sends none (history/constants.toml
    ``[[engine_core_dead]]``)."""
    literal = constants_at(version, "engine_core_dead").get("literal")
    return literal.encode("ascii") if isinstance(literal, str) and literal != "none" else None


def dp_coordinator_at(version: str) -> str | None:
    """The DP coordinator's class at ``version`` (``DPCoordinator``), or None where the
    release has no coordinator (history/constants.toml ``[[dp_coordinator]]``)."""
    name = constants_at(version, "dp_coordinator").get("class")
    return name if isinstance(name, str) and name != "none" else None


def _since(table: str, key: str) -> str | None:
    """The first release of the newest run of ``table``'s rows that hold a value under
    ``key`` (newest range first); None where the newest row holds none."""
    since: str | None = None
    for versions, values in constant_rows(table):
        value = values.get(key)
        if not isinstance(value, str) or value == "none":
            break
        since = format_version(versions.low)
    return since


def request_type_gap(spec: Any, kind: str) -> str | None:
    """Why the frames surface's message ``kind`` has no request type at ``spec``'s release
    (None: it has one, or it is no request): the release's table (the request_types surface
    of ``load(version)``) lacks the type the message names, as START_DP_WAVE before 0.8.5."""
    message = next((m for m in spec.surface("frames").messages if m.kind == kind), None)
    if message is None or message.request_type is None:
        return None
    table = spec.surface("request_types").types
    if any(t.name == message.request_type for t in table):
        return None
    known = ", ".join(f"{t.name} 0x{t.byte:02x}" for t in table)
    return (f"vLLM {spec.version} has no request type {message.request_type}, so no {kind} "
            f"message (its table: {known}; request_types.toml)")


def message_gap(spec: Any, kind: str) -> str | None:
    """Why the frames surface's message ``kind`` does not exist at ``spec``'s release (None:
    it does, or the history says nothing of it): a request whose request type the release's
    table lacks (:func:`request_type_gap`: START_DP_WAVE before 0.8.5), ``engine_core_dead``
    where the release's engine has no sentinel, and every kind on a channel the DP
    coordinator owns (a channel with a ``coordinator`` end: coordinator_input,
    coordinator_output, stats_publish) where the release has no coordinator."""
    version = spec.version
    gap = request_type_gap(spec, kind)
    if gap is not None:
        return gap
    if kind == "engine_core_dead" and engine_core_dead_at(version) is None:
        since = _since("engine_core_dead", "literal")
        came = f": the sentinel came in vLLM {since}" if since is not None else ""
        return (f"vLLM {version} has no ENGINE_CORE_DEAD (its engine dies without a last "
                f"message on the output socket{came}; history/constants.toml "
                "[[engine_core_dead]])")
    message = next((m for m in spec.surface("frames").messages if m.kind == kind), None)
    if message is None or dp_coordinator_at(version) is not None:
        return None
    owned = {c.name for c in spec.surface("transport").channels
             if any(e.role == "coordinator" for e in c.ends)}
    if message.channel not in owned:
        return None
    since = _since("dp_coordinator", "class")
    came = f": vllm/v1/engine/coordinator.py came in vLLM {since}" if since is not None else ""
    return (f"vLLM {version} has no DP coordinator{came}, so no {kind} message: no "
            f"{message.channel} channel (history/constants.toml [[dp_coordinator]])")
