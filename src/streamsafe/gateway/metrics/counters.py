"""The gateway's figures as ``/stats`` shows them, defined once: counters and readings.

Each series is a field of :class:`Counters` (incremented by the gateway as things happen) or of
:class:`Readings` (read from admission, the registry and the upstream at scrape time); its help
text sits in the field's metadata, so adding a series is one line. :func:`stats_document` is
the ``/stats`` body; :mod:`streamsafe.gateway.metrics.exposition` shows the same series, with
the per-engine ones and the histograms (:mod:`streamsafe.gateway.metrics.histograms`,
:mod:`streamsafe.gateway.metrics.route_metrics`), as ``/metrics``. The hot path pays nothing
for metrics: plain ints, no per-chunk ``Counter.inc()`` and its lock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PREFIX", "SERIES", "Counters", "Readings", "stats_document"]

#: The prefix of every series the gateway exports.
PREFIX = "streamsafe_gateway_"


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
SERIES = tuple(
    (f.name, f.metadata["doc"], f.metadata["kind"])
    for cls in (Counters, Readings)
    for f in dataclasses.fields(cls)
    if f.metadata
)


def stats_document(counters: Counters, readings: Readings, uptime_s: float) -> dict[str, Any]:
    """The ``/stats`` document: every counter and reading, ``errors`` by status, uptime.
    Reads plain ints only, so it is safe to call from another thread."""
    doc: dict[str, Any] = {name: getattr(counters, name) for name in _COUNTER_NAMES}
    for name in _READING_NAMES:
        doc[name] = getattr(readings, name)
    doc["errors"] = {str(k): v for k, v in list(counters.errors.items())}
    doc["uptime_s"] = round(uptime_s, 3)
    return doc
