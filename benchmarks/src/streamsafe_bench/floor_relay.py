"""The floor for a relay written in Python, as a ``bench peers`` peer (``python-floor``).

What any Python proxy pays per chunk at the least: uvloop, a plain asyncio protocol on each side,
httptools parsing the upstream's chunked response in C, and one write downstream per upstream
read. Nothing else: no retries, no log, no admission, no limits, no error handling worth the name
(a request it cannot relay is dropped). It is not a product; it tells, in the same run and on the
same machine, how much of streamsafe's cost per chunk is its own work and how much is Python's.

    python -m streamsafe_bench.floor_relay UPSTREAM_HOST:PORT PORT
"""

from __future__ import annotations

import asyncio
import sys

import httptools

__all__ = ["client_protocol", "main"]

_HEAD = b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_SKIP = (b"host", b"content-length", b"connection")


class _Upstream(asyncio.Protocol):
    """The upstream response, relayed as it is read."""

    def __init__(self, down: _Downstream) -> None:
        self.down = down
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)
        self._flush()

    def _flush(self) -> None:
        if self.body:  # one write per read, however many chunks it held
            body = b"".join(self.body)
            self.body.clear()
            self.down.write(b"%x\r\n%b\r\n" % (len(body), body))

    def on_headers_complete(self) -> None:
        self.down.write(_HEAD % self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self._flush()
        self.down.write(b"0\r\n\r\n")
        if self.transport is not None:
            self.transport.close()


class _Downstream(asyncio.Protocol):
    """One client connection: each request is sent upstream on a new connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b"/"
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _SKIP:
            self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, headers = b"".join(self.body), self.headers
        self.body, self.headers = [], []
        method = self.parser.get_method()
        head = b"%s %s HTTP/1.1\r\nhost: upstream\r\ncontent-length: %d\r\n" % (
            method,
            self.url,
            len(body),
        )
        request = head + b"".join(b"%s: %s\r\n" % h for h in headers) + b"\r\n" + body
        asyncio.get_running_loop().create_task(self._relay(request))

    async def _relay(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.upstream
        transport, _ = await loop.create_connection(lambda: _Upstream(self), host, port)
        transport.write(request)


def client_protocol(upstream: tuple[str, int]) -> asyncio.Protocol:
    """The protocol of one client connection, relaying to ``upstream`` (``bench relay`` drives
    it in process)."""
    return _Downstream(upstream)


async def _serve(upstream: tuple[str, int], port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: client_protocol(upstream), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """Serve until killed: ``UPSTREAM_HOST:PORT PORT``."""
    import uvloop

    args = sys.argv[1:] if argv is None else argv
    host, _, up_port = args[0].rpartition(":")
    uvloop.run(_serve((host, int(up_port)), int(args[1])))


if __name__ == "__main__":
    main()
