"""The deadlines of one upstream attempt: first token, idle between chunks, total; and the
engine's health asked when the attempt goes quiet.

:class:`AttemptWatch` keeps them without a timer per chunk: the reader notes the time of each chunk
and one timer checks the deadline when it falls due. Every :data:`QUIET_CHECK` seconds without a
read (before the first token or after it) the engine is asked whether it is still there
(:meth:`~streamsafe.gateway.upstream.connection.Upstream.still_there`, one ``/health`` shared by all
its quiet attempts): a frozen, killed or unreachable engine ends the attempt at once, phase
``engine_down``, instead of at its timeout (docs/design.md, Failover). One watch per request
sent; where a request is asked again within its round (a failover, a same-engine retry), the
next watch's first-token bound counts from the round's start (``since``), not its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "QUIET_CHECK",
    "AttemptWatch",
    "EngineCheck",
    "ReadClock",
    "UpstreamStalled",
    "UpstreamTimeouts",
]

#: Seconds an attempt may go without a read before its engine's health is asked: past a few
#: heartbeats, well under any timeout, and rare for a working engine mid-answer (it sends a token
#: every few tens of milliseconds; before the first token, a long prefill or a queue is quiet).
QUIET_CHECK = 5.0


class EngineCheck(Protocol):
    """The engine an attempt went to, as its watch sees it."""

    base_url: str

    def still_there(self) -> Awaitable[bool]:
        """Whether the engine answers its health check (False holds it down)."""
        ...


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Bounds on one upstream request; ``None`` disables one. See
    :class:`~streamsafe.gateway.GatewayConfig` for the defaults and their reasons."""

    #: From sending the request to its first event (response headers included).
    first_token: float | None = 60.0
    #: Between two chunks once events flow.
    idle: float | None = 35.0
    #: For the whole generation, every attempt and wait included.
    total: float | None = 600.0
    #: From an answer's last event to the first event of the attempt that continues it (a
    #: continuation's first-token bound is what is left of it; see ``stall_deadline``).
    stall: float | None = 45.0


class UpstreamStalled(Exception):
    """An attempt passed a deadline: ``phase`` is ``first_token``, ``idle``, ``stall``, ``total``
    or ``engine_down``."""

    def __init__(self, phase: str, seconds: float, why: str | None = None) -> None:
        super().__init__(why or f"upstream {phase.replace('_', ' ')} timeout ({seconds:g} s)")
        self.phase = phase
        self.seconds = seconds


class ReadClock(Protocol):
    """A connection that notes the event loop's time of its last read."""

    read_at: float


