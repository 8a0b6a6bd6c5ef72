"""The real vLLM with a full KV cache behind the gateway: it preempts requests and computes
them again (no error, no crash), and every stream still ends whole."""

from __future__ import annotations

import threading
from typing import Any

import httpx2
import orjson
import pytest
from vllm_helpers import chat_body, gateway, sse_events

from streamsafe.bench.vllm_engine import VLLMEngine

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

    with gateway(vllm_engine) as gw:
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
