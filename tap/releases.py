"""Releases: the codec of a vLLM release, and which other releases would explain a violation.

:func:`codec_for` is the only way the tap turns a ``--version`` into a codec: it builds the
reference :class:`~enginewire.reference.codec.Codec` on ``enginewire.spec.load(version)``, so
once the spec loads per-release layouts every tap command follows them without change here.

:func:`explain` is the hook for the history: given a message that breaks a clause under one
release, it returns the releases under whose layouts the same frames decode cleanly (each one,
with the release the tap was told, is a release pair that explains the skew). Candidates come
from :func:`known_releases`: the releases the spec's history was derived from
(``spec/data/history/releases.toml``, read by ``enginewire.spec.history.wheels``), or only the
reference release where a spec has no history.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from enginewire.reference.codec import Codec
from enginewire.reference.errors import ProtocolError
from enginewire.spec.loader import REFERENCE_VLLM_VERSION

DEFAULT_RELEASE = REFERENCE_VLLM_VERSION


class UnknownRelease(ValueError):
    """A release the spec cannot load layouts for."""


@lru_cache(maxsize=1)
def known_releases() -> tuple[str, ...]:
    """Every release whose layouts the installed spec can load, oldest first."""
    from enginewire.spec.history.wheels import read_releases
    from enginewire.spec.loader import DATA_DIR

    return tuple(read_releases(DATA_DIR)) or (DEFAULT_RELEASE,)


@lru_cache(maxsize=64)
def codec_for(version: str | None = None) -> Codec:
    """The codec of ``version`` (default: the reference release), decoding tensors as
    :class:`~enginewire.reference.tensors.WireTensor` (a tap shows what travels: it needs no
    torch) and tensor IPC handles."""
    version = version or DEFAULT_RELEASE
    known = known_releases()
    if version not in known:
        raise UnknownRelease(
            f"no layouts for release {version!r}: this spec knows {known[0]} to {known[-1]} "
            f"({len(known)} releases; `enginewire spec releases` lists them)"
        )
    try:
        return Codec(version=version, tensors="wire", ipc_handles=True)
    except Exception as exc:  # the loader's own errors name the file and field
        raise UnknownRelease(f"release {version!r} does not load: {exc}") from exc


def explain(
    channel: str, frames: Sequence[Any], sender: str, version: str
) -> list[str]:
    """The releases other than ``version`` under whose layouts ``frames`` decode without a
    protocol error (empty where the history knows no other release)."""
    found: list[str] = []
    for release in known_releases():
        if release == version:
            continue
        try:
            codec_for(release).decode_message(channel, frames, sender=sender)
        except (ProtocolError, UnknownRelease, KeyError):
            continue
        except Exception:  # a release without the message's types (UnknownTypeError, ...)
            continue
        found.append(release)
    return found
