"""streamsafe in front of and behind the real Llama Stack, under the report's load: 32 concurrent
calls from unmodified llama-stack-client 0.2.12 (3 s timeout, its 2 retries), an engine with
room for each call once. Without streamsafe the same load kills the engine (non-streamed) or
times callers out mid-stream (streamed); see test_llama_stack_baseline and the demo."""

from __future__ import annotations

import pytest

from conftest import LlamaStackTier
from streamsafe_bench.middle_tier import Position, gateway_for, run_tier
from streamsafe_bench.tier_load import Api, TierLoad

pytestmark = pytest.mark.timeout(120)

TIMEOUTS = {"APITimeoutError", "ReadTimeout"}


@pytest.mark.parametrize("api", ["native", "openai"])
async def test_in_front_every_streamed_call_gets_the_exact_text_once(
    llama_stack_tier: LlamaStackTier, api: Api
) -> None:
    load = TierLoad(stream=True, api=api)
    result = await run_tier(llama_stack_tier.deployment, "in-front", load)
    assert result.exact == load.calls, (result.row(), result.gateway)
    # One generation per call; on a starved machine Llama Stack's own client may retry an
    # engine call that was slow to connect, which only it can see (behind it, they attach).
    assert result.engine_generations <= load.calls + result.llama_stack_retries, result.row()
    assert result.gateway is not None and result.gateway["generations_started"] == load.calls
    assert result.engine_crashes == 0


async def test_in_front_non_streamed_calls_make_one_generation_each(
    llama_stack_tier: LlamaStackTier,
) -> None:
    load = TierLoad(stream=False, api="native")
    result = await run_tier(llama_stack_tier.deployment, "in-front", load)
    assert result.engine_generations <= load.calls + result.llama_stack_retries, result.row()
    assert result.gateway is not None and result.gateway["generations_started"] == load.calls
    assert result.engine_crashes == 0, (
        result.row(),
        result.gateway,
    )
    # The client's retries attached; a caller gets its exact text or, past its own retries, a
    # timeout: never a wrong text, never another error.
    assert result.wrong_text == 0 and set(result.errors) <= TIMEOUTS
    assert result.exact + sum(result.errors.values()) == load.calls


async def test_in_front_json_keepalive_answers_every_non_streamed_call(
    llama_stack_tier: LlamaStackTier,
) -> None:
    load = TierLoad(stream=False, api="openai")
    gateway = gateway_for(load, "in-front", json_keepalive=True)
    result = await run_tier(llama_stack_tier.deployment, "in-front", load, gateway=gateway)
    assert result.exact == load.calls, result.row()
    assert result.engine_generations <= load.calls + result.llama_stack_retries
    assert result.engine_crashes == 0
    assert result.gateway is not None and result.gateway["retries_seen"] == 0


@pytest.mark.parametrize(
    ("api", "stream"), [("native", False), ("native", True), ("openai", False), ("openai", True)]
)
async def test_behind_the_engine_makes_one_generation_per_call(
    llama_stack_tier: LlamaStackTier, api: Api, stream: bool
) -> None:
    load = TierLoad(stream=stream, api=api)
    position: Position = "behind"
    result = await run_tier(llama_stack_tier.deployment, position, load)
    # Behind Llama Stack streamsafe cannot keep the caller's connection alive, so callers still
    # time out; but their retries (fresh Llama Stack calls) join the first copy. (On a busy
    # machine some calls time out before Llama Stack passes them on at all: at most one
    # generation per call, never more.)
    assert 0 < result.engine_generations <= load.calls, (result.row(), result.gateway)
    assert result.engine_crashes == 0
    allowed = TIMEOUTS | ({"InternalServerError"} if result.llama_stack_retries else set())
    assert result.wrong_text == 0 and set(result.errors) <= allowed, result.row()
