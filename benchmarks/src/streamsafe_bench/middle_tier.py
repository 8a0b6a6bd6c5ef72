"""The report's real deployment: llama-stack-client -> Llama Stack -> engine, without streamsafe,
with streamsafe in front of Llama Stack, and with streamsafe behind it.

One :class:`~streamsafe_bench.llamastack_deployment.Deployment` (the real Llama Stack server in
front of an engine slot) serves every run; each run installs a fresh simulator (and, behind Llama
Stack, a gateway in front of it) in the slot, drives ``calls`` concurrent calls through
unmodified llama-stack-client with its own retries (:mod:`streamsafe_bench.tier_load`), and reads
what the engine saw from the engine's own counters.

Positions (see docs/design.md, Positions around Llama Stack):

- ``direct``: client -> Llama Stack -> engine, as the report deployed it.
- ``in-front``: client -> streamsafe (``--upstream-kind llama-stack``) -> Llama Stack -> engine.
- ``behind``: client -> Llama Stack -> streamsafe (``--upstream-kind vllm``) -> engine.

A call counts as exact only if its caller got exactly the text Llama Stack gives for it unloaded
(on the native streamed chat route, Llama Stack drops the engine's last token; that loss is Llama
Stack's and is expected here).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.harness import engine_drained
from streamsafe_bench.llamastack_deployment import Deployment
from streamsafe_bench.processes import free_port
from streamsafe_bench.tier_load import (
    CallResult,
    TierLoad,
    call_llama_stack,
    engine_for,
    expected_answer,
    llama_stack_client,
)

__all__ = ["Position", "TierResult", "gateway_for", "run_tier"]

Position = Literal["direct", "in-front", "behind"]


@dataclass
class TierResult:
    """One run's figures: what the callers got and what the engine saw."""

    position: Position
    load: TierLoad
    exact: int
    wrong_text: int
    errors: dict[str, int]
    engine_requests: int
    #: Requests Llama Stack sent behind it marked as its own retries (``x-stainless-retry-count``
    #: >= 1): its upstream client retries a failed or slow-to-connect engine call by itself.
    llama_stack_retries: int
    engine_generations: int
    engine_crashes: int
    engine_aborted: int
    tokens_unread: int
    memory_peak_tokens: int
    memory_capacity_tokens: int
    gateway: dict[str, Any] | None
    seconds: float

    def row(self) -> dict[str, Any]:
        """The JSON row of the demo report."""
        return {
            "position": self.position,
            "api": self.load.api,
            "stream": self.load.stream,
            "calls": self.load.calls,
            "exact": self.exact,
            "wrong_text": self.wrong_text,
            "errors": self.errors,
            "engine_requests": self.engine_requests,
            "llama_stack_retries": self.llama_stack_retries,
            "engine_generations": self.engine_generations,
            "engine_crashes": self.engine_crashes,
            "engine_aborted": self.engine_aborted,
            "tokens_unread": self.tokens_unread,
            "memory_peak_tokens": self.memory_peak_tokens,
            "memory_capacity_tokens": self.memory_capacity_tokens,
            "gateway_attached": (self.gateway or {}).get("attached"),
            "gateway_breaker_open": (self.gateway or {}).get("breaker_open"),
            "seconds": round(self.seconds, 2),
        }


def gateway_for(load: TierLoad, position: Position, **overrides: Any) -> GatewayConfig:
    """The gateway of a position: in front of Llama Stack it speaks Llama Stack's routes and
    keeps the client's connection alive (a heartbeat well inside the client's timeout); behind
    it, it speaks vLLM's and collapses a client's retry that Llama Stack sends as a fresh call."""
    heartbeat = max(0.05, load.timeout_s / 4)
    base: dict[str, Any] = {
        "upstream": "http://placeholder",
        "heartbeat": heartbeat,
        "grace": load.timeout_s * 5,
        "queue_size": load.calls * 4,
        "queue_timeout": load.timeout_s * 30,
    }
    if position == "in-front":
        base["upstream_kind"] = "llama-stack"
    else:
        base["upstream_kind"] = "vllm"
        base["collapse_identical"] = "all"
    base.update(overrides)
    return GatewayConfig(**base)


