"""One exchange with an engine (:class:`Exchange`): a request written on a kept-alive connection
of the engine's pool (:mod:`~streamsafe.gateway.upstream.transport`), its response parsed.

The hot path is a streaming completion. Through httpx, httpcore and h11, each chunk of a relayed
stream was parsed in pure Python under several layers of async iterators: a third of the
gateway's CPU per chunk, measured with ``streamsafe bench peers``. Here httptools (C) parses the
response inside the protocol's ``data_received``; the body, chunked framing already undone, goes
straight into the SSE decoder, and each read's completed event payloads are handed to a sink in
the same call (once per read, however many chunks it held), so a log that lives in this process
is appended to, and its subscribers written to, with no task switch per chunk.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import cast

import httptools

from streamsafe.gateway.upstream.errors import UpstreamClosed, UpstreamTimeout
from streamsafe.gateway.upstream.pool_connections import PoolConnections
from streamsafe.sse import SSEDecoder, SSEError

__all__ = ["KEEP_IDLE_S", "EventSink", "Exchange"]

#: Bytes of a response body held before the stream is read: past it the socket stops being read,
#: so TCP pushes back on the engine instead of the gateway buffering.
_READ_HIGH_WATER = 256 * 1024
#: Seconds an idle connection is reused within: under uvicorn's (and so vLLM's) 5 s keep-alive,
#: so the engine never closes a connection just as a request goes out on it.
KEEP_IDLE_S = 4.0
#: Seconds a streamed request body waits, at most, for the engine to take more of it (the write
#: timeout the gateway gave httpx before).
_WRITE_TIMEOUT_S = 30.0

#: Takes the payloads of the events one network read completed (never empty).
EventSink = Callable[[list[bytes]], None]


class Exchange(asyncio.Protocol):
    """One connection, one exchange at a time: :meth:`ConnectionPool.request` (the hot stream)
    or :meth:`ConnectionPool.open` (any other) writes a request, :meth:`head` waits for the
    status and headers, then the body is either read (whole: :meth:`read_body`; as it comes:
    :meth:`body_chunks`) or decoded as events into a sink (:meth:`stream_events`) until the
    response completes or the connection ends; :meth:`release` hands the connection back."""

    def __init__(self, conns: PoolConnections[Exchange]) -> None:
        self._conns = conns
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
        self._head_only = False  # the answer to a HEAD: no body follows its head
        self._broken: str | None = None  # why the exchange ended before the response did
        self._more: asyncio.Future[None] | None = None  # a body reader waiting for bytes
        self._paused = False  # reading stopped: the body reader is behind
        self._drain: asyncio.Future[None] | None = None  # the engine takes no more for now
        #: The loop's time of the last read (the upstream timeouts' sign of life).
        self.read_at = 0.0
        self._one: Callable[[bytes], bool] | None = None
        self.idle_since = 0.0

    # -- the exchange ---------------------------------------------------------------------------

    def _send(self, request: bytes, *, head_only: bool = False) -> None:
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
        self._head_only = head_only
        self._broken = None
        if self._paused:  # the last answer's body was left unread past the high water
            self._paused = False
            self._transport.resume_reading()
        self._head = self._loop.create_future()
        self._end = self._loop.create_future()
        self._transport.write(request)

    async def _send_body(self, chunks: AsyncIterable[bytes]) -> None:
        """Write a request body as it comes, in chunked framing, waiting while the engine takes
        no more (at most :data:`_WRITE_TIMEOUT_S` at a time); the terminating chunk once it
        ended. Raises :class:`UpstreamClosed` where the connection ends meanwhile."""
        async for chunk in chunks:
            if not chunk:
                continue
            transport = self._transport
            if self._closed or transport is None or transport.is_closing():
                raise UpstreamClosed("upstream connection closed while the request body was sent")
            transport.write(b"%x\r\n" % len(chunk))
            transport.write(chunk)
            transport.write(b"\r\n")
            drain = self._drain
            if drain is not None:
                try:
                    async with asyncio.timeout(_WRITE_TIMEOUT_S):
                        await asyncio.shield(drain)
                except TimeoutError:
                    raise UpstreamTimeout(
                        f"the engine took no more of the request body for {_WRITE_TIMEOUT_S} s"
                    ) from None
        if self._transport is None or self._transport.is_closing():
            raise UpstreamClosed("upstream connection closed while the request body was sent")
        self._transport.write(b"0\r\n\r\n")

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

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes, chunked framing undone: what each wait found (a pass-through
        relays it so). Raises :class:`UpstreamClosed` where the connection ends before the
        response is whole."""
        while True:
            if self._body:
                chunks = self._body
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._body = []
                self._body_size = 0
                if self._paused:
                    self._paused = False
                    self._resume()
                yield data
            elif self._complete:
                return
            elif self._broken is not None:
                raise UpstreamClosed(self._broken)
            else:
                self._more = more = self._loop.create_future()
                try:
                    await more
                finally:
                    self._more = None

    async def read_body(self, limit: int | None = None, *, broken_ok: bool = False) -> bytes:
        """The whole body, at most ``limit`` bytes (past it the connection is dropped). Raises
        :class:`UpstreamClosed` where the connection ends before the response is whole, unless
        ``broken_ok`` (an error body, passed on as far as it came) and some of it came."""
        parts: list[bytes] = []
        size = 0
        try:
            async for piece in self.body_chunks():
                parts.append(piece)
                size += len(piece)
                if limit is not None and size > limit:
                    self.close()
                    break
        except UpstreamClosed:
            if not (broken_ok and parts):
                raise
        body = b"".join(parts)
        return body if limit is None else body[:limit]

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

    def _wake(self) -> None:
        more = self._more
        if more is not None and not more.done():
            more.set_result(None)

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
            self._loop.call_later(KEEP_IDLE_S, self._give_up)
        else:
            self.close()

    def _to_pool(self) -> None:
        transport = self._transport
        if (
            self._keep_alive
            and not self._closed
            and transport
            and not transport.is_closing()
            and self._conns.keep(self)
        ):
            self._parser = None
            self._release_on_complete = False
            self.idle_since = self._loop.time()
        else:
            self.close()

    def _readable(self) -> bool:
        """Whether the idle connection's socket has something to read: the engine closed it
        (or sent bytes nobody asked for) and the loop has not yet said so. One ``poll`` per
        reuse, as httpcore asks before it reuses a connection."""
        transport = self._transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is None:
            return True
        try:
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):  # closed meanwhile
            return True

    def _give_up(self) -> None:
        if self._release_on_complete:
            self.close()

    def _completed(self) -> None:
        self._complete = True
        if self._end is not None and not self._end.done():
            self._end.set_result(None)
        self._wake()
        if self._release_on_complete:
            self._to_pool()

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
        if self._head_only:  # its Content-Length is the GET's: no body comes
            self._completed()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        if self._decoder is None:
            self._body_size += len(body)
            if self._body_size > _READ_HIGH_WATER and self._transport is not None:
                self._paused = True
                self._transport.pause_reading()
            self._wake()
        # A stream's body is decoded once the whole read is parsed (see data_received).

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._completed()

    # -- protocol callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._conns.opened(self)

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

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        # The parser and the sink (the relay's, which can close this connection) refer back to
        # it: let go of them, so that nothing is left for the garbage collector.
        self._parser = None
        self._sink = self._one = None
        self.resume_writing()  # a body writer waiting finds the connection gone
        self._conns.closed(self)
        if not self._complete:
            self._fail(f"upstream connection closed: {exc or 'end of stream'}")

    def _fail(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamClosed(why))
        if self._end is not None and not self._end.done():
            self._end.set_result(why)
        self._wake()
        self.close()
