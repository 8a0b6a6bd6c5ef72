"""The hot stream reader on its own, against a real simulator and against a raw server that
misbehaves on purpose: events arrive whole and in order, connections are reused, and an abandoned
stream reaches the server as a disconnect (the upstream timeouts around it are the relay's)."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator

import pytest

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.gateway.upstream import exchange
from streamsafe.gateway.upstream.connect_failure import connect_failure
from streamsafe.gateway.upstream.errors import (
    ConnectFailed,
    TLSFailed,
    UpstreamError,
    UpstreamTimeout,
)
from streamsafe.gateway.upstream.transport import ConnectionPool
from streamsafe.server import ServerThread
from waiting import wait_until_async

_JSON = {"content-type": "application/json"}


def _chat(max_tokens: int) -> bytes:
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps(
        {"model": "sim-llama-8b", "messages": messages, "max_tokens": max_tokens, "stream": True}
    ).encode()


def test_streams_reuse_one_kept_alive_connection_and_deliver_every_event() -> None:
    async def two_streams(url: str) -> None:
        pool = ConnectionPool(url, _JSON)
        conns = []
        for _ in range(2):
            conn = await pool.request(b"POST", "/v1/chat/completions", _chat(20))
            await conn.head()
            assert conn.status == 200
            got: list[bytes] = []
            asked = asyncio.get_running_loop().time()
            assert await conn.stream_events(got.extend) is None
            assert conn.read_at > asked  # every read notes its time (the timeouts' sign of life)
            # the role chunk, one chunk per token, [DONE]
            assert len(got) == 22 and got[-1] == b"[DONE]"
            assert all(json.loads(p)["object"] == "chat.completion.chunk" for p in got[:-1])
            conn.release(finished=True)
            conns.append(conn)
        assert conns[0] is conns[1]
        error = await pool.request(b"POST", "/v1/chat/completions", b"{}")
        await error.head()
        assert error.status == 400 and b'"error"' in await error.read_body(65536)
        error.release()
        pool.close()

    with ServerThread(Simulator(SimConfig(itl_ms=1.0))) as server:
        asyncio.run(two_streams(server.url))


async def _stalling_server(events: int, seen: asyncio.Queue[str]) -> tuple[asyncio.Server, str]:
    """Answers every request with ``events`` events, then says nothing more; reports
    ``closed`` when the client drops the connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for i in range(events):
            event = b'data: {"n": %d}\n\n' % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await reader.read()  # until the client goes
        await seen.put("closed")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def test_a_server_that_goes_quiet_is_not_a_finished_stream() -> None:
    async def run() -> None:
        seen: asyncio.Queue[str] = asyncio.Queue()
        server, url = await _stalling_server(3, seen)
        pool = ConnectionPool(url)
        conn = await pool.request(b"POST", "/v1/chat/completions", b"{}")
        await conn.head()
        got: list[bytes] = []
        three = asyncio.Event()

        def sink(payloads: list[bytes]) -> None:
            got.extend(payloads)
            if len(got) >= 3:
                three.set()

        end = conn.stream_events(sink)
        await asyncio.wait_for(three.wait(), 5)
        assert got == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
        assert not end.done()  # quiet, not over
        conn.release()  # the reader gives up: the connection goes, the server sees it
        assert await asyncio.wait_for(seen.get(), 5) == "closed"
        assert await asyncio.wait_for(end, 5) is not None
        server.close()

    asyncio.run(run())


def test_an_abandoned_stream_closes_its_connection() -> None:
    async def run() -> None:
        seen: asyncio.Queue[str] = asyncio.Queue()
        server, url = await _stalling_server(1, seen)
        pool = ConnectionPool(url)
        conn = await pool.request(b"POST", "/v1/chat/completions", b"{}")
        await conn.head()
        end = conn.stream_events(list)
        conn.release()  # the reader went away mid-stream
        assert await asyncio.wait_for(seen.get(), 5) == "closed"
        assert await asyncio.wait_for(end, 5) is not None  # our side saw the connection go
        assert pool.idle == 0
        # Gone with its last reference, not left to the garbage collector (its parser calls it
        # back, a cycle until the connection is lost).
        gone = weakref.ref(conn)
        gc.disable()
        try:
            del conn
            assert gone() is None
        finally:
            gc.enable()
        server.close()

    asyncio.run(run())