@contextlib.contextmanager
def _position(
    deployment: Deployment, position: Position, sim: Simulator, gateway: GatewayConfig | None
) -> Iterator[tuple[str, Callable[[], dict[str, Any]] | None]]:
    """Arrange ``position`` around the deployment's Llama Stack; yield where callers connect and
    how to read the gateway's ``/stats`` (if there is a gateway)."""
    if position == "direct":
        deployment.install(sim)
        yield deployment.url, None
    elif position == "in-front":
        assert gateway is not None
        deployment.install(sim)
        # Its own process, as deployed: the callers' load in this process must not starve it.
        with _gateway_process(replace(gateway, upstream=deployment.url)) as url:

            def stats() -> dict[str, Any]:
                import httpx2

                doc: dict[str, Any] = httpx2.get(url + "/stats", timeout=10).json()
                return doc

            yield url, stats
    else:
        assert gateway is not None
        with ServerThread(sim) as engine:
            gw = Gateway(replace(gateway, upstream=engine.url))
            deployment.install(gw)
            try:
                yield deployment.url, gw.stats
            finally:
                deployment.install(Simulator(SimConfig(model=sim.config.model)))


def _serve_gateway(config: GatewayConfig, port: int) -> None:
    """The body of a gateway process (see :func:`_gateway_process`)."""
    from streamsafe.server import run_server

    run_server(Gateway(config), port=port, log_level="warning")


@contextlib.contextmanager
def _gateway_process(config: GatewayConfig) -> Iterator[str]:
    """A gateway with ``config`` in a child process on a free loopback port; its URL."""
    import multiprocessing

    import httpx2

    port = free_port()
    proc = multiprocessing.get_context("spawn").Process(
        target=_serve_gateway, args=(config, port), daemon=True
    )
    proc.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(url + "/health", timeout=2).status_code == 200:
                    break
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway process did not start")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


async def run_tier(
    deployment: Deployment,
    position: Position,
    load: TierLoad,
    engine: SimConfig | None = None,
    gateway: GatewayConfig | None = None,
    *,
    drain_s: float | None = None,
) -> TierResult:
    """Drive ``load`` through ``position`` on a fresh engine (default :func:`engine_for`) and,
    where the position has one, a fresh gateway (default :func:`gateway_for`); wait for the
    engine to finish what it still holds (at most ``drain_s``, default 20 client timeouts or
    60 s) and for Llama Stack to go quiet (at most 30 s), and return the figures. ``seconds``
    is the time until the last caller had its answer or error."""
    sim = Simulator(engine or engine_for(load))
    if position != "direct" and gateway is None:
        gateway = gateway_for(load, position)
    t0 = time.monotonic()
    with _position(deployment, position, sim, gateway) as (url, gateway_stats):
        async with llama_stack_client(url, load) as client:
            results = await asyncio.gather(
                *(call_llama_stack(client, load, i) for i in range(load.calls))
            )
        seconds = time.monotonic() - t0
        # What Llama Stack still does for callers that left (finishing non-streaming calls,
        # retrying failed engine calls after a backoff) counts for this run, and must not land
        # on the next run's engine: wait until the engine is idle and Llama Stack quiet.
        limit = drain_s if drain_s is not None else max(60.0, load.timeout_s * 20)
        await engine_drained(sim, limit)
        await asyncio.to_thread(deployment.quiesce, 2.5, 30.0)
        stats = sim.stats()
        gw_stats = gateway_stats() if gateway_stats is not None else None
        ls_retries = sum(
            1 for r in deployment.slot.seen if r.headers.get("x-stainless-retry-count", "0") != "0"
        )
    exact, wrong, errors = _score(results, load, sim.config.seed)
    return TierResult(
        position=position,
        load=load,
        exact=exact,
        wrong_text=wrong,
        errors=errors,
        engine_requests=stats["requests_received"],
        llama_stack_retries=ls_retries,
        engine_generations=stats["generations_started"] - stats["continuations"],
        engine_crashes=stats["crashes"],
        engine_aborted=stats["generations_aborted"],
        tokens_unread=stats["tokens_unread"],
        memory_peak_tokens=stats["memory_peak_tokens"],
        memory_capacity_tokens=stats["memory_capacity_tokens"],
        gateway=gw_stats,
        seconds=seconds,
    )


def _score(results: list[CallResult], load: TierLoad, seed: int) -> tuple[int, int, dict[str, int]]:
    """The calls answered exactly, those answered with another text, and the errors the rest
    got (each with how many)."""
    exact = wrong = 0
    errors: Counter[str] = Counter()
    for i, result in enumerate(results):
        if result.error is not None:
            errors[result.error] += 1
        elif result.text == expected_answer(load, i, seed):
            exact += 1
        else:
            wrong += 1
    return exact, wrong, dict(errors)
