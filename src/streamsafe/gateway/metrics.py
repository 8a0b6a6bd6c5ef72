"""The gateway's counters, gauges and histograms, defined once, and their two views: ``/stats``
(JSON) and ``/metrics`` (Prometheus text).

Each series is a field of :class:`Counters` (incremented by the gateway as things happen) or of
:class:`Readings` (read from admission, the registry and the upstream at scrape time); its help
text sits in the field's metadata, so adding a series is one line. Per-engine series
(:data:`ENGINE_SERIES`, label ``engine``) come from :class:`EngineReading` values, one per engine
of the pool (a gateway with one upstream is a pool of one); per-route series
(:class:`RouteMetrics`, labels ``route``, ``model``, ``status``) by route and model, their
labels bounded. Histograms (:data:`HISTOGRAMS`, :data:`ROUTE_HISTOGRAMS`) are observed once per
request, when its access line is written, never per
chunk. Prometheus reads all of it through a custom collector at scrape time, so the hot path pays
nothing for metrics: no per-chunk ``Counter.inc()`` and its lock. Each gateway has its own
Prometheus registry, so several gateways in one process (tests, benchmarks) do not collide.
"""

from __future__ import annotations

import bisect
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

__all__ = [
    "CONTENT_TYPE",
    "ENGINE_SERIES",
    "HISTOGRAMS",
    "LEARNED_MODELS",
    "PREFIX",
    "ROUTE_COUNTERS",
    "ROUTE_HISTOGRAMS",
    "STATUS_CLASSES",
    "Counters",
    "EngineReading",
    "Histogram",
    "HistogramSpec",
    "Histograms",
    "Metrics",
    "Readings",
    "RouteMetrics",
    "exported_names",
    "series",
    "stats_document",
    "status_class",
]

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
#: The prefix of every series the gateway exports.
PREFIX = "streamsafe_gateway_"
_PREFIX = PREFIX


def _counter(doc: str) -> Any:
    return field(default=0, metadata={"doc": doc, "kind": "counter"})


def _gauge(doc: str) -> Any:
    return field(default=0, metadata={"doc": doc, "kind": "gauge"})


@dataclass(slots=True)
class Counters:
    """Monotonic counters the gateway increments (plain ints: no lock on the hot path)."""

    requests_received: int = _counter("Completion requests received")
    retries_seen: int = _counter(
        "Requests marked as client retries (X-Retry-Count or x-stainless-retry-count)"
    )
    attached: int = _counter("Requests attached to a live generation instead of starting one")
    unread_adopted: int = _counter(
        "Requests given a live generation with their body that every caller left unread"
    )
    replayed: int = _counter("Requests answered by replaying a finished generation")
    resumed: int = _counter("Requests resuming a stream with Last-Event-ID")
    generations_started: int = _counter("Generations sent upstream")
    generations_completed: int = _counter("Generations finished with [DONE]")
    generations_failed: int = _counter("Generations that failed")
    generations_aborted: int = _counter("Generations aborted after their last subscriber left")
    shed: int = _counter("Requests refused with 429 by admission control")
    breaker_rejections: int = _counter("Requests refused with 503 while the engine was down")
    key_conflicts: int = _counter("Idempotency-Keys reused with a different body (422)")
    evicted: int = _counter("Finished generations evicted to cap memory")
    events_relayed: int = _counter("SSE events read from upstream")
    continued: int = _counter(
        "Upstream attempts made again: broken streams continued where they stopped, requests "
        "dropped before their answer asked again"
    )
    usage_recovered: int = _counter(
        "Usage chunks a stream owed after the engine dropped it past its last token, counted "
        "by the engine's tokenizer (vLLM's /tokenize)"
    )
    upstream_timeouts: int = _counter(
        "Upstream attempts past their first-token, idle or total timeout"
    )
    upstream_failures: int = _counter(
        "Upstream failures: 5xx answers and error events standing for one (Llama Stack's masked "
        "500s included)"
    )
    passed_through: int = _counter("Requests forwarded unchanged to the upstream (other routes)")
    engine_sheds: int = _counter(
        "Upstream attempts the engine shed before any work (429/503, as a status or an error "
        "event): the generation waited for room and asked again"
    )
    #: Requests refused by the gateway, by status (its own labelled series).
    errors: dict[int, int] = field(default_factory=dict)

    def count_error(self, status: int) -> None:
        """One more refusal with ``status``."""
        self.errors[status] = self.errors.get(status, 0) + 1


