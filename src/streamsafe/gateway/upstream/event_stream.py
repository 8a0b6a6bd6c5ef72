"""The hot stream: an upstream streaming completion read on a plain asyncio protocol.

Through httpx2, httpcore2 and h11, each chunk of a relayed stream is parsed in pure Python under
several layers of async iterators: a third of the gateway's CPU per chunk, measured with
``streamsafe bench peers``. Here httptools (C) parses the response inside the protocol's
``data_received``; the body, chunked framing already undone, goes straight into the SSE decoder,
and each read's completed event payloads are handed to a sink in the same call (once per read,
however many chunks it held), so a log that lives in this process is appended to, and its
subscribers written to, with no task switch per chunk.

Only streaming completions come this way; everything else (models, health, non-streaming calls)
keeps httpx2. Connections are kept alive and reused, and a stream that is abandoned closes its
connection, which is how the engine learns to abort the request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import Callable, Mapping
from typing import cast

import httptools

from streamsafe.sse import SSEDecoder, SSEError

__all__ = ["EventSink", "EventStream", "EventStreamPool", "UpstreamClosed", "header_lines"]

#: Bytes of a response body held before the stream is read: past it the socket stops being read,
#: so TCP pushes back on the engine instead of the gateway buffering.
_READ_HIGH_WATER = 256 * 1024
#: Seconds an idle connection is reused within: under uvicorn's (and so vLLM's) 5 s keep-alive,
#: so the engine never closes a connection just as a request goes out on it.
_KEEP_IDLE_S = 4.0

#: Takes the payloads of the events one network read completed (never empty).
EventSink = Callable[[list[bytes]], None]


class UpstreamClosed(ConnectionError):
    """The connection ended before the response head arrived."""


class EventStream(asyncio.Protocol):
    """One connection, one exchange at a time: :meth:`EventStreamPool.request` writes a request,
    :meth:`head` waits for the status and headers, then the body is either collected
    (:meth:`read_body`) or decoded as events into a sink (:meth:`stream_events`) until the
    response completes or the connection ends; :meth:`release` hands the connection back."""

    def __init__(self, pool: EventStreamPool) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] | None = None
        self._end: asyncio.Future[str | None] | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._decoder: SSEDecoder | None = None
        self._sink: EventSink | None = None
        self._complete = False
        self._interim = False  # the head just parsed was a 1xx: the real one follows
        self._keep_alive = False
        self._release_on_complete = False
        self._closed = False
        #: The loop's time of the last read (the upstream timeouts' sign of life).
        self.read_at = 0.0
        self._one: Callable[[bytes], bool] | None = None
        self.idle_since = 0.0

    # -- the exchange ---------------------------------------------------------------------------

    def _send(self, request: bytes) -> None:
        assert self._transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = []
        self._body = []
        self._body_size = 0
        self._decoder = None
        self._sink = None
        self._one = None
        self._complete = self._keep_alive = self._release_on_complete = self._interim = False
        self._head = self._loop.create_future()
        self._end = self._loop.create_future()
        self._transport.write(request)

    async def head(self) -> None:
        """Wait for the status line and headers (:attr:`status`, :meth:`header`); raise
        :class:`UpstreamClosed` if the connection ends first."""
        assert self._head is not None
        await self._head

    def header(self, name: bytes) -> bytes | None:
        """The first value of response header ``name`` (lower case), if any."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read_body(self, limit: int) -> bytes:
        """The whole body, at most ``limit`` bytes (past it the connection is dropped)."""
        assert self._end is not None
        self._resume()
        if self._body_size < limit:
            error = await self._end
            if error is not None and not self._body:
                raise UpstreamClosed(error)
        body = b"".join(self._body)
        if len(body) > limit:
            self.close()
        return body[:limit]

    def stream_events(
        self,
        sink: EventSink,
        *,
        one: Callable[[bytes], bool] | None = None,
    ) -> asyncio.Future[str | None]:
        """Decode the body as an event stream from now on, handing each read's completed event
        payloads to ``sink`` from the event loop's read callback (it must not block); every
        read notes its time in :attr:`read_at` (the upstream timeouts' sign of life). The future
        returned resolves when the stream ends: ``None`` once the response completed, else why
        it broke. ``one``, where given, is offered first the payload of a read that is exactly
        one plain event (the usual read of a token stream), and takes it or answers ``False``
        for ``sink`` to have it."""
        assert self._end is not None
        self._decoder = SSEDecoder()
        self._sink = sink
        self._one = one
        if self._body:  # read with the head, before the stream was asked for
            self._deliver()
        self._resume()
        return self._end

    def _resume(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def close(self) -> None:
        """Drop the connection (an unfinished stream: the engine sees the disconnect)."""
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def release(self, *, finished: bool = False) -> None:
        """Done with the exchange. A completed response leaves its connection in the pool for
        the next request; so does a stream that ``finished`` (``[DONE]`` seen) once its
        terminating chunk arrives, which usually follows in the same read. Anything else is
        closed: an abandoned stream must reach the engine as a disconnect."""
        if self._complete:
            self._to_pool()
        elif finished and not self._closed:
            self._sink = None
            self._one = None
            self._release_on_complete = True
            self._loop.call_later(_KEEP_IDLE_S, self._give_up)
        else:
            self.close()

    def _to_pool(self) -> None:
        transport = self._transport
        if self._keep_alive and not self._closed and transport and not transport.is_closing():
            self._parser = None
            self._release_on_complete = False
            self.idle_since = self._loop.time()
            self._pool._idle.append(self)
        else:
            self.close()

    def _give_up(self) -> None:
        if self._release_on_complete:
            self.close()

    # -- httptools callbacks --------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows on the
            # same connection; a connection that ends first never gave a head.
            self.headers = []
            self._interim = True
            return
        self.status = status
        self._keep_alive = self._parser.should_keep_alive()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        if self._decoder is None:
            self._body_size += len(body)
            if self._body_size > _READ_HIGH_WATER and self._transport is not None:
                self._transport.pause_reading()
        # A stream's body is decoded once the whole read is parsed (see data_received).

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._complete = True
        if self._end is not None and not self._end.done():
            self._end.set_result(None)
        if self._release_on_complete:
            self._to_pool()

    # -- protocol callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # bytes on an idle connection: it cannot be reused
            self.close()
            return
        self.read_at = self._loop.time()
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._decoder is not None and self._body:
                self._deliver()  # what came whole before the broken bytes
            self._fail(f"upstream sent broken HTTP: {exc}")
            return
        chunks = self._body
        if chunks and self._decoder is not None:
            one = self._one
            if len(chunks) == 1 and one is not None:
                payload = self._decoder.one_payload(chunks[0])
                if payload is not None and one(payload):
                    chunks.clear()
                    return
            self._deliver()

    def _deliver(self) -> None:
        """Hand the events of what was read to the sink, in one call however many chunks of
        the response the read held: one log append and one write to each subscriber per read
        (under load a read often carries several events)."""
        chunks = self._body
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        assert self._decoder is not None
        try:
            payloads = self._decoder.payloads(body)
        except SSEError as exc:
            self._fail(f"upstream sent a broken event stream: {exc}")
            return
        if payloads and self._sink is not None:
            self._sink(payloads)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        # The parser and the sink (the relay's, which can close this connection) refer back to
        # it: let go of them, so that nothing is left for the garbage collector.
        self._parser = None
        self._sink = self._one = None
        with contextlib.suppress(ValueError):  # not idle: in an exchange
            self._pool._idle.remove(self)
        if not self._complete:
            self._fail(f"upstream connection closed: {exc or 'end of stream'}")

    def _fail(self, why: str) -> None:
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamClosed(why))
        if self._end is not None and not self._end.done():
            self._end.set_result(why)
        self.close()


