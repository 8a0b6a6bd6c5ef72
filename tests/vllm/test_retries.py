"""Unmodified clients' retries against the real vLLM, straight and through the gateway with its
default flags, counted in vLLM's own request log: the report's storm, and the retries the
gateway coalesces into the generation already running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from vllm_helpers import chat_body, gateway, greedy_text, sse_events, stream_text, wait_until

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(120, func_only=True)

CALLS = 8
#: The clients' timeout (openai's, for each attempt): shorter than the engine's stall.
TIMEOUT = 1.0


def _run_all(call: Callable[[int], Any]) -> list[Any]:
    """``call(i)`` for :data:`CALLS` callers at once: the value or the exception each got."""
    out: list[Any] = [None] * CALLS

    def one(i: int) -> None:
        try:
            out[i] = call(i)
        except Exception as exc:  # reported by the test
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _openai(base_url: str, max_retries: int = 2) -> Any:
    import openai

    return openai.OpenAI(
        base_url=base_url + "/v1", api_key="x", timeout=TIMEOUT, max_retries=max_retries
    )


def _plain_calls(vllm: VLLMEngine, base_url: str, seed: int) -> list[Any]:
    client = _openai(base_url)

    def call(i: int) -> str:
        reply = client.chat.completions.create(
            model=vllm.model,
            messages=[{"role": "user", "content": f"storm caller {i}"}],
            max_tokens=16,
            temperature=0,
            seed=seed,
        )
        return reply.choices[0].message.content or ""

    return _run_all(call)


def test_the_storm_straight_to_vllm_triples_its_requests_and_fails_every_call(
    vllm_engine: VLLMEngine,
) -> None:
    # The engine is stalled past every attempt's timeout (three attempts each: max_retries=2):
    # each attempt is a new request, and vLLM aborts each one its client leaves.
    vllm_engine.pause()
    results: list[Any] = []
    caller = threading.Thread(
        target=lambda: results.extend(_plain_calls(vllm_engine, vllm_engine.url, seed=2001))
    )
    caller.start()
    caller.join(60)
    vllm_engine.resume()
    import openai

    assert all(isinstance(r, openai.APITimeoutError) for r in results), results
    assert len(vllm_engine.requests_received(seed=2001)) == 3 * CALLS


def test_the_storm_through_the_gateway_is_one_vllm_request_per_call_and_all_answered(
    vllm_engine: VLLMEngine,
) -> None:
    wanted = [greedy_text(vllm_engine, f"storm caller {i}", 16, seed=2002) for i in range(CALLS)]
    with gateway(vllm_engine) as gw:
        vllm_engine.pause()
        results: list[Any] = []
        caller = threading.Thread(
            target=lambda: results.extend(_plain_calls(vllm_engine, gw.url, seed=2003))
        )
        caller.start()
        # Stalled as long as straight (past all three attempts' timeouts): the callers state
        # their read timeout, so the gateway keeps them alive (102 Processing) and none retries;
        # a retry that came anyway would attach to the waiting generation.
        wait_until(
            lambda: len(vllm_engine.requests_received(seed=2003)) == CALLS, what="all received"
        )
        stalled_until = time.monotonic() + 3 * TIMEOUT + 1.0
        wait_until(lambda: time.monotonic() > stalled_until, what="the stall")
        vllm_engine.resume()
        caller.join(60)
        retried = gw.gw.stats()["retries_seen"]
    assert results == wanted
    assert len(vllm_engine.requests_received(seed=2003)) == CALLS
    assert retried == 0


def test_openai_streams_through_the_gateway_survive_a_stall_past_their_timeout(
    vllm_engine: VLLMEngine,
) -> None:
    wanted = [greedy_text(vllm_engine, f"stream caller {i}", 24, seed=2004) for i in range(CALLS)]
    with gateway(vllm_engine) as gw:
        client = _openai(gw.url)

        def call(i: int) -> str:
            stream = client.chat.completions.create(
                model=vllm_engine.model,
                messages=[{"role": "user", "content": f"stream caller {i}"}],
                max_tokens=24,
                temperature=0,
                seed=2005,
                stream=True,
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        results: list[Any] = []
        vllm_engine.pause()
        caller = threading.Thread(target=lambda: results.extend(_run_all(call)))
        caller.start()
        wait_until(
            lambda: len(vllm_engine.requests_received(seed=2005)) == CALLS, what="all received"
        )
        # Still stalled for three client timeouts after the last request reached vLLM.
        vllm_engine.stall(3 * TIMEOUT).join()
        caller.join(60)
    assert results == wanted
    assert len(vllm_engine.requests_received(seed=2005)) == CALLS


def test_an_idempotency_key_sent_twice_is_one_vllm_request_replayed(
    vllm_engine: VLLMEngine,
) -> None:
    body = chat_body(vllm_engine, "keyed once", 24, seed=2006, stream=True)
    headers = {"Idempotency-Key": "vllm-replay-1"}
    with gateway(vllm_engine) as gw, httpx2.Client(timeout=60.0) as client:
        first = client.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
        second = client.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
        assert gw.gw.stats()["replayed"] == 1
    assert first.status_code == second.status_code == 200
    assert sse_events(second.text) == sse_events(first.text)
    assert stream_text(sse_events(first.text)) == greedy_text(
        vllm_engine, "keyed once", 24, seed=2007
    )
    assert len(vllm_engine.requests_received(seed=2006)) == 1
