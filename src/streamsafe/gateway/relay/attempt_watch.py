"""The deadlines of one upstream attempt: first token, idle between chunks, total.

:class:`AttemptWatch` keeps them without a timer per chunk: the reader notes the time of each chunk
and one timer checks the deadline when it falls due.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["AttemptWatch", "ReadClock", "UpstreamStalled", "UpstreamTimeouts"]


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Bounds on one upstream request; ``None`` disables one. See
    :class:`~streamsafe.gateway.GatewayConfig` for the defaults and their reasons."""

    #: From sending the request to its first event (response headers included).
    first_token: float | None = 60.0
    #: Between two chunks once events flow.
    idle: float | None = 30.0
    #: For the whole generation, every attempt and wait included.
    total: float | None = 600.0


class UpstreamStalled(Exception):
    """An attempt passed a deadline: ``phase`` is ``first_token``, ``idle`` or ``total``."""

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"upstream {phase.replace('_', ' ')} timeout ({seconds:g} s)")
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
        "_handle",
        "_last",
        "_loop",
        "_source",
        "_task",
        "_total_deadline",
        "expired",
        "flowing",
        "timeouts",
    )

    def __init__(self, timeouts: UpstreamTimeouts, total_deadline: float | None) -> None:
        self.timeouts = timeouts
        self._total_deadline = total_deadline
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._handle: asyncio.TimerHandle | None = None
        self._source: ReadClock | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        #: The phase whose deadline passed (``None`` while none did).
        self.expired: str | None = None
        #: Whether the first event came.
        self.flowing = False

    def chunk(self) -> None:
        """A chunk arrived (call for every chunk read)."""
        self._last = self._loop.time()

    def follow(self, source: ReadClock) -> None:
        """Take ``source.read_at`` (the loop's time of its last read) as the sign of life instead
        of :meth:`chunk` calls: a read callback stores a float, with no call per chunk."""
        self._source = source

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
        if limit is not None:
            last = self._last
            if self._source is not None and self._source.read_at > last:
                last = self._source.read_at
            best = (last + limit, phase, limit)
        total = self._total_deadline
        if total is not None and t.total is not None and (best is None or total < best[0]):
            best = (total, "total", t.total)
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
        self.expired = due[1]
        if self._task is not None:
            self._task.cancel()

    async def __aenter__(self) -> AttemptWatch:
        self._task = asyncio.current_task()
        assert self._task is not None
        self._cancelling = self._task.cancelling()
        self._last = self._loop.time()
        self._arm()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: Any, tb: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # Let go of the task: the exception it may end with holds the frame that holds this
        # watch, and the task holds that exception (a cycle only the garbage collector frees).
        task, self._task = self._task, None
        phase = self.expired
        if phase is None or kind is not asyncio.CancelledError:
            return
        assert task is not None
        if task.uncancel() <= self._cancelling:
            t = self.timeouts
            seconds = {"first_token": t.first_token, "idle": t.idle, "total": t.total}[phase]
            raise UpstreamStalled(phase, seconds or 0.0) from None
