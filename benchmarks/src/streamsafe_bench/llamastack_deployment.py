"""The report's deployment for tests and the demo: the real Llama Stack server in front of an
:class:`EngineSlot`, a fixed address whose engine can be replaced between scenarios.

Llama Stack registers the model at start-up by listing the engine's models, and keeps the
provider URL for its lifetime. A test session or a demo run therefore starts Llama Stack once (a
few seconds) in front of the slot, so every scenario gets a fresh engine with its own counters
without a Llama Stack restart. The slot hands each ASGI call straight to the current app in the
same process; it is not a proxy and changes nothing on the wire.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from streamsafe.server import ServerThread
from streamsafe.server.asgi import Receive, Scope, Send
from streamsafe_bench.llamastack import LlamaStackServer

__all__ = ["ASGIApp", "Deployment", "EngineSlot", "SeenRequest", "llama_stack_deployment"]

#: An ASGI application.
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """One request that reached the engine slot: what the middle tier sent."""

    method: str
    path: str
    headers: Mapping[str, str]


class EngineSlot:
    """A fixed address for a replaceable engine: an ASGI app that hands every call to the app
    installed last.

    Apps are expected to start themselves on their first request (the simulator does), because
    the slot's server ran its lifespan long before. :meth:`install` returns the app it replaced;
    the caller stops it (see :func:`serve_engine_slot`). Without an app, requests get 503.
    ``seen`` holds the method, path and headers of the last ``keep_seen`` requests (1000), so a
    test can read what the tier in front sent (its retry markers, keys); :meth:`install` clears
    it.
    """

    def __init__(self, app: ASGIApp | None = None, *, keep_seen: int = 1000) -> None:
        self.app = app
        self.seen: collections.deque[SeenRequest] = collections.deque(maxlen=keep_seen)
        #: Requests being served now, and when the last one came or went (monotonic clock).
        self.inflight = 0
        self.last_request_at = 0.0

    def install(self, app: ASGIApp) -> ASGIApp | None:
        """Route every later request to ``app``; return the previous app."""
        old, self.app = self.app, app
        self.seen.clear()
        return old

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            self.seen.append(SeenRequest(scope["method"], scope["path"], headers))
            self.last_request_at = time.monotonic()
            self.inflight += 1
            try:
                await self._call(scope, receive, send)
            finally:
                self.inflight -= 1
                self.last_request_at = time.monotonic()
            return
        await self._call(scope, receive, send)

    async def _call(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        if app is None:
            body = b'{"error":{"message":"no engine installed","type":"service_unavailable"}}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)


@dataclass
class Deployment:
    """Llama Stack in front of an :class:`EngineSlot`: the report's deployment, with the engine
    (or whatever stands behind Llama Stack) replaceable between scenarios."""

    ls: LlamaStackServer
    slot: EngineSlot
    slot_server: ServerThread

    @property
    def url(self) -> str:
        """Llama Stack's base URL."""
        return self.ls.url

    def install(self, app: ASGIApp) -> None:
        """Put ``app`` behind Llama Stack: started (``startup()`` where it has one) on the slot's
        loop, and the app it replaces stopped (``shutdown()``, or its simulator engine's
        ``stop()``)."""
        start = getattr(app, "startup", None)
        if start is not None:
            self._on_loop(start)
        old = self.slot.install(app)
        if old is not None and old is not app:
            self._stop(old)

    def _stop(self, app: Any) -> None:
        stop = getattr(app, "shutdown", None)
        if stop is None:
            stop = getattr(getattr(app, "engine", None), "stop", None)
        if stop is not None:
            self._on_loop(stop)

    def _on_loop(self, fn: Callable[[], Awaitable[Any]]) -> None:
        loop = self.slot_server.loop
        if loop is None or loop.is_closed():
            return

        async def _run() -> None:
            await asyncio.wait_for(fn(), 10)

        self.slot_server.call(_run(), timeout=15)

    def quiesce(self, quiet_s: float = 3.0, limit_s: float = 30.0) -> bool:
        """Wait until nothing reached the slot for ``quiet_s`` seconds (at most ``limit_s``);
        True if it went quiet. Llama Stack keeps working for callers that left (it retries a
        failed engine call after a backoff, finishes non-streaming calls), so a run is over
        only once that has passed; otherwise it lands on the next run's engine."""
        slot = self.slot
        deadline = time.monotonic() + limit_s
        while True:
            now = time.monotonic()
            if slot.inflight == 0 and now - slot.last_request_at >= quiet_s:
                return True
            if now > deadline:
                return False
            time.sleep(0.05)

    def close(self) -> None:
        """Stop whatever is installed, Llama Stack, and the slot's server."""
        try:
            self.ls.stop()
            if self.slot.app is not None:
                with contextlib.suppress(Exception):
                    self._stop(self.slot.app)
        finally:
            self.slot_server.stop()


@contextlib.contextmanager
def llama_stack_deployment(
    first: ASGIApp,
    model: str,
    *,
    server: Callable[[str], LlamaStackServer] | None = None,
) -> Iterator[Deployment]:
    """Serve an :class:`EngineSlot` holding ``first`` (an engine serving ``model``) and start
    Llama Stack in front of it; stop both on exit. ``server`` makes the Llama Stack server for
    the slot's URL (default: 0.2.12's, :class:`LlamaStackServer`; today's are
    :class:`~streamsafe_bench.ogx_server.OGXServer`)."""
    slot = EngineSlot()
    slot_server = ServerThread(slot).start()
    make = server or (lambda url: LlamaStackServer(url, model))
    try:
        deployment = Deployment(make(slot_server.url), slot, slot_server)
        deployment.install(first)
        deployment.ls.start()
    except BaseException:
        slot_server.stop()
        raise
    try:
        yield deployment
    finally:
        deployment.close()
