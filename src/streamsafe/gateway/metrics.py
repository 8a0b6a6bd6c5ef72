"""Prometheus metrics for ``/metrics``.

Read from the gateway's counters at scrape time by a custom collector, so the hot path pays
nothing for them: no per-chunk ``Counter.inc()`` and its lock. Each gateway has its own registry,
so several gateways in one process (tests, benchmarks) do not collide.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from streamsafe.gateway.app import Gateway

__all__ = ["Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_COUNTERS = (
    ("requests_received", "Completion requests received"),
    (
        "retries_seen",
        "Requests marked as client retries (X-Retry-Count or x-stainless-retry-count)",
    ),
    ("attached", "Requests attached to a live generation instead of starting one"),
    ("replayed", "Requests answered by replaying a finished generation"),
    ("resumed", "Requests resuming a stream with Last-Event-ID"),
    ("generations_started", "Generations sent upstream"),
    ("generations_completed", "Generations finished with [DONE]"),
    ("generations_failed", "Generations that failed"),
    ("generations_aborted", "Generations aborted after their last subscriber left"),
    ("shed", "Requests refused with 429 by admission control"),
    ("breaker_rejections", "Requests refused with 503 while the engine was down"),
    ("key_conflicts", "Idempotency-Keys reused with a different body (422)"),
    ("evicted", "Finished generations evicted to cap memory"),
    ("events_relayed", "SSE events read from upstream"),
    ("breaker_trips", "Times the engine was found dead"),
    ("upstream_connect_retries", "Upstream connections retried after being refused"),
)
_GAUGES = (
    ("live_generations", "Generations queued or running"),
    ("kept_generations", "Finished generations kept for replay"),
    ("queued", "Generations waiting for admission"),
    ("inflight", "Generations admitted upstream"),
    ("memory_tokens", "Estimated engine memory held by admitted generations (tokens)"),
    ("subscribers", "Connected subscribers"),
    ("kept_bytes", "Bytes held by finished generations"),
    ("breaker_open", "1 while the engine is considered dead"),
)


class _Collector:
    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Any]:
        stats = self._gateway.stats()
        for name, doc in _COUNTERS:
            yield CounterMetricFamily(f"streamsafe_gateway_{name}", doc, value=stats[name])
        for name, doc in _GAUGES:
            yield GaugeMetricFamily(f"streamsafe_gateway_{name}", doc, value=float(stats[name]))
        errors = CounterMetricFamily(
            "streamsafe_gateway_errors",
            "Requests refused by the gateway, by status",
            labels=["status"],
        )
        for status, count in sorted(stats["errors"].items()):
            errors.add_metric([str(status)], count)
        yield errors


class Metrics:
    """The gateway's Prometheus registry; :meth:`render` gives the ``/metrics`` body."""

    def __init__(self, gateway: Gateway) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(gateway))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE
