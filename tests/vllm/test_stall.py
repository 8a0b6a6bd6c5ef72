"""A stall of the real vLLM's engine in the middle of streams, longer than the clients' read
timeout and shorter than the gateway's idle timeout, is invisible to the clients: the gateway's
heartbeats (after the first token too) keep every connection alive, and no client retries."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from vllm_helpers import gateway, greedy_text, start_together

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(180, func_only=True)

STREAMS = 8
TOKENS = 200
#: Content chunks every stream has had before the engine stalls.
BEFORE_STALL = 5


def test_openai_streams_survive_a_six_second_mid_stream_stall_with_default_flags(
    vllm_engine: VLLMEngine,
) -> None:
    import openai

    prompts = [f"stalled story {i}" for i in range(STREAMS)]
    wanted = [greedy_text(vllm_engine, p, TOKENS, seed=3001) for p in prompts]
    flowing = threading.Semaphore(0)
    results: list[Any] = [None] * STREAMS

    with gateway(vllm_engine) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", timeout=2.0, max_retries=2)

        def read(i: int) -> None:
            parts: list[str] = []
            try:
                stream = client.chat.completions.create(
                    model=vllm_engine.model,
                    messages=[{"role": "user", "content": prompts[i]}],
                    max_tokens=TOKENS,
                    temperature=0,
                    seed=3102,
                    stream=True,
                )
                for chunk in stream:
                    content = chunk.choices[0].delta.content if chunk.choices else None
                    if content:
                        parts.append(content)
                        if len(parts) == BEFORE_STALL:
                            flowing.release()
                results[i] = "".join(parts)
            except Exception as exc:
                results[i] = exc
                flowing.release()

        # The engine generates slowly enough that no stream ends before all have started:
        # paused until all eight are in, then let go together.
        threads = start_together(vllm_engine, read, STREAMS, seed=3102)
        for _ in range(STREAMS):
            assert flowing.acquire(timeout=60)
        # Retries before the stall are not its doing: a client that got no head within its 2 s
        # (a gateway starved for a second beside two busy loops and the rest of the suite)
        # asks again before its stream flows, and attaches. Counted from here.
        before = gw.gw.stats()
        # Mid-stream: three times the clients' read timeout without a token.
        vllm_engine.stall(6.0).join()
        for t in threads:
            t.join(90)
        stats = gw.gw.stats()

    assert results == wanted
    assert len(vllm_engine.requests_received(seed=3102)) == STREAMS
    assert stats["retries_seen"] == before["retries_seen"]  # nobody timed out in the stall
    assert stats["continued"] == 0  # and the gateway did not cut anything either
