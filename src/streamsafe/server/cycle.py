"""One HTTP/1.1 request and its response, as the ASGI app sees them.

:class:`RequestCycle` is what :mod:`streamsafe.server.protocol` hands the app for each request:
``receive`` (the body, then ``http.disconnect`` once the client left or the response ended),
``send`` (the response, framed here: ``content-length`` where the app gave one, else chunked,
or until the close for HTTP/1.0), and the direct body writer offered as the
:data:`~streamsafe.server.asgi.BODY_WRITER_EXTENSION`.

It is built for the gateway's streams: a message costs one ``transport.write`` and no task; the
head is held until the end of the loop iteration that started the response, so a start followed
at once by a body (a first token already there) leaves in one write; a body bigger than the
connection's write buffer makes ``send`` wait for the client to read (``drain``, see
:mod:`streamsafe.server.flow`), for at most ``ServerLimits.send_timeout``, and the direct writer
declines instead.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from streamsafe.server.flow import HIGH_WATER
from streamsafe.server.limits import error_response

__all__ = ["Connection", "RequestCycle"]

#: The server's error log: uvicorn's, whose ``Server`` runs the listening sockets, so that a
#: filter set on it sees every server error in one place.
log = logging.getLogger("uvicorn.error")


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


_STATUS_LINES = {code: _status_line(code) for code in range(100, 600)}
# RFC 9110 tokens for names; values may hold visible characters, spaces and tabs only. A CR or LF
# from an app would split the response.
_BAD_NAME = re.compile(rb"[^!#$%&\'*+\-.^_`|~0-9A-Za-z]")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_NO_BODY_STATUS = frozenset((204, 304))


class Connection(Protocol):
    """What a cycle needs from the connection it belongs to."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    write_paused: bool

    def default_head(self) -> bytes: ...
    def writable(self) -> Awaitable[None]: ...
    def resume_reading(self) -> None: ...
    def response_complete(self, cycle: RequestCycle) -> None: ...
    def close_lingering(self) -> None: ...


