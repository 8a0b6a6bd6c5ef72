"""A network between the gateway and an engine that cuts chosen streams: the first response to a
chat request carrying a planned marker is passed on for that many SSE events, then the
connection is reset (no ``[DONE]``, no error event: what a proxy restart or a network blip looks
like). Everything else, the gateway's continuations included, passes untouched. The tests and
``streamsafe demo --engine vllm`` put it between the gateway and the real vLLM."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx2

from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder

__all__ = ["Cut", "CuttingProxy", "serve_proxy"]


class Cut(Exception):
    """Raised in the app to drop the connection mid-response."""


@dataclass
class CuttingProxy:
    """An ASGI app in front of ``upstream``. ``plan[marker] = n``: the first chat request whose
    body holds ``marker`` is cut after ``n`` events. ``paths`` records every request's path."""

    upstream: str
    plan: dict[str, int] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    cuts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: One client for every request, made on the server's loop at its start (a client per
    #: request builds its connection pool and TLS context each time: CPU the engine and the
    #: gateway share, enough to slow the gateway's health probe past its timeout).
    _client: httpx2.AsyncClient | None = None

    def _cut_at(self, path: str, body: bytes) -> int | None:
        with self._lock:
            self.paths.append(path)
            if not path.endswith(("/chat/completions", "/v1/messages")):
                return None
            for marker, n in self.plan.items():
                if marker.encode() in body:
                    del self.plan[marker]
                    return n
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self._client is not None:
                await self._client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if self._client is None:
            self._client = httpx2.AsyncClient(base_url=self.upstream, timeout=120, trust_env=False)
        client = self._client
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        path = scope["path"]
        cut_at = self._cut_at(path, body)
        headers = {
            k.decode(): v.decode()
            for k, v in scope["headers"]
            if k.lower() not in (b"host", b"content-length")
        }
        async with client.stream(scope["method"], path, headers=headers, content=body) as resp:
            hdrs = [
                (k.encode(), v.encode())
                for k, v in resp.headers.items()
                if k not in ("content-length", "transfer-encoding")
            ]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": hdrs})
            decoder = SSEDecoder()
            seen = 0
            async for raw in resp.aiter_raw():
                if cut_at is not None:
                    # Pass whole events only, up to the planned count, then reset.
                    events = decoder.payloads(raw)
                    if seen + len(events) >= cut_at:
                        keep = b"".join(b"data: " + e + b"\n\n" for e in events[: cut_at - seen])
                        await send({"type": "http.response.body", "body": keep, "more_body": True})
                        with self._lock:
                            self.cuts += 1
                        raise Cut
                    seen += len(events)
                await send({"type": "http.response.body", "body": raw, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def serve_proxy(proxy: CuttingProxy) -> ServerThread:
    """The proxy on a loopback port (use as ``with serve_proxy(p) as server:``)."""
    # A cut is a deliberate reset: keep the server's traceback for it out of the output (a filter,
    # which outlives the levels the server sets when it starts).
    logging.getLogger("uvicorn.error").addFilter(_not_a_cut)
    return ServerThread(proxy)


def _not_a_cut(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], Cut))
