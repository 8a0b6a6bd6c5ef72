"""The gateway with its default flags in front of today's Llama Stack, real (OGX 1.5.0 and
llama-stack 0.7.3, each in front of the simulator sized as the report's engine: room for each
call once), under the report's load from unmodified clients: 32 concurrent plain calls from
llama-stack-client 0.7.5 (3 s timeout, its 2 retries), 32 openai streams (3 s, 2 retries), 32
plain calls from ogx-client 1.5.0 (its defaults). Everything is counted at the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from today_tier import TodayTier

from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.client_calls import run_calls
from streamsafe_bench.tier_load import TierLoad, engine_for, expected_answer
from waiting import wait_until

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def gateway_in_front(tier: TodayTier) -> Iterator[tuple[str, Gateway]]:
    """The gateway with its default flags (``--upstream-kind auto`` included) in front of
    ``tier``'s server."""
    gateway = Gateway(GatewayConfig(upstream=tier.url))
    with ServerThread(gateway) as server:
        yield server.url, gateway


def calls_of(load: TierLoad, model: str) -> list[dict[str, Any]]:
    return [
        {
            "model": model,
            "messages": load.messages(i),
            "max_tokens": load.max_tokens,
            "stream": load.stream,
        }
        for i in range(load.calls)
    ]


def exact(load: TierLoad, results: list[dict[str, Any]]) -> int:
    return sum(
        r["error"] is None and r["text"] == expected_answer(load, i) for i, r in enumerate(results)
    )


def server_retries(tier: TodayTier) -> int:
    """Engine calls the server itself made again (its openai SDK marks them): on a starved
    machine it may retry one that was slow to connect, which only it can see."""
    return sum(int(s.headers.get("x-stainless-retry-count", "0")) >= 1 for s in tier.seen)


def storm_engine(tier: TodayTier, load: TierLoad) -> Simulator:
    return tier.engine(engine_for(load))


def llama_stack_client_calls(tier: TodayTier, url: str, load: TierLoad) -> list[dict[str, Any]]:
    """The load through llama-stack-client 0.7.5 (in llama-stack 0.7.3's venv)."""
    from streamsafe_bench.ogx_server import LLAMA_STACK_07, find_venv

    plan = {
        "client": "llama-stack-client",
        "base_url": url,
        "calls": calls_of(load, tier.model),
        "timeout": load.timeout_s,
        "max_retries": load.max_retries,
    }
    return run_calls(find_venv(LLAMA_STACK_07) / "bin" / "python", plan)


