"""``probe_kind`` against the real servers: Llama Stack, the simulator (vLLM's surface), the
streamsafe gateway, and nothing at all."""

from __future__ import annotations

import asyncio

import httpx2

from conftest import LlamaStackTier
from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.upstream.probe import probe_kind
from streamsafe.gateway.upstream.transport import ConnectionPool
from streamsafe.server import ServerThread, bind_socket


async def _probe(url: str) -> str | None:
    pool = ConnectionPool(url)
    try:
        async with asyncio.timeout(30):
            return await probe_kind(pool)
    finally:
        pool.close()


async def test_probe_tells_llama_stack_from_vllm(tier: LlamaStackTier) -> None:
    assert await _probe(tier.url) == "llama-stack"
    assert await _probe(tier.slot_url) == "vllm"


async def test_probe_of_a_dead_engine_still_says_vllm() -> None:
    sim = Simulator(SimConfig(memory_tokens=64, default_max_tokens=200))
    with ServerThread(sim) as server:
        body = {"model": "sim-llama-8b", "prompt": "x", "max_tokens": 200}
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as client:
            await client.post(server.url + "/v1/completions", json=body)
        assert sim.stats()["engine_dead"]
        assert await _probe(server.url) == "vllm"


async def test_probe_of_a_gateway_and_of_nothing() -> None:
    with ServerThread(Simulator(SimConfig())) as engine:
        gateway = Gateway(GatewayConfig(upstream=engine.url))
        with ServerThread(gateway) as server:
            assert await _probe(server.url) == "vllm"
    sock = bind_socket()  # a port just released: connections to it are refused
    port = sock.getsockname()[1]
    sock.close()
    assert await _probe(f"http://127.0.0.1:{port}") is None
