"""Bad input gets a clear OpenAI-shaped error and loses nothing; slow readers stall nobody."""

from __future__ import annotations

import socket
import threading

import httpx2
import orjson
import pytest
from gateway_helpers import MODEL, Stack, chat_body, fast_sim, make_stack, post_stream, wait_for


def _post_raw(url: str, content: bytes, headers: dict[str, str] | None = None) -> httpx2.Response:
    hdrs = {"content-type": "application/json", **(headers or {})}
    return httpx2.post(url + "/v1/chat/completions", content=content, headers=hdrs, timeout=10)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "empty"),
        (b"[1, 2]", "JSON object"),
        (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), "model"),
        (orjson.dumps({"model": MODEL}), "messages"),
        (orjson.dumps({"model": MODEL, "messages": []}), "messages"),
        (orjson.dumps({"model": MODEL, "messages": ["x"]}), "role"),
        (orjson.dumps({"model": MODEL, "messages": [{"role": "user"}], "stream": "yes"}), "stream"),
    ],
)
def test_malformed_or_incomplete_request_is_400(
    stack: Stack, content: bytes, fragment: str
) -> None:
    r = _post_raw(stack.url, content)
    assert r.status_code == 400
    error = r.json()["error"]
    assert fragment in error["message"]
    assert error["type"] == "invalid_request_error"
    assert stack.sim.stats()["requests_received"] == 0


def test_completion_without_prompt_is_400(stack: Stack) -> None:
    r = httpx2.post(stack.url + "/v1/completions", json={"model": MODEL}, timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"


def test_oversized_body_is_413_by_content_length_and_by_counting() -> None:
    with make_stack(max_body_bytes=1000) as s:
        big = orjson.dumps(chat_body("x" * 2000))
        assert _post_raw(s.url, big).status_code == 413

        def chunks():  # no Content-Length: counted while reading
            yield big[:500]
            yield big[500:]

        r = httpx2.post(s.url + "/v1/chat/completions", content=chunks(), timeout=10)
        assert r.status_code == 413
        assert "limit" in r.json()["error"]["message"]


def test_unknown_model_is_passed_through_from_upstream(stack: Stack) -> None:
    body = chat_body()
    body["model"] = "no-such-model"
    r = post_stream(stack.url, body)
    assert r.status_code == 404
    assert "error" in r.json()


def test_missing_or_invalid_api_key_is_401_and_key_is_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    with make_stack(api_keys=("sk-secret-1",)) as s:
        assert post_stream(s.url, chat_body()).status_code == 401
        r = post_stream(s.url, chat_body(), {"Authorization": "Bearer sk-wrong"})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        ok = post_stream(s.url, chat_body(), {"Authorization": "Bearer sk-secret-1"})
        assert ok.status_code == 200
        assert "sk-secret-1" not in orjson.dumps(s.gw.stats()).decode()
        assert "sk-secret-1" not in httpx2.get(s.url + "/metrics").text
    assert "sk-secret-1" not in caplog.text and "sk-wrong" not in caplog.text


def test_unknown_route_is_404_and_wrong_method_is_405(stack: Stack) -> None:
    assert httpx2.get(stack.url + "/v2/nothing").status_code == 404
    assert httpx2.get(stack.url + "/v1/chat/completions").status_code == 405


def test_models_health_stats_and_metrics_routes(stack: Stack) -> None:
    assert httpx2.get(stack.url + "/v1/models").json()["data"][0]["id"] == MODEL
    assert httpx2.get(stack.url + "/v1/openai/v1/models").status_code == 200
    assert httpx2.get(stack.url + "/health").status_code == 200
    post_stream(stack.url, chat_body(max_tokens=3))
    stats = httpx2.get(stack.url + "/stats").json()
    for key in (
        "requests_received",
        "retries_seen",
        "attached",
        "replayed",
        "resumed",
        "generations_started",
        "generations_completed",
        "generations_aborted",
        "shed",
        "live_generations",
        "queued",
    ):
        assert key in stats
    metrics = httpx2.get(stack.url + "/metrics").text
    assert "streamsafe_gateway_generations_completed_total 1.0" in metrics


def test_slow_reader_does_not_stall_a_fast_one() -> None:
    # Many tokens, fast engine; one subscriber never reads (its socket buffer fills), the other
    # reads everything. Both are subscribers of one generation (same key).
    with make_stack(fast_sim(itl_ms=0.0), grace=30.0) as s:
        body = chat_body("long " * 50, max_tokens=4000)
        payload = orjson.dumps(body)
        slow = socket.create_connection(("127.0.0.1", s.gw_server.port))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"idempotency-key: shared\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        wait_for(lambda: s.gw.stats()["events_relayed"] > 0, what="stream started")
        fast = post_stream(s.url, body, {"Idempotency-Key": "shared"})
        assert fast.status_code == 200
        assert fast.text.endswith("data: [DONE]\n\n")
        assert s.gw.stats()["generations_completed"] == 1
        slow.close()


def test_client_vanishing_while_queued_frees_its_place() -> None:
    # first-token commit: a queued request has no headers yet; the client times out waiting.
    sim = fast_sim(itl_ms=20.0)
    with make_stack(sim, max_inflight=1, grace=0.0, queue_timeout=5.0, commit="first-token") as s:
        first = threading.Thread(target=post_stream, args=(s.url, chat_body("a", max_tokens=30)))
        first.start()
        wait_for(lambda: s.gw.stats()["inflight"] == 1, what="first admitted")
        with pytest.raises(httpx2.ReadTimeout):
            httpx2.post(s.url + "/v1/chat/completions", json=chat_body("b"), timeout=0.2)
        wait_for(lambda: s.gw.stats()["queued"] == 0, what="queued request withdrawn")
        first.join(10)
        assert s.sim.stats()["requests_received"] == 1


def test_early_commit_answers_and_heartbeats_while_queued_and_a_leaver_frees_its_place() -> None:
    sim = fast_sim(itl_ms=20.0)
    with make_stack(
        sim, max_inflight=1, grace=0.0, queue_timeout=5.0, commit="early", heartbeat=0.05
    ) as s:
        first = threading.Thread(target=post_stream, args=(s.url, chat_body("a", max_tokens=100)))
        first.start()
        wait_for(lambda: s.gw.stats()["inflight"] == 1, what="first admitted")
        with (
            httpx2.Client(timeout=5) as client,
            client.stream("POST", s.url + "/v1/chat/completions", json=chat_body("b")) as resp,
        ):
            assert resp.status_code == 200  # committed while still queued
            assert s.gw.stats()["queued"] == 1
            first_bytes = next(resp.iter_raw())
            assert first_bytes.startswith(b": keep-alive")
        wait_for(lambda: s.gw.stats()["queued"] == 0, what="queued request withdrawn")
        first.join(10)
        assert s.sim.stats()["requests_received"] == 1
