"""The demo: the outage of the original report reproduced, and prevented, side by side.

Six scenarios drive the same workload (many concurrent streaming chats whose total fits the
engine only if each is sent once) through a client library and a path:

1. llama-stack-client straight to an engine that keeps abandoned work and holds its headers
   until the first token (the deployment of the original report): copies pile up, it dies.
2. openai, same path: the same failure from the other Stainless client.
3. streamsafe's client, same path: a stream is never re-sent, the engine lives.
4. llama-stack-client, unmodified, through the gateway with ``commit=first-token``: its
   retries arrive and attach to the generation already running.
5. The same through the gateway's defaults (early commit, keep-alive heartbeats): no client
   times out, so there are no retries at all.
6. streamsafe's client through the gateway while the engine cuts streams at random: every
   stream still completes, no token lost or repeated.

Time is compressed: the clients' 60 s read timeout becomes ``timeout_s`` (2 s; 1 s with
``--quick``) and the gateway's 5 s heartbeat scales with it, so the whole demo runs in about a
minute. Everything runs in-process on loopback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamsafe.engine_sim import Fault, SimConfig
from streamsafe.gateway import GatewayConfig
from streamsafe_bench.harness import (
    ClientKind,
    Outcome,
    PathKind,
    Workload,
    compare_tokens,
    drive_workload,
    engine_drained,
    expected_reply,
    make_driver,
    run_stack,
)
from streamsafe_bench.stats import percentile

__all__ = ["DemoSettings", "Scenario", "healthy_engine", "run_demo", "scenarios"]

_REAL_TIMEOUT_S = 60.0  # llama-stack-client's read timeout, which the demo compresses
_REAL_HEARTBEAT_S = 5.0  # the gateway's default heartbeat, compressed alike


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of one demo run. ``quick`` is the test suite's smaller run."""

    workload: Workload
    timeout_s: float
    memory_tokens: int
    max_num_seqs: int
    itl_ms: float
    itl_ms_per_seq: float
    seed: int = 7

    @classmethod
    def full(cls) -> DemoSettings:
        return cls(Workload(48, 240, 100), 1.0, 16384, 16, 8.0, 0.4)

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(Workload(24, 250, 60), 0.5, 7424, 8, 10.0, 0.5)

    @property
    def heartbeat_s(self) -> float:
        return _REAL_HEARTBEAT_S * self.timeout_s / _REAL_TIMEOUT_S


@dataclass(frozen=True)
class Scenario:
    """One row of the demo."""

    name: str
    client: ClientKind
    path: PathKind
    claim: str
    sim: Callable[[DemoSettings], SimConfig]
    gateway: Callable[[DemoSettings], GatewayConfig] | None = None


def _engine(s: DemoSettings, **overrides: Any) -> SimConfig:
    base: dict[str, Any] = {
        "model": s.workload.model,
        "memory_tokens": s.memory_tokens,
        "max_num_seqs": s.max_num_seqs,
        "itl_ms": s.itl_ms,
        "itl_ms_per_seq": s.itl_ms_per_seq,
        "prefill_ms_per_token": 0.02,
        "default_max_tokens": s.workload.max_tokens,
        "seed": s.seed,
    }
    base.update(overrides)
    return SimConfig(**base)


def _report_deployment(s: DemoSettings) -> SimConfig:
    """The original report's deployment, modelled in the simulator: a middle layer that neither
    passes a client's disconnect on nor sends headers before the first token. It stands for
    Llama Stack + vLLM so rows 1-3 can compare three clients on one cheap, in-process path; the
    real Llama Stack server is measured in the middle-tier rows (7 on), where non-streaming
    calls behave as modelled and streams get their headers at once."""
    return _engine(s, abort_on_disconnect=False, headers_after_first_token=True)


def healthy_engine(s: DemoSettings) -> SimConfig:
    """A healthy vLLM-like engine at the demo's sizes (the overload benchmark's capacity is
    measured on it)."""
    return _engine(s)


def _vllm_cutting(s: DemoSettings) -> SimConfig:
    return _engine(s, faults=(Fault.parse(f"cut:1-{s.workload.max_tokens}:0.3"),))


def _gateway(s: DemoSettings, commit: str) -> GatewayConfig:
    # max_continuations: scenario 6 cuts 30 % of engine streams, continuations included; 12
    # continuations make a stream that still fails a one-in-millions event.
    return GatewayConfig(
        max_continuations=12,
        upstream="http://placeholder",
        commit=commit,  # type: ignore[arg-type]
        heartbeat=s.heartbeat_s,
        grace=s.timeout_s * 5,
        max_inflight=s.max_num_seqs,
        max_memory_tokens=int(s.memory_tokens * 0.9),
        queue_size=s.workload.requests * 4,
        queue_timeout=s.timeout_s * 30,
    )


