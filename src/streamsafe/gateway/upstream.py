"""The one connection to the engine: a pooled HTTP client, connect retries, and the breaker.

Retries here are only those that cannot duplicate work: the connection was never made
(``ConnectError``: refused, unreachable), so the engine never saw the request. They are spent from
a :class:`~streamsafe.retry.RetryBudget` shared by all requests, so a dead upstream is not hit
three times per request. Nothing is retried once a response started.

The breaker opens when the engine says it is dead (a 500 whose body names ``EngineDeadError``, an
error event naming it, or ``/health`` answering 503): new work then fails fast with 503 and
``Retry-After`` instead of piling onto a broken engine, while one task probes ``/health`` and closes
the breaker when it answers 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import httpcore2
import httpx2
from httpcore2._utils import is_socket_readable

from streamsafe.retry import RetryBudget

__all__ = ["Breaker", "Upstream", "is_engine_death"]

log = logging.getLogger("streamsafe.gateway")

_ENGINE_DEATH_MARKERS = (
    b"EngineDeadError",
    b"EngineDead",
    b"engine is dead",
    b"Engine loop is not running",
)

#: Bytes an upstream connection buffers before it stops reading from the socket.
_READ_HIGH_WATER = 256 * 1024


def is_engine_death(body: bytes) -> bool:
    """True if an error body says the engine loop died (vLLM's ``EngineDeadError``,
    ``MQEngineDeadError``)."""
    return any(m in body for m in _ENGINE_DEATH_MARKERS)


class Breaker:
    """Open while the engine is known dead. ``clock`` is injectable for tests."""

    def __init__(self, probe_interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.probe_interval = probe_interval
        self.is_open = False
        self.opened_at = 0.0
        self.trips = 0
        self._clock = clock

    def trip(self) -> bool:
        """Open the breaker; True if it was closed."""
        if self.is_open:
            return False
        self.is_open = True
        self.opened_at = self._clock()
        self.trips += 1
        return True

    def close(self) -> None:
        """The engine answered healthy again."""
        self.is_open = False

    def retry_after(self) -> int:
        """Seconds a client should wait: the next probe, rounded up, at least 1."""
        return max(1, math.ceil(self.probe_interval))


class Upstream:
    """Pooled ``httpx2.AsyncClient`` to ``base_url`` plus the breaker and the retry budget."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        connect_retries: int = 2,
        connect_backoff: float = 0.05,
        probe_interval: float = 1.0,
        max_keepalive: int = 512,
        api_key: str | None = None,
        budget: RetryBudget | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.connect_retries = connect_retries
        self.connect_backoff = connect_backoff
        self.budget = budget or RetryBudget()
        self.breaker = Breaker(probe_interval)
        self.connect_retries_done = 0
        self._headers = {"accept-encoding": "identity"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = httpx2.Timeout(connect=connect_timeout, read=None, write=30.0, pool=None)
        self._limits = httpx2.Limits(max_connections=None, max_keepalive_connections=max_keepalive)
        self._client: httpx2.AsyncClient | None = None
        self._probe: asyncio.Task[None] | None = None
        self._health_check: asyncio.Task[None] | None = None

    @property
    def client(self) -> httpx2.AsyncClient:
        """The pooled client, created on first use (normally at lifespan startup)."""
        if self._client is None:
            transport = httpx2.AsyncHTTPTransport(limits=self._limits, trust_env=False)
            if httpx2.URL(self.base_url).scheme == "http":
                # Same pool, asyncio sockets instead of anyio ones (see _AsyncioStream).
                transport._pool = httpcore2.AsyncConnectionPool(
                    max_connections=self._limits.max_connections,
                    max_keepalive_connections=self._limits.max_keepalive_connections,
                    keepalive_expiry=self._limits.keepalive_expiry,
                    network_backend=_AsyncioBackend(),
                )
            self._client = httpx2.AsyncClient(
                base_url=self.base_url,
                timeout=self._timeout,
                headers=self._headers,
                trust_env=False,
                transport=transport,
            )
        return self._client

    async def start(self) -> None:
        """Create the connection pool."""
        _ = self.client

    async def close(self) -> None:
        """Stop the probe and close every upstream connection."""
        for task in (self._probe, self._health_check):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def open(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        retry_connect: bool = True,
    ) -> httpx2.Response:
        """Send a request and return the response with its body unread (the caller reads it
        and closes it). Retries a refused connection within the budget when ``retry_connect``."""
        client = self.client
        request = client.build_request(method, path, content=content, headers=headers)
        attempt = 0
        while True:
            try:
                response = await client.send(request, stream=True)
            except httpx2.ConnectError:
                self.budget.record_failure()
                if not retry_connect or attempt >= self.connect_retries:
                    raise
                if not self.budget.allow_retry():
                    raise
                delay = self.connect_backoff * (2**attempt)
                attempt += 1
                self.connect_retries_done += 1
                log.info("upstream refused the connection; retry %d in %.2f s", attempt, delay)
                await asyncio.sleep(delay)
                continue
            self.budget.record_success()
            return response

    def engine_died(self, why: str) -> None:
        """Open the breaker and start probing ``/health``."""
        if self.breaker.trip():
            log.warning("engine reported dead (%s); failing fast until /health is 200", why)
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_healthy())

    def suspect(self) -> None:
        """An upstream 5xx: ask ``/health`` once, in the background, whether the engine died."""
        if self.breaker.is_open or (self._health_check and not self._health_check.done()):
            return
        self._health_check = asyncio.get_running_loop().create_task(self._check_once())

    async def health(self) -> int | None:
        """Status of upstream ``/health``, or ``None`` if it did not answer."""
        try:
            response = await self.client.get(
                "/health", timeout=max(1.0, self.breaker.probe_interval)
            )
        except httpx2.HTTPError:
            return None
        return response.status_code

    async def _check_once(self) -> None:
        if await self.health() == 503:
            self.engine_died("/health answered 503")

    async def _probe_until_healthy(self) -> None:
        while True:
            await asyncio.sleep(self.breaker.probe_interval)
            if await self.health() == 200:
                self.breaker.close()
                log.warning("engine healthy again; breaker closed")
                return


