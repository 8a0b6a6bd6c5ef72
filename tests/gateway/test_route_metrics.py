"""Metrics by route and model (issue 31, item 6): request durations by route, model and status
class, time per output token, prompt and completion tokens, with labels bounded; observed once
per request, never per chunk."""

from __future__ import annotations

import httpx2
import pytest
from gateway_helpers import MODEL, chat_body, make_stack
from prometheus_client.parser import text_string_to_metric_families

from streamsafe.gateway.metrics.exposition import exported_names
from streamsafe.gateway.metrics.route_metrics import LEARNED_MODELS, RouteMetrics
from waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


P = "streamsafe_gateway_"


def test_requests_are_counted_by_route_model_and_status_class() -> None:
    with make_stack() as stack, httpx2.Client(timeout=10) as client:
        body = {**chat_body(max_tokens=8), "stream_options": {"include_usage": True}}
        r = client.post(stack.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200
        for _ in range(2):
            r = client.post(stack.url + "/v1/embeddings", json={"model": MODEL, "input": "hi"})
            assert r.status_code == 200
        r = client.post(stack.url + "/v1/embeddings", json={"model": "nope", "input": "hi"})
        assert r.status_code == 404
        client.get(stack.url + "/no/such/route")
        samples = _samples(client.get(stack.url + "/metrics").text)
    duration = P + "route_request_duration_seconds_count"
    assert _value(samples, duration, route="/v1/embeddings", model=MODEL, status="2xx") == 2
    # A model no engine serves is "other": a caller cannot grow the label's values.
    assert _value(samples, duration, route="/v1/embeddings", model="other", status="4xx") == 1
    assert _value(samples, duration, route="other", model="none", status="4xx") == 1
    chat = {"route": "/v1/chat/completions", "model": MODEL}
    assert _value(samples, duration, status="2xx", **chat) == 1
    assert _value(samples, P + "route_time_per_output_token_seconds_count", **chat) == 1
    assert _value(samples, P + "route_completion_tokens_total", **chat) == 8
    prompt = _value(samples, P + "route_prompt_tokens_total", **chat)
    assert prompt is not None and prompt > 0
    # An embedding's tokens, counted once (the same call again was replayed), and no
    # completion tokens in the generations' histogram.
    embed = {"route": "/v1/embeddings", "model": MODEL}
    assert _value(samples, P + "route_prompt_tokens_total", **embed) == 1
    assert _value(samples, P + "completion_tokens_count") == 1
    names = {name for name, _ in samples}
    assert names <= exported_names()


def test_model_labels_are_bounded_to_the_engines_models_or_the_first_answered() -> None:
    named = RouteMetrics(known_models=("a", "b"))
    assert named.model_label("a", 200) == "a"
    assert named.model_label("c", 200) == "other"
    learning = RouteMetrics()
    assert learning.model_label("x", 404) == "other"  # refused: never learned
    labels = {learning.model_label(f"m{i}", 200) for i in range(LEARNED_MODELS + 5)}
    assert len(labels) == LEARNED_MODELS + 1  # the first ones, then "other"
    assert learning.model_label(None, 200) == "none"


def test_a_stream_is_observed_once_at_its_end_not_per_chunk(monkeypatch) -> None:
    calls = []
    real = RouteMetrics.observe

    def observe(self: RouteMetrics, *args: object, **kw: object) -> None:
        calls.append(args[0])
        real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(RouteMetrics, "observe", observe)
    with make_stack() as stack, httpx2.Client(timeout=10) as client:
        r = client.post(stack.url + "/v1/chat/completions", json=chat_body(max_tokens=64))
        assert r.status_code == 200 and r.text.count("data:") > 64
        # Observed as the request ends, which may be a moment after its last byte reached
        # the client.
        wait_until(lambda: calls, 10, "the request observed")
    assert calls == ["/v1/chat/completions"]
