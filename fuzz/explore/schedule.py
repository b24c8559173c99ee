"""Ring configurations and the schedule string that replays one execution.

A schedule string is ``TARGET/MODEL/CONFIG/CHOICES``, for example
``reference/sc/2x2x3/w*6,r0*4,r1,w``:

- ``CONFIG`` is ``READERSxCHUNKSxMESSAGES``, with ``xPAYLOAD`` appended when the payload of
  each message is not the default 2 bytes;
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
    and bytes per message. Message ``seq`` is the byte ``seq + 1`` repeated (so stale or torn
    data shows as the wrong byte)."""

    readers: int = 2
    chunks: int = 2
    messages: int = 3
    payload_bytes: int = DEFAULT_PAYLOAD_BYTES

    def __post_init__(self) -> None:
        for name in ("readers", "chunks", "messages", "payload_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.messages > 255:
            raise ValueError("at most 255 messages: message seq is the byte seq + 1")

    def payload(self, seq: int) -> bytes:
        return bytes((seq + 1,)) * self.payload_bytes

    def payloads(self) -> list[bytes]:
        return [self.payload(seq) for seq in range(self.messages)]

    def spell(self) -> str:
        text = f"{self.readers}x{self.chunks}x{self.messages}"
        if self.payload_bytes != DEFAULT_PAYLOAD_BYTES:
            text += f"x{self.payload_bytes}"
        return text

    def describe(self) -> str:
        def plural(n: int, word: str) -> str:
            return f"{n} {word}" + ("" if n == 1 else "s")
        return (f"{plural(self.readers, 'reader')} x {plural(self.chunks, 'chunk')} x "
                f"{plural(self.messages, 'message')}")

    @classmethod
    def parse(cls, text: str) -> RingConfig:
        try:
            numbers = [int(part) for part in text.split("x")]
        except ValueError:
            numbers = []
        if len(numbers) not in (3, 4):
            raise ValueError(f"bad configuration {text!r}: expected READERSxCHUNKSxMESSAGES "
                             "with an optional xPAYLOAD_BYTES")
        return cls(*numbers)


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
