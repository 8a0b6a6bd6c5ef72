"""The load generator every throughput benchmark uses: N concurrent streaming chat requests, one
raw connection each, all started at once.

It runs in its own process (:func:`run_load`), so it never competes with the server it measures
for a GIL, and it does as little per chunk as it can: httptools (C) undoes the HTTP framing, and
events are counted with ``bytes.count`` of a marker in the body (no SSE or JSON parsing). For
each stream it records when the request went out and when each event arrived.

Each request carries a key in its prompt (``bench-key:<key>;``) that survives any proxy, so the
tap at the simulator (:mod:`streamsafe_bench.tap`) can pair the time an event left the engine
with the time it arrived here, whatever the proxy does to ids and headers.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

__all__ = [
    "API_KEY",
    "EVENT",
    "TOKEN",
    "LoadReport",
    "StreamResult",
    "key_of",
    "request_body",
    "run_load",
]

EVENT = b"data: "
"""Marker of one SSE event (keep-alive comments do not count)."""
TOKEN = b'"delta":{"content":"'
"""Marker of one content token in the simulator's chat chunks (the role chunk does not count)."""

API_KEY = "sk-bench-5f0c1e7a9b3d4c2e8f6a1b0c9d7e5f3a"
"""Bearer key every request carries: a proxy that insists on authentication (LiteLLM refuses to
start without a master key) is given this one; the others ignore it."""

_KEY_PREFIX = "bench-key:"


@dataclass
class StreamResult:
    """One stream as the load generator saw it."""

    key: str
    status: int = 0
    started: float = 0.0
    arrivals: list[float] = field(default_factory=list)
    complete: bool = False
    error: str = ""


@dataclass
class LoadReport:
    """Every stream of one load, the load's wall time, and the generator's own CPU time."""

    streams: list[StreamResult]
    wall_s: float
    cpu_s: float

    @property
    def events(self) -> int:
        return sum(len(s.arrivals) for s in self.streams)


def request_body(key: str, max_tokens: int, model: str = "sim-llama-8b") -> bytes:
    """The chat request of stream ``key``."""
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"{_KEY_PREFIX}{key}; bench stream"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()


def key_of(body: bytes) -> str | None:
    """The key a request body carries (see :func:`request_body`), or ``None``."""
    start = body.find(_KEY_PREFIX.encode())
    if start < 0:
        return None
    start += len(_KEY_PREFIX)
    end = body.find(b";", start)
    return body[start:end].decode() if end > 0 else None


class _Stream(asyncio.Protocol):
    """One stream: write the request, count ``marker`` in the decoded body as it arrives."""

    def __init__(self, request: bytes, marker: bytes, done: asyncio.Future[None], key: str):
        import httptools

        self.result = StreamResult(key)
        self._request = request
        self._marker = marker
        self._keep = len(marker) - 1
        self._carry = b""
        self._done = done
        self._now = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        import httptools

        self._now = time.perf_counter()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(f"bad HTTP from the server: {exc}")

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.result.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.result.status != 200:
            if len(self.result.error) < 2000:
                self.result.error += body.decode(errors="replace")
            return
        # A marker may straddle two reads: keep its possible beginning for the next one.
        buf = self._carry + body if self._carry else body
        n = buf.count(self._marker)
        if n:
            self.result.arrivals.extend([self._now] * n)
        self._carry = buf[-self._keep :] if self._keep else b""

    def on_message_complete(self) -> None:
        self.result.complete = True
        self._finish("")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.result.complete:
            self._finish(f"connection closed before the end of the response ({exc})")

    def _finish(self, error: str) -> None:
        if error and not self.result.error:
            self.result.error = error
        if self._transport is not None:
            self._transport.close()
        if not self._done.done():
            self._done.set_result(None)


async def _load(
    url: str, keys: list[str], max_tokens: int, marker: bytes, model: str
) -> list[StreamResult]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = (parts.path.rstrip("/") or "") + "/v1/chat/completions"
    loop = asyncio.get_running_loop()

    async def one(key: str) -> StreamResult:
        body = request_body(key, max_tokens, model)
        request = (
            b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (path.encode(), host.encode(), port, API_KEY.encode(), len(body), body)
        )
        done: asyncio.Future[None] = loop.create_future()
        stream = _Stream(request, marker, done, key)
        stream.result.started = time.perf_counter()
        try:
            await loop.create_connection(lambda: stream, host, port)
        except OSError as exc:
            stream.result.error = f"connect failed: {exc}"
            return stream.result
        await done
        return stream.result

    return list(await asyncio.gather(*(one(k) for k in keys)))


def _worker() -> None:
    """Entry of the load process: one JSON argument in argv, the report as JSON on stdout."""
    import resource

    args = json.loads(sys.argv[1])
    before = resource.getrusage(resource.RUSAGE_SELF)
    coro = _load(
        args["url"], args["keys"], args["max_tokens"], args["marker"].encode(), args["model"]
    )
    t0 = time.perf_counter()
    try:
        import uvloop

        results = uvloop.run(coro)
    except ImportError:  # pragma: no cover - platform without uvloop
        results = asyncio.run(coro)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (usage.ru_utime - before.ru_utime) + (usage.ru_stime - before.ru_stime)
    streams = [r.__dict__ for r in results]
    sys.stdout.write(json.dumps({"streams": streams, "wall_s": wall, "cpu_s": cpu}))


def run_load(
    url: str,
    streams: int,
    max_tokens: int,
    tag: str,
    *,
    marker: bytes = EVENT,
    model: str = "sim-llama-8b",
    sample: Callable[[], None] | None = None,
) -> LoadReport:
    """Run ``streams`` concurrent streams of ``max_tokens`` tokens against ``url`` in a load
    process; keys are ``<tag>-<i>``. ``sample`` is called every 50 ms while the load runs (to
    follow a server's memory, say)."""
    import subprocess

    args = {
        "url": url,
        "keys": [f"{tag}-{i}" for i in range(streams)],
        "max_tokens": max_tokens,
        "marker": marker.decode(),
        "model": model,
    }
    cmd = [sys.executable, "-m", "streamsafe_bench.load", json.dumps(args)]
    # The report goes through a file: a pipe would fill up while this process samples.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        while proc.poll() is None:
            if sample is not None:
                sample()
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"load generator failed ({tag}): {err.read().decode()[-2000:]}")
        raw: dict[str, Any] = json.load(out)
    results = [StreamResult(**s) for s in raw["streams"]]
    return LoadReport(results, raw["wall_s"], raw["cpu_s"])


if __name__ == "__main__":
    _worker()
