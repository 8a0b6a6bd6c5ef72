"""An engine's health: its breaker, and the ``/health`` probe that holds it down while the engine
is gone (see docs/design.md, Breaker and health).

:class:`EngineHealth` is what an :class:`~streamsafe.gateway.upstream.connection.Upstream` knows
of its engine's health, and what it is told: an attempt failed (:meth:`EngineHealth.failed`), got
its first token (:meth:`EngineHealth.succeeded`), the engine said it died, a stream went quiet
(:meth:`EngineHealth.still_there`). Failures go to the breaker (three in a row open it); the health
probe is asked once after a failure, when a stream is quiet, and by ``/ready``; where ``/health``
answers 5xx or nothing the breaker is held down and one task asks every probe interval until it
answers. Where the health path does not cover the engine (Llama Stack's ``/v1/health``) only the
failures open the breaker, and ``/health`` answering half-opens it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from streamsafe.gateway.upstream.breaker import EngineBreaker
from streamsafe.gateway.upstream.connect_failure import connect_failure, is_tls_failure
from streamsafe.gateway.upstream.errors import UpstreamError
from streamsafe.gateway.upstream.kinds import UpstreamKind
from streamsafe.gateway.upstream.transport import ConnectionPool

__all__ = ["QUIET_HEALTH_TIMEOUT", "EngineHealth"]

log = logging.getLogger("streamsafe.gateway")

#: Seconds ``/health`` gets to answer when a stream from the engine went quiet: longer than the
#: probe's own bound, since a busy engine answers slowly and a wrong verdict ends its streams.
QUIET_HEALTH_TIMEOUT = 10.0
#: Bytes of a ``/health`` answer read, at most (only its status counts).
_HEALTH_BODY = 4096


class EngineHealth:
    """The health of the engine at ``base_url`` (see the module). ``pool`` and ``kind`` are the
    connection's (the subclass sets them); ``probe_interval`` is the seconds between probes
    of an engine held down, and its breaker's first cool-down."""

    base_url: str
    kind: UpstreamKind
    pool: ConnectionPool

    def __init__(
        self,
        probe_interval: float,
        failure_threshold: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe_interval = probe_interval
        #: This engine's breaker (the pool's picks read it; the health probe holds it).
        self.breaker = EngineBreaker(failure_threshold, cooldown=probe_interval)
        self._clock = clock
        #: Attempts that failed on the engine's side: a 5xx, a reset, a refused connection, a
        #: stall, an error event standing for a 5xx.
        self.failures = 0
        #: Loop time of the last sign of life (a response, or /health answering).
        self.alive_at = -math.inf
        #: Why the engine is held down (a refused connection, a TLS failure, ``/health``
        #: silent), for the callers turned away meanwhile; ``None`` while it is not.
        self.down_why: str | None = None
        #: The TLS failure of the last ``/health`` that did not answer, if it was one.
        self._health_tls: str | None = None
        self._health_check_running: asyncio.Future[int | None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._health_check: asyncio.Task[None] | None = None

    def health_tasks(self) -> tuple[asyncio.Task[None] | None, ...]:
        """The background probes, for the connection to stop when it closes."""
        return (self._probe, self._health_check)

    def engine_died(self, why: str) -> None:
        """The engine is down (it said it died, or ``/health`` answered 5xx): hold its breaker
        open and probe ``/health`` until it answers."""
        self.unreachable(why)

    def unreachable(self, why: str) -> None:
        """The engine cannot be reached (refused, or ``/health`` silent after a failure or a
        quiet stream): held down as a dead one is, until ``/health`` answers."""
        self.down_why = why
        if self.breaker.hold(self._clock(), self.probe_interval):
            log.warning(
                "engine %s down (%s); failing fast until %s answers",
                self.base_url,
                why,
                self.kind.health_path,
                extra={"fields": {"event": "engine_down", "engine": self.base_url}},
            )
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_healthy())

    def failed(self, why: str, *, dead: bool = False) -> None:
        """An attempt failed on the engine's side: a 5xx, an error event standing for one, a
        reset before the answer, a stall; ``dead`` where the engine said it died. Told to the
        breaker (three in a row open it for a cool-down); a dead engine is held down, and where
        ``/health`` covers the engine it is asked once, in the background, whether the engine is
        dead, gone or frozen."""
        self.failures += 1
        if dead:
            self.engine_died(why)
            return
        breaker = self.breaker
        if breaker.held:
            return
        breaker.failures_prove_down = not self.kind.health_covers_engine
        now = self._clock()
        if breaker.on_failure(now):
            log.warning(
                "engine %s failing (%s); its breaker is open, next try in %.3g s",
                self.base_url,
                why,
                breaker.retry_after(now),
                extra={"fields": {"event": "engine_down", "engine": self.base_url}},
            )
        if self.kind.health_covers_engine and (
            self._health_check is None or self._health_check.done()
        ):
            self._health_check = asyncio.get_running_loop().create_task(self._check_once())

    def succeeded(self) -> None:
        """An attempt got its first token, or a whole answer: the engine works."""
        if self.breaker.on_success():
            log.info(
                "engine %s back: an attempt got its first token; breaker closed",
                self.base_url,
                extra={"fields": {"event": "engine_up", "engine": self.base_url}},
            )

    def abandoned(self) -> None:
        """An attempt ended with no verdict on the engine (a 4xx, its caller left)."""
        self.breaker.on_abandon()

    async def healthy(self, within: float | None = None) -> bool:
        """Whether the engine is believed alive: not known down (held by the probe, or open
        after failures where failures are all anyone knows) and, unless it answered within
        the last probe interval, ``/health`` answers now ``within`` so many seconds (default: the
        probe interval, at least a second; one check shared by every concurrent caller). A load
        balancer polling the gateway's ``/ready`` gets the truth."""
        if self.breaker.down(self._clock()):
            return False
        loop = asyncio.get_running_loop()
        if loop.time() - self.alive_at < self.probe_interval:
            return True
        asked_at = loop.time()
        running = self._health_check_running
        if running is None or running.done():
            running = self._health_check_running = loop.create_task(self.health(within))
        status = await asyncio.shield(running)
        if _healthy_status(status):
            return True
        if status is None and self.pool.last_read() >= asked_at:
            # No answer in time, but the engine sent something meanwhile on another
            # connection: busy (its health path starved), not frozen or gone.
            log.info(
                "engine %s: /health did not answer within %s s, but it streams: busy, not down",
                self.base_url,
                within,
            )
            return True
        self._judge(status)
        return False

    async def still_there(self) -> bool:
        """A stream from this engine went quiet: whether the engine is still there (``/health``
        answers within :data:`QUIET_HEALTH_TIMEOUT`). False holds it down, so its other streams
        and every continuation learn it at once."""
        return await self.healthy(QUIET_HEALTH_TIMEOUT)

    async def health(self, within: float | None = None) -> int | None:
        """Status of the upstream's health path (``/health``, Llama Stack's ``/v1/health``), or
        ``None`` if it did not answer ``within`` so many seconds (default: the probe interval, and
        at least a second). A TLS failure is kept as the reason the engine is down."""
        try:
            response = await self.pool.call(
                "GET",
                self.kind.health_path,
                within=within if within is not None else max(1.0, self.probe_interval),
                limit=_HEALTH_BODY,
            )
        except UpstreamError as exc:
            self._health_tls = connect_failure(exc) if is_tls_failure(exc) else None
            return None
        if _healthy_status(response.status):
            self.alive_at = asyncio.get_running_loop().time()
        return response.status

    def _judge(self, status: int | None) -> None:
        if status is None:
            self.unreachable(self._health_tls or "/health did not answer")
        elif status >= 500:
            self.engine_died(f"/health answered {status}")

    async def _check_once(self) -> None:
        status = await self.health()
        if not _healthy_status(status):
            self._judge(status)

    async def _probe_until_healthy(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval)
            if _healthy_status(await self.health()):
                # Where health does not cover the engine, the breaker half-opens: the next
                # attempt finds out whether the engine behind works.
                self.breaker.let_go(close=self.kind.health_covers_engine)
                self.down_why = None
                log.info(
                    "engine %s back: %s answers; breaker %s",
                    self.base_url,
                    self.kind.health_path,
                    self.breaker.state.value,
                    extra={"fields": {"event": "engine_up", "engine": self.base_url}},
                )
                return
            self.breaker.hold(self._clock(), self.probe_interval)


def _healthy_status(status: int | None) -> bool:
    # Reachable and not reporting itself down; an engine without /health (404) counts as up.
    return status is not None and status < 500
