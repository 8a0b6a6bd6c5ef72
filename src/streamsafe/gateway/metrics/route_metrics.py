"""Per-route series: requests by ``route``, ``model`` and status class, their time per output
token, and the tokens their generations took, with labels kept bounded
(:class:`RouteMetrics`); observed once per request, at its end, read at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from streamsafe.gateway.metrics.counters import PREFIX
from streamsafe.gateway.metrics.histograms import Histogram, HistogramSpec

__all__ = [
    "LEARNED_MODELS",
    "ROUTE_COUNTERS",
    "ROUTE_HISTOGRAMS",
    "STATUS_CLASSES",
    "RouteMetrics",
    "status_class",
]


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
            PREFIX + spec.name, spec.doc, labels=["route", "model", "status"]
        )
        for labels, h in sorted(list(self.durations.items())):
            family.add_metric(list(labels), h.cumulative(), h.sum)
        yield family
        spec = ROUTE_HISTOGRAMS[1]
        family = HistogramMetricFamily(PREFIX + spec.name, spec.doc, labels=["route", "model"])
        for pair, h in sorted(list(self.per_token.items())):
            family.add_metric(list(pair), h.cumulative(), h.sum)
        yield family
        for i, (name, doc) in enumerate(ROUTE_COUNTERS):
            counter = CounterMetricFamily(PREFIX + name, doc, labels=["route", "model"])
            for pair, counts in sorted(list(self.tokens.items())):
                counter.add_metric(list(pair), counts[i])
            yield counter
