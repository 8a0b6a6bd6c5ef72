"""The context-length fallback in front of the real vLLM: a request too long for vLLM's
``--max-model-len`` gets vLLM's own 400, which the gateway reads as "the context is too long"
and sends to the model's ``--fallback-model`` with the body's model rewritten (here a simulated
larger model); a request that fits is vLLM's (docs/design.md, Engine pool). One larger than the
KV cache the gateway learned from vLLM goes to the fallback without asking vLLM at all."""

from __future__ import annotations

import httpx2
import pytest
from vllm_helpers import gateway, wait_until

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.server import ServerThread
from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(120, func_only=True)

LARGE = "sim-large"


def test_a_prompt_too_long_for_vllm_is_answered_by_the_fallback_model(
    vllm_engine: VLLMEngine,
) -> None:
    large = ServerThread(Simulator(SimConfig(model=LARGE, itl_ms=1.0))).start()
    try:
        # memory= as an operator may set it: larger than the cache, so the gateway asks vLLM and
        # reads its 400 (the next test: what it does with the cache it learned).
        engines = (
            f"{vllm_engine.url} models={vllm_engine.model} memory=1000000",
            f"{large.url} models={LARGE}",
        )
        with gateway(
            vllm_engine, engines=engines, fallback_models=(f"{vllm_engine.model}={LARGE}",)
        ) as gw:
            too_long = " ".join(f"word{i}" for i in range(3 * vllm_engine.options.max_model_len))
            body = {
                "model": vllm_engine.model,
                "messages": [{"role": "user", "content": too_long}],
                "max_tokens": 8,
            }
            # vLLM itself refuses it, with its own words.
            straight = httpx2.post(vllm_engine.url + "/v1/chat/completions", json=body, timeout=60)
            assert straight.status_code == 400, straight.text
            answer = httpx2.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == LARGE  # the answering model says so
            fits = {**body, "messages": [{"role": "user", "content": "a short one"}]}
            short = httpx2.post(gw.url + "/v1/chat/completions", json=fits, timeout=60)
            assert short.status_code == 200 and short.json()["model"] == vllm_engine.model
            stats = gw.gw.stats()
        assert large.app.stats()["requests_received"] == 1
        assert stats["engine_failovers"] == 1
    finally:
        large.stop()


def test_a_request_larger_than_the_learned_kv_cache_goes_to_the_fallback_unasked(
    vllm_engine: VLLMEngine,
) -> None:
    large = ServerThread(Simulator(SimConfig(model=LARGE, itl_ms=1.0))).start()
    try:
        engines = (f"{vllm_engine.url} models={vllm_engine.model}", f"{large.url} models={LARGE}")
        with gateway(
            vllm_engine, engines=engines, fallback_models=(f"{vllm_engine.model}={LARGE}",)
        ) as gw:
            wait_until(
                lambda: gw.gw.stats()["engines"][0]["memory_limit_tokens"] == 2048,
                what="the KV capacity learned",
            )
            words = " ".join(f"word{i}" for i in range(3 * vllm_engine.options.max_model_len))
            body = {
                "model": vllm_engine.model,
                "messages": [{"role": "user", "content": words}],
                "max_tokens": 8,
                "seed": 6101,
            }
            answer = httpx2.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == LARGE
            assert gw.gw.stats()["engine_failovers"] == 0
        assert vllm_engine.requests_received(seed=6101) == []
        assert large.app.stats()["requests_received"] == 1
    finally:
        large.stop()