class AttemptWatch:
    """The deadlines of one upstream attempt, as an async context manager around it.

    >>> async with AttemptWatch(timeouts, total_deadline) as watch:
    ...     response = await upstream.open(...)
    ...     async for chunk in response.aiter_raw():
    ...         watch.chunk()

    Past a deadline the attempt's task is cancelled and :class:`UpstreamStalled` leaves the
    block instead (a real cancellation of the task still propagates). Per chunk the reader
    only stores the loop's time; the one timer reschedules itself to the current deadline.
    """

    __slots__ = (
        "_cancelling",
        "_check",
        "_checked_at",
        "_engine",
        "_handle",
        "_last",
        "_loop",
        "_since",
        "_source",
        "_stall_deadline",
        "_task",
        "_total_deadline",
        "expired",
        "flowing",
        "timeouts",
    )

    def __init__(
        self,
        timeouts: UpstreamTimeouts,
        total_deadline: float | None,
        stall_deadline: float | None = None,
        since: float | None = None,
    ) -> None:
        self.timeouts = timeouts
        self._total_deadline = total_deadline
        #: Loop time by which a continuation must send its first event: the answer it continues
        #: went quiet ``timeouts.stall`` seconds before (``None``: not a continuation).
        self._stall_deadline = stall_deadline
        self._loop = asyncio.get_running_loop()
        #: Until the first event, the first-token bound counts from ``since``: the start of
        #: the round where this attempt asks again after one that failed before its first
        #: token (the round keeps one bound, not one per request).
        self._since = since
        self._last = self._loop.time() if since is None else since
        self._handle: asyncio.TimerHandle | None = None
        self._source: ReadClock | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        #: The phase whose deadline passed (``None`` while none did).
        self.expired: str | None = None
        #: Whether the first event came.
        self.flowing = False
        self._engine: EngineCheck | None = None
        self._check: asyncio.Task[None] | None = None
        self._checked_at = -float("inf")

    def chunk(self) -> None:
        """A chunk arrived (call for every chunk read)."""
        self._last = self._loop.time()

    @property
    def last_read(self) -> float:
        """Loop time of the attempt's last read (its start where nothing was read)."""
        source = self._source
        return source.read_at if source is not None and source.read_at > self._last else self._last

    def follow(self, source: ReadClock) -> None:
        """Take ``source.read_at`` (the loop's time of its last read) as the sign of life instead
        of :meth:`chunk` calls: a read callback stores a float, with no call per chunk."""
        self._source = source

    def engine(self, engine: EngineCheck) -> None:
        """The attempt goes to ``engine`` (told by
        :class:`~streamsafe.gateway.engines.attempts.Attempts` as it sends): its health is what a
        quiet stretch asks."""
        self._engine = engine
        self._checked_at = self._loop.time()
        if self._handle is not None:  # the quiet check may fall before the armed deadline
            self._handle.cancel()
            self._arm()

    def working(self) -> None:
        """The engine sends what this attempt does not relay (a replay of the part of the answer
        already delivered): the continuation's stall bound no longer applies; the first-token
        bound does, from its last read."""
        self._stall_deadline = None

    def first_event(self) -> None:
        """The first event arrived: from now on the idle bound applies (re-armed once, since it
        may fall before the first-token deadline)."""
        self.flowing = True
        self._last = self._loop.time()
        if self._handle is not None:
            self._handle.cancel()
            self._arm()

    def _deadline(self) -> tuple[float, str, float] | None:
        t = self.timeouts
        phase, limit = ("idle", t.idle) if self.flowing else ("first_token", t.first_token)
        best: tuple[float, str, float] | None = None
        last = self._last
        if self._source is not None and self._source.read_at > last:
            last = self._source.read_at
        if limit is not None:
            best = (last + limit, phase, limit)
        stall = self._stall_deadline
        if not self.flowing and stall is not None and (best is None or stall < best[0]):
            best = (stall, "stall", t.stall or 0.0)
        total = self._total_deadline
        if total is not None and t.total is not None and (best is None or total < best[0]):
            best = (total, "total", t.total)
        if self._engine is not None and self._check is None:
            quiet = max(last, self._checked_at) + QUIET_CHECK
            if best is None or quiet < best[0]:
                best = (quiet, "quiet", QUIET_CHECK)
        return best

    def _arm(self) -> None:
        due = self._deadline()
        self._handle = None if due is None else self._loop.call_at(due[0], self._fire)

    def _fire(self) -> None:
        due = self._deadline()
        if due is None:
            self._handle = None
            return
        if self._loop.time() < due[0]:  # a chunk moved the deadline: wait for the new one
            self._handle = self._loop.call_at(due[0], self._fire)
            return
        self._handle = None
        if due[1] == "quiet":
            self._checked_at = self._loop.time()
            self._check = self._loop.create_task(self._ask_engine())
            self._arm()
            return
        self.expired = due[1]
        if self._task is not None:
            self._task.cancel()

    async def _ask_engine(self) -> None:
        """The attempt went quiet: end it where its engine no longer answers its health check;
        else look again after another quiet stretch."""
        engine = self._engine
        try:
            there = engine is None or await engine.still_there()
        finally:
            self._check = None
        if self._task is None:  # the attempt ended meanwhile
            return
        if not there and self.expired is None:
            self.expired = "engine_down"
            self._task.cancel()
            return
        if self._handle is not None:
            self._handle.cancel()
        self._arm()

    async def __aenter__(self) -> AttemptWatch:
        self._task = asyncio.current_task()
        assert self._task is not None
        self._cancelling = self._task.cancelling()
        self._last = self._loop.time() if self._since is None else self._since
        self._arm()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: Any, tb: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        check, self._check = self._check, None
        if check is not None:
            check.cancel()
        # Let go of the task: the exception it may end with holds the frame that holds this
        # watch, and the task holds that exception (a cycle only the garbage collector frees).
        task, self._task = self._task, None
        phase = self.expired
        if phase is None or kind is not asyncio.CancelledError:
            return
        assert task is not None
        if task.uncancel() <= self._cancelling:
            if phase == "engine_down":
                engine = self._engine.base_url if self._engine is not None else "the engine"
                why = f"engine {engine} down: its /health did not answer while the answer was quiet"
                raise UpstreamStalled(phase, QUIET_CHECK, why) from None
            t = self.timeouts
            if phase == "stall":
                why = (
                    f"the answer stalled: no token for {t.stall:g} s since its last one, "
                    "through its continuation"
                )
                raise UpstreamStalled(phase, t.stall or 0.0, why) from None
            seconds = {"first_token": t.first_token, "idle": t.idle, "total": t.total}[phase]
            raise UpstreamStalled(phase, seconds or 0.0) from None
