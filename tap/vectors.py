"""A recording's messages as golden vectors (the format :mod:`enginewire.conformance.oracle.golden`
reads and ``check_vector`` checks).

Each message that decoded without a violation becomes one vector: ``kind`` the message kind,
``vllm_version`` the release it was decoded with, ``value`` its decoded value, ``frames`` the
recorded frames (the routing identity is not part of a message's frames), ``threshold`` the
release's default. Named ``<stem>_<index>_<kind>``; messages with violations are left out
(a vector must decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from enginewire.conformance.oracle.golden import GoldenVector, write_vector

from .annotate import Annotation
from .releases import codec_for


def vectors(annotations: Sequence[Annotation], stem: str) -> list[GoldenVector]:
    """The golden vectors of the annotations that decoded cleanly."""
    found = []
    for index, annotation in enumerate(annotations):
        if annotation.kind is None or annotation.violations:
            continue
        record = annotation.record
        found.append(GoldenVector(
            name=f"{stem}_{index:04d}_{annotation.kind}",
            kind=annotation.kind,
            threshold=codec_for(annotation.release).threshold,
            description=(f"recorded by enginewire tap: {record.channel} message from the "
                         f"{record.sender}"),
            vllm_version=annotation.release,
            value=annotation.value,
            frames=record.frames,
        ))
    return found


def write_vectors(annotations: Sequence[Annotation], directory: Path, stem: str) -> list[Path]:
    """Write :func:`vectors` under ``directory``; their paths."""
    return [write_vector(v, directory) for v in vectors(annotations, stem)]
