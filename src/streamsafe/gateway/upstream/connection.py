"""The one connection to the engine: its pooled HTTP client
(:class:`~streamsafe.gateway.upstream.transport.ConnectionPool`, every call to the engine goes
through it), connect retries, and health.

Retries here are only those that cannot duplicate work: the connection was never made
(:class:`~streamsafe.gateway.upstream.errors.ConnectFailed`: refused, unreachable), so the engine
never saw the request. They are spent from
a :class:`~streamsafe.retry.RetryBudget` shared by all requests, so a dead upstream is not hit
three times per request. Nothing is retried once a response started.

Each engine has one breaker (:class:`~streamsafe.gateway.upstream.breaker.EngineBreaker`), whether
it is the gateway's only upstream or one of a pool. Failed attempts open it (three in a row, or
one where the engine says it died: a 500 naming ``EngineDeadError``); the health probe holds it
open while ``/health`` answers 5xx or nothing (a killed or frozen engine says nothing). The probe is
asked after a failure, when a stream from the engine goes quiet (:meth:`Upstream.still_there`), and
by ``/ready``; once held, it asks every probe interval until ``/health`` answers. Where the health
path does not cover the engine (Llama Stack's ``/v1/health``) only the failures open it.

An attempt's upstream timeouts are :mod:`streamsafe.gateway.relay.attempt_watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

import orjson

from streamsafe._url_userinfo import basic_authorization, split_userinfo
from streamsafe.gateway.upstream.connect_failure import connect_failure, is_tls_failure
from streamsafe.gateway.upstream.errors import ConnectFailed, UpstreamError
from streamsafe.gateway.upstream.exchange import Exchange
from streamsafe.gateway.upstream.health import EngineHealth
from streamsafe.gateway.upstream.kinds import KINDS, UpstreamKind, describe_kind
from streamsafe.gateway.upstream.probe import ProbeResult, describe_probes, probe_kind
from streamsafe.gateway.upstream.transport import ConnectionPool, header_lines
from streamsafe.retry import RetryBudget

__all__ = [
    "MAX_ERROR_BODY",
    "NotConnected",
    "Upstream",
    "is_engine_death",
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
_JSON_PAIR = ((b"content-type", b"application/json"),)

#: Seconds the gateway's start waits for an ``auto`` upstream's kind before serving anyway.
_START_PROBE_WAIT = 1.0

#: Seconds the engine's tokenizer gets to count a prompt (``Upstream.prompt_tokens``).
_TOKENIZE_TIMEOUT = 5.0


def is_engine_death(body: bytes) -> bool:
    """True if an error body says the engine loop died (vLLM's ``EngineDeadError``,
    ``MQEngineDeadError``)."""
    return any(m in body for m in _ENGINE_DEATH_MARKERS)


def upstream_ssl_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """The context that verifies an ``https`` upstream: the system's trusted CAs, or only those
    in ``ca_bundle`` (a PEM file: a private CA, or a server's self-signed certificate, as OGX
    serves TLS by default). Raises ``ValueError`` naming the file where it cannot be read or
    holds no certificate (a setting to fix at start, not a traceback)."""
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except ssl.SSLError as exc:
        raise ValueError(
            f"upstream CA bundle {ca_bundle}: no PEM certificate in it ({exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"upstream CA bundle {ca_bundle}: cannot read it ({exc.strerror or exc})"
        ) from None


class NotConnected(Exception):
    """No connection to the engine was made (``cause``: refused, unreachable, TLS, the connect
    timed out), so it never saw the request: raised by a ``connect_once`` send, whose caller's
    :class:`~streamsafe.gateway.engines.attempt_plan.AttemptPlan` decides whether to connect
    again (the one loop that decides a generation's requests; see docs/design.md)."""

    def __init__(self, cause: Exception, why: str) -> None:
        super().__init__(why)
        self.cause = cause
        #: Why, as :func:`connect_failure` names it (logged, and the engine's ``down_why``).
        self.why = why
        #: False for a TLS failure: the certificate will not have changed.
        self.retryable = not is_tls_failure(cause)


class Upstream(EngineHealth):
    """The engine at ``base_url``: its connection pool, its breaker and health, the retry budget.

    Credentials in ``base_url`` (``http://user:password@host``), or ``userinfo`` given apart,
    go upstream as Basic authorization (``api_key``, where given, wins); :attr:`base_url`, the
    engine's name in every log line, holds none (see :mod:`streamsafe._url_userinfo`)."""

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
        userinfo: str | None = None,
        failure_threshold: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(probe_interval, failure_threshold, clock)
        # Credentials in the URL never reach a log line: the URL is the engine's name too.
        base_url, in_url = split_userinfo(base_url)
        userinfo = userinfo or in_url
        self.base_url = base_url.rstrip("/")
        #: How an ``https`` upstream is verified: the CAs in ``ca_bundle`` (a PEM file), or the
        #: system's. One context for every connection.
        self._ssl = upstream_ssl_context(ca_bundle)
        #: What the upstream is; vLLM's table until an ``auto`` probe says otherwise.
        self.kind: UpstreamKind = KINDS["vllm"] if kind == "auto" else KINDS[kind]  # type: ignore[index]
        #: The kind was set or found (an ``auto`` upstream that never answered is asked again).
        self.kind_known = kind != "auto"
        self._kind_probed_at: float | None = None
        self._kind_lock = asyncio.Lock()
        self.connect_retries = connect_retries
        self.connect_backoff = connect_backoff
        self.budget = budget or RetryBudget()
        self.connect_retries_done = 0
        #: Requests sent (per engine series in ``/metrics``).
        self.requests = 0
        #: Headers on every request to the engine (a request's own of the same name win).
        self.headers = {"accept-encoding": "identity"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        elif userinfo:
            self.headers["authorization"] = basic_authorization(userinfo)
        self._connect_timeout = connect_timeout
        #: Every request to the engine goes through it (see its module).
        self.pool = ConnectionPool(
            self.base_url,
            self.headers,
            connect_timeout=connect_timeout,
            ssl_context=self._ssl,
            max_idle=max_keepalive,
        )
        self._kind_check: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        """For an ``auto`` kind, ask the upstream what it is:
        waited for up to :data:`_START_PROBE_WAIT`, then left to finish in the background (an
        engine that answers nothing must not keep the gateway from serving ``/ready``; a
        completion waits for the probe, :meth:`resolve_kind`). A Llama Stack kind that was set
        is checked in the background (see :meth:`_check_kind`)."""
        if not self.kind_known:
            probe = asyncio.get_running_loop().create_task(self.resolve_kind())
            self._kind_check = probe
            await asyncio.wait((probe,), timeout=_START_PROBE_WAIT)
        elif self.kind.name in ("llama-stack", "ogx"):
            self._kind_check = asyncio.get_running_loop().create_task(self._check_kind())

    async def _check_kind(self) -> None:
        """Warn where a Llama Stack kind that was set is not what the upstream serves: the
        0.2 kind in front of OGX or llama-stack >= 0.4 protects routes the server no longer
        has, and passes the ones it has straight through (issue 21)."""
        found: dict[str, ProbeResult] = {}
        name = None
        with contextlib.suppress(TimeoutError, UpstreamError):
            async with asyncio.timeout(self._connect_timeout or 5.0):
                name = await probe_kind(self.pool, found=found)
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
            if self.kind_known or (last is not None and now - last < self.probe_interval):
                return self.kind
            self._kind_probed_at = now
            name = None
            found: dict[str, ProbeResult] = {}
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._connect_timeout or 5.0):
                    name = await probe_kind(self.pool, found=found)
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
        for task in (*self.health_tasks(), self._kind_check):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.pool.close()

    async def open(
        self,
        method: str,
        path: str | bytes,
        *,
        content: bytes | AsyncIterable[bytes] = b"",
        headers: Iterable[tuple[bytes, bytes]] = (),
        retry_connect: bool = True,
        connect_once: bool = False,
    ) -> Exchange:
        """Send a request and return the exchange once its head came (the caller reads the
        body and releases it). Retries a refused connection within the budget when
        ``retry_connect`` (never a streamed ``content``: it cannot be sent twice);
        ``connect_once``: no retry here, a connection not made raises :class:`NotConnected`
        (the generation's plan decides)."""
        retry_connect = retry_connect and isinstance(content, bytes)
        conn = await self._connected(
            lambda: self.pool.open(method, path, content, headers), retry_connect, connect_once
        )
        try:
            await conn.head()
        except BaseException:
            conn.release()
            raise
        self.alive_at = conn.read_at
        return conn

    async def open_events(
        self,
        path: str,
        body: bytes,
        *,
        retry_connect: bool = True,
        headers: bytes = b"",
        connect_once: bool = False,
    ) -> Exchange:
        """POST a streaming completion on the hot path
        (:mod:`streamsafe.gateway.upstream.exchange`) and return the exchange once the request
        is written; connect retries as :meth:`open`. ``headers``: header lines of the request's own.
        Raises :class:`ConnectFailed` when no connection could be made."""
        lines = _JSON_LINE + headers if headers else _JSON_LINE
        return await self._connected(
            lambda: self.pool.request(b"POST", path, body, lines), retry_connect, connect_once
        )

    async def _connected(
        self,
        send: Callable[[], Awaitable[Exchange]],
        retry_connect: bool,
        connect_once: bool = False,
    ) -> Exchange:
        """``send`` a request, again while no connection could be made and
        :meth:`_may_retry_connect` allows: the one connect-retry loop (``connect_once``: none,
        :class:`NotConnected` instead, for a generation's plan to decide)."""
        if not connect_once:  # a plan's sends are counted by their attempt, once
            self.requests += 1
        attempt = 0
        while True:
            try:
                conn = await send()
            except ConnectFailed as exc:  # refused, unreachable, TLS, or the connect timed out
                if connect_once:
                    raise self._not_connected(exc) from exc
                if not await self._may_retry_connect(retry_connect, attempt, exc):
                    raise
                attempt += 1
                continue
            self.budget.record_success()
            return conn

    async def _may_retry_connect(
        self, retry_connect: bool, attempt: int, exc: BaseException
    ) -> bool:
        """A connection could not be made (``exc``): whether to try again (after the backoff,
        within the budget); when not, the engine counts as unreachable, for the reason
        :func:`connect_failure` names. A TLS failure is not asked again: the certificate will
        not have changed."""
        self.budget.record_failure()
        why = connect_failure(exc)
        if (
            not retry_connect
            or attempt >= self.connect_retries
            or is_tls_failure(exc)
            or not self.budget.allow_retry()
        ):
            self.failures += 1
            self.unreachable(why)
            return False
        delay = self.connect_backoff * (2**attempt)
        self.connect_retries_done += 1
        log.info("upstream %s: %s; retry %d in %.2f s", self.base_url, why, attempt + 1, delay)
        await asyncio.sleep(delay)
        return True

    def _not_connected(self, exc: Exception) -> NotConnected:
        """A connection could not be made (a ``connect_once`` send): counted against the retry
        budget, as :meth:`_may_retry_connect` counts it."""
        self.budget.record_failure()
        return NotConnected(exc, connect_failure(exc))

    def gave_up_connecting(self, why: str) -> None:
        """No more connects for this request (its plan said so): the engine counts as
        unreachable, for ``why``, as where :meth:`_may_retry_connect` gives up."""
        self.failures += 1
        self.unreachable(why)

    async def prompt_tokens(self, body: bytes) -> int | None:
        """The prompt tokens of ``body`` (a ``/tokenize`` request) as the engine counts them, or
        ``None`` where it cannot say: no tokenizer route, no answer within
        :data:`_TOKENIZE_TIMEOUT`, or an answer without a count."""
        path = self.kind.tokenize_path
        if path is None:
            return None
        try:
            response = await self.pool.call(
                "POST", path, body, _JSON_PAIR, within=_TOKENIZE_TIMEOUT
            )
            answer = orjson.loads(response.body) if response.status == 200 else None
        except (UpstreamError, orjson.JSONDecodeError):
            return None
        count = answer.get("count") if isinstance(answer, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return None
        return count
