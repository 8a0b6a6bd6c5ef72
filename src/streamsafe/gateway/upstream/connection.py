"""The one connection to the engine: a pooled HTTP client, connect retries, and health.

Retries here are only those that cannot duplicate work: the connection was never made
(``ConnectError``: refused, unreachable), so the engine never saw the request. They are spent from
a :class:`~streamsafe.retry.RetryBudget` shared by all requests, so a dead upstream is not hit
three times per request. Nothing is retried once a response started.

The breaker (:class:`~streamsafe.gateway.upstream.breaker.Breaker`) opens when the engine says it is
dead (a 500 whose body names ``EngineDeadError``, an error event naming it, or ``/health`` answering
5xx) and when it cannot be reached at all (the connection refused after the connect retries, or
``/health`` unanswered after a reset or a stall: a killed or frozen engine says nothing): new work
then fails fast with 503 and ``Retry-After`` instead of piling onto a broken engine, while one task
probes ``/health`` and closes the breaker when it answers. Where the upstream's health path does
not cover the engine (Llama Stack's ``/v1/health``), :data:`FAILURES_TO_TRIP` upstream failures in
a row open it too.

An attempt's upstream timeouts are :mod:`streamsafe.gateway.relay.attempt_watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections.abc import Mapping

import httpcore2
import httpx2
import orjson

from streamsafe.gateway.upstream.asyncio_backend import AsyncioBackend
from streamsafe.gateway.upstream.breaker import Breaker
from streamsafe.gateway.upstream.event_stream import EventStream, EventStreamPool, header_lines
from streamsafe.gateway.upstream.kinds import (
    KINDS,
    ProbeResult,
    UpstreamKind,
    describe_kind,
    describe_probes,
    probe_kind,
)
from streamsafe.retry import RetryBudget
from streamsafe.retry import parse_retry_after as read_retry_after

__all__ = [
    "MAX_ENGINE_RETRY_AFTER",
    "MAX_ERROR_BODY",
    "Upstream",
    "is_engine_death",
    "parse_retry_after",
    "read_bounded",
    "retry_after_value",
    "upstream_ssl_context",
]

log = logging.getLogger("streamsafe.gateway")

_ENGINE_DEATH_MARKERS = (
    b"EngineDeadError",
    b"EngineDead",
    b"engine is dead",
    b"Engine loop is not running",
)

#: Largest upstream error body kept and passed on.
MAX_ERROR_BODY = 64 * 1024
_JSON_LINE = header_lines({"content-type": "application/json"})
#: Upstream failures in a row that open the breaker where the upstream's health does not cover
#: the engine (Llama Stack masks an engine's death as an ordinary 500).
FAILURES_TO_TRIP = 3

#: Seconds the engine's tokenizer gets to count a prompt (``Upstream.prompt_tokens``).
_TOKENIZE_TIMEOUT = 5.0


def is_engine_death(body: bytes) -> bool:
    """True if an error body says the engine loop died (vLLM's ``EngineDeadError``,
    ``MQEngineDeadError``)."""
    return any(m in body for m in _ENGINE_DEATH_MARKERS)


def upstream_ssl_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """The context that verifies an ``https`` upstream: the system's trusted CAs, or only those
    in ``ca_bundle`` (a PEM file: a private CA, or a server's self-signed certificate, as OGX
    serves TLS by default). Raises ``OSError`` where the file cannot be read, ``ssl.SSLError``
    where it holds no certificate."""
    return ssl.create_default_context(cafile=ca_bundle)


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
        kind: str = "auto",
        ca_bundle: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        #: How an ``https`` upstream is verified: the CAs in ``ca_bundle`` (a PEM file), or the
        #: system's. One context for every connection, the hot stream's and the client's.
        self._ssl = upstream_ssl_context(ca_bundle)
        #: What the upstream is; vLLM's table until an ``auto`` probe says otherwise.
        self.kind: UpstreamKind = KINDS["vllm"] if kind == "auto" else KINDS[kind]  # type: ignore[index]
        #: The kind was set or found (an ``auto`` upstream that never answered is asked again).
        self.kind_known = kind != "auto"
        self._kind_probed_at: float | None = None
        self._kind_lock = asyncio.Lock()
        #: Upstream failures since the last success.
        self.failures_in_a_row = 0
        self.connect_retries = connect_retries
        self.connect_backoff = connect_backoff
        self.budget = budget or RetryBudget()
        self.breaker = Breaker(probe_interval)
        self.connect_retries_done = 0
        #: Requests sent (per engine series in ``/metrics``).
        self.requests = 0
        #: Attempts that failed on the engine's side: a 5xx, a reset, a refused connection, a
        #: stall, an error event standing for a 5xx.
        self.failures = 0
        #: Whether this upstream logs its own breaker's changes (a pool's engines are announced
        #: by the pool's breakers instead).
        self.announce = True
        #: Loop time of the last sign of life (a response, or /health answering).
        self.alive_at = -math.inf
        self._health_check_running: asyncio.Future[int | None] | None = None
        self._headers = {"accept-encoding": "identity"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = httpx2.Timeout(connect=connect_timeout, read=None, write=30.0, pool=None)
        self._limits = httpx2.Limits(max_connections=None, max_keepalive_connections=max_keepalive)
        self._client: httpx2.AsyncClient | None = None
        self._events = EventStreamPool(
            self.base_url, self._headers, connect_timeout=connect_timeout, ssl_context=self._ssl
        )
        self._probe: asyncio.Task[None] | None = None
        self._kind_check: asyncio.Task[None] | None = None
        self._health_check: asyncio.Task[None] | None = None

    @property
    def client(self) -> httpx2.AsyncClient:
        """The pooled client, created on first use (normally at lifespan startup)."""
        if self._client is None:
            transport = httpx2.AsyncHTTPTransport(
                limits=self._limits, trust_env=False, verify=self._ssl
            )
            if httpx2.URL(self.base_url).scheme == "http":
                # Same pool, asyncio sockets instead of anyio ones (see asyncio_backend).
                transport._pool = httpcore2.AsyncConnectionPool(
                    max_connections=self._limits.max_connections,
                    max_keepalive_connections=self._limits.max_keepalive_connections,
                    keepalive_expiry=self._limits.keepalive_expiry,
                    network_backend=AsyncioBackend(),
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
        """Create the connection pool and, for an ``auto`` kind, ask the upstream what it is.
        A Llama Stack kind that was set is checked in the background (see
        :meth:`_check_kind`)."""
        _ = self.client
        if not self.kind_known:
            await self.resolve_kind()
        elif self.kind.name in ("llama-stack", "ogx"):
            self._kind_check = asyncio.get_running_loop().create_task(self._check_kind())

    async def _check_kind(self) -> None:
        """Warn where a Llama Stack kind that was set is not what the upstream serves: the
        0.2 kind in front of OGX or llama-stack >= 0.4 protects routes the server no longer
        has, and passes the ones it has straight through (issue 21)."""
        found: dict[str, ProbeResult] = {}
        name = None
        with contextlib.suppress(TimeoutError, httpx2.HTTPError):
            async with asyncio.timeout(self._timeout.connect or 5.0):
                name = await probe_kind(self.client, found=found)
        if name is not None and name != self.kind.name:
            log.warning(
                "upstream %s was set as %s but answers as %s (probed: %s): the routes the "
                "gateway protects are not the ones it serves; set --upstream-kind %s (or auto)",
                self.base_url,
                self.kind.name,
                name,
                describe_probes(found),
                name,
            )

    async def resolve_kind(self) -> UpstreamKind:
        """The upstream's kind: probed (once at a time, at most once per probe interval, within
        the connect timeout) while it is not known; vLLM's table until then."""
        if self.kind_known:
            return self.kind
        async with self._kind_lock:
            now = asyncio.get_running_loop().time()
            last = self._kind_probed_at
            if self.kind_known or (last is not None and now - last < self.breaker.probe_interval):
                return self.kind
            self._kind_probed_at = now
            name = None
            found: dict[str, ProbeResult] = {}
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timeout.connect or 5.0):
                    name = await probe_kind(self.client, found=found)
            if name is None:
                log.warning(
                    "upstream %s did not answer as vLLM, OGX/Llama Stack or an OpenAI server "
                    "(%s); serving it as vLLM and asking again later",
                    self.base_url,
                    describe_probes(found) or "nothing answered",
                )
                return self.kind
            self.kind = KINDS[name]
            self.kind_known = True
            log.info(
                "upstream %s is %s (probed: %s); the gateway %s",
                self.base_url,
                name,
                describe_probes(found),
                describe_kind(self.kind),
            )
            return self.kind

    async def close(self) -> None:
        """Stop the probe and close every upstream connection."""
        for task in (self._probe, self._health_check, self._kind_check):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._events.close()

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
        self.requests += 1
        attempt = 0
        while True:
            try:
                response = await client.send(request, stream=True)
            except httpx2.ConnectError:
                if not await self._may_retry_connect(retry_connect, attempt):
                    raise
                attempt += 1
                continue
            self.budget.record_success()
            self.alive_at = asyncio.get_running_loop().time()
            return response

    async def open_events(
        self, path: str, body: bytes, *, retry_connect: bool = True, headers: bytes = b""
    ) -> EventStream:
        """POST a streaming completion on the hot path
        (:mod:`streamsafe.gateway.upstream.event_stream`) and return the exchange once the request
        is written; connect retries as :meth:`open`. ``headers``: header lines of the request's own.
        Raises ``OSError`` when no connection could be made."""
        lines = _JSON_LINE + headers if headers else _JSON_LINE
        self.requests += 1
        attempt = 0
        while True:
            try:
                conn = await self._events.request(b"POST", path, body, lines)
            except OSError:  # refused, unreachable, or the connect timed out
                if not await self._may_retry_connect(retry_connect, attempt):
                    raise
                attempt += 1
                continue
            self.budget.record_success()
            return conn

    async def _may_retry_connect(self, retry_connect: bool, attempt: int) -> bool:
        """A connection could not be made: whether to try again (after the backoff, within the
        budget); when not, the engine counts as unreachable."""
        self.budget.record_failure()
        if not retry_connect or attempt >= self.connect_retries or not self.budget.allow_retry():
            self.failures += 1
            self.unreachable("the connection was refused")
            return False
        delay = self.connect_backoff * (2**attempt)
        self.connect_retries_done += 1
        log.info("upstream refused the connection; retry %d in %.2f s", attempt + 1, delay)
        await asyncio.sleep(delay)
        return True

    def engine_died(self, why: str) -> None:
        """Open the breaker and start probing ``/health``."""
        if self.breaker.trip():
            if self.announce:
                log.warning(
                    "engine %s down (%s); failing fast until %s answers",
                    self.base_url,
                    why,
                    self.kind.health_path,
                    extra={"fields": {"event": "engine_down", "engine": self.base_url}},
                )
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_healthy())

    def unreachable(self, why: str) -> None:
        """The engine cannot be reached at all (refused, or silent after a reset or a stall):
        open the breaker as for a dead engine."""
        self.engine_died(why)

    def failed(self, why: str) -> None:
        """An upstream failure: a 5xx, an error event standing for one, a reset before the
        answer, or a stall. The health path is asked once, in the background, whether the
        upstream is dead, gone or frozen; where that answer does not cover the engine (Llama
        Stack masks an engine's death as an ordinary 500), :data:`FAILURES_TO_TRIP` in a row
        open the breaker as well."""
        self.failures_in_a_row += 1
        self.failures += 1
        if self.breaker.is_open:
            return
        if not self.kind.health_covers_engine and self.failures_in_a_row >= FAILURES_TO_TRIP:
            self.engine_died(f"{self.failures_in_a_row} upstream failures in a row, last: {why}")
            return
        if self._health_check is None or self._health_check.done():
            self._health_check = asyncio.get_running_loop().create_task(self._check_once())

    def succeeded(self) -> None:
        """A whole answer came back."""
        self.failures_in_a_row = 0

    async def healthy(self) -> bool:
        """Whether the engine is believed alive: the breaker is closed and, unless it answered
        within the last probe interval, ``/health`` answers now (one check shared by every
        concurrent caller). A load balancer polling the gateway's ``/health`` gets the truth."""
        if self.breaker.is_open:
            return False
        loop = asyncio.get_running_loop()
        if loop.time() - self.alive_at < self.breaker.probe_interval:
            return True
        running = self._health_check_running
        if running is None or running.done():
            running = self._health_check_running = loop.create_task(self.health())
        status = await asyncio.shield(running)
        if _healthy_status(status):
            return True
        self._judge(status)
        return False

    async def health(self) -> int | None:
        """Status of the upstream's health path (``/health``, Llama Stack's ``/v1/health``), or
        ``None`` if it did not answer in time (at most the probe interval, and at least a
        second)."""
        try:
            response = await self.client.get(
                self.kind.health_path, timeout=max(1.0, self.breaker.probe_interval)
            )
        except httpx2.HTTPError:
            return None
        if _healthy_status(response.status_code):
            self.alive_at = asyncio.get_running_loop().time()
        return response.status_code

    async def prompt_tokens(self, body: bytes) -> int | None:
        """The prompt tokens of ``body`` (a ``/tokenize`` request) as the engine counts them, or
        ``None`` where it cannot say: no tokenizer route, no answer within
        :data:`_TOKENIZE_TIMEOUT`, or an answer without a count."""
        path = self.kind.tokenize_path
        if path is None:
            return None
        try:
            response = await self.client.post(
                path,
                content=body,
                headers={"content-type": "application/json"},
                timeout=_TOKENIZE_TIMEOUT,
            )
            answer = orjson.loads(response.content) if response.status_code == 200 else None
        except (httpx2.HTTPError, orjson.JSONDecodeError):
            return None
        count = answer.get("count") if isinstance(answer, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return None
        return count

    def _judge(self, status: int | None) -> None:
        if status is None:
            self.unreachable("/health did not answer")
        elif status >= 500:
            self.engine_died(f"/health answered {status}")

    async def _check_once(self) -> None:
        status = await self.health()
        if not _healthy_status(status):
            self._judge(status)

    async def _probe_until_healthy(self) -> None:
        while True:
            await asyncio.sleep(self.breaker.probe_interval)
            if _healthy_status(await self.health()):
                # Where health does not cover the engine, this lets traffic try again: the next
                # failures in a row open the breaker anew.
                self.failures_in_a_row = 0
                self.breaker.close()
                if self.announce:
                    log.info(
                        "engine %s back: %s answers; breaker closed",
                        self.base_url,
                        self.kind.health_path,
                        extra={"fields": {"event": "engine_up", "engine": self.base_url}},
                    )
                return


def _healthy_status(status: int | None) -> bool:
    # Reachable and not reporting itself down; an engine without /health (404) counts as up.
    return status is not None and status < 500


async def read_bounded(response: httpx2.Response) -> bytes:
    """An upstream error body, at most 64 KiB of it (a misbehaving engine cannot make the gateway
    hold more)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        parts.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BODY:
            break
    return b"".join(parts)[:MAX_ERROR_BODY]


#: Most seconds of an engine's ``Retry-After`` the gateway waits out or passes on (an hour).
#: An engine may send anything (``inf``, ``1e308``, a date in 2100): past this it reads as this,
#: so every value gives a caller a 429 or 503 with a ``Retry-After`` it can act on.
MAX_ENGINE_RETRY_AFTER = 3600.0


def retry_after_value(value: str | None) -> float | None:
    """Seconds an engine's ``Retry-After`` asks for, within [0, :data:`MAX_ENGINE_RETRY_AFTER`],
    read by the retry core's parser (:func:`streamsafe.retry.parse_retry_after`: seconds,
    fractions, or an HTTP date, one already past being 0); ``None`` for none, or for a negative,
    NaN or unreadable value."""
    if not value:
        return None
    seconds = read_retry_after((("retry-after", value),), time.time())
    return None if seconds is None else min(seconds, MAX_ENGINE_RETRY_AFTER)


def parse_retry_after(value: str | None) -> int | None:
    """Whole seconds (rounded up, at least 1) from an engine's ``Retry-After``, as read by
    :func:`retry_after_value`."""
    seconds = retry_after_value(value)
    return None if seconds is None else max(1, math.ceil(seconds))
