"""What protects the engine: abort of abandoned work, admission, the breaker."""

from __future__ import annotations

import threading

import httpx2
from gateway_helpers import chat_body, fast_sim, make_stack, post_stream, sse_payloads, wait_for

from streamsafe.engine_sim import expected_text


def _read_some_then_leave(url: str, body: dict[str, object], headers: dict[str, str]) -> None:
    url += "/v1/chat/completions"
    with (
        httpx2.Client(timeout=10) as client,
        client.stream("POST", url, json=body, headers=headers) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("id: 2"):
                return


def test_last_subscriber_leaving_aborts_upstream_after_grace() -> None:
    with make_stack(fast_sim(itl_ms=20.0), grace=0.05) as s:
        _read_some_then_leave(s.url, chat_body(max_tokens=200), {})
        wait_for(lambda: s.sim.stats()["generations_aborted"] == 1, what="engine abort")
        wait_for(lambda: s.sim.stats()["memory_used_tokens"] == 0, what="memory freed")
        stats = s.gw.stats()
        assert stats["generations_aborted"] == 1
        assert stats["live_generations"] == 0
        assert stats["inflight"] == 0


def test_grace_zero_aborts_at_once() -> None:
    with make_stack(fast_sim(itl_ms=20.0), grace=0.0) as s:
        _read_some_then_leave(s.url, chat_body(max_tokens=200), {})
        wait_for(lambda: s.sim.stats()["generations_aborted"] == 1, what="engine abort")


def test_coming_back_within_grace_keeps_the_generation() -> None:
    with make_stack(fast_sim(itl_ms=5.0), grace=5.0) as s:
        body = chat_body(max_tokens=40)
        _read_some_then_leave(s.url, body, {"Idempotency-Key": "back"})
        r = post_stream(s.url, body, {"Idempotency-Key": "back", "Last-Event-ID": "2"})
        events = sse_payloads(r.text)
        assert events[0][0] == 3 and events[-1][1] == "[DONE]"
        assert s.sim.stats()["generations_aborted"] == 0
        assert s.sim.stats()["generations_completed"] == 1
        assert s.gw.stats()["generations_aborted"] == 0


def test_overload_is_shed_with_retry_after_and_engine_memory_stays_bounded() -> None:
    # Each request costs ~ (prompt ~8) + 40 tokens; the engine holds 400; the gateway admits 200.
    sim = fast_sim(memory_tokens=400, max_num_seqs=64, itl_ms=5.0)
    with make_stack(sim, max_memory_tokens=200, queue_size=4, queue_timeout=0.3) as s:
        results: list[httpx2.Response] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            r = post_stream(s.url, chat_body(f"user {i}", max_tokens=40))
            with lock:
                results.append(r)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        ok = [r for r in results if r.status_code == 200]
        shed = [r for r in results if r.status_code == 429]
        assert len(ok) + len(shed) == 30
        assert ok and shed
        for r in shed:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
        for r in ok:  # a whole stream: never a 200 that ends in an in-band 429
            payloads = sse_payloads(r.text)
            assert payloads[-1][1] == "[DONE]"
            assert not any('"error"' in data for _, data in payloads)
        sim_stats = s.sim.stats()
        assert sim_stats["memory_peak_tokens"] <= 200
        assert not sim_stats["engine_dead"] and sim_stats["crashes"] == 0
        assert s.gw.stats()["shed"] == len(shed)


def _thirty_streams_at_once(url: str) -> None:
    """30 streams of about 48 tokens each (prompt and answer) against an engine of 400."""
    threads = [
        threading.Thread(target=post_stream, args=(url, chat_body(f"u{i}", max_tokens=40)))
        for i in range(30)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)


def test_the_default_gateway_learns_the_engines_memory_and_the_same_load_cannot_kill_it() -> None:
    # The simulator publishes its memory as vLLM publishes its KV cache (/metrics); the gateway,
    # given no budget at all, learns it and keeps the engine within it.
    sim = fast_sim(memory_tokens=400, max_num_seqs=64, itl_ms=5.0)
    with make_stack(sim) as s:
        wait_for(lambda: s.gw.stats()["engines"][0]["memory_limit_tokens"] == 400, what="learned")
        _thirty_streams_at_once(s.url)
        stats = s.sim.stats()
        assert stats["crashes"] == 0 and stats["memory_peak_tokens"] <= 400


def test_without_admission_the_same_load_kills_the_engine() -> None:
    # The control for the test above: proves the load really is above capacity.
    sim = fast_sim(memory_tokens=400, max_num_seqs=64, itl_ms=5.0, publish_kv_cache=False)
    with make_stack(sim, max_memory_tokens=None) as s:
        _thirty_streams_at_once(s.url)
        assert s.sim.stats()["crashes"] >= 1


def test_request_larger_than_the_memory_budget_is_400() -> None:
    with make_stack(max_memory_tokens=50) as s:
        r = post_stream(s.url, chat_body(max_tokens=100))
        assert r.status_code == 400
        assert "max_tokens" in r.json()["error"]["message"]


def test_dead_engine_gives_fast_503_and_gateway_recovers_after_restart() -> None:
    sim = fast_sim(memory_tokens=100, itl_ms=2.0, publish_kv_cache=False)
    with make_stack(sim, probe_interval=0.05) as s:
        # Kill the engine: one request that outgrows its memory.
        r = post_stream(s.url, chat_body(max_tokens=200))
        assert r.status_code == 200
        assert '"error"' in sse_payloads(r.text)[-2][1]
        wait_for(lambda: s.gw.stats()["breaker_open"], what="breaker open")
        before = s.sim.stats()["requests_received"]
        r = post_stream(s.url, chat_body("after death", max_tokens=5))
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        assert s.sim.stats()["requests_received"] == before  # failed fast, engine untouched
        assert httpx2.get(s.url + "/ready").status_code == 503
        assert httpx2.get(s.url + "/health").status_code == 200  # the gateway itself is alive
        s.sim.restart()
        wait_for(lambda: not s.gw.stats()["breaker_open"], what="breaker closed")
        body = chat_body("after restart", max_tokens=5)
        r = post_stream(s.url, body)
        assert r.status_code == 200
        from gateway_helpers import content_of

        assert content_of(sse_payloads(r.text)) == expected_text(body, 5, 0)


def test_engine_death_as_500_before_commit_keeps_status_with_first_token_commit() -> None:
    sim = fast_sim(memory_tokens=100, itl_ms=2.0, publish_kv_cache=False)
    with make_stack(sim, commit="first-token", probe_interval=5.0) as s:
        post_stream(s.url, chat_body(max_tokens=200))  # kills the engine
        wait_for(lambda: s.sim.stats()["engine_dead"], what="engine dead")
        # The breaker may already be open (error event); either way: a real status, not 200.
        r = post_stream(s.url, chat_body("x", max_tokens=5))
        assert r.status_code in (500, 503)
        assert "error" in r.json()


def test_upstream_refusing_connections_gives_503_with_retry_after() -> None:
    from streamsafe.gateway import Gateway, GatewayConfig
    from streamsafe.server import ServerThread, bind_socket

    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    gw = Gateway(GatewayConfig(upstream=f"http://127.0.0.1:{port}", connect_backoff=0.001))
    with ServerThread(gw) as server:
        r = post_stream(server.url, chat_body())
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert gw.stats()["upstream_connect_retries"] == 2


def test_streaming_header_request_is_never_retried_upstream() -> None:
    from streamsafe.gateway import Gateway, GatewayConfig
    from streamsafe.server import ServerThread, bind_socket

    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    gw = Gateway(GatewayConfig(upstream=f"http://127.0.0.1:{port}", connect_backoff=0.001))
    with ServerThread(gw) as server:
        r = post_stream(server.url, chat_body(), {"X-LlamaStack-Streaming": "true"})
        assert r.status_code == 503
        assert gw.stats()["upstream_connect_retries"] == 0


def test_stats_and_metrics_answer_200_with_requests_asking_for_2_63_tokens_in_flight() -> None:
    # Without a memory budget two such requests summed past 64 bits: /stats was a 500
    # ("Integer exceeds 64-bit range").
    with make_stack(fast_sim(itl_ms=20.0, memory_tokens=10**6, publish_kv_cache=False)) as s:
        readers = [
            threading.Thread(
                target=_read_some_then_leave,
                args=(s.url, chat_body(max_tokens=2**63 - 1), {}),
            )
            for _ in range(2)
        ]
        for t in readers:
            t.start()
        wait_for(lambda: s.gw.admission.inflight == 2, what="both in flight")
        stats = httpx2.get(s.url + "/stats", timeout=10)
        assert stats.status_code == 200 and stats.json()["memory_tokens"] < 2**63
        assert httpx2.get(s.url + "/metrics", timeout=10).status_code == 200
        for t in readers:
            t.join(10)
