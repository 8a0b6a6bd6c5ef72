"""Running an ASGI app on loopback: in a background thread (tests, the demo, benchmarks) or in
the foreground (``streamsafe serve`` / ``simulate``).

Every server here binds its own socket first, so port 0 gives a free port with no race, and the
caller learns the port before the first request. ASGI lifespan is on: apps start and stop their
background work (the simulator's engine loop, the gateway's upstream connection pool) in
``lifespan``.

Every server enforces :class:`ServerLimits` (header sizes, read timeouts for unfinished requests,
a connection cap) before the app sees a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

from streamsafe.server.limits import ServerLimits
from streamsafe.server.protocol import limited_protocol

__all__ = [
    "CannotListen",
    "DrainingServer",
    "ServerLimits",
    "ServerThread",
    "base_url",
    "bind_socket",
    "run_server",
    "serve_in_thread",
    "server_config",
    "tune_collector",
]


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0 picks a free one), Nagle's algorithm off
    for every connection it accepts: a response may take several writes, and with Nagle's
    algorithm each would wait for the ACK of the one before (40 ms, delayed). Accepted sockets
    inherit TCP_NODELAY from the listening one (Linux, the BSDs), so no connection pays a system
    call for it (tests/test_serving_limits.py checks that every one has it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CannotListen(host, port, exc) from None
    sock.set_inheritable(True)
    return sock


class CannotListen(OSError):
    """A server could not listen on its address (a port already in use, an address that is not
    this machine's, a port it may not take): ``str()`` is one line for the operator, which the
    command line prints instead of a traceback."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        reason = "address already in use" if cause.errno == errno.EADDRINUSE else cause.strerror
        super().__init__(cause.errno, f"cannot listen on {host}:{port}: {reason or cause}")

    def __str__(self) -> str:
        return str(self.strerror)


def server_config(
    app: Any,
    *,
    log_level: str | None,
    loop: str,
    limits: ServerLimits | None,
    tls: ssl.SSLContext | None = None,
    **kwargs: Any,
) -> uvicorn.Config:
    """The configuration every server here runs ``app`` with: this project's HTTP protocol
    enforcing ``limits``, lifespan on, no access log of uvicorn's (the gateway writes its own),
    a 2 s graceful shutdown. Logging stays the program's (:mod:`streamsafe._logging` for the
    command line): uvicorn installs no handler; ``log_level`` (``None``: untouched) is the level
    of its loggers. ``tls``: serve HTTPS with this context
    (:func:`streamsafe.server.tls.server_context` builds the command line's), built before, so
    that a bad file fails before the port is bound."""
    if tls is not None:
        kwargs["ssl_context_factory"] = lambda config, default: tls
    return uvicorn.Config(
        app,
        log_level=log_level,
        log_config=None,
        loop=loop,
        http=limited_protocol(limits or ServerLimits()),
        lifespan="on",
        access_log=False,
        # No X-Forwarded-For rewriting of scope["client"]: no app here reads it, and uvicorn's
        # middleware for it costs every request.
        proxy_headers=False,
        timeout_graceful_shutdown=2,
        **kwargs,
    )


class ServerThread:
    """Serve ``app`` on loopback from a daemon thread with its own event loop.

    >>> with ServerThread(app) as server:
    ...     httpx2.get(server.url + "/health")

    ``start()`` returns once the server accepts connections; ``stop()`` shuts it down (open
    streams are cancelled after a short grace) and joins the thread. ``loop`` is the server's
    event loop, for tests that must run a coroutine next to the app
    (:meth:`call`). ``limits``: what one connection may cost (default :class:`ServerLimits`);
    ``tls``: serve HTTPS with this context.
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        loop: str = "asyncio",
        limits: ServerLimits | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.app = app
        self.tls = tls
        self._sock = bind_socket(host, port)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._server = uvicorn.Server(
            server_config(app, log_level=log_level, loop=loop, limits=limits, tls=tls)
        )
        self._thread = threading.Thread(target=self._run, name=f"server:{self.port}", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (``https://`` with ``tls``)."""
        return base_url(self.host, self.port, tls=self.tls is not None)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start()/stop()
            self._error = exc
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        watcher = asyncio.create_task(self._watch_started())
        try:
            await self._server.serve(sockets=[self._sock])
        finally:
            watcher.cancel()

    async def _watch_started(self) -> None:
        # uvicorn offers a flag, not an event, for "listening"; poll it briefly.
        while not self._server.started:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        self._ready.set()

    def start(self, timeout: float = 30.0) -> ServerThread:
        """Start serving; return once connections are accepted."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"server on port {self.port} did not start in {timeout} s")
        if self._error is not None or not self._server.started:
            raise RuntimeError(f"server on port {self.port} failed to start") from self._error
        return self

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        assert self.loop is not None, "server not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Shut the server down and wait for its thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_thread(app: Any, **kwargs: Any) -> Iterator[ServerThread]:
    """Context manager form of :class:`ServerThread`."""
    server = ServerThread(app, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain before it stops: the first SIGTERM or Ctrl-C runs
    ``drain()`` (the app's own: stop taking new work, let running work finish) while the
    server still listens, and only then stops it, so a load balancer sees the app's refusals
    and readiness instead of a closed port, and running streams end whole. A second signal
    stops it at once (uvicorn's way). Without ``drain`` it is uvicorn's server."""

    def __init__(
        self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        super().__init__(config)
        self._drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.draining = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if self._drain is None or loop is None or self.draining or not self.started:
            super().handle_exit(sig, frame)
            return
        self.draining = True
        # A signal handler runs between two bytecodes of the loop's thread: hand over to it.
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        assert self._loop is not None
        self._drain_task = self._loop.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        assert self._drain is not None
        try:
            await self._drain()
        finally:
            self.should_exit = True


def run_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str | None = None,
    announce: Callable[[str], None] | None = None,
    limits: ServerLimits | None = None,
    drain: Callable[[], Awaitable[None]] | None = None,
    sock: socket.socket | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Serve ``app`` in the foreground until interrupted (uvloop where available).

    ``announce`` is called with the base URL once the socket is bound, before serving: with
    ``port=0`` it is how the caller learns the port the system picked. ``drain``: run on the
    first SIGTERM or Ctrl-C before the server stops listening (see :class:`DrainingServer`).
    ``sock``: a listening socket to accept from instead of binding ``host:port`` (one a
    supervisor's workers share).
    ``tls``: serve HTTPS with this context (the announced URL is ``https://``)."""
    loop = "uvloop"
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover - platform without uvloop
        loop = "asyncio"
    if sock is None:
        sock = bind_socket(host, port)
    if announce is not None:
        announce(base_url(host, sock.getsockname()[1], tls=tls is not None))
    config = server_config(app, log_level=log_level, loop=loop, limits=limits, tls=tls)
    server = DrainingServer(config, drain)
    tune_collector()
    server.run(sockets=[sock])


def base_url(host: str, port: int, *, tls: bool = False) -> str:
    """The base URL of a server listening on ``host:port``: ``http://127.0.0.1:8000``,
    ``https://[::1]:8443``."""
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def tune_collector() -> None:
    """Freeze, for the cyclic garbage collector, everything a server process made before it
    serves (modules, the app, its configuration): it lives as long as the process, and no
    collection scans it again.

    Each collection of the oldest generation otherwise walks every object of the process, and
    every stream stalls for it: in bursts of 100 one-token requests through the gateway (2,000
    in all), such a collection took 33-90 ms, and 22-23 ms with the startup frozen (7-8 ms once
    a served request left no reference cycles behind: see ``HttpProtocol.connection_lost`` and
    ``RequestCycle.run``). The young threshold stays CPython's: what only the collector frees
    (an exception kept with its traceback and the frames it holds, say) would wait longer for
    it, and memory with it. Only for processes that serve
    (:func:`run_server`); an app served in a thread of another program (:class:`ServerThread`)
    leaves that program's collector alone."""
    gc.collect()
    gc.freeze()
