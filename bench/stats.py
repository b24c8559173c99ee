"""Small statistics: medians with their spread over rounds, percentiles, paired ratios."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """The median of some values with their minimum and maximum."""

    median: float
    min: float
    max: float

    def to_builtins(self) -> dict[str, float]:
        return {"median": self.median, "min": self.min, "max": self.max}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks.

    Raises ``ValueError`` on an empty sequence.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median, min and max of the values that are not None; None when there are none."""
    found = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not found:
        return None
    return Spread(percentile(found, 50), min(found), max(found))


def paired_ratios(values: Sequence[float | None],
                  baseline: Sequence[float | None]) -> list[float | None]:
    """``values[i] / baseline[i]`` round by round (None where either is missing or the
    baseline is zero): both were measured in the same round, so drift cancels."""
    ratios: list[float | None] = []
    for value, base in zip(values, baseline, strict=False):
        if value is None or base is None or base == 0:
            ratios.append(None)
        else:
            ratios.append(value / base)
    return ratios
