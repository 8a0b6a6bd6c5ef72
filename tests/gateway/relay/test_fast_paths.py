"""The relay's fast paths: the upstream connection pool, the wake scheme, the nowait log."""

from __future__ import annotations

import asyncio

import pytest

from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.upstream.connection import Upstream
from streamsafe.gateway.upstream.errors import ConnectFailed, UpstreamClosed, UpstreamError
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.sse import encode_events

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")


async def _serve_raw(
    handler: object,
) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))


async def test_upstream_does_not_reuse_a_keepalive_connection_the_engine_closed() -> None:
    connections = 0
    hung_up = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive was promised, but the engine hangs up
        await writer.wait_closed()
        hung_up.set()

    server, url = await _serve_raw(handler)
    upstream = Upstream(url)
    try:
        for _ in range(3):
            response = await upstream.open("GET", "/x")
            assert await response.read_body() == b"ok"
            response.release()
            await hung_up.wait()
            hung_up.clear()
        assert connections == 3
    finally:
        await upstream.close()
        server.close()


async def test_upstream_body_larger_than_the_read_buffer_arrives_whole_when_read_slowly() -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: reading pauses and resumes several times

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload))
        writer.write(payload)
        await writer.drain()
        writer.close()

    server, url = await _serve_raw(handler)
    upstream = Upstream(url)
    try:
        response = await upstream.open("POST", "/x", content=b"{}")
        parts = []
        async for chunk in response.body_chunks():
            parts.append(chunk)
            await asyncio.sleep(0)
        response.release()
        assert b"".join(parts) == payload
    finally:
        await upstream.close()
        server.close()


async def test_upstream_connection_cut_mid_body_is_an_upstream_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        writer.close()

    server, url = await _serve_raw(handler)
    upstream = Upstream(url)
    try:
        response = await upstream.open("GET", "/x")
        with pytest.raises(UpstreamError) as cut:
            async for _ in response.body_chunks():
                pass
        assert isinstance(cut.value, UpstreamClosed)
        response.release()
    finally:
        await upstream.close()
        server.close()


async def test_refused_upstream_connection_is_a_connect_error() -> None:
    server, url = await _serve_raw(lambda r, w: None)
    server.close()
    await server.wait_closed()
    upstream = Upstream(url, connect_retries=0)
    try:
        with pytest.raises(ConnectFailed):
            await upstream.open("GET", "/x")
    finally:
        await upstream.close()


def _generation() -> Generation:
    req = GenerationRequest(
        tenant="t",
        path="/v1/chat/completions",
        body=b"{}",
        fingerprint=b"f",
        cost=1,
        stream=True,
        route=CHAT,
    )
    return Generation("gen-1", req, MemoryEventLog(), None)


async def test_wake_resolves_every_waiter_once_and_skips_those_that_gave_up() -> None:
    gen = _generation()
    first, second, gave_up = gen.next_change(), gen.next_change(), gen.next_change()
    gave_up.cancel()
    version = gen.version
    gen.wake()
    assert gen.version == version + 1
    assert first.done() and second.done() and gave_up.cancelled()
    later = gen.next_change()
    assert not later.done()
    gen.forget_waiter(later)
    gen.wake()
    assert not later.done()


async def test_nowait_log_matches_the_awaitable_log() -> None:
    log = MemoryEventLog()
    assert log.append_nowait([b"a"]) == 1
    assert await log.append([b"bc", b"d"]) == 3
    assert log.read_nowait(1) == await log.read(1) == [b"bc", b"d"]
    assert log.nbytes > 4


def test_one_event_frame_equals_the_general_frame() -> None:
    assert encode_events([b"{}"], 7, False) == b"id: 7\ndata: {}\n\n"
    assert (
        encode_events([b"{}", b"[DONE]"], 7, False) == b"id: 7\ndata: {}\n\nid: 8\ndata: [DONE]\n\n"
    )
