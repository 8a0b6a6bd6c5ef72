"""The histograms the gateway observes once per request, when its access line is written,
never per chunk: their specs (:data:`HISTOGRAMS`) and their counts, plain numbers read at
scrape time (:mod:`streamsafe.gateway.metrics.exposition`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HISTOGRAMS", "Histogram", "HistogramSpec", "Histograms"]


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    """A histogram the gateway observes once per request: its name (without the prefix), help
    text and bucket bounds."""

    name: str
    doc: str
    buckets: tuple[float, ...]


#: Every histogram, in the order ``/metrics`` lists them.
HISTOGRAMS = (
    HistogramSpec(
        "time_to_first_token_seconds",
        "Streamed completions: seconds from the request to the first event of its generation "
        "(attached requests: from their own arrival)",
        (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    ),
    HistogramSpec(
        "admission_wait_seconds",
        "Seconds a new generation waited for admission (queue and limits) before going upstream",
        (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0),
    ),
    HistogramSpec(
        "request_duration_seconds",
        "Seconds from a completion request's arrival to the end of its answer",
        (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
    ),
    HistogramSpec(
        "completion_tokens",
        "Completion tokens of each generation answered whole, where its usage says",
        (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    ),
)


class Histogram:
    """Bucket counts and a sum, as plain numbers (no lock: observed on the event loop, read at
    scrape time)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """One more observation of ``value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as Prometheus wants them, ``+Inf`` last."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else f"{bound:g}", total))
        return out


class Histograms:
    """One :class:`Histogram` per :data:`HISTOGRAMS` entry, as attributes of the same name."""

    def __init__(self) -> None:
        self.all = {spec.name: Histogram(spec.buckets) for spec in HISTOGRAMS}
        self.time_to_first_token_seconds = self.all["time_to_first_token_seconds"]
        self.admission_wait_seconds = self.all["admission_wait_seconds"]
        self.request_duration_seconds = self.all["request_duration_seconds"]
        self.completion_tokens = self.all["completion_tokens"]