def test_the_events_of_one_read_reach_the_sink_in_one_call() -> None:
    # Three events in three HTTP chunks, written at once: one read, so one sink call (one log
    # append and one write to each subscriber downstream), not one per chunk.
    async def run() -> None:
        go = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await writer.drain()
            await go.wait()
            events = [b'data: {"n": %d}\n\n' % i for i in range(3)] + [b"data: [DONE]\n\n"]
            writer.write(b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n")
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        pool = ConnectionPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        conn = await pool.request(b"POST", "/v1/chat/completions", b"{}")
        await conn.head()
        calls: list[list[bytes]] = []
        end = conn.stream_events(calls.append)
        head_read_at = conn.read_at
        go.set()
        assert await asyncio.wait_for(end, 5) is None
        assert calls == [[b'{"n": 0}', b'{"n": 1}', b'{"n": 2}', b"[DONE]"]]
        assert conn.read_at > head_read_at  # the read that brought them was noted
        conn.release(finished=True)
        pool.close()
        server.close()

    asyncio.run(run())


async def _recording_server(
    answer: bytes, heads: list[bytes], bodies: list[bytes]
) -> tuple[asyncio.Server, str]:
    """Answers every request with ``answer`` after reading it whole (a ``Content-Length`` body
    or a chunked one), keeping each request's head and body."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            heads.append(head)
            body = b""
            lower = head.lower()
            if b"transfer-encoding: chunked" in lower:
                while (size := int((await reader.readline()).strip(), 16)) > 0:
                    body += await reader.readexactly(size)
                    await reader.readline()
                await reader.readline()
            elif b"content-length:" in lower:
                length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
            bodies.append(body)
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_any_method_a_streamed_body_and_headers_of_the_request_own_go_upstream() -> None:
    heads: list[bytes] = []
    bodies: list[bytes] = []

    async def run() -> None:
        answer = b"HTTP/1.1 201 Created\r\nx-engine: e1\r\ncontent-length: 4\r\n\r\nmade"
        server, url = await _recording_server(answer, heads, bodies)
        pool = ConnectionPool(url + "/base", {"authorization": "Bearer gateway"})

        async def upload() -> AsyncIterator[bytes]:
            for part in (b"--form\r\n", b"", b"file bytes", b"\r\n--form--\r\n"):
                yield part

        conn = await pool.open("PUT", b"/v1/files?purpose=x", upload(), [(b"X-Trace", b"7")])
        await conn.head()
        assert (conn.status, conn.header(b"x-engine")) == (201, b"e1")
        assert await conn.read_body() == b"made"
        conn.release()
        answer_ = await pool.call("GET", "/v1/models", headers=[(b"Authorization", b"Bearer c")])
        assert (answer_.status, answer_.body, answer_.header(b"x-engine")) == (201, b"made", b"e1")
        pool.close()
        server.close()

    asyncio.run(asyncio.wait_for(run(), 20))
    assert heads[0].startswith(b"PUT /base/v1/files?purpose=x HTTP/1.1\r\n")
    assert b"transfer-encoding: chunked" in heads[0] and b"x-trace: 7" in heads[0]
    assert b"authorization: Bearer gateway" in heads[0]
    assert bodies[0] == b"--form\r\nfile bytes\r\n--form--\r\n"
    # The request's own Authorization replaces the pool's; a GET without a body has no framing.
    assert b"authorization: Bearer c" in heads[1] and b"Bearer gateway" not in heads[1]
    assert b"content-length" not in heads[1] and b"transfer-encoding" not in heads[1]
    assert len(heads) == 2  # over one kept-alive connection (the server loops on it)


def test_a_head_answer_ends_at_its_head_and_its_connection_is_reused() -> None:
    heads: list[bytes] = []

    async def run() -> None:
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n"
        server, url = await _recording_server(answer, heads, [])
        pool = ConnectionPool(url)
        first = await pool.call("HEAD", "/v1/models", within=5)
        second = await pool.call("HEAD", "/v1/models", within=5)
        assert (first.status, first.body, second.body) == (200, b"", b"")
        pool.close()
        server.close()

    asyncio.run(asyncio.wait_for(run(), 20))
    assert len(heads) == 2


def test_a_call_with_no_answer_in_time_is_an_upstream_timeout_and_drops_its_connection() -> None:
    async def run() -> None:
        seen: asyncio.Queue[str] = asyncio.Queue()
        server, url = await _stalling_server(0, seen)
        pool = ConnectionPool(url)
        with pytest.raises(UpstreamTimeout) as late:
            await pool.call("POST", "/v1/chat/completions", b"{}", within=0.2)
        assert isinstance(late.value, UpstreamError) and isinstance(late.value, TimeoutError)
        assert await asyncio.wait_for(seen.get(), 5) == "closed"
        assert pool.idle == 0
        server.close()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_a_refused_connection_is_a_connect_failure_with_its_cause() -> None:
    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        pool = ConnectionPool(f"http://127.0.0.1:{port}")
        with pytest.raises(ConnectFailed) as refused:
            await pool.call("GET", "/health")
        assert not isinstance(refused.value, TLSFailed)
        assert connect_failure(refused.value) == "the connection was refused"

    asyncio.run(asyncio.wait_for(run(), 20))


def test_a_connection_whose_answer_was_left_unread_past_the_high_water_reads_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Past the read high water the socket stops being read; an answer that came whole in that
    # read, released unread, leaves it so, and the next exchange on it must read again.
    monkeypatch.setattr(exchange, "_READ_HIGH_WATER", 1024)
    heads: list[bytes] = []
    large = b"x" * 4096  # one loopback write, one read: past the high water and complete

    async def run() -> None:
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(large), large)
        server, url = await _recording_server(answer, heads, [])
        pool = ConnectionPool(url)
        conn = await pool.open("GET", "/big")
        await conn.head()
        await wait_until_async(lambda: conn._complete, 10, "the whole answer read")
        assert conn._paused
        conn.release()
        again = await pool.open("GET", "/big")
        assert again is conn
        await again.head()
        assert await asyncio.wait_for(again.read_body(), 10) == large
        again.release()
        pool.close()
        server.close()

    asyncio.run(asyncio.wait_for(run(), 20))
    assert len(heads) == 2