class RequestCycle:
    """One request on a connection: its body as it arrives, its response as the app sends it."""

    __slots__ = (
        "_body",
        "_body_size",
        "_head",
        "_on_lost",
        "_ready",
        "_waiter",
        "chunked",
        "complete",
        "conn",
        "disconnected",
        "http_11",
        "keep_alive",
        "length_left",
        "more_body",
        "no_body",
        "scope",
        "started",
        "transport",
        "waiting_100",
    )

    def __init__(
        self, conn: Connection, scope: dict[str, Any], keep_alive: bool, expect_100: bool
    ) -> None:
        self.conn = conn
        self.transport = conn.transport
        # Held until the app runs, then only the app has it: the scope's body writer refers to
        # this cycle, so a cycle holding its scope would be garbage only the collector frees.
        self.scope: dict[str, Any] | None = scope
        self.http_11 = scope["http_version"] == "1.1"
        self.keep_alive = keep_alive
        self.waiting_100 = expect_100
        self.disconnected = False  # the client left (nothing more is written)
        self._on_lost: Callable[[], None] | None = None  # the app's disconnect notice
        # Request body: parts not yet received by the app, whether more is coming, and whether
        # receive() has something new to tell (a body part, the end of the body, a disconnect).
        self._body: list[bytes] = []
        self._body_size = 0
        self.more_body = True
        self._ready = False
        self._waiter: asyncio.Future[None] | None = None
        # Response: started (head built), the head not yet written, the framing, the end.
        self.started = False
        self.complete = False
        self._head: bytes | None = None
        self.chunked = False
        self.no_body = scope["method"] == "HEAD"
        self.length_left: int | None = None  # content-length still owed; None: until close

    # -- from the connection ----------------------------------------------------------------------

    def feed(self, body: bytes) -> int:
        """A piece of the request body arrived; returns the bytes now held for the app."""
        self._body.append(body)
        self._body_size += len(body)
        self._wake()
        return self._body_size

    def end_of_body(self) -> None:
        self.more_body = False
        self._wake()

    def lost(self) -> None:
        """The connection is gone: whatever the app sends now is dropped."""
        notice, self._on_lost = self._on_lost, None
        if not self.complete:
            self.disconnected = True
            if notice is not None:
                notice()
        self._head = None
        self._wake()

    def on_disconnect(self, notice: Callable[[], None] | None) -> None:
        """The disconnect notice (:data:`~streamsafe.server.asgi.DISCONNECT_EXTENSION`)."""
        if notice is not None and self.disconnected:
            notice()
            return
        self._on_lost = notice
        if notice is not None and not self.complete:
            # The client's leaving is seen only while the connection is read: a request
            # pipelined behind this one paused reading. Read on, as a receive() waiting for
            # http.disconnect would.
            self.conn.resume_reading()

    def _wake(self) -> None:
        self._ready = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- ASGI ------------------------------------------------------------------------------------

    async def run(self, app: Callable[..., Awaitable[None]]) -> None:
        """Run the app for this request; a failure before any of the response went out is a
        JSON 500 (never the app's traceback, never a text body), after it the connection is
        closed."""
        scope, self.scope = self.scope, None
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.error("Exception in ASGI application", exc_info=exc)
            self._failed("the server failed to answer the request")
            if not isinstance(exc, Exception):
                raise
        else:
            if not self.disconnected and not self.complete:
                log.error("ASGI app returned without completing its response")
                self._failed("the server returned no answer to the request")

    def _failed(self, message: str) -> None:
        if self.complete or self.disconnected:
            return
        transport = self.transport
        # Nothing went out yet (not even a held head): the client still gets a proper answer.
        if (not self.started or self._head is not None) and not transport.is_closing():
            transport.write(error_response(500, message))
        self.complete = True
        self._head = None
        transport.close()
        self._wake()

    async def receive(self) -> dict[str, Any]:
        if self.waiting_100:
            self.waiting_100 = False
            # Only an HTTP/1.1 client is sent 100 (never a 1.0 one: RFC 9110, 10.1.1).
            if self.http_11 and not self.transport.is_closing():
                self.transport.write(_CONTINUE)
        if not self._ready and not self.disconnected and not self.complete:
            self.conn.resume_reading()
            waiter = self._waiter
            if waiter is None:
                waiter = self._waiter = self.conn.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        self._ready = False
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        parts = self._body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        if parts:
            self._body = []
            if self._body_size > HIGH_WATER:
                self.conn.resume_reading()
            self._body_size = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        if self.conn.write_paused and not self.disconnected:
            await self.conn.writable()
            if self.transport.is_closing():  # aborted: it stopped reading
                self.lost()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self._start(message["status"], message.get("headers", ()))
        elif self.complete:
            raise RuntimeError(f"ASGI message {kind!r} sent after the response completed")
        elif kind != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
        else:
            self._send_body(message.get("body", b""), message.get("more_body", False))

    def write_interim(self) -> bool:
        """The interim-response writer: ``102 Processing``, written now, before the response
        started; ``False`` (nothing written) where it cannot be: the response started, the
        client left, or it speaks HTTP/1.0, which has no interim responses (RFC 9110, 15.2)."""
        if self.started or self.disconnected or not self.http_11 or self.transport.is_closing():
            return False
        self.transport.write(_PROCESSING)
        return True

    def write_chunk(self, body: bytes) -> bool:
        """The direct body writer: one piece of a started chunked response, written now, or
        ``False`` (nothing written) where ``send`` must be used instead."""
        if (
            not self.chunked
            or self.complete
            or self.disconnected
            or self.conn.write_paused
            or self.transport.is_closing()
        ):
            return False
        if not body:  # an empty chunk would be the last-chunk, ending the response
            return True
        data = b"%x\r\n%b\r\n" % (len(body), body)
        head = self._head
        if head is not None:
            self._head = None
            data = head + data
        self.transport.write(data)
        return True

    # -- the response ----------------------------------------------------------------------------

    def _start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        # A bad start raises before anything is decided: the app's failure is then a JSON 500.
        parts = [_STATUS_LINES[status], self.conn.default_head()]
        length: int | None = None
        declared_chunked = close = False
        for raw_name, value in headers:
            name = raw_name.lower()
            if _BAD_NAME.search(name) or _BAD_VALUE.search(value):
                raise RuntimeError(f"invalid HTTP header {raw_name!r}")
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                declared_chunked = value.lower() == b"chunked"
            elif name == b"connection":
                close = b"close" in [token.strip() for token in value.lower().split(b",")]
            parts += (name, b": ", value, b"\r\n")
        self.started = True
        self.waiting_100 = False
        if close or self.more_body:
            # Answered before its body was all in (a 401, a 404, a 413): the connection ends
            # with this answer. Reading on to the next request would let a client trickle the
            # rest of an unwanted body for as long as it likes, holding a connection; the close
            # lingers instead, bounded in time and bytes (close_lingering).
            self.keep_alive = False
        if self.no_body or status < 200 or status in _NO_BODY_STATUS:
            self.no_body = True
            self.length_left = 0
        elif length is not None and not declared_chunked:
            self.length_left = length
        elif self.http_11:
            self.chunked = True
            if not declared_chunked:
                parts.append(b"transfer-encoding: chunked\r\n")
        else:  # HTTP/1.0 without a length: the body ends with the connection
            self.keep_alive = False
        if not self.keep_alive and not close:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self._head = b"".join(parts)
        # Written with the first body if the app sends one in this loop iteration, else then.
        self.conn.loop.call_soon(self._flush_head)

    def _flush_head(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self.transport.is_closing():
                self.transport.write(head)

    def _send_body(self, body: bytes, more_body: bool) -> None:
        if self.chunked:
            if more_body:
                data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            elif body:
                data = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
            else:
                data = _LAST_CHUNK
        elif self.no_body:
            data = b""
        elif self.length_left is None:
            data = body
        else:
            self.length_left -= len(body)
            if self.length_left < 0:
                raise RuntimeError("response body longer than its Content-Length")
            data = body
        head = self._head
        if head is not None and (data or not more_body):
            self._head = None
            data = head + data
        if data:
            self.transport.write(data)
        if more_body:
            return
        if self.length_left:
            raise RuntimeError("response body shorter than its Content-Length")
        self.complete = True
        self._wake()
        if not self.keep_alive:
            if self.more_body:  # answered before its body was read: the rest must not reset it
                self.conn.close_lingering()
            else:
                self.transport.close()
        self.conn.response_complete(self)
