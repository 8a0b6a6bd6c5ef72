"""A quiet attempt asks its engine's ``/health``; no answer in time holds the engine down, unless
the engine sent something on another connection meanwhile: then it is busy (its health path
starved, as a CPU vLLM's is under load), not frozen or gone (docs/design.md, Failover)."""

from __future__ import annotations

import asyncio

import pytest

from streamsafe.gateway.upstream.connection import Upstream
from streamsafe.gateway.upstream.exchange import Exchange

pytestmark = pytest.mark.timeout(30)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine whose ``/health`` never answers and whose ``/stream`` sends a byte every 50 ms."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /health"):
            await asyncio.Event().wait()  # starved: no answer
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)  # the engine's pace: the behaviour under test
    except (asyncio.CancelledError, ConnectionError):
        writer.close()  # the test's loop ends, or the gateway hung up


async def test_an_engine_that_streams_while_its_health_is_silent_is_busy_not_down() -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # A probe interval shorter than the checks: neither check is answered from the last one.
    upstream = Upstream(f"http://127.0.0.1:{port}", kind="vllm", probe_interval=0.1)
    exchange = await upstream.open("GET", "/stream")
    flowing = asyncio.Event()
    reading = asyncio.create_task(_drain(exchange, flowing))
    try:
        # Past the probe interval since the stream's head: the check is not answered from it.
        await flowing.wait()
        assert await upstream.healthy(0.3)
        assert not upstream.breaker.held
        # The stream closed: nothing comes from the engine on any connection now, and its
        # /health is still silent: down.
        reading.cancel()
        exchange.close()
        assert not await upstream.healthy(0.3)
        assert upstream.breaker.held
    finally:
        reading.cancel()
        exchange.close()
        await upstream.close()
        server.close()


async def _drain(exchange: Exchange, flowing: asyncio.Event) -> None:
    """Read the stream; ``flowing`` is set once five pieces came (past the probe interval)."""
    pieces = 0
    async for _ in exchange.body_chunks():
        pieces += 1
        if pieces == 5:
            flowing.set()
