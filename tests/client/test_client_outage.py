"""The client's retry budget straight against the simulator (issue 23, row 15): in a total outage
100 calls cost the engine at most 130 requests, and an engine refusing 10 % of requests before
any work costs no call."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from streamsafe.client import AsyncClient, RetryBudgetExhausted
from streamsafe.engine_sim import Fault, SimConfig, Simulator
from streamsafe.retry import RetryPolicy
from streamsafe.server import ServerThread

pytestmark = pytest.mark.timeout(120)

MODEL = "sim-llama-8b"
CALLS = 100
CONCURRENCY = 10


def _sim(fault: str) -> Simulator:
    return Simulator(
        SimConfig(
            model=MODEL,
            itl_ms=1.0,
            itl_ms_per_seq=0.0,
            prefill_ms_per_token=0.0,
            faults=(Fault.parse(fault),),
        )
    )


async def _calls(base_url: str, stream: bool, policy: RetryPolicy) -> list[str]:
    """Outcome of each call: "ok" or the name of its error."""
    slots = asyncio.Semaphore(CONCURRENCY)
    async with AsyncClient(base_url=base_url, retry=policy) as client:

        async def one(i: int) -> str:
            async with slots:
                try:
                    answer = await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"question {i}"}],
                        max_tokens=3,
                        stream=stream,
                    )
                    if stream:
                        async with answer:  # type: ignore[union-attr]
                            async for _ in answer:  # type: ignore[union-attr]
                                pass
                    return "ok"
                except Exception as exc:
                    return type(exc).__name__

        return await asyncio.gather(*(one(i) for i in range(CALLS)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_hundred_calls_to_an_engine_refusing_everything_cost_it_at_most_130_requests(
    stream: bool,
) -> None:
    # Each call would retry twice (3x the load); the budget held it to 134-140 requests when
    # its reserve was added to the share of the calls, 123 now.
    sim = _sim("status:503:1:1")  # Retry-After: 1, as a shedding server sends
    with ServerThread(sim) as server:
        outcomes = asyncio.run(_calls(server.url + "/v1", stream, RetryPolicy()))
    assert sim.stats()["requests_received"] <= 130
    assert Counter(outcomes).keys() <= {"ServiceUnavailableError", RetryBudgetExhausted.__name__}


def test_an_engine_refusing_ten_percent_of_requests_costs_no_call() -> None:
    # Four retries, not two: one call in a thousand meets three refusals in a row, which would
    # use up two retries whatever the budget; the budget is what is under test here.
    sim = _sim("status:503:0.1:0.05")
    with ServerThread(sim) as server:
        outcomes = asyncio.run(_calls(server.url + "/v1", True, RetryPolicy(max_retries=4)))
    assert outcomes == ["ok"] * CALLS
    assert sim.stats()["faults_injected"]["status"] >= 5