@dataclass(frozen=True, slots=True)
class Readings:
    """Values read from the gateway's parts when ``/stats`` or ``/metrics`` is asked for."""

    live_generations: int = _gauge("Generations queued or running")
    kept_generations: int = _gauge("Finished generations kept for replay")
    queued: int = _gauge("Generations waiting for admission")
    inflight: int = _gauge("Generations admitted upstream")
    memory_tokens: int = _gauge("Estimated engine memory held by admitted generations (tokens)")
    subscribers: int = _gauge("Connected subscribers")
    kept_bytes: int = _gauge("Bytes held by finished generations")
    breaker_open: int = _gauge(
        "Engines whose breaker is open (held down by their health probe, or cooling down)"
    )
    breaker_trips: int = _counter("Times an engine's breaker opened")
    upstream_connect_retries: int = _counter("Upstream connections retried after being refused")
    engine_failovers: int = _counter(
        "Attempts sent to another engine or model before the first token (engine pool)"
    )
    engine_migrations: int = _counter(
        "Cut streams continued on the pool, on another engine where there was one"
    )
    generations_mirrored: int = _counter(
        "Generations of other replicas followed here (for a retry, resume or replay)"
    )
    generations_taken_over: int = _counter(
        "Generations taken over from a replica whose lease lapsed"
    )
    leases_lost: int = _counter("Generations whose lease another replica took while this ran it")
    redis_errors: int = _counter("Operations on the shared store that failed")
    redis_degraded: bool = _gauge("1 while the shared store is unreachable (per-replica state)")
    fleet_replicas: int = _gauge("Gateway replicas with a live heartbeat in the shared store")
    redis_used_memory_bytes: int = _gauge("Bytes the shared store uses (Redis INFO memory)")


_COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(Counters) if f.metadata)
_READING_NAMES = tuple(f.name for f in dataclasses.fields(Readings))
#: (name, help, kind) of every unlabelled series, in /stats order.
_SERIES = tuple(
    (f.name, f.metadata["doc"], f.metadata["kind"])
    for cls in (Counters, Readings)
    for f in dataclasses.fields(cls)
    if f.metadata
)


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


#: Histograms labelled ``route``, ``model`` (and ``status`` where the spec says), observed once
#: per request like the others (see :class:`RouteMetrics`).
ROUTE_HISTOGRAMS = (
    HistogramSpec(
        "route_request_duration_seconds",
        "Seconds from a request's arrival to the end of its answer, by route, model and status "
        "class",
        (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
    ),
    HistogramSpec(
        "route_time_per_output_token_seconds",
        "Streamed generations a request started: seconds per completion token after the first, "
        "by route and model",
        (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0),
    ),
)
#: Counters labelled ``route`` and ``model``: (name, help).
ROUTE_COUNTERS = (
    ("route_prompt_tokens", "Prompt tokens of generations answered whole, where usage says"),
    (
        "route_completion_tokens",
        "Completion tokens of generations answered whole, where usage says",
    ),
)
#: The ``status`` label: the class of the answer's status, ``none`` where none went out.
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "none")
#: Models a gateway whose engines name none labels by name (the first this many answered
#: 2xx, so a name the engine does not serve never takes a place); the rest are ``other``.
LEARNED_MODELS = 16