async def openai_streams(url: str, load: TierLoad, model: str) -> list[dict[str, Any]]:
    client = openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="none", timeout=load.timeout_s, max_retries=load.max_retries
    )

    async def one(call: dict[str, Any]) -> dict[str, Any]:
        parts: list[str] = []
        try:
            stream = await client.chat.completions.create(
                model=model, messages=call["messages"], max_tokens=call["max_tokens"], stream=True
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
        except Exception as exc:
            return {"text": "".join(parts), "error": type(exc).__name__}
        return {"text": "".join(parts), "error": None}

    try:
        return list(await asyncio.gather(*(one(c) for c in calls_of(load, model))))
    finally:
        await client.close()


def test_auto_finds_today_s_server_and_says_what_it_protects(
    today: TodayTier, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streamsafe.gateway")
    with gateway_in_front(today) as (_url, gateway):
        assert gateway.stats()["upstream_kind"] == "ogx"
    found = [r.getMessage() for r in caplog.records if "(probed:" in r.getMessage()]
    assert len(found) == 1, found
    assert f"/v1/version 200 (version {today.flavor.version})" in found[0]
    assert "/v1/chat/completions 200" in found[0] and f"models {today.model}" in found[0]
    assert "serves POST /v1/chat/completions, /v1/completions" in found[0]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_llama_stack_client_calls_through_the_gateway_are_one_generation_each(
    today: TodayTier, stream: bool
) -> None:
    load = TierLoad(stream=stream, api="openai")
    engine = storm_engine(today, load)
    with gateway_in_front(today) as (url, gateway):
        results = llama_stack_client_calls(today, url, load)
        stats = gateway.stats()
    assert exact(load, results) == load.calls, [r["error"] for r in results]
    assert stats["generations_started"] == load.calls
    sim = engine.stats()
    # A retry of the server's own reached the engine slot; whether its first copy had started a
    # generation there is the machine's timing (slow to connect: it had not).
    assert load.calls <= sim["generations_started"] <= load.calls + server_retries(today), sim
    assert not sim["engine_dead"] and sim["crashes"] == 0


async def test_openai_streams_through_the_gateway_are_one_generation_each(
    today: TodayTier,
) -> None:
    load = TierLoad(stream=True, api="openai")
    engine = storm_engine(today, load)
    with gateway_in_front(today) as (url, gateway):
        results = await openai_streams(url, load, today.model)
        stats = gateway.stats()
    assert exact(load, results) == load.calls, [r["error"] for r in results]
    assert stats["generations_started"] == load.calls
    sim = engine.stats()
    assert load.calls <= sim["generations_started"] <= load.calls + server_retries(today), sim
    assert not sim["engine_dead"] and sim["crashes"] == 0


def test_without_the_gateway_the_plain_calls_kill_the_engine(today: TodayTier) -> None:
    # The report, today: the server's own retries (its openai SDK's 2) times the client's.
    load = TierLoad(stream=False, api="openai")
    engine = storm_engine(today, load)
    results = llama_stack_client_calls(today, today.url, load)
    today.deployment.quiesce(quiet_s=2.0, limit_s=60.0)
    sim = engine.stats()
    assert exact(load, results) < load.calls
    assert sim["requests_received"] > 2 * load.calls and sim["engine_dead"], sim


def test_ogx_client_plain_calls_through_the_gateway_with_defaults(ogx_server: TodayTier) -> None:
    load = TierLoad(stream=False, api="openai")
    engine = storm_engine(ogx_server, load)
    with gateway_in_front(ogx_server) as (url, gateway):
        plan = {"client": "ogx-client", "base_url": url, "calls": calls_of(load, ogx_server.model)}
        results = run_calls(ogx_server.client_python, plan)
        stats = gateway.stats()
    assert exact(load, results) == load.calls, [r["error"] for r in results]
    assert stats["generations_started"] == load.calls
    sim = engine.stats()
    # A retry of the server's own attaches to its first copy where that reached the gateway, and
    # is a generation of its own only where it did not (slow to connect: only the server saw it).
    assert load.calls <= sim["generations_started"] <= load.calls + server_retries(ogx_server), sim
    assert not sim["engine_dead"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_caller_s_provider_data_reaches_the_engine_through_ogx(
    ogx_server: TodayTier, stream: bool
) -> None:
    # ogx-client sends X-OGX-Provider-Data; OGX's vLLM provider takes the caller's token from it
    # and calls the engine with it instead of its configured one ("fake").
    load = TierLoad(calls=2, max_tokens=4, stream=stream, api="openai")
    with gateway_in_front(ogx_server) as (url, _gateway):
        plan = {
            "client": "ogx-client",
            "base_url": url,
            "calls": calls_of(load, ogx_server.model),
            "provider_data": {"vllm_api_token": "caller-key"},
        }
        results = run_calls(ogx_server.client_python, plan)
    assert [r["error"] for r in results] == [None, None]
    engine_calls = [s for s in ogx_server.seen if s.path == "/v1/chat/completions"]
    assert len(engine_calls) == 2
    assert {s.headers.get("authorization") for s in engine_calls} == {"Bearer caller-key"}


def test_the_positions_bench_measures_a_position(ogx_server: TodayTier) -> None:
    # python -m streamsafe_bench.today_positions, one of its rows (the design doc's table).
    from streamsafe_bench.today_positions import run

    row = run(ogx_server.deployment, ogx_server.flavor, "in-front", "openai streams")
    assert (row.exact, row.engine_generations, row.engine_dead) == (32, 32, False), row
    ogx_server.engine()


def test_a_llama_stack_kind_set_by_hand_that_the_server_is_not_is_warned_about(
    today: TodayTier, caplog: pytest.LogCaptureFixture
) -> None:
    # The trap of the issue: the 0.2 kind in front of today's server protects routes it no
    # longer has. Set by hand, it is kept, and said to be wrong.
    caplog.set_level(logging.WARNING, logger="streamsafe.gateway")
    gateway = Gateway(GatewayConfig(upstream=today.url, upstream_kind="llama-stack"))
    with ServerThread(gateway):
        wait_until(
            lambda: any("answers as ogx" in r.getMessage() for r in caplog.records),
            10,
            lambda: f"the kind said wrong: {[r.getMessage() for r in caplog.records]}",
            every=0.05,
        )
    said = next(r.getMessage() for r in caplog.records if "answers as ogx" in r.getMessage())
    assert "was set as llama-stack" in said and "--upstream-kind ogx" in said


def test_a_plain_call_slower_than_the_openai_timeout_is_answered_once_in_front(
    ogx_server: TodayTier,
) -> None:
    # Issue 28, row 5, scaled: a 4 s plain answer, an unmodified openai client with a 1.5 s read
    # timeout and its 2 retries, the gateway in front of the server with its defaults. The
    # gateway keeps the call alive with 102 Processing (openai states its read timeout), so the
    # client never retries: one engine generation, the answer whole.
    sim = ogx_server.engine(itl_ms=400.0)
    with gateway_in_front(ogx_server) as (url, gateway):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=1.5, max_retries=2)
        reply = client.chat.completions.create(
            model=ogx_server.model,
            messages=[{"role": "user", "content": "slow in front"}],
            max_tokens=10,
        )
        retried = gateway.stats()["retries_seen"]
    assert reply.choices[0].message.content
    assert retried == 0
    assert sim.stats()["generations_started"] == 1
