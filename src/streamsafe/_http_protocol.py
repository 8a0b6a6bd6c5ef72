"""uvicorn's httptools protocol with the limits a server facing the network needs.

uvicorn 0.55 with httptools buffers request headers without bound (an 8 MB header line is served),
never times out a request whose headers or body stop half way, and counts connections only once a
request's headers are complete (``limit_concurrency`` answers 503 then, after buffering them). This
protocol adds, per connection and before the app sees anything:

- header limits: bytes per line, bytes in all, number of lines; past them 431 (414 for the request
  line) and the connection is closed. Bytes of an unfinished header section are counted as they
  arrive, so memory stays bounded however slowly or hugely they come;
- a deadline for the header section (from the connection's or the request's first byte) and an
  idle timeout between body reads; past them 408 and the connection is closed (the app, if it is
  reading the body, sees ``http.disconnect``);
- a cap on open connections; past it 503 with ``Retry-After`` and the new connection is closed.

Every such answer is an OpenAI-style JSON error, like the app's own.

It also offers the app two ASGI extensions: :data:`streamsafe._asgi.RESET_EXTENSION`, a
callable that resets the connection (TCP RST, no response), and
:data:`streamsafe._asgi.BODY_WRITER_EXTENSION`, which writes a piece of a started streaming
response without a coroutine (the gateway's per-chunk path, see :class:`_BodyWriter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from streamsafe._asgi import BODY_WRITER_EXTENSION, RESET_EXTENSION

__all__ = ["ServerLimits", "limited_protocol"]


@dataclasses.dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one HTTP connection may cost the server before the app is involved.

    Defaults suit an API server behind which requests are small JSON bodies and responses long
    streams: generous for any real client (browsers send under 16 KiB of headers), tight enough
    that a thousand hostile connections hold well under 100 MiB.
    """

    #: Largest header line (name, value and separator) or request line, in bytes (default
    #: 16 KiB, room for a large bearer token). Past it: 431 (414 for the request line).
    max_header_line_bytes: int = 16 * 1024
    #: Largest header section (request line and every header line), in bytes (default 64 KiB).
    #: Past it: 431.
    max_header_bytes: int = 64 * 1024
    #: Most header lines in one request (default 128). Past it: 431.
    max_headers: int = 128
    #: Seconds a request's header section may take to arrive in full, counted from the
    #: connection's or the request's first byte (default 10; nginx allows 60, but a client that
    #: needs more than a few seconds for a few KiB is broken or hostile). Past it: 408.
    header_timeout: float = 10.0
    #: Seconds between two reads of an unfinished request body (default 30, nginx's
    #: ``client_body_timeout`` is 60). Not counted while the app holds the body back. Past it:
    #: 408.
    body_timeout: float = 30.0
    #: Open connections at once (default 4096). The one past it gets 503 and is closed. ``None``
    #: for no cap.
    max_connections: int | None = 4096

    def __post_init__(self) -> None:
        for name in ("max_header_line_bytes", "max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.header_timeout <= 0 or self.body_timeout <= 0:
            raise ValueError("header_timeout and body_timeout must be > 0")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be >= 1 or None")


_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
_TYPES = {503: "service_unavailable"}
#: Seconds a rejected connection is still read from (and the bytes dropped) before it is closed.
_LINGER_S = 2.0


def _error_response(status: int, message: str, retry_after: int | None = None) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "message": message,
                "type": _TYPES.get(status, "invalid_request_error"),
                "param": None,
                "code": status,
            }
        }
    )
    head = [
        b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
    ]
    if retry_after is not None:
        head.append(b"retry-after: %d\r\n" % retry_after)
    return b"".join(head) + b"\r\n" + body


class _BodyWriter:
    """``write(body) -> bool`` for one request (see :data:`BODY_WRITER_EXTENSION`).

    uvicorn's ``send`` costs a coroutine, a message dict, three checks and a join per chunk; a
    subscriber that keeps up is instead written to from the upstream's read callback, one
    ``transport.write`` of the chunk in HTTP/1.1 chunked framing. uvicorn's cycle still owns the
    response: it sent the headers (and chose chunked framing) and sends the end, so the writer
    only ever writes between the two, and declines (``False``) whenever ``send`` must decide:
    before the start, after the end, once the client left, or while the connection's write
    buffer is over its high-water mark (``send`` waits for it to drain).
    """

    __slots__ = ("cycle", "protocol")

    def __init__(self, protocol: HttpToolsProtocol) -> None:
        self.protocol = protocol
        self.cycle: Any = None  # the request's RequestResponseCycle, once its headers are in

    def __call__(self, body: bytes) -> bool:
        cycle = self.cycle
        if (
            cycle is None
            or not cycle.chunked_encoding  # not started, a HEAD, or a fixed length
            or cycle.response_complete
            or cycle.disconnected
            or self.protocol.flow.write_paused
        ):
            return False
        transport = self.protocol.transport
        if transport.is_closing():
            return False
        transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True


