"""Behind OGX 1.5.0 (client -> OGX -> gateway -> engine) with an engine that refuses
everything (503, ``Retry-After: 1``): with ``--engine-refusals answer`` the server's own retries
(its openai SDK's, marked) are answered by the gateway, so each of the server's logical calls
costs the engine one request; the client's retries reach the server as new logical calls.
Without the gateway one call of llama-stack-client 0.7.5 (2 retries) costs 9 engine requests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from today_tier import MODEL, TodayTier

from streamsafe.bench.client_calls import run_calls
from streamsafe.bench.ogx_server import LLAMA_STACK_07, find_venv
from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.engine_sim.config import Fault
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.serving import ServerThread

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
def test_each_logical_call_costs_the_refusing_engine_one_request(
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
    # The client's 3 attempts are 3 logical calls of the server; its SDK's retries of each
    # were answered by the gateway.
    assert sim.stats()["requests_received"] == 3
    assert gateway.stats()["refusals_answered"] == 6
