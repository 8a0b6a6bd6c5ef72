"""The HTTP/1.1 connection every server here speaks: httptools parsing, ASGI, and the limits a
server facing the network needs.

uvicorn's ``Server`` still owns the listening sockets, signals, lifespan and graceful shutdown;
this protocol replaces its per-connection one (``Config(http=...)``) for the limits a server
facing the network needs (:class:`~streamsafe.server.limits.ServerLimits`, each refusal a JSON
error, as is the 500 of an app that failed before answering) and for its cost per request (about
0.13 ms of CPU less than uvicorn's here: see docs/gateway.md, Cost).

It offers the app these ASGI extensions: :data:`streamsafe.server.asgi.RESET_EXTENSION` (reset the
connection: TCP RST, no response), :data:`streamsafe.server.asgi.BODY_WRITER_EXTENSION` (write a
piece of a started streaming response without a coroutine: the gateway's per-chunk path),
:data:`streamsafe.server.asgi.DISCONNECT_EXTENSION` (learn of a disconnect) and
:data:`streamsafe.server.asgi.INTERIM_EXTENSION` (a ``102 Processing`` interim response before the
answer: a waiting plain call kept alive with its status still open).
Pipelined requests are answered in order, and an error in one of them (a 400, a 431) only
after the answers before it, never inside them. An ``Upgrade`` request is answered as plain
HTTP, but one with a body is refused (400): llhttp would take its body for the new protocol's
bytes, and what the body holds must never be parsed as a request. Trailer fields are bounded
like a header section and never merged into the headers the app sees. A kept-alive connection
idle for ``ServerLimits.keep_alive_timeout`` is closed. The connections of one client address
with a request still arriving are bounded (:mod:`streamsafe.server.unfinished`), and a request
body must keep up ``ServerLimits.min_body_rate`` (those deadlines and that count:
:mod:`streamsafe.server.deadlines`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import httptools

from streamsafe.server.asgi import (
    BODY_WRITER_EXTENSION,
    DISCONNECT_EXTENSION,
    INTERIM_EXTENSION,
    RESET_EXTENSION,
)
from streamsafe.server.cycle import RequestCycle
from streamsafe.server.deadlines import Deadlines
from streamsafe.server.flow import HIGH_WATER, FlowControl, reset
from streamsafe.server.limits import (
    FIRST_BYTE_S,
    LINGER_BYTES,
    LINGER_S,
    ServerLimits,
    error_response,
)
from streamsafe.server.request import (
    RequestHead,
    framing_refusal,
    request_scope,
    target_refusal,
    upgrade_with_body,
)
from streamsafe.server.unfinished import UnfinishedRequests, client_key
from streamsafe.server.uvicorn_link import UvicornLink

__all__ = ["HttpProtocol", "limited_protocol"]

#: What a closed connection parses with: no callbacks, so it refers to no protocol.
_SPENT = httptools.HttpRequestParser(object())


class HttpProtocol(UvicornLink, FlowControl, Deadlines, asyncio.Protocol):
    """One HTTP/1.1 connection (see the module docstring), built by uvicorn's ``Server`` for each
    accepted one (what they share: :class:`~streamsafe.server.uvicorn_link.UvicornLink`; its
    deadlines: :class:`~streamsafe.server.deadlines.Deadlines`);
    ``limits`` is set on the subclass :func:`limited_protocol` makes, with ``unfinished``, the
    server's count of connections owing a request."""

    limits = ServerLimits()
    unfinished = UnfinishedRequests(limits.max_unfinished_per_client)

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # answer a request followed by a close
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.write_paused = self.read_paused = False
        self._drained: asyncio.Future[None] | None = None
        # The request being answered, the one parsed (the same unless pipelined), those waiting.
        self.current: RequestCycle | None = None
        self.parsing: RequestCycle | None = None
        self.pipeline: deque[RequestCycle] = deque()
        self._head = RequestHead()  # of the request being parsed
        self._in_headers = True  # the limits' state
        self._raw_header_bytes = 0  # bytes fed while the header section was unfinished
        self._too_large: tuple[int, str] | None = None
        self._got_bytes = False  # of the request whose headers are awaited
        self._completed = 0  # requests whose last byte was parsed on this connection
        self._lingering = False  # answered an error; reading only to drop what still comes
        self._lingered = 0  # bytes dropped while lingering
        # An error to answer once the requests before it are (nothing more is read meanwhile).
        self._refusal: tuple[int, str, int | None] | None = None
        self._unparsed = 0  # bytes fed past a head with no body or end parsed (a trailer)
        self._timer: asyncio.TimerHandle | None = None
        self._idle = False  # the timer is the kept-alive connection's idle timeout
        self._owing = False  # counted in ``unfinished``: a request is still arriving
        self._client_key = ""  # the address it is counted under there
        # The body being read: when its head was parsed (its rate counts from there), the bytes
        # that came since, the last read (loop times).
        self._body_began = self._body_read = 0.0
        self._body_bytes = 0

    # -- connection ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        open_now = self.opened()
        self.transport = transport
        self.server = transport.get_extra_info("sockname")
        self.client = transport.get_extra_info("peername")
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"
        self._client_key = client_key(self.client[0]) if self.client else ""
        # TCP_NODELAY comes from the listening socket (run.bind_socket).
        cap = self.limits.max_connections
        if cap is not None and open_now > cap:
            self.closed()
            self._reject(503, f"the server holds {cap} connections, its limit", retry_after=1)
            return
        self._arm(min(FIRST_BYTE_S, self.limits.header_timeout), self._first_byte_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed()
        self._settle()
        self._disarm()
        for cycle in (self.current, self.parsing, *self.pipeline):
            if cycle is not None:
                cycle.lost()
        # The parser and the requests refer back to this protocol: let go of them (an inert
        # parser in its place), so that nothing here waits for the garbage collector.
        self.parser = _SPENT
        self.current = self.parsing = None
        self.pipeline.clear()
        self.resume_writing()
        if exc is None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # the client's end of the stream is its leaving (as uvicorn): close

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # dropped; past the bound in bytes the close comes now, not later
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self.transport.close()
            return
        if self._refusal is not None or self.transport.is_closing():
            return
        completed = self._completed
        if self._in_headers:
            self._got_bytes = True
            # The header deadline runs while the client owes a request, not while it waits for
            # an answer (response_complete arms it then).
            if self.current is None and (self._timer is None or self._idle):
                self._arm(self.limits.header_timeout, self._header_deadline)
        else:
            self._unparsed += len(data)
        rest = b""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # llhttp stops after a request asking to switch protocols (none is offered: it is
            # served as plain HTTP); what follows is the next request. One with a body was
            # refused at its head (llhttp would take the body for the new protocol's bytes).
            offset = exc.args[0]
            rest = data[offset:] if 0 < offset < len(data) else b""
        except httptools.HttpParserError:
            if self._too_large is None:
                self._reject(400, "invalid HTTP request")
                return
        if self._too_large is not None:
            self._reject(*self._too_large)
            return
        if self.transport.is_closing():
            return
        if rest:
            self.data_received(rest)
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
        elif self._unparsed > self.limits.max_header_bytes:
            limit = self.limits.max_header_bytes
            self._reject(431, f"request trailers are over the limit of {limit} bytes")
        elif self.parsing is not None and self.parsing.more_body:
            self._body_read = now = self.loop.time()
            self._arm_body_deadline(now)

    # -- parser callbacks --------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._head = RequestHead()
        self._in_headers = True
        self._got_bytes = True
        self._raw_header_bytes = 0
        if not self._owe() and self._too_large is None:
            self._too_large = (503, self._unfinished_message())

    def on_url(self, url: bytes) -> None:
        if self._too_large is None:
            self._too_large = self._head.add_url(url, self.limits)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_headers:
            # A trailer field: never merged into the headers the app has (RFC 9110, 6.5.2);
            # the trailer section is bounded like a header section, a line that never ends by
            # data_received.
            self._unparsed = 0
            if self._too_large is None:
                self._too_large = self._head.add_trailer(name, value, self.limits)
            return
        if self._too_large is None:
            self._too_large = self._head.add_header(name, value, self.limits)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        if self._too_large is not None:
            return  # answered by data_received once the parser returns
        parser, head = self.parser, self._head
        refusal = framing_refusal(parser, head.headers) or target_refusal(parser, head)
        if refusal is not None:
            self._too_large = refusal
            return
        if upgrade_with_body(parser, head.headers):
            msg = "a request with a body cannot ask to switch protocols (Upgrade): send it without"
            self._too_large = (400, msg)
            return
        scope = request_scope(
            parser,
            head.url,
            head.headers,
            server=self.server,
            client=self.client,
            scheme=self.scheme,
            root_path=self.root_path,
            state=self.app_state.copy(),
        )
        version = scope["http_version"]
        keep_alive = version != "1.0" and parser.should_keep_alive()
        cycle = RequestCycle(self, scope, keep_alive, head.expect_100)
        self._body_began = self._body_read = self.loop.time()
        self._body_bytes = 0
        # ASGI types extensions as dicts; these are callables, as the apps expect.
        scope["extensions"] = {
            RESET_EXTENSION: self._reset,
            BODY_WRITER_EXTENSION: cycle.write_chunk,
            DISCONNECT_EXTENSION: cycle.on_disconnect,
            INTERIM_EXTENSION: cycle.write_interim,
        }
        self.parsing = cycle
        if self.current is None:
            self._start(cycle)
        else:  # pipelined: answered once the ones before are
            self.pipeline.append(cycle)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        self._unparsed = 0
        self._body_bytes += len(body)
        cycle = self.parsing
        held = 0 if self._too_large or cycle is None or cycle.complete else cycle.feed(body)
        if held > HIGH_WATER:
            self.pause_reading()

    def on_message_complete(self) -> None:
        self._disarm()
        self._settle()
        self._unparsed = 0
        self._completed += 1
        # What comes next on this connection is another request's header section.
        self._in_headers = True
        self._got_bytes = False
        self._raw_header_bytes = 0
        cycle = self.parsing
        if self._too_large is None and cycle is not None and not cycle.complete:
            cycle.end_of_body()

    # -- requests ----------------------------------------------------------------------------------

    def _start(self, cycle: RequestCycle) -> None:
        self.current = cycle
        self.run_request(cycle.run(self.app))

    def response_complete(self, cycle: RequestCycle) -> None:
        """``cycle``'s response is out: answer the next pipelined request, or wait for one."""
        self.answered()
        if cycle is not self.current or self._lingering or self.transport.is_closing():
            return
        self.current = None
        if self.pipeline:
            if self._refusal is None:
                self.resume_reading()
            self._start(self.pipeline.popleft())
        elif self._refusal is not None:
            self._reject(*self._refusal)
        else:
            self.resume_reading()
            if self._in_headers and self._got_bytes:  # the next request began: the client
                self._arm(self.limits.header_timeout, self._header_deadline)  # owes the rest
            elif self._in_headers:
                self._arm(self.limits.keep_alive_timeout, self._idle_timeout)
                self._idle = True

    def shutdown(self) -> None:
        """Called by uvicorn's ``Server`` on a graceful shutdown: close an idle connection, and
        end a busy one once its response is out."""
        if self.current is None:
            self.transport.close()
            return
        for cycle in (self.current, *self.pipeline):
            cycle.keep_alive = False

    # -- refusals and closes ----------------------------------------------------------------------

    def _reset(self) -> None:
        """Reset the connection: SO_LINGER 0 makes the close a TCP RST."""
        for cycle in (self.current, self.parsing):
            if cycle is not None:
                cycle.lost()
        reset(self.transport)

    def _reject(self, status: int, message: str, retry_after: int | None = None) -> None:
        """Answer ``status`` and close. The close lingers (as nginx's ``lingering_close``): what
        the client still sends is read and dropped for a moment, so its kernel does not turn our
        close into a reset that destroys the answer before the client reads it. A 503 is
        the server's load of the moment: it says ``Retry-After`` (1 s) unless told otherwise."""
        self._disarm()
        self._settle()
        if status == 503 and retry_after is None:
            retry_after = 1
        parsing, current = self.parsing, self.current
        if parsing is not None and parsing.more_body:  # its body broke off: it is not served
            parsing.lost()
            if parsing in self.pipeline:
                self.pipeline.remove(parsing)
            elif parsing is current and parsing.started:
                self.transport.close()  # its answer has begun: no error can follow it
                return
        if current is not None and not current.more_body and not current.complete:
            # Requests before the broken one are answered first, in order; then this error.
            self._refusal = (status, message, retry_after)
            self.pause_reading()
            return
        for cycle in (current, parsing, *self.pipeline):
            if cycle is not None and not cycle.complete:
                cycle.lost()  # whatever the app sends now is dropped
        if self._lingering or self.transport.is_closing():
            return
        self.transport.write(error_response(status, message, retry_after))
        self.close_lingering()

    def close_lingering(self) -> None:
        """Close after the last answer without losing it to a reset: end our side, then read and
        drop what the client still sends (the rest of a request body answered early) for a
        moment, as nginx's ``lingering_close``, and close: after ``LINGER_S`` seconds or
        ``LINGER_BYTES`` bytes, whichever comes first, however slowly or quickly they come."""
        transport = self.transport
        if self._lingering or transport.is_closing():
            return
        self._lingering = True
        self._disarm()
        self._settle()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.resume_reading()
        self._timer = self.loop.call_later(LINGER_S, transport.close)


def limited_protocol(limits: ServerLimits) -> type[asyncio.Protocol]:
    """The protocol class to hand uvicorn (``Config(http=...)``) for a server with ``limits``:
    one per server, as it holds the server's count of connections owing a request."""
    unfinished = UnfinishedRequests(limits.max_unfinished_per_client)
    attributes = {"limits": limits, "unfinished": unfinished}
    return type("LimitedHttpProtocol", (HttpProtocol,), attributes)