def scenarios() -> list[Scenario]:
    """The six scenarios, in the order the demo runs them."""
    return [
        Scenario(
            "1. llama-stack-client, direct",
            "llama-stack-client",
            "direct",
            "copies pile up, the engine dies (simulated middle tier; the real one is row 7)",
            _report_deployment,
        ),
        Scenario(
            "2. openai, direct",
            "openai",
            "direct",
            "copies pile up, the engine dies (simulated middle tier; the real one is row 7)",
            _report_deployment,
        ),
        Scenario(
            "3. streamsafe client, direct",
            "streamsafe",
            "direct",
            "no copies, the engine lives (simulated middle tier)",
            _report_deployment,
        ),
        Scenario(
            "4. llama-stack-client via gateway (first-token commit)",
            "llama-stack-client",
            "gateway",
            "retries attach: one generation per request",
            healthy_engine,
            lambda s: _gateway(s, "first-token"),
        ),
        Scenario(
            "5. llama-stack-client via gateway (defaults)",
            "llama-stack-client",
            "gateway",
            "heartbeats: no retries at all",
            healthy_engine,
            lambda s: _gateway(s, "early"),
        ),
        Scenario(
            "6. streamsafe client via gateway, engine cuts streams",
            "streamsafe",
            "gateway",
            "every stream completes, no token lost or repeated",
            _vllm_cutting,
            lambda s: _gateway(s, "early"),
        ),
    ]


@dataclass
class ScenarioResult:
    """One row of the report (see the JSON keys in the README)."""

    row: dict[str, Any]
    memory_series: list[tuple[float, int]] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value, 3)


def _score(outcomes: list[Outcome], s: DemoSettings) -> tuple[int, int, int, list[float]]:
    """Tokens lost and repeated over the answers, the calls silently truncated, and the
    latencies of the calls completed.

    A call counts as completed only if its caller got the whole, exact answer. A call that
    ended without an error but short (llama-stack-client 0.2.x reads an in-stream error event
    as one more chunk) is "silently truncated": its missing tokens count as lost."""
    lost = repeated = truncated = 0
    latencies: list[float] = []
    for i, out in enumerate(outcomes):
        if out.ok:
            lo, rep = compare_tokens(expected_reply(s.workload, i, s.seed), out.text)
            lost += lo
            repeated += rep
            truncated += lo > 0
            if lo == 0 and rep == 0:
                latencies.append(out.seconds)
    return lost, repeated, truncated, latencies


async def run_scenario(sc: Scenario, s: DemoSettings) -> ScenarioResult:
    """Run one scenario on fresh servers; return its row and the engine's memory series."""
    gw_cfg = sc.gateway(s) if sc.gateway else None
    with run_stack(sc.sim(s), gw_cfg) as stack:
        async with make_driver(sc.client, stack.url, s.timeout_s) as driver:
            outcomes = await drive_workload(driver, s.workload)
        # Let the engine drain what it still holds (orphans keep running), so memory and crash
        # figures include the aftermath, bounded in time.
        await engine_drained(stack.simulator, s.timeout_s * 10)
        sim = stack.simulator.stats()
        gw = stack.gateway.stats() if stack.gateway else None
        series = stack.simulator.memory_series()

    lost, repeated, truncated, latencies = _score(outcomes, s)
    completed = len(latencies)
    n = s.workload.requests
    attempts = gw["requests_received"] if gw is not None else sim["requests_received"]
    # A continuation (the gateway resuming a broken stream) generates only the missing tokens,
    # so it is not another generation of the request.
    generations = sim["generations_started"] - sim["continuations"]
    row = {
        "name": sc.name,
        "client": sc.client,
        "path": sc.path,
        "claim": sc.claim,
        "logical_requests": n,
        "client_attempts": attempts,
        "upstream_generations": generations,
        "amplification": round(generations / n, 3),
        "engine_crashes": sim["crashes"],
        "completed": completed,
        "failed": n - completed,
        "silently_truncated": truncated,
        "tokens_lost": lost,
        "tokens_repeated": repeated,
        "tokens_unread": sim["tokens_unread"],
        "engine_cuts": sim["faults_injected"]["cut"],
        "upstream_continuations": sim["continuations"],
        "p50_s": _percentile(latencies, 0.5),
        "p99_s": _percentile(latencies, 0.99),
        "memory_peak_tokens": sim["memory_peak_tokens"],
        "memory_capacity_tokens": sim["memory_capacity_tokens"],
        "errors": sorted({o.error for o in outcomes if not o.ok}),
    }
    return ScenarioResult(row, series)


async def run_demo(
    settings: DemoSettings,
    *,
    only: list[int] | None = None,
    on_done: Callable[[ScenarioResult], None] | None = None,
) -> list[ScenarioResult]:
    """Run the scenarios (all, or the 1-based indices in ``only``) one after another."""
    results = []
    for i, sc in enumerate(scenarios(), 1):
        if only and i not in only:
            continue
        result = await run_scenario(sc, settings)
        results.append(result)
        if on_done:
            on_done(result)
    return results