class EventStreamPool:
    """Kept-alive connections to one upstream for :class:`EventStream` exchanges.

    ``base_url`` is ``http://host[:port][/prefix]`` or ``https://...``; ``headers`` go on every
    request; ``connect_timeout`` bounds opening a new connection (a reused one costs no timer).
    ``ssl_context`` verifies an ``https`` upstream (default: the system's trusted CAs).
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        *,
        connect_timeout: float | None = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if tls else 80)
        self._prefix = parts.path.rstrip("/").encode()
        self._ssl = (ssl_context or ssl.create_default_context()) if tls else None
        self._connect_timeout = connect_timeout
        self._idle: collections.deque[EventStream] = collections.deque()
        default_port = 443 if tls else 80
        host = self.host if self.port == default_port else f"{self.host}:{self.port}"
        if ":" in self.host:  # IPv6 literal
            host = f"[{self.host}]" if self.port == default_port else f"[{self.host}]:{self.port}"
        self._fixed = header_lines({"host": host, **(headers or {})})

    async def request(
        self, method: bytes, path: str, body: bytes, headers: bytes = b""
    ) -> EventStream:
        """Write a request on an idle connection or a new one and return it (await
        :meth:`EventStream.head` next). ``headers`` are header lines, each ending in CRLF, on top
        of the pool's own (see :func:`header_lines`). Raises ``OSError`` (``TimeoutError``
        included) when no connection can be made: then nothing reached the engine."""
        request = b"%s %s%s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n%s" % (
            method,
            self._prefix,
            path.encode(),
            self._fixed,
            headers,
            len(body),
            body,
        )
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._idle:
            conn = self._idle.pop()
            if conn._closed:
                continue
            if now - conn.idle_since > _KEEP_IDLE_S:
                conn.close()
                continue
            conn._send(request)
            return conn
        async with asyncio.timeout(self._connect_timeout):
            _, conn = await loop.create_connection(
                lambda: EventStream(self),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl else None,
            )
        conn._send(request)
        return conn

    def close(self) -> None:
        """Close every idle connection."""
        while self._idle:
            self._idle.pop().close()


def header_lines(headers: Mapping[str, str]) -> bytes:
    """``headers`` as HTTP/1.1 header lines, each ending in CRLF (built once, not per request)."""
    return b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
