"""The statistics every benchmark reports with: one percentile rule, medians and spread over
rounds.

Percentiles are nearest-rank on ``round(q * (n - 1))``: a reported p99 is always a value that
was measured, never an interpolation between two, so it can be found in the raw data.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = ["interval", "median", "percentile", "spread"]


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


def interval(
    values: Sequence[float], rng: random.Random, confidence: float = 0.95, draws: int = 2000
) -> tuple[float, float] | None:
    """A ``confidence`` interval of the median of ``values`` (per-round figures): the percentile
    bootstrap, ``draws`` resamples drawn with ``rng`` (a seeded one gives the same interval for
    the same values). ``None`` for fewer than two values: one round says nothing of the spread."""
    if len(values) < 2:
        return None
    n = len(values)
    medians = sorted(
        median([values[rng.randrange(n)] for _ in range(n)]) or 0.0 for _ in range(draws)
    )
    tail = (1 - confidence) / 2
    low = percentile(medians, tail)
    high = percentile(medians, 1 - tail)
    assert low is not None and high is not None
    return low, high
