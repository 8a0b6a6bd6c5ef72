"""The statistics every benchmark reports with: one percentile rule, medians and spread over
rounds.

Percentiles are nearest-rank on ``round(q * (n - 1))``: a reported p99 is always a value that
was measured, never an interpolation between two, so it can be found in the raw data.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["median", "percentile", "spread"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 <= q <= 1) of ``values``; ``None`` for no values
    (JSON has no NaN, and a missing figure must not read as zero)."""
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def median(values: Sequence[float]) -> float | None:
    """The median as :func:`percentile` reads it (a measured value); ``None`` for none."""
    return percentile(values, 0.5)


def spread(values: Sequence[float]) -> tuple[float, float] | None:
    """(lowest, highest) of the per-round values: how far one round can be from another on this
    machine; ``None`` for none."""
    if not values:
        return None
    return min(values), max(values)