# The ``timeout`` parameters below are httpcore's interface, hence the ASYNC109 exemptions.


class _AsyncioStream(asyncio.Protocol, httpcore2.AsyncNetworkStream):
    """One upstream TCP connection as an asyncio protocol.

    httpcore's default backend goes through anyio, which opens a cancel scope and two context
    managers around every read (about a fifth of the gateway's CPU per relayed chunk). Here a read
    returns what the loop already delivered without suspending, and otherwise waits on one
    future; a timeout costs something only where one is set (upstream reads have none).
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._reading_paused = False

    # -- protocol callbacks (called by the loop) ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _READ_HIGH_WATER and not self._reading_paused:
            # The reader is behind: let TCP push back on the engine instead of buffering here.
            self._reading_paused = True
            assert self._transport is not None
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        if exc is not None:
            self._error = exc
        self._wake()
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- AsyncNetworkStream ---------------------------------------------------------------------

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        """Bytes received so far (up to ``max_bytes``), waiting only when there are none."""
        if not self._chunks and not self._eof:
            self._waiter = waiter = self._loop.create_future()
            try:
                if timeout is None:
                    await waiter
                else:
                    async with asyncio.timeout(timeout):
                        await waiter
            except TimeoutError:
                raise httpcore2.ReadTimeout("upstream read timed out") from None
            finally:
                self._waiter = None
        chunks = self._chunks
        if not chunks:
            if self._error is not None:
                raise httpcore2.ReadError(str(self._error) or type(self._error).__name__)
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if len(data) > max_bytes:
            self._chunks = [data[max_bytes:]]
            data = data[:max_bytes]
        else:
            self._chunks = []
        self._buffered -= len(data)
        if self._reading_paused and self._buffered <= _READ_HIGH_WATER // 4:
            self._reading_paused = False
            if self._transport is not None:
                self._transport.resume_reading()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Send ``buffer``; wait only while the transport asks for a pause."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise httpcore2.WriteError("upstream connection is closed")
        if not buffer:
            return
        transport.write(buffer)
        drain = self._drain
        if drain is not None:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(drain)
            except TimeoutError:
                raise httpcore2.WriteTimeout("upstream write timed out") from None

    async def aclose(self) -> None:
        """Close the connection (the engine sees the disconnect and aborts the request)."""
        if self._transport is not None:
            self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
    ) -> httpcore2.AsyncNetworkStream:
        """Not offered: :class:`_AsyncioBackend` is used for plain ``http://`` upstreams only."""
        raise httpcore2.ConnectError("TLS is not handled by the asyncio upstream backend")

    def get_extra_info(self, info: str) -> Any:
        """What httpcore asks of a stream; ``is_readable`` tells a dead idle connection."""
        transport = self._transport
        if info == "is_readable":
            if self._chunks or self._eof or transport is None:
                return True
            return is_socket_readable(transport.get_extra_info("socket"))
        if transport is None:
            return None
        if info == "socket":
            return transport.get_extra_info("socket")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        return None


class _AsyncioBackend(httpcore2.AsyncNetworkBackend):
    """httpcore network backend on plain asyncio protocols (see :class:`_AsyncioStream`)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Open a TCP connection (TCP_NODELAY, as asyncio sets by default)."""
        loop = asyncio.get_running_loop()
        local = None if local_address is None else (local_address, 0)
        try:
            async with asyncio.timeout(timeout):
                transport, stream = await loop.create_connection(
                    _AsyncioStream, host, port, local_addr=local
                )
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc) or type(exc).__name__) from exc
        if socket_options:
            sock = transport.get_extra_info("socket")
            for option in socket_options:
                sock.setsockopt(*option)
        return stream

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Not used (the upstream is a TCP URL)."""
        raise httpcore2.ConnectError("unix sockets are not handled by the asyncio backend")

    async def sleep(self, seconds: float) -> None:
        """Sleep on the running loop."""
        await asyncio.sleep(seconds)
