"""The middle-tier rows of ``streamsafe demo``: the report's deployment as it was (Llama Stack
straight in front of the engine), then with streamsafe in front of Llama Stack (see
:mod:`streamsafe_bench.middle_tier`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from streamsafe.engine_sim import Simulator
from streamsafe_bench.middle_tier import Position, gateway_for, run_tier
from streamsafe_bench.tier_load import TierLoad, engine_for

__all__ = ["DEMO_ROWS", "FIRST_DEMO_ROW", "DemoRow", "demo_load", "run_demo_rows"]


@dataclass(frozen=True)
class DemoRow:
    """One middle-tier row of ``streamsafe demo``."""

    name: str
    position: Position
    stream: bool
    claim: str
    json_keepalive: bool = False


#: The demo's middle-tier rows: the report's deployment as it was, then with streamsafe.
DEMO_ROWS = (
    DemoRow(
        "7. llama-stack-client -> Llama Stack, non-streamed",
        "direct",
        False,
        "the report's storm: copies pile up, the engine dies",
    ),
    DemoRow(
        "8. llama-stack-client -> Llama Stack, streamed",
        "direct",
        True,
        "no copies, but callers time out mid-stream",
    ),
    DemoRow(
        "9. ... -> streamsafe -> Llama Stack, streamed",
        "in-front",
        True,
        "heartbeats: every caller gets its text, one generation each",
    ),
    DemoRow(
        "10. ... -> streamsafe (json keep-alive) -> Llama Stack, non-streamed",
        "in-front",
        False,
        "no timeouts, no copies: every caller gets its text",
        json_keepalive=True,
    ),
)


def demo_load(quick: bool) -> TierLoad:
    """The demo's load: 32 calls with a 2 s client timeout (16 and 1 s with ``quick``), each
    answer taking longer than the timeout once the engine's queue is in the way."""
    if quick:
        return TierLoad(calls=16, max_tokens=30, timeout_s=1.0)
    return TierLoad(calls=32, max_tokens=70, timeout_s=2.0)


#: The number of the first middle-tier row in the demo (after the six simulator scenarios).
FIRST_DEMO_ROW = 7


async def run_demo_rows(
    quick: bool,
    *,
    only: list[int] | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Start Llama Stack once, run the :data:`DEMO_ROWS` rows (all, or those numbered in
    ``only``) on a fresh engine each, and return the rows (see :meth:`TierResult.row`, plus
    ``name``, ``claim`` and Llama Stack's ``startup_s``)."""
    specs = [
        spec for number, spec in enumerate(DEMO_ROWS, FIRST_DEMO_ROW) if not only or number in only
    ]
    if not specs:
        return []
    from streamsafe_bench.llamastack_deployment import llama_stack_deployment

    base = demo_load(quick)
    engine = engine_for(base, itl_ms=40.0)
    rows: list[dict[str, Any]] = []
    with llama_stack_deployment(Simulator(engine), base.model) as deployment:
        for spec in specs:
            load = replace(base, stream=spec.stream)
            gateway = None
            if spec.position != "direct":
                gateway = gateway_for(load, spec.position, json_keepalive=spec.json_keepalive)
            result = await run_tier(deployment, spec.position, load, engine, gateway)
            row = {"name": spec.name, "claim": spec.claim, **result.row()}
            row["startup_s"] = round(deployment.ls.startup_s or 0.0, 2)
            rows.append(row)
            if on_done is not None:
                on_done(row)
    return rows