class _LimitedProtocol(HttpToolsProtocol):
    """See the module docstring; ``limits`` is set on the subclass :func:`limited_protocol`
    makes."""

    limits = ServerLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = True
        self._raw_header_bytes = 0  # bytes fed while the header section was unfinished
        self._header_bytes = 0  # bytes of the lines parsed so far
        self._header_lines = 0
        self._too_large: tuple[int, str] | None = None
        self._got_bytes = False  # of the request whose headers are awaited
        self._completed = 0  # requests whose last byte was parsed on this connection
        self._lingering = False  # answered an error; reading only to drop what still comes
        self._timer: asyncio.TimerHandle | None = None
        self._writer: _BodyWriter | None = None  # the current request's

    # -- connection ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Responses go out in several writes (the head, then each body message). With Nagle's
        # algorithm on, a write waits for the ACK of the one before, which a kept-alive client
        # delays by 40 ms: every response after a connection's first took 44 ms. asyncio sets
        # TCP_NODELAY only on sockets made with IPPROTO_TCP, and uvloop not at all here.
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cap = self.limits.max_connections
        if cap is not None and len(self.connections) > cap:
            self.connections.discard(self)
            self._reject(503, f"the server holds {cap} connections, its limit", retry_after=1)
            return
        self._arm(self.limits.header_timeout, self._header_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering or self.transport.is_closing():
            return
        completed = self._completed
        if self._in_headers:
            self._got_bytes = True
            if self._timer is None:
                self._arm(self.limits.header_timeout, self._header_deadline)
        super().data_received(data)
        if self._too_large is not None:
            self._reject(*self._too_large)
            return
        if self.transport.is_closing():
            return
        if self._in_headers:
            # The header section is unfinished, so httptools holds its bytes: count them. Where
            # a request ended inside this chunk (its body's tail, perhaps the start of the next
            # request), the split is unknown and the chunk (one socket read) is left out: a
            # body is never counted as header bytes.
            if completed == self._completed:
                self._raw_header_bytes += len(data)
            if self._raw_header_bytes > self.limits.max_header_bytes:
                limit = self.limits.max_header_bytes
                self._reject(431, f"request headers are over the limit of {limit} bytes")
        elif self.cycle is not None and self.cycle.more_body:
            self._arm(self.limits.body_timeout, self._body_idle)

    # -- parser callbacks --------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # ASGI types extensions as dicts; these are callables, as the app expects.
        self._writer = _BodyWriter(self)
        self.scope["extensions"] = {
            RESET_EXTENSION: self._reset,  # type: ignore[dict-item]
            BODY_WRITER_EXTENSION: self._writer,  # type: ignore[dict-item]
        }
        self._in_headers = True
        self._got_bytes = True
        self._raw_header_bytes = 0
        self._header_bytes = 0
        self._header_lines = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._header_bytes += len(url)
        if len(self.url) > self.limits.max_header_line_bytes and self._too_large is None:
            limit = self.limits.max_header_line_bytes
            self._too_large = (414, f"the request line is over the limit of {limit} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        line = len(name) + len(value) + 4
        self._header_bytes += line
        self._header_lines += 1
        limits = self.limits
        if self._too_large is None:
            if line > limits.max_header_line_bytes:
                msg = f"a header line is over the limit of {limits.max_header_line_bytes} bytes"
                self._too_large = (431, msg)
            elif self._header_bytes > limits.max_header_bytes:
                msg = f"request headers are over the limit of {limits.max_header_bytes} bytes"
                self._too_large = (431, msg)
            elif self._header_lines > limits.max_headers:
                self._too_large = (431, f"more than {limits.max_headers} header lines")
        if self._too_large is None:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        if self._too_large is not None:
            return  # answered by data_received once the parser returns
        super().on_headers_complete()
        if self._writer is not None:
            self._writer.cycle = self.cycle

    def on_body(self, body: bytes) -> None:
        if self._too_large is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._completed += 1
        # What comes next on this connection is another request's header section.
        self._in_headers = True
        self._got_bytes = False
        self._raw_header_bytes = 0
        if self._too_large is None:
            super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers unparsable requests in plain text; this server answers in JSON."""
        self._reject(400, msg)

    # -- timers -----------------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_deadline(self) -> None:
        self._timer = None
        if self._in_headers and self._got_bytes:
            self._reject(408, "the request headers did not arrive in time")
        elif self._in_headers and (self.cycle is None or self.cycle.response_complete):
            # A connection that never sent a byte: close it as a kept-alive one is closed.
            self.transport.close()

    def _body_idle(self) -> None:
        self._timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        if self.flow.read_paused:  # the app is not reading: not the client's delay
            self._arm(self.limits.body_timeout, self._body_idle)
            return
        started = cycle.response_started
        cycle.disconnected = True
        cycle.message_event.set()
        if started:
            self.transport.close()
        else:
            self._reject(408, "the request body stopped arriving")

    def _reset(self) -> None:
        """Reset the connection: SO_LINGER 0 makes the close a TCP RST."""
        if self.cycle is not None:
            self.cycle.disconnected = True
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _reject(self, status: int, message: str, retry_after: int | None = None) -> None:
        """Answer ``status`` and close. The close lingers (as nginx's ``lingering_close``): what
        the client still sends is read and dropped for a moment, so its kernel does not turn our
        close into a reset that destroys the answer before the client reads it."""
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # whatever the app sends now is dropped
            self.cycle.message_event.set()
        transport = self.transport
        if self._lingering or transport.is_closing():
            return
        self._lingering = True
        transport.write(_error_response(status, message, retry_after))
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.flow.resume_reading()
        self._timer = self.loop.call_later(_LINGER_S, transport.close)


def limited_protocol(limits: ServerLimits) -> type[asyncio.Protocol]:
    """The protocol class to hand uvicorn (``Config(http=...)``) for a server with ``limits``."""
    return type("LimitedHttpToolsProtocol", (_LimitedProtocol,), {"limits": limits})
