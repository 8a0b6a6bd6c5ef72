"""Behind OGX 1.5.0 (client -> OGX -> gateway -> engine) with an engine that refuses
everything (503, ``Retry-After: 1``): with ``--engine-refusals answer`` the server's own retries
(its openai SDK's, marked) and the client's (new logical calls of the server, with the same
body) are answered by the gateway from the first refusal, so the whole call costs the engine one
request. Without the gateway one call of llama-stack-client 0.7.5 (2 retries) costs 9 engine
requests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from today_tier import MODEL, TodayTier

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.engine_sim.config import Fault
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.client_calls import run_calls
from streamsafe_bench.ogx_server import LLAMA_STACK_07, find_venv

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def behind(ogx_server: TodayTier) -> Iterator[tuple[TodayTier, Simulator, Gateway]]:
    sim = Simulator(SimConfig(model=MODEL, itl_ms=2.0, faults=(Fault.parse("status:503:1"),)))
    with ServerThread(sim) as engine:
        config = GatewayConfig(upstream=engine.url, upstream_kind="vllm", engine_refusals="answer")
        gateway = Gateway(config)
        ogx_server.deployment.install(gateway)
        try:
            yield ogx_server, sim, gateway
        finally:
            ogx_server.engine()  # the slot's next test gets a plain engine again


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_call_costs_the_refusing_engine_one_request(
    behind: tuple[TodayTier, Simulator, Gateway], stream: bool
) -> None:
    tier, sim, gateway = behind
    call: dict[str, Any] = {
        "model": tier.model,
        "messages": [{"role": "user", "content": "a full engine"}],
        "max_tokens": 4,
        "stream": stream,
    }
    plan = {
        "client": "llama-stack-client",
        "base_url": tier.url,
        "calls": [call],
        "timeout": 30.0,
        "max_retries": 2,
    }
    [result] = run_calls(find_venv(LLAMA_STACK_07) / "bin" / "python", plan)
    tier.deployment.quiesce(quiet_s=1.0, limit_s=30.0)
    assert result["error"] is not None  # the engine refused all along
    # The client's 3 attempts are 3 logical calls of the server, 3 requests each with its
    # SDK's retries: all but the first answered by the gateway (the same body, while the engine
    # refuses).
    assert sim.stats()["requests_received"] == 1
    assert gateway.stats()["refusals_answered"] == 8


@pytest.fixture
def behind_waiting(ogx_server: TodayTier) -> Iterator[tuple[TodayTier, Simulator, Gateway]]:
    # vLLM's own refusal past --max-num-queued-reqs: 503 without Retry-After.
    sim = Simulator(SimConfig(model=MODEL, itl_ms=2.0, faults=(Fault.parse("status:503:1:none"),)))
    with ServerThread(sim) as engine:
        gateway = Gateway(GatewayConfig(upstream=engine.url, upstream_kind="vllm"))
        ogx_server.deployment.install(gateway)
        try:
            yield ogx_server, sim, gateway
        finally:
            ogx_server.engine()


def test_with_its_defaults_a_call_costs_the_refusing_engine_at_most_6_requests(
    behind_waiting: tuple[TodayTier, Simulator, Gateway],
) -> None:
    # The gateway's defaults (engine_refusals wait): the server's first request waits at the
    # engine's refusal gate (one probe, backoff with jitter: at most 6 engine requests), then
    # gets the 503 with x-should-retry: false, which the server's openai SDK does not retry;
    # the client's retries (fresh calls of the server, the same body) are answered from it.
    # Before: 60-181 engine requests, each of the server's retries waiting 20 s of its own.
    tier, sim, gateway = behind_waiting
    call: dict[str, Any] = {
        "model": tier.model,
        "messages": [{"role": "user", "content": "a full engine, waited for"}],
        "max_tokens": 4,
        "stream": False,
    }
    plan = {
        "client": "llama-stack-client",
        "base_url": tier.url,
        "calls": [call],
        "timeout": 60.0,
        "max_retries": 2,
    }
    [result] = run_calls(find_venv(LLAMA_STACK_07) / "bin" / "python", plan)
    tier.deployment.quiesce(quiet_s=1.0, limit_s=30.0)
    assert result["error"] is not None
    assert sim.stats()["requests_received"] <= 6
    assert gateway.stats()["refusals_answered"] <= 8
