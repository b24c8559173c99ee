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
"""``(channel, front end's address) -> address to put in its place``; channel is ``input`` or
``output``."""


def init_addresses(payload: bytes) -> tuple[list[str], list[str]] | None:
    """The front end's ``(inputs, outputs)`` inside an init payload, or None if it has none."""
    try:
        addresses = msgspec.msgpack.decode(payload)["addresses"]
        return list(addresses["inputs"]), list(addresses["outputs"])
    except (msgspec.DecodeError, KeyError, TypeError, IndexError):
        return None


def rewrite_init(payload: bytes, substitute: Substitute) -> bytes:
    """``payload`` with each input and output address replaced by ``substitute``'s answer."""
    found = init_addresses(payload)
    if found is None:
        return payload
    inputs, outputs = found
    new_inputs = [substitute("input", a) for a in inputs]
    new_outputs = [substitute("output", a) for a in outputs]
    if new_inputs == inputs and new_outputs == outputs:
        return payload
    metadata = msgspec.msgpack.decode(payload)
    metadata["addresses"]["inputs"] = new_inputs
    metadata["addresses"]["outputs"] = new_outputs
    return msgspec.msgpack.encode(metadata)
