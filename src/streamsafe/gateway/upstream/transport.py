"""The gateway's one HTTP/1.1 client to its engines: every upstream call goes through a
:class:`ConnectionPool` (one per engine) and comes back as an
:class:`~streamsafe.gateway.upstream.exchange.Exchange` (a plain asyncio protocol, one
connection, whose read callback is the hot stream's path) or, for a call read whole, an
:class:`Answer`.

Every call rides the same connections: any method, a request body given whole or streamed
(chunked, as a pass-through's large upload is), the response's head, its body read whole
(:meth:`Exchange.read_body`, :meth:`ConnectionPool.call` with a timeout) or piece by piece as it
comes (:meth:`Exchange.body_chunks`, a pass-through's). Connections are kept alive and reused, and
an exchange that is abandoned closes its connection, which is how the engine learns to abort the
request. Every failure is one of :mod:`streamsafe.gateway.upstream.errors`.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from streamsafe.gateway.upstream.errors import (
    ConnectFailed,
    ConnectTimeout,
    TLSFailed,
    UpstreamError,
    UpstreamTimeout,
)
from streamsafe.gateway.upstream.exchange import KEEP_IDLE_S, Exchange
from streamsafe.gateway.upstream.pool_connections import PoolConnections

__all__ = [
    "Answer",
    "ConnectionPool",
    "Response",
    "header_lines",
]

#: Methods whose request carries no body, and so no framing header, where none is given.
_BODILESS = frozenset(("GET", "HEAD", "OPTIONS", "DELETE"))


@dataclass(frozen=True, slots=True)
class Answer:
    """A response read whole (:meth:`ConnectionPool.call`), or one the gateway makes up in an
    engine's place: read as an :class:`Exchange` is, with nothing left to release."""

    status: int
    headers: Sequence[tuple[bytes, bytes]] = ()
    body: bytes = b""

    def header(self, name: bytes) -> bytes | None:
        """The first value of response header ``name`` (lower case), if any."""
        return next((value for key, value in self.headers if key == name), None)

    async def read_body(self, limit: int | None = None, *, broken_ok: bool = False) -> bytes:
        """The body (its first ``limit`` bytes); it was read whole already."""
        return self.body if limit is None else self.body[:limit]

    def release(self, *, finished: bool = False) -> None:
        """Nothing to hand back: no connection is held (the :class:`Exchange` interface)."""


#: A response a caller reads: an exchange still open, or an answer read whole.
Response = Exchange | Answer


