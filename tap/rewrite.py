"""The one rewrite the tap makes (sans-IO): the addresses inside a handshake init message.

:func:`rewrite_init` takes the init's payload frame and a function from each of the front
end's input / output addresses to the address that should stand in its place, and returns the
new payload. The payload is decoded as a generic msgpack map and written back, so every other
key, its value and the keys' order stay as the front end wrote them. A payload that is no
such map comes back unchanged (the annotator flags it); so does one whose addresses all map to
themselves.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

Substitute = Callable[[str, str], str]
"""``(channel, front end's address) -> address to put in its place``; channel is ``input``,
``output``, ``coordinator_input`` or ``coordinator_output`` (the DP coordinator's, where the
init names one)."""

#: The single-address keys of EngineZmqAddresses that are rewritten, where not nil.
COORDINATOR_KEYS = ("coordinator_input", "coordinator_output")


def init_addresses(payload: bytes) -> tuple[list[str], list[str]] | None:
    """The front end's ``(inputs, outputs)`` inside an init payload, or None if it has none."""
    try:
        addresses = msgspec.msgpack.decode(payload)["addresses"]
        return list(addresses["inputs"]), list(addresses["outputs"])
    except (msgspec.DecodeError, KeyError, TypeError, IndexError):
        return None


def rewrite_init(payload: bytes, substitute: Substitute) -> bytes:
    """``payload`` with each input and output address, and the DP coordinator's addresses
    where set, replaced by ``substitute``'s answer."""
    found = init_addresses(payload)
    if found is None:
        return payload
    inputs, outputs = found
    metadata = msgspec.msgpack.decode(payload)
    addresses = metadata["addresses"]
    changed: dict[str, str | list[str]] = {
        "inputs": [substitute("input", a) for a in inputs],
        "outputs": [substitute("output", a) for a in outputs]}
    for key in COORDINATOR_KEYS:
        if isinstance(addresses.get(key), str):
            changed[key] = substitute(key, addresses[key])
    if all(addresses.get(key) == value for key, value in changed.items()):
        return payload
    addresses.update(changed)
    return msgspec.msgpack.encode(metadata)
