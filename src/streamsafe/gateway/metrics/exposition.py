"""``/metrics``: every series the gateway exports, in Prometheus's text exposition.

The unlabelled series are :mod:`streamsafe.gateway.metrics.counters`'s; per-engine series
(:data:`ENGINE_SERIES`, label ``engine``) come from :class:`EngineReading` values, one per engine
of the pool (a gateway with one upstream is a pool of one); the histograms are
:mod:`streamsafe.gateway.metrics.histograms`'s, the per-route series
:mod:`streamsafe.gateway.metrics.route_metrics`'s. Prometheus reads all of it through a custom
collector at scrape time, so the hot path pays nothing for metrics. Each gateway has its own
Prometheus registry, so several gateways in one process (tests, benchmarks) do not collide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from streamsafe.gateway.metrics.counters import PREFIX, SERIES
from streamsafe.gateway.metrics.histograms import HISTOGRAMS, Histograms
from streamsafe.gateway.metrics.route_metrics import ROUTE_COUNTERS, ROUTE_HISTOGRAMS, RouteMetrics

__all__ = [
    "CONTENT_TYPE",
    "ENGINE_SERIES",
    "EngineReading",
    "Metrics",
    "exported_names",
    "series",
]

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One engine's figures at scrape time (label ``engine``: its URL)."""

    engine: str
    requests: int = field(
        default=0, metadata={"doc": "Requests sent to the engine", "kind": "counter"}
    )
    failures: int = field(
        default=0,
        metadata={
            "doc": "Attempts that failed on the engine's side (5xx, reset, refused, stalled)",
            "kind": "counter",
        },
    )
    breaker_state: int = field(
        default=0,
        metadata={"doc": "The engine's breaker: 0 closed, 1 half-open, 2 open", "kind": "gauge"},
    )
    breaker_trips: int = field(
        default=0, metadata={"doc": "Times the engine's breaker opened", "kind": "counter"}
    )
    memory_tokens: int = field(
        default=0,
        metadata={
            "doc": "Estimated engine memory held by the generations sent to it (tokens)",
            "kind": "gauge",
        },
    )


#: (name, help, kind) of every per-engine series (``engine_`` + the field's name).
ENGINE_SERIES = tuple(
    ("engine_" + f.name, f.metadata["doc"], f.metadata["kind"])
    for f in dataclasses.fields(EngineReading)
    if f.metadata
)


def series() -> list[tuple[str, str, str]]:
    """(full name, help, kind) of every series the gateway exports: ``counter``, ``gauge``,
    ``histogram``, ``engine_counter`` / ``engine_gauge`` (labelled ``engine``), or
    ``route_histogram`` / ``route_counter`` (labelled ``route`` and ``model``). Counters
    are exposed with ``_total`` (Prometheus's rule), histograms with ``_bucket``, ``_sum`` and
    ``_count``."""
    out = [(PREFIX + name, doc, kind) for name, doc, kind in SERIES]
    out.append((PREFIX + "errors", "Requests refused by the gateway, by status", "counter"))
    out += [(PREFIX + name, doc, "engine_" + kind) for name, doc, kind in ENGINE_SERIES]
    out += [(PREFIX + spec.name, spec.doc, "histogram") for spec in HISTOGRAMS]
    out += [(PREFIX + spec.name, spec.doc, "route_histogram") for spec in ROUTE_HISTOGRAMS]
    out += [(PREFIX + name, doc, "route_counter") for name, doc in ROUTE_COUNTERS]
    return out


def exported_names() -> set[str]:
    """Every sample name ``/metrics`` may carry (``_total``, ``_bucket``, ``_sum``,
    ``_count`` included)."""
    names: set[str] = set()
    for name, _doc, kind in series():
        if kind.endswith("counter"):
            names.add(name + "_total")
        elif kind.endswith("histogram"):
            names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


class _Collector:
    def __init__(
        self,
        stats: Callable[[], dict[str, Any]],
        histograms: Histograms,
        engines: Callable[[], Sequence[EngineReading]],
        routes: RouteMetrics,
    ) -> None:
        self._stats = stats
        self._histograms = histograms
        self._engines = engines
        self._routes = routes

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        for name, doc, kind in SERIES:
            if kind == "counter":
                yield CounterMetricFamily(PREFIX + name, doc, value=stats[name])
            else:
                yield GaugeMetricFamily(PREFIX + name, doc, value=float(stats[name]))
        errors = CounterMetricFamily(
            PREFIX + "errors", "Requests refused by the gateway, by status", labels=["status"]
        )
        for status, count in sorted(stats["errors"].items()):
            errors.add_metric([str(status)], count)
        yield errors
        yield from _engine_families(self._engines())
        for spec in HISTOGRAMS:
            h = self._histograms.all[spec.name]
            yield HistogramMetricFamily(
                PREFIX + spec.name, spec.doc, buckets=h.cumulative(), sum_value=h.sum
            )
        yield from self._routes.families()


def _engine_families(readings: Sequence[EngineReading]) -> Iterator[Any]:
    for name, doc, kind in ENGINE_SERIES:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            PREFIX + name, doc, labels=["engine"]
        )
        attr = name.removeprefix("engine_")
        for reading in readings:
            family.add_metric([reading.engine], getattr(reading, attr))
        yield family


class Metrics:
    """A Prometheus registry over ``stats`` (a callable returning :func:`stats_document`), the
    ``histograms``, the per-engine readings ``engines`` returns and the per-route ``routes``;
    :meth:`render` gives the ``/metrics`` body."""

    def __init__(
        self,
        stats: Callable[[], dict[str, Any]],
        histograms: Histograms,
        engines: Callable[[], Sequence[EngineReading]],
        routes: RouteMetrics,
    ) -> None:
        self.histograms = histograms
        self.routes = routes
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(stats, histograms, engines, routes))

    def render(self) -> bytes:
        """The exposition text (its content type is :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