class ConnectionPool:
    """Kept-alive connections to one upstream for :class:`Exchange` exchanges: the gateway's one
    way to talk to an engine (see the module).

    ``base_url`` is ``http://host[:port][/prefix]`` or ``https://...``; ``headers`` (lower-case
    names) go on every request, unless a request gives its own of the same name;
    ``connect_timeout`` bounds opening a new connection (a reused one costs no timer).
    ``ssl_context`` verifies an ``https`` upstream (default: the system's trusted CAs).
    ``max_idle`` connections are kept for reuse at most (a burst's others are closed).
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        *,
        connect_timeout: float | None = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        max_idle: int = 512,
    ) -> None:
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if tls else 80)
        self._prefix = parts.path.rstrip("/").encode()
        self._ssl = (ssl_context or ssl.create_default_context()) if tls else None
        self._connect_timeout = connect_timeout
        self._conns: PoolConnections[Exchange] = PoolConnections(max_idle)
        default_port = 443 if tls else 80
        host = self.host if self.port == default_port else f"{self.host}:{self.port}"
        if ":" in self.host:  # IPv6 literal
            host = f"[{self.host}]" if self.port == default_port else f"[{self.host}]:{self.port}"
        self._own = {"host": host, **(headers or {})}
        self._fixed = header_lines(self._own)

    async def request(
        self, method: bytes, path: str, body: bytes, headers: bytes = b""
    ) -> Exchange:
        """The hot stream's request: write it on an idle connection or a new one and return it
        (await :meth:`Exchange.head` next). ``headers`` are header lines, each ending in CRLF,
        on top of the pool's own (see :func:`header_lines`). Raises :class:`ConnectFailed` when
        no connection can be made: then nothing reached the engine."""
        request = b"%s %s%s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n%s" % (
            method,
            self._prefix,
            path.encode(),
            self._fixed,
            headers,
            len(body),
            body,
        )
        conn = await self._connection()
        conn._send(request)
        return conn

    async def open(
        self,
        method: str,
        target: str | bytes,
        body: bytes | AsyncIterable[bytes] = b"",
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> Exchange:
        """Any request: ``method`` on ``target`` (path and query, under the base URL's path),
        ``headers`` on top of the pool's own (replacing those of the same name), ``body`` whole
        (sent with its ``Content-Length``) or as it comes (chunked). Returns the exchange once
        the request is written (await :meth:`Exchange.head` next). Raises
        :class:`ConnectFailed` when no connection can be made, :class:`UpstreamClosed` where it
        ends while a streamed body is sent (the exchange is dropped)."""
        given = [(k.lower(), v) for k, v in headers]
        names = {k.decode("latin-1") for k, _ in given}
        fixed = self._fixed
        if names & self._own.keys():
            fixed = header_lines({k: v for k, v in self._own.items() if k not in names})
        if isinstance(body, bytes):
            bodiless = not body and method in _BODILESS
            framing = b"" if bodiless else b"content-length: %d\r\n" % len(body)
        else:
            framing = b"transfer-encoding: chunked\r\n"
        path = target if isinstance(target, bytes) else target.encode()
        request = b"%s %s%s HTTP/1.1\r\n%s%s%s\r\n" % (
            method.encode(),
            self._prefix,
            path,
            fixed,
            b"".join(b"%s: %s\r\n" % pair for pair in given),
            framing,
        )
        conn = await self._connection()
        if isinstance(body, bytes):
            conn._send(request + body, head_only=method == "HEAD")
            return conn
        conn._send(request)
        try:
            await conn._send_body(body)
        except BaseException:
            conn.close()  # half a body: the engine must not take it for a whole one
            raise
        return conn

    async def call(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: Iterable[tuple[bytes, bytes]] = (),
        *,
        within: float | None = None,
        limit: int | None = None,
    ) -> Answer:
        """One request and its answer read whole (at most ``limit`` bytes, where given; past
        it the connection is dropped), all ``within`` so many seconds (``None``: no bound but
        the connect timeout's; the caller may bound it). Raises :class:`UpstreamTimeout` past
        it, else as :meth:`open` and :meth:`Exchange.read_body` do."""
        exchange: Exchange | None = None
        try:
            async with asyncio.timeout(within):
                exchange = await self.open(method, target, body, headers)
                await exchange.head()
                content = await exchange.read_body(limit)
        except TimeoutError as exc:
            if isinstance(exc, UpstreamError):  # the connect's own, or a body write's
                raise
            raise UpstreamTimeout(f"{method} {target}: no answer within {within} s") from None
        finally:
            if exchange is not None:
                exchange.release()
        return Answer(exchange.status, exchange.headers, content)

    async def _connection(self) -> Exchange:
        """An idle connection not too old to reuse, else a new one."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while (conn := self._conns.take()) is not None:
            if conn._closed:
                continue
            if now - conn.idle_since > KEEP_IDLE_S or conn._readable():
                conn.close()
                continue
            return conn
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Exchange(self._conns),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except TimeoutError as exc:
            raise ConnectTimeout(f"connect to {self.host}:{self.port} timed out") from exc
        except ssl.SSLError as exc:
            raise TLSFailed(str(exc)) from exc
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        return conn

    @property
    def idle(self) -> int:
        """Connections kept for reuse now."""
        return len(self._conns)

    def last_read(self) -> float:
        """Loop time of the engine's last read on any open connection (``-inf``: none)."""
        return max((conn.read_at for conn in self._conns.open), default=-math.inf)

    def close(self) -> None:
        """Close every idle connection."""
        while (conn := self._conns.take()) is not None:
            conn.close()


def header_lines(headers: Mapping[str, str]) -> bytes:
    """``headers`` as HTTP/1.1 header lines, each ending in CRLF (built once, not per request)."""
    return b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