def status_class(status: int | None) -> str:
    """``2xx`` for 200 (and so on); ``none`` where no answer started."""
    if status is None or not 100 <= status <= 599:
        return "none"
    return STATUS_CLASSES[status // 100 - 1]


class RouteMetrics:
    """Requests by ``route`` (a path of the route table, or ``other``), ``model`` and status
    class, their time per output token, and the tokens their generations took, with bounded
    labels: a model the engines name (``known_models``), or, where they name none, one of the
    first :data:`LEARNED_MODELS` models answered 2xx; else ``other`` (``none`` where the request
    named none). Each request resolves its label values once, at its end."""

    def __init__(self, known_models: Sequence[str] = ()) -> None:
        self._known = frozenset(known_models)
        self._learned: set[str] = set()
        self.durations: dict[tuple[str, str, str], Histogram] = {}
        self.per_token: dict[tuple[str, str], Histogram] = {}
        #: (prompt, completion) tokens by (route, model).
        self.tokens: dict[tuple[str, str], list[int]] = {}

    def model_label(self, model: str | None, status: int | None) -> str:
        """The ``model`` label of a request for ``model`` answered ``status``."""
        if not model:
            return "none"
        if model in self._known or model in self._learned:
            return model
        if (
            not self._known
            and len(self._learned) < LEARNED_MODELS
            and status_class(status) == ("2xx")
        ):
            self._learned.add(model)
            return model
        return "other"

    def observe(
        self,
        route: str,
        model: str | None,
        status: int | None,
        duration: float,
        per_token: float | None = None,
        tokens: tuple[int | None, int | None] = (None, None),
    ) -> None:
        """One request on ``route`` for ``model`` ended with ``status`` after ``duration``
        seconds; ``per_token``: its generation's seconds per output token; ``tokens``: its
        generation's (prompt, completion) tokens."""
        label = self.model_label(model, status)
        key = (route, label, status_class(status))
        h = self.durations.get(key)
        if h is None:
            h = self.durations[key] = Histogram(ROUTE_HISTOGRAMS[0].buckets)
        h.observe(duration)
        if per_token is not None:
            pair = (route, label)
            t = self.per_token.get(pair)
            if t is None:
                t = self.per_token[pair] = Histogram(ROUTE_HISTOGRAMS[1].buckets)
            t.observe(per_token)
        prompt, completion = tokens
        if prompt is not None or completion is not None:
            counts = self.tokens.setdefault((route, label), [0, 0])
            counts[0] += prompt or 0
            counts[1] += completion or 0

    def families(self) -> Iterator[Any]:
        """The Prometheus families of these series (read at scrape time)."""
        spec = ROUTE_HISTOGRAMS[0]
        family = HistogramMetricFamily(
            _PREFIX + spec.name, spec.doc, labels=["route", "model", "status"]
        )
        for labels, h in sorted(list(self.durations.items())):
            family.add_metric(list(labels), h.cumulative(), h.sum)
        yield family
        spec = ROUTE_HISTOGRAMS[1]
        family = HistogramMetricFamily(_PREFIX + spec.name, spec.doc, labels=["route", "model"])
        for pair, h in sorted(list(self.per_token.items())):
            family.add_metric(list(pair), h.cumulative(), h.sum)
        yield family
        for i, (name, doc) in enumerate(ROUTE_COUNTERS):
            counter = CounterMetricFamily(_PREFIX + name, doc, labels=["route", "model"])
            for pair, counts in sorted(list(self.tokens.items())):
                counter.add_metric(list(pair), counts[i])
            yield counter


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
    out = [(PREFIX + name, doc, kind) for name, doc, kind in _SERIES]
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


def stats_document(counters: Counters, readings: Readings, uptime_s: float) -> dict[str, Any]:
    """The ``/stats`` document: every counter and reading, ``errors`` by status, uptime.
    Reads plain ints only, so it is safe to call from another thread."""
    doc: dict[str, Any] = {name: getattr(counters, name) for name in _COUNTER_NAMES}
    for name in _READING_NAMES:
        doc[name] = getattr(readings, name)
    doc["errors"] = {str(k): v for k, v in list(counters.errors.items())}
    doc["uptime_s"] = round(uptime_s, 3)
    return doc


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
        for name, doc, kind in _SERIES:
            if kind == "counter":
                yield CounterMetricFamily(_PREFIX + name, doc, value=stats[name])
            else:
                yield GaugeMetricFamily(_PREFIX + name, doc, value=float(stats[name]))
        errors = CounterMetricFamily(
            _PREFIX + "errors", "Requests refused by the gateway, by status", labels=["status"]
        )
        for status, count in sorted(stats["errors"].items()):
            errors.add_metric([str(status)], count)
        yield errors
        yield from _engine_families(self._engines())
        for spec in HISTOGRAMS:
            h = self._histograms.all[spec.name]
            yield HistogramMetricFamily(
                _PREFIX + spec.name, spec.doc, buckets=h.cumulative(), sum_value=h.sum
            )
        yield from self._routes.families()


def _engine_families(readings: Sequence[EngineReading]) -> Iterator[Any]:
    for name, doc, kind in ENGINE_SERIES:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            _PREFIX + name, doc, labels=["engine"]
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
