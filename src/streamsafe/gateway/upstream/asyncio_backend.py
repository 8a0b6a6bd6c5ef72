"""An httpcore network backend on plain asyncio protocols, for the gateway's upstream pool; the
one module that reaches into httpx2's and httpcore2's private parts (``_pool``, ``_utils``),
checked against the pinned versions by tests/gateway/upstream/test_asyncio_backend.py.

httpcore's default backend goes through anyio, which opens a cancel scope and two context managers
around every read (about a fifth of the gateway's CPU per relayed chunk). Here a read returns what
the loop already delivered without suspending, and otherwise waits on one future; a timeout costs
something only where one is set (upstream reads have none). Plain ``http://`` only.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any, cast

import httpcore2
import httpx2
from httpcore2._utils import is_socket_readable

__all__ = ["AsyncioBackend", "pooled_transport"]

#: Bytes an upstream connection buffers before it stops reading from the socket.
_READ_HIGH_WATER = 256 * 1024

# The ``timeout`` parameters below are httpcore's interface, hence the ASYNC109 exemptions.


class _AsyncioStream(asyncio.Protocol, httpcore2.AsyncNetworkStream):
    """One upstream TCP connection as an asyncio protocol (see the module)."""

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
        """Not offered: :class:`AsyncioBackend` is used for plain ``http://`` upstreams only."""
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


class AsyncioBackend(httpcore2.AsyncNetworkBackend):
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


def pooled_transport(
    base_url: str, limits: httpx2.Limits, ssl_context: ssl.SSLContext
) -> httpx2.AsyncHTTPTransport:
    """httpx2's transport for ``base_url``; for plain ``http://`` its connection pool runs on
    :class:`AsyncioBackend` (httpx2 has no argument for a network backend: its ``_pool`` is
    replaced by the same pool on this backend)."""
    transport = httpx2.AsyncHTTPTransport(limits=limits, trust_env=False, verify=ssl_context)
    if httpx2.URL(base_url).scheme == "http":
        transport._pool = httpcore2.AsyncConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=AsyncioBackend(),
        )
    return transport
