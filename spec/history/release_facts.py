"""What one release's engine and front end say during start-up, read from the history.

The structs of a release come from :func:`enginewire.spec.load` (``load(version)``); the
handshake keys and the form of the ready response live in ``history/constants.toml``
(derived from the wheels by :mod:`.protocol_facts`). These functions answer for one release:

- :func:`handshake_keys_at`: the keys of the engine's HELLO or READY map, ``(required,
  optional)``, or None where the release has no HELLO/READY handshake;
- :func:`request_types_at`: the request type bytes the release knows, name -> byte;
- :func:`ready_response_at`: the engine's first message on each input DEALER: ``struct`` (a
  msgpack ``EngineCoreReadyResponse``), ``empty`` (an empty frame), ``READY`` (the literal
  bytes) or ``none``;
- :func:`conversation_gap`: why the reference peers and the suite's peers cannot hold a
  start-up conversation in a release's terms (None when they can): the release has no
  HELLO/READY handshake, a HELLO or READY without one of status, local and headless, no
  ``EngineHandshakeMetadata`` for its init message in the spec, or a
  ready response that is neither a struct nor an empty frame.

At the reference release (:data:`~enginewire.spec.loader.REFERENCE_VLLM_VERSION`) the
handshake surface (``spec/data/handshake.toml``) is authoritative; the history's newest row
agrees with it (:mod:`.consistency`).
"""

from __future__ import annotations

from typing import Any

from .constants import constants_at

#: The keys every HELLO and READY carries in every release that has the handshake.
BASE_KEYS = ("status", "local", "headless")


def handshake_keys_at(version: str, status: str) -> tuple[list[str], list[str]] | None:
    """``(required, optional)`` keys of the engine's ``status`` (``HELLO``/``READY``) map at
    ``version``, or None where the release sends no such map."""
    table = constants_at(version, "handshake")
    entry = table.get(status)
    if not entry:
        return None
    return list(entry.get("required", [])), list(entry.get("optional", []))


def request_types_at(version: str) -> dict[str, int]:
    """The release's EngineCoreRequestType table, name -> byte ({} where not derived)."""
    return {str(k): int(v) for k, v in constants_at(version, "request_types").items()}


def ready_response_at(version: str) -> str:
    """``struct``, ``empty``, ``READY`` or ``none`` (see the module docstring)."""
    return str(constants_at(version, "ready_response").get("payload", "none"))


def conversation_gap(spec: Any) -> str | None:
    """Why a start-up conversation in the terms of ``spec``'s release is not possible, or
    None. ``spec``: a loaded spec (``load(version)``)."""
    version = spec.version
    if handshake_keys_at(version, "HELLO") is None:
        return (f"vLLM {version} has no HELLO/READY handshake (history/constants.toml "
                "[[handshake]] is empty for it)")
    for status in ("HELLO", "READY"):
        keys = handshake_keys_at(version, status) or ([], [])
        lacking = [k for k in BASE_KEYS if k not in keys[0]]
        if lacking:
            return (f"vLLM {version}'s {status} has no {', '.join(lacking)} key "
                    "(history/constants.toml [[handshake]]): the conversations are held with "
                    f"the {'/'.join(BASE_KEYS)} HELLO and READY of later releases")
    if "EngineHandshakeMetadata" not in spec.structs:
        return (f"vLLM {version} has no EngineHandshakeMetadata: its init message has no "
                "layout in the spec")
    form = ready_response_at(version)
    if form not in ("struct", "empty"):
        return (f"vLLM {version}'s engine sends no ready response frame on its input DEALER "
                f"(history/constants.toml [[ready_response]]: {form})")
    return None
