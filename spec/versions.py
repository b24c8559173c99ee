"""Version ranges in the style of Kafka's message specs.

A range is written as one of:

- ``"0.8.0+"``: that version and every later one;
- ``"0.8.0-0.32.9"``: both ends inclusive;
- ``"0.33.0"``: exactly that version.

Versions are dotted integers (``major.minor.patch``); shorter forms are padded with zeros.
"""

from __future__ import annotations

import re

import msgspec

_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")


class VersionError(ValueError):
    """A version or version range string is malformed."""


def parse_version(text: str) -> tuple[int, int, int]:
    """Parse ``"0.33.0"`` into ``(0, 33, 0)``; raise :class:`VersionError` otherwise."""
    text = text.strip()
    if not _VERSION.match(text):
        raise VersionError(f"expected a version like '0.33.0', got {text!r}")
    parts = [int(p) for p in text.split(".")]
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def format_version(version: tuple[int, int, int]) -> str:
    return ".".join(str(p) for p in version)


class VersionRange(msgspec.Struct, frozen=True):
    """An inclusive range of versions; ``high`` is None for an open range."""

    low: tuple[int, int, int]
    high: tuple[int, int, int] | None

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        text = text.strip()
        if text.endswith("+"):
            return cls(parse_version(text[:-1]), None)
        if "-" in text:
            low_text, high_text = text.split("-", 1)
            low, high = parse_version(low_text), parse_version(high_text)
            if high < low:
                raise VersionError(f"range {text!r} ends before it starts")
            return cls(low, high)
        exact = parse_version(text)
        return cls(exact, exact)

    def __contains__(self, version: object) -> bool:
        if isinstance(version, str):
            version = parse_version(version)
        if not isinstance(version, tuple):
            return False
        return self.low <= version and (self.high is None or version <= self.high)

    def overlaps(self, other: VersionRange) -> bool:
        """Whether some version lies in both ranges."""
        return (self.high is None or other.low <= self.high) and (
            other.high is None or self.low <= other.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{format_version(self.low)}+"
        if self.high == self.low:
            return format_version(self.low)
        return f"{format_version(self.low)}-{format_version(self.high)}"
