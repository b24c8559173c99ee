"""Ring configurations and the schedule string that replays one execution.

A schedule string is ``TARGET/MODEL/CONFIG/CHOICES``, for example
``reference/sc/2x2x3/w*6,r0*4,r1,w``:

- ``CONFIG`` is ``READERSxCHUNKSxMESSAGES``, with ``xPAYLOAD`` appended when the payload of
  each message is not the default 2 bytes, and ``+N`` when each message carries N
  out-of-band buffers after its main buffer;
- ``CHOICES`` lists the actions in order, comma-separated, ``*N`` repeating one N times:
  ``w`` (the writer's next access), ``r0``/``r1``/... (that reader's next access), ``dw``/``dr0``
  (the oldest store in that thread's store buffer becomes visible, ``tso``), ``dw.5`` (the
  thread's store number 5 becomes visible, ``weak``). Past the last choice the execution
  goes on without preemption.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from enginewire.fuzz.explore.model import MemoryModel

DEFAULT_PAYLOAD_BYTES = 2
_CHOICE = re.compile(r"^(d?(?:w|r\d+)(?:\.\d+)?)(?:\*(\d+))?$")


@dataclass(frozen=True)
class RingConfig:
    """The size of one exploration: readers, chunks in the ring, messages the writer sends,
    bytes per message, and out-of-band buffers per message. Message ``seq`` is the byte
    ``seq + 1`` repeated (so stale or torn data shows as the wrong byte); with
    ``oob_buffers = N`` it has N more buffers (the ring's buffer lists: a pickle stream and
    its out-of-band buffers), buffer ``i`` the byte ``0x80 | (seq + 1)`` repeated
    ``payload_bytes + i`` times (every buffer of a message a different length, so a length
    prefix taken from the wrong buffer shows)."""

    readers: int = 2
    chunks: int = 2
    messages: int = 3
    payload_bytes: int = DEFAULT_PAYLOAD_BYTES
    oob_buffers: int = 0

    def __post_init__(self) -> None:
        for name in ("readers", "chunks", "messages", "payload_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.oob_buffers, int) or self.oob_buffers < 0:
            raise ValueError(f"oob_buffers must be a non-negative integer, got "
                             f"{self.oob_buffers!r}")
        if self.messages > 127:
            raise ValueError("at most 127 messages: message seq is the byte seq + 1")

    def payload(self, seq: int) -> bytes:
        return bytes((seq + 1,)) * self.payload_bytes

    def message(self, seq: int) -> list[bytes]:
        """The buffers of message ``seq``: its payload, then its out-of-band buffers."""
        extra = bytes((0x80 | (seq + 1),))
        return [self.payload(seq)] + [extra * (self.payload_bytes + 1 + i)
                                      for i in range(self.oob_buffers)]

    def messages_sent(self) -> list[list[bytes]]:
        return [self.message(seq) for seq in range(self.messages)]

    def payloads(self) -> list[bytes]:
        """What each reader must receive, message by message (:meth:`received_form` of the
        buffers)."""
        return [received_form(self.message(seq)) for seq in range(self.messages)]

    def spell(self) -> str:
        text = f"{self.readers}x{self.chunks}x{self.messages}"
        if self.payload_bytes != DEFAULT_PAYLOAD_BYTES:
            text += f"x{self.payload_bytes}"
        if self.oob_buffers:
            text += f"+{self.oob_buffers}"
        return text

    def describe(self) -> str:
        def plural(n: int, word: str) -> str:
            return f"{n} {word}" + ("" if n == 1 else "s")
        text = (f"{plural(self.readers, 'reader')} x {plural(self.chunks, 'chunk')} x "
                f"{plural(self.messages, 'message')}")
        if self.oob_buffers:
            text += f" (+{plural(self.oob_buffers, 'out-of-band buffer')} each)"
        return text

    @classmethod
    def parse(cls, text: str) -> RingConfig:
        sizes, plus, oob = text.partition("+")
        try:
            numbers = [int(part) for part in sizes.split("x")]
            extra = int(oob) if plus else 0
        except ValueError:
            numbers = []
        if len(numbers) not in (3, 4):
            raise ValueError(f"bad configuration {text!r}: expected READERSxCHUNKSxMESSAGES "
                             "with an optional xPAYLOAD_BYTES and +OOB_BUFFERS")
        return cls(*numbers, oob_buffers=extra)  # type: ignore[misc]


def received_form(buffers: list[bytes]) -> bytes:
    """One message's buffers as the bytes a reader reports (``ThreadContext.received``): the
    buffer itself for a one-buffer message, else every buffer after its 4-byte big-endian
    length (so buffers split at other places never look alike)."""
    if len(buffers) == 1:
        return bytes(buffers[0])
    return b"".join(len(b).to_bytes(4, "big") + bytes(b) for b in buffers)


def encode_choices(keys: Sequence[str]) -> str:
    parts: list[str] = []
    index = 0
    while index < len(keys):
        key = keys[index]
        run = 1
        while index + run < len(keys) and keys[index + run] == key:
            run += 1
        parts.append(key if run == 1 else f"{key}*{run}")
        index += run
    return ",".join(parts)


def decode_choices(text: str) -> list[str]:
    keys: list[str] = []
    if not text:
        return keys
    for part in text.split(","):
        match = _CHOICE.match(part.strip())
        if match is None:
            raise ValueError(f"bad schedule choice {part!r}: expected w, r0, dw, dr1.4, w*3, ...")
        keys.extend([match.group(1)] * int(match.group(2) or 1))
    return keys


@dataclass(frozen=True)
class Schedule:
    """Everything needed to replay one execution (see the module docstring)."""

    target: str
    model: MemoryModel
    config: RingConfig
    keys: tuple[str, ...]

    def __str__(self) -> str:
        return (f"{self.target}/{self.model.value}/{self.config.spell()}/"
                f"{encode_choices(self.keys)}")

    @classmethod
    def parse(cls, text: str) -> Schedule:
        parts = text.strip().rsplit("/", 3)
        if len(parts) != 4:
            raise ValueError(f"bad schedule {text!r}: expected TARGET/MODEL/CONFIG/CHOICES")
        target, model, config, choices = parts
        return cls(target, MemoryModel.parse(model), RingConfig.parse(config),
                   tuple(decode_choices(choices)))
