"""The real vLLM frozen whole (SIGSTOP of its API server, engine core and worker) under open
streams, behind the gateway with its default flags: the streams end with an error event that
names the engine, in seconds, not at a timeout; ``/ready`` says 503 while it is frozen; once it
runs again, a new call is answered (docs/design.md, Failover)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx2
import pytest
from vllm_helpers import gateway, start_together, wait_until

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(180, func_only=True)

STREAMS = 4
TOKENS = 900
#: What the crash-test suite allows a frozen engine to hold a caller.
BOUND_S = 60.0


def test_streams_on_a_frozen_vllm_end_with_a_clear_error_and_the_next_call_is_answered(
    vllm_engine: VLLMEngine,
) -> None:
    import openai

    flowing = threading.Semaphore(0)
    ended: list[Any] = [None] * STREAMS
    ended_at: list[float] = [0.0] * STREAMS

    # Four streams of 900 tokens are more than the session server's cache (2,048 tokens), which
    # the gateway learns and would not exceed: memory= lets them all in at once, so all four are
    # open when the engine freezes (the point here, not admission).
    with gateway(vllm_engine, upstream=f"{vllm_engine.url} memory=8192") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", timeout=90.0, max_retries=0)

        def read(i: int) -> None:
            chunks = 0
            try:
                stream = client.chat.completions.create(
                    model=vllm_engine.model,
                    messages=[{"role": "user", "content": f"frozen story {i}"}],
                    max_tokens=TOKENS,
                    temperature=0,
                    seed=3201,
                    stream=True,
                )
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        chunks += 1
                        if chunks == 3:
                            flowing.release()
                ended[i] = "whole"
            except openai.APIError as exc:
                ended[i] = exc
            finally:
                ended_at[i] = time.monotonic()
                if chunks < 3:
                    flowing.release()

        # Started together (the engine held until all are in), so they run in one batch and none
        # ends before the freeze.
        threads = start_together(vllm_engine, read, STREAMS, seed=3201)
        for _ in range(STREAMS):
            assert flowing.acquire(timeout=60)
        vllm_engine.freeze()
        frozen_at = time.monotonic()
        try:
            for t in threads:
                t.join(BOUND_S + 10)
            ready = httpx2.get(gw.url + "/ready", timeout=30).status_code
        finally:
            vllm_engine.resume()
        # Answered again once vLLM's /health answers (the probe lets the engine go).
        wait_until(
            lambda: httpx2.get(gw.url + "/ready", timeout=30).status_code == 200,
            timeout=60,
            what="/ready after the thaw",
        )
        after = client.chat.completions.create(
            model=vllm_engine.model,
            messages=[{"role": "user", "content": "after the thaw"}],
            max_tokens=8,
            temperature=0,
        )
        stats = gw.gw.stats()

    # A stream whose whole answer left the engine before the freeze took hold ends whole (under
    # two busy loops the SIGSTOPs landed after three of the four 900-token answers were done,
    # 2026-12-07); every other ends with the error, in seconds.
    cut = [i for i, e in enumerate(ended) if e != "whole"]
    assert cut, ended
    assert all(isinstance(ended[i], openai.APIError) for i in cut), ended
    assert all("down" in str(ended[i]) and vllm_engine.url in str(ended[i]) for i in cut), ended
    waited = [ended_at[i] - frozen_at for i in cut]
    assert max(waited) < BOUND_S, waited
    assert ready == 503
    assert after.choices[0].message.content
    assert stats["engines"][0]["breaker_trips"] >= 1
