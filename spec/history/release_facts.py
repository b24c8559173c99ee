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
- :func:`request_types_at`: the request type bytes the release knows, name -> byte;
- :func:`ready_response_at`: the engine's first message on each input DEALER: ``struct`` (a
  msgpack ``EngineCoreReadyResponse``), ``empty`` (an empty frame), ``READY`` (the literal
  bytes) or ``none``;
- :func:`conversation_gap`: why the reference peers and the suite's peers cannot hold a
  start-up conversation in a release's terms (None when they can): the release has no
  HELLO/READY handshake, an init message that is no ``EngineHandshakeMetadata`` (0.9.0's
  plain map, :func:`init_message_at`), or a ready response that is neither a struct nor an
  empty frame;
- :func:`init_message_at`: how the release's engine reads the init message.

At the reference release (:data:`~enginewire.spec.loader.REFERENCE_VLLM_VERSION`) the
handshake surface (``spec/data/handshake.toml``) is authoritative; the history's newest row
agrees with it (:mod:`.consistency`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..loader import REFERENCE_VLLM_VERSION, load
from ..schema import HandshakeMessage, MapKey
from .compat import constants_at

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


def init_message_at(version: str) -> dict[str, Any]:
    """How the release's engine reads the init message: ``{"form": "struct", "struct":
    name}``, ``{"form": "map", "keys": [...]}`` (0.9.0) or ``{"form": "none"}``
    (history/constants.toml [[init_message]])."""
    return dict(constants_at(version, "init_message")) or {"form": "none"}


def conversation_gap(spec: Any) -> str | None:
    """Why a start-up conversation in the terms of ``spec``'s release is not possible, or
    None. ``spec``: a loaded spec (``load(version)``)."""
    version = spec.version
    if handshake_keys_at(version, "HELLO") is None:
        return (f"vLLM {version} has no HELLO/READY handshake (history/constants.toml "
                "[[handshake]] is empty for it)")
    init = init_message_at(version)
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
