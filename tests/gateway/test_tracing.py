"""OpenTelemetry spans per request, generation and upstream attempt, with the client's trace
continued and ``traceparent`` passed upstream (the SDK's in-memory exporter)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from gateway_helpers import chat_body, fast_sim, sse_payloads, wait_for
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from server_stops import stop_later
from streamsafe.engine_sim import Fault, SimConfig, Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    found = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # set once per process
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(found))
    return found


class Recording:
    """The simulator, noting the headers of every completion request it gets."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.headers: list[dict[str, str]] = []
        self.url = ""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/completions"):
            self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.sim(scope, receive, send)


@pytest.fixture
def traced(exporter: InMemorySpanExporter) -> Iterator[tuple[str, Recording, Gateway]]:
    exporter.clear()
    yield from _stack(fast_sim(itl_ms=5))


def _stack(config: SimConfig) -> Iterator[tuple[str, Recording, Gateway]]:
    engine = Recording(Simulator(config))
    engine_server = ServerThread(engine).start()
    engine.url = engine_server.url
    gw = Gateway(GatewayConfig(upstream=engine_server.url, heartbeat=0.05, tracing=True))
    server = ServerThread(gw).start()
    try:
        yield server.url, engine, gw
    finally:
        stop_later(server, engine_server)


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _ids(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def test_a_request_its_generation_and_its_attempt_are_one_trace_passed_upstream(
    traced: tuple[str, Recording, Gateway], exporter: InMemorySpanExporter
) -> None:
    url, engine, _gw = traced
    r = httpx2.post(url + "/v1/chat/completions", json=chat_body(), headers=CLIENT, timeout=10)
    assert r.status_code == 200
    wait_for(lambda: _by_name(exporter.get_finished_spans(), "POST /v1/chat/completions"))
    spans = exporter.get_finished_spans()
    (request,) = _by_name(spans, "POST /v1/chat/completions")
    (generation,) = _by_name(spans, "generation")
    (attempt,) = _by_name(spans, "upstream attempt")
    assert _ids(request)[0] == _ids(generation)[0] == _ids(attempt)[0] == TRACE_ID
    assert request.kind is trace.SpanKind.SERVER and attempt.kind is trace.SpanKind.CLIENT
    assert request.parent is not None and f"{request.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert generation.parent is not None and generation.parent.span_id == int(_ids(request)[1], 16)
    assert attempt.parent is not None and attempt.parent.span_id == int(_ids(generation)[1], 16)
    attrs = dict(request.attributes or {})
    assert attrs["http.response.status_code"] == 200 and attrs["streamsafe.outcome"] == "completed"
    assert attrs["streamsafe.generation"] == r.headers["x-streamsafe-generation"]
    assert attrs["streamsafe.asks"] == 1 and attrs["streamsafe.asks_bound"] == 99
    assert dict(generation.attributes or {})["streamsafe.state"] == "done"
    assert dict(attempt.attributes or {})["server.address"] == engine.url
    # The engine was asked under the attempt's span: a tracing engine joins the trace.
    sent = engine.headers[-1]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{_ids(attempt)[1]}-01"


def test_an_attached_request_links_to_the_generation_it_joined(
    traced: tuple[str, Recording, Gateway], exporter: InMemorySpanExporter
) -> None:
    url, _engine, gw = traced
    body = chat_body("shared", max_tokens=30)
    key = {"idempotency-key": "trace-1"}
    first: list[httpx2.Response] = []
    thread = threading.Thread(
        target=lambda: first.append(
            httpx2.post(url + "/v1/chat/completions", json=body, headers=key, timeout=10)
        )
    )
    thread.start()
    wait_for(lambda: gw.stats()["generations_started"] == 1, what="started")
    second = httpx2.post(url + "/v1/chat/completions", json=body, headers=key, timeout=10)
    thread.join(10)
    assert second.status_code == first[0].status_code == 200
    wait_for(lambda: len(_by_name(exporter.get_finished_spans(), "POST /v1/chat/completions")) == 2)
    spans = exporter.get_finished_spans()
    (generation,) = _by_name(spans, "generation")
    joined = {
        dict(s.attributes or {})["streamsafe.joined"]: s
        for s in _by_name(spans, "POST /v1/chat/completions")
    }
    assert set(joined) == {"new", "attached"}
    links = joined["attached"].links
    assert [link.context.span_id for link in links] == [int(_ids(generation)[1], 16)]


def test_a_continued_stream_shows_two_attempts(exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    config = fast_sim(itl_ms=5, faults=(Fault.parse("cut:4:1#1"),))
    for url, engine, _gw in _stack(config):
        r = httpx2.post(url + "/v1/chat/completions", json=chat_body(max_tokens=12), timeout=10)
        assert r.status_code == 200 and sse_payloads(r.text)[-1][1] == "[DONE]"
        wait_for(lambda: _by_name(exporter.get_finished_spans(), "generation"))
        attempts = _by_name(exporter.get_finished_spans(), "upstream attempt")
        first, second = sorted(attempts, key=lambda s: s.start_time or 0)
        assert dict(first.attributes or {})["streamsafe.continuation"] is False
        assert "streamsafe.broke" in dict(first.attributes or {})
        assert dict(second.attributes or {})["streamsafe.continuation"] is True
        assert len(engine.headers) == 2
        assert engine.headers[0]["traceparent"] != engine.headers[1]["traceparent"]
