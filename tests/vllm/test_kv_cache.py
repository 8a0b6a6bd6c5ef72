"""The real vLLM's KV cache behind the gateway: by default the gateway learns what it holds from
its /metrics and never sends more at once (a request larger than the cache is a 400 that never
reaches it); where the operator lets more through (``memory=`` on ``--upstream``) vLLM preempts
requests and computes them again (no error, no crash), and every stream still ends whole."""

from __future__ import annotations

import threading
from typing import Any

import httpx2
import orjson
import pytest
from vllm_helpers import chat_body, gateway, sse_events, wait_until

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(150, func_only=True)

STREAMS = 16
#: 16 streams of about 420 tokens each (27 blocks of 128 tokens for the 8 vLLM runs at once)
#: against the session server's 16 blocks.
MAX_TOKENS = 400


def test_many_long_streams_on_a_small_kv_cache_all_complete(vllm_engine: VLLMEngine) -> None:
    preempted = vllm_engine.preemptions()
    results: list[Any] = [None] * STREAMS

    def stream(i: int, url: str) -> None:
        body = chat_body(vllm_engine, f"long story {i}", MAX_TOKENS, seed=5001, stream=True)
        body["stream_options"] = {"include_usage": True}
        try:
            r = httpx2.post(url + "/v1/chat/completions", json=body, timeout=120.0)
            chunks = [orjson.loads(d) for _, d in sse_events(r.text) if d != "[DONE]"]
            results[i] = (r.status_code, chunks)
        except Exception as exc:  # reported by the test
            results[i] = exc

    # The operator's memory= lets four times the cache through, so the cache fills.
    with gateway(vllm_engine, upstream=f"{vllm_engine.url} memory=8192") as gw:
        threads = [threading.Thread(target=stream, args=(i, gw.url)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for result in results:
        assert not isinstance(result, Exception), result
        status, chunks = result
        assert status == 200
        assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS
        finish = [c["finish_reason"] for e in chunks for c in e["choices"] if c["finish_reason"]]
        assert finish == ["length"]
    assert len(vllm_engine.requests_received(seed=5001)) == STREAMS
    assert vllm_engine.preemptions() > preempted
    assert httpx2.get(vllm_engine.url + "/health", timeout=5.0).status_code == 200


def test_the_default_gateway_learns_the_kv_capacity_and_keeps_what_cannot_fit_out(
    vllm_engine: VLLMEngine,
) -> None:
    with gateway(vllm_engine) as gw:
        # The session server's cache: 16 blocks of 128 tokens.
        wait_until(
            lambda: gw.gw.stats()["engines"][0]["memory_limit_tokens"] == 2048,
            what="the KV capacity learned",
        )
        body = chat_body(vllm_engine, "too long", 3000, seed=5002, stream=True)
        r = httpx2.post(gw.url + "/v1/chat/completions", json=body, timeout=30.0)
        assert r.status_code == 400
        assert "more than any engine" in r.json()["error"]["message"]
        ok = chat_body(vllm_engine, "fits", 8, seed=5002, stream=False)
        r = httpx2.post(gw.url + "/v1/chat/completions", json=ok, timeout=60.0)
        assert r.status_code == 200
    assert len(vllm_engine.requests_received(seed=5002)) == 1
