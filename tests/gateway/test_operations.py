"""What an operator sees: one access line per answered request, the events that matter at the
default level, liveness apart from readiness, histograms and per-engine series in /metrics."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from gateway_helpers import MODEL, chat_body, fast_sim, make_stack, sse_payloads, wait_for
from prometheus_client.parser import text_string_to_metric_families

from server_stops import stop_later
from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.admission.shed_log import ShedLog
from streamsafe.gateway.metrics.exposition import exported_names
from streamsafe.server import ServerThread, bind_socket
from waiting import wait_until_async

KEY = "sk-secret-tenant-key"


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> Iterator[list[dict[str, Any]]]:
    """The fields of every access line written, in order."""
    caplog.set_level(logging.INFO, logger="streamsafe")
    lines: list[dict[str, Any]] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(dict(record.fields))  # type: ignore[attr-defined]

    grab = Grab()
    logging.getLogger("streamsafe.access").addHandler(grab)
    yield lines
    logging.getLogger("streamsafe.access").removeHandler(grab)


def _completion_lines(lines: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    wait_for(lambda: len([x for x in lines if "outcome" in x]) >= n, what=f"{n} access lines")
    return [x for x in lines if "outcome" in x]


def test_each_completion_gets_one_access_line_with_what_it_took(
    access: list[dict[str, Any]],
) -> None:
    with make_stack(api_keys=(KEY,)) as s:
        auth = {"authorization": f"Bearer {KEY}", "x-request-id": "trace-42"}
        body = chat_body("count me", max_tokens=6)
        body["stream_options"] = {"include_usage": True}
        r = httpx2.post(s.url + "/v1/chat/completions", json=body, headers=auth, timeout=10)
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42"
        plain = httpx2.post(
            s.url + "/v1/chat/completions",
            json=chat_body("plain", max_tokens=3, stream=False),
            headers={"authorization": f"Bearer {KEY}"},
            timeout=10,
        )
        assert plain.status_code == 200 and plain.headers["x-request-id"].startswith("req-")
        streamed, unary = _completion_lines(access, 2)
    assert streamed["request_id"] == "trace-42"
    assert streamed["tenant"].startswith("t-") and KEY not in repr(access)
    assert (streamed["method"], streamed["path"], streamed["status"]) == (
        "POST",
        "/v1/chat/completions",
        200,
    )
    assert streamed["duration_ms"] > 0 and streamed["ttft_ms"] <= streamed["duration_ms"]
    assert streamed["generation"] == r.headers["x-streamsafe-generation"]
    assert streamed["attempts"] == 1 and streamed["engine"] == s.sim_url
    assert streamed["asks"] == 1 and streamed["asked"] is None and streamed["asks_bound"] == 99
    assert streamed["outcome"] == "completed" and streamed["completion_tokens"] == 6
    assert unary["outcome"] == "completed" and unary["completion_tokens"] == 3
    assert "ttft_ms" not in unary and unary["stream"] is False


def test_the_access_line_says_every_request_a_call_cost_and_its_bound(
    access: list[dict[str, Any]],
) -> None:
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    gw = Gateway(GatewayConfig(upstream=f"http://127.0.0.1:{port}", connect_backoff=0.001))
    with ServerThread(gw) as server:
        r = httpx2.post(server.url + "/v1/chat/completions", json=chat_body("x"), timeout=10)
        assert r.status_code == 503
        (line,) = _completion_lines(access, 1)
        stats = gw.stats()
    # The connect retries are asks of the one plan, not a loop hidden under the failover.
    assert line["asks"] == 3 and line["asked"] == "connect-retry x2"
    assert line["asks_bound"] == stats["asks_bound"] == 99
    assert stats["asks_bound_made_of"] == "99 = 11 rounds x 3 attempts x 3 connects"
    assert stats["upstream_connect_retries"] == 2


def test_outcomes_say_how_a_request_was_served(access: list[dict[str, Any]]) -> None:
    with make_stack(fast_sim(itl_ms=20)) as s:
        url = s.url + "/v1/chat/completions"
        key = {"idempotency-key": "k-1"}
        body = chat_body("one generation", max_tokens=10)
        first: list[httpx2.Response] = []
        thread = threading.Thread(
            target=lambda: first.append(httpx2.post(url, json=body, headers=key, timeout=10))
        )
        thread.start()
        wait_for(lambda: s.gw.stats()["generations_started"] == 1, what="first started")
        attached = httpx2.post(url, json=body, headers=key, timeout=10)
        thread.join(10)
        replayed = httpx2.post(url, json=body, headers=key, timeout=10)
        resumed = httpx2.post(url, json=body, headers={**key, "last-event-id": "3"}, timeout=10)
        for r in (first[0], attached, replayed, resumed):
            assert r.status_code == 200 and sse_payloads(r.text)[-1][1] == "[DONE]"
        lines = _completion_lines(access, 4)
    by_outcome = {x["outcome"]: x for x in lines}
    assert set(by_outcome) == {"completed", "attached", "replayed", "resumed"}
    generation = by_outcome["completed"]["generation"]
    assert all(x["generation"] == generation for x in lines)
    assert by_outcome["attached"]["joined"] == "attached"


def test_a_refusal_is_shed_and_an_engine_failure_failed(access: list[dict[str, Any]]) -> None:
    with make_stack(fast_sim(itl_ms=50), max_inflight=1, queue_size=0) as s:
        url = s.url + "/v1/chat/completions"
        running = threading.Thread(
            target=lambda: httpx2.post(url, json=chat_body("long", max_tokens=20), timeout=10)
        )
        running.start()
        wait_for(lambda: s.gw.stats()["inflight"] == 1, what="one running")
        shed = httpx2.post(url, json=chat_body("no room", stream=False), timeout=10)
        assert shed.status_code == 429
        running.join(10)
        unknown = {**chat_body("fails", stream=False), "model": "no-such-model"}
        failed = httpx2.post(url, json=unknown, timeout=10)
        assert failed.status_code == 404
        lines = _completion_lines(access, 3)
    outcomes = sorted(x["outcome"] for x in lines)
    assert outcomes == ["completed", "failed", "shed"]


def test_health_is_liveness_and_ready_is_readiness_while_draining() -> None:
    with make_stack() as s:
        assert httpx2.get(s.url + "/ready").status_code == 200
        s.gw_server.call(_start_drain(s.gw))
        assert httpx2.get(s.url + "/health").status_code == 200
        ready = httpx2.get(s.url + "/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
        refused = httpx2.post(s.url + "/v1/chat/completions", json=chat_body(), timeout=10)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert s.sim.stats()["requests_received"] == 0


async def _start_drain(gw: Gateway) -> None:
    asyncio.get_running_loop().create_task(gw.drain(5.0))
    await asyncio.sleep(0)


def test_an_engine_going_and_coming_back_is_logged_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="streamsafe")
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens: refused
    gw = Gateway(GatewayConfig(upstream=f"http://127.0.0.1:{port}", probe_interval=0.05))
    with ServerThread(gw) as server:
        r = httpx2.post(server.url + "/v1/chat/completions", json=chat_body(), timeout=10)
        assert r.status_code == 503
        assert httpx2.get(server.url + "/health").status_code == 200
        assert httpx2.get(server.url + "/ready").status_code == 503
        engine = ServerThread(Simulator(fast_sim()), port=port).start()
        try:
            wait_for(lambda: not gw.stats()["breaker_open"], what="breaker closed")
            assert httpx2.get(server.url + "/ready").status_code == 200
        finally:
            stop_later(engine)
    events = [(r.fields["event"], r.fields["engine"]) for r in _events(caplog)]  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    assert events == [("engine_down", url), ("engine_up", url)]
    down = next(r for r in caplog.records if getattr(r, "fields", {}).get("event") == "engine_down")
    assert down.levelno == logging.WARNING and url in down.getMessage()


def _events(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "event" in getattr(r, "fields", {})]


def test_shedding_is_logged_when_it_begins_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="streamsafe")

    async def episode() -> None:
        shedding = ShedLog("gateway", quiet=0.05)
        for _ in range(5):
            shedding.note("the admission queue is full")
        await asyncio.sleep(0.03)  # within the quiet time: the behaviour under test
        shedding.note("the admission queue is full")
        assert shedding.active
        await wait_until_async(lambda: not shedding.active, 5, "shedding ended after quiet")

    asyncio.run(episode())
    lines = [(r.fields["event"], r.getMessage()) for r in _events(caplog)]  # type: ignore[attr-defined]
    assert [event for event, _ in lines] == ["shedding_begun", "shedding_ended"]
    assert "6 refused" in lines[1][1]


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_metrics_have_histograms_and_per_engine_series_for_a_pool_of_two() -> None:
    engines = [ServerThread(Simulator(fast_sim())).start() for _ in range(2)]
    urls = [e.url for e in engines]
    gw = Gateway(GatewayConfig(upstream=urls[0], engines=tuple(urls), heartbeat=0.05))
    try:
        with ServerThread(gw) as server:
            for i in range(4):
                body = chat_body(f"spread {i}", max_tokens=4)
                body["stream_options"] = {"include_usage": True}
                r = httpx2.post(server.url + "/v1/chat/completions", json=body, timeout=10)
                assert r.status_code == 200
            wait_for(lambda: gw.histograms.request_duration_seconds.count == 4, what="observed")
            samples = _samples(httpx2.get(server.url + "/metrics").text)
    finally:
        stop_later(*engines)
    prefix = "streamsafe_gateway_"
    assert set(samples) <= exported_names()
    ttft = samples[prefix + "time_to_first_token_seconds_count"]
    assert ttft == [({}, 4.0)]
    assert samples[prefix + "admission_wait_seconds_count"] == [({}, 4.0)]
    assert samples[prefix + "completion_tokens_sum"] == [({}, 16.0)]
    buckets = samples[prefix + "request_duration_seconds_bucket"]
    assert buckets[-1] == ({"le": "+Inf"}, 4.0)
    requests = {labels["engine"]: v for labels, v in samples[prefix + "engine_requests_total"]}
    assert set(requests) == set(urls) and sum(requests.values()) >= 4
    assert all(v >= 1 for v in requests.values())  # least loaded: both got work
    states = {labels["engine"]: v for labels, v in samples[prefix + "engine_breaker_state"]}
    assert states == {urls[0]: 0.0, urls[1]: 0.0}
    assert {labels["engine"] for labels, _ in samples[prefix + "engine_memory_tokens"]} == set(urls)


def test_a_single_upstream_is_a_pool_of_one_in_metrics(stack: Any) -> None:
    r = httpx2.post(stack.url + "/v1/chat/completions", json=chat_body(), timeout=10)
    assert r.status_code == 200
    samples = _samples(httpx2.get(stack.url + "/metrics").text)
    engine = samples["streamsafe_gateway_engine_requests_total"]
    assert engine == [({"engine": stack.sim_url}, 1.0)]
    assert MODEL in r.text


def test_model_lists_read_the_same_through_openai_and_llama_stack_client(stack: Any) -> None:
    from llama_stack_client import LlamaStackClient
    from openai import OpenAI

    listed = LlamaStackClient(base_url=stack.url).models.list()
    assert [m.identifier for m in listed] == [MODEL]  # was [None]
    assert [m.id for m in OpenAI(base_url=stack.url + "/v1", api_key="x").models.list()] == [MODEL]
