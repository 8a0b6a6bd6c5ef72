"""Heartbeats once a stream flows: a ``: keep-alive`` comment whenever a subscriber's stream has
been silent for its heartbeat interval, so a stall of the engine in the middle of an answer never
trips a client's read timeout (see docs/design.md, Commit).

:class:`Keepalive` keeps the interval without a timer per chunk, as
:class:`~streamsafe.gateway.relay.attempt_watch.AttemptWatch` keeps the upstream deadlines: whoever
writes stores the loop's time of its last write (:meth:`Keepalive.wrote`), and one timer looks
when the interval would have passed, then reschedules itself from that last write
(:func:`quiet_beat` decides, a pure function of the clock's readings). A generation's fan-out
keeps one for all its members (:mod:`streamsafe.gateway.generations.fanout`); a subscriber served by
its own loop keeps one through :class:`QuietWait`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["KEEPALIVE_LINE", "TICK", "Keepalive", "QuietWait", "quiet_beat"]

#: One comment line with no blank line after it: a blank line would end an event, and the
#: Stainless clients' decoders (llama-stack-client, openai) dispatch an empty event there once an
#: ``id:`` has been seen, which llama-stack-client then fails to JSON-decode. A comment line is
#: ignored and the next event's lines simply follow it.
KEEPALIVE_LINE = b": keep-alive\n"


#: How early a timer may fire: uvloop's timers run on millisecond ticks. A heartbeat that is
#: due within it goes now rather than after another turn of the loop.
TICK = 0.001


def quiet_beat(last: float, now: float, beat: float) -> tuple[bool, float]:
    """At loop time ``now``, with the last write at ``last``: whether a heartbeat is due (the
    stream was silent ``beat`` seconds, less a :data:`TICK`) and when to look again. Looked at
    when it says, a stream is never silent longer than ``beat`` (plus the timer's lateness),
    however writes fall, and never gets a heartbeat sooner than ``beat - TICK`` after a write."""
    due = last + beat
    if now < due - TICK:
        return False, due
    return True, now + beat


class Keepalive:
    """Calls ``on_quiet`` whenever nothing was written for ``beat`` seconds, with one timer
    that reschedules itself from the loop time of the last write; :meth:`close` when done."""

    __slots__ = ("_beat", "_handle", "_loop", "_on_quiet", "clock", "last")

    def __init__(self, beat: float, on_quiet: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        #: The loop's clock (its ``time``).
        self.clock = self._loop.time
        self._beat = beat
        self._on_quiet = on_quiet
        #: The loop's time of the last write (or heartbeat).
        self.last = self.clock()
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self.last + beat, self._fire)

    @property
    def beat(self) -> float:
        """Seconds of silence after which ``on_quiet`` is called."""
        return self._beat

    def wrote(self) -> None:
        """Something was written: the silence starts again (a float stored, no timer)."""
        self.last = self.clock()

    def tighten(self, beat: float) -> None:
        """Heartbeat at least every ``beat`` seconds from now on (a shorter interval only)."""
        if beat >= self._beat or self._handle is None:
            return
        self._beat = beat
        self._handle.cancel()
        self._handle = self._loop.call_at(self.last + beat, self._fire)

    def _fire(self) -> None:
        now = self.clock()
        due, at = quiet_beat(self.last, now, self._beat)
        if due:
            self.last = now
        self._handle = self._loop.call_at(at, self._fire)
        if due:
            self._on_quiet()

    def close(self) -> None:
        """Stop the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _Changes(Protocol):
    """What :class:`QuietWait` waits on (a
    :class:`~streamsafe.gateway.generations.generation.Generation`)."""

    def next_change(self) -> asyncio.Future[None]: ...

    def forget_waiter(self, waiter: asyncio.Future[None]) -> None: ...


class QuietWait:
    """A subscriber loop's wait once its stream flows: until the generation changes or a
    heartbeat is due, every ``beat`` seconds of silence (0: never). One :class:`Keepalive`,
    started by the first :meth:`wait`, serves the loop's whole life; the loop calls
    :meth:`wrote` after each write and :meth:`close` at its end."""

    __slots__ = ("_due", "_keepalive", "_waiter", "beat")

    def __init__(self, beat: float) -> None:
        self.beat = beat
        self._due = False
        self._waiter: asyncio.Future[None] | None = None
        self._keepalive: Keepalive | None = None

    def _quiet(self) -> None:
        self._due = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wrote(self) -> None:
        """The loop wrote to its client."""
        keepalive = self._keepalive
        if keepalive is not None:
            keepalive.wrote()

    async def wait(self, gen: _Changes) -> bool:
        """Wait until ``gen`` changes or a heartbeat falls due; ``True`` where one is due (the
        caller sends it, then :meth:`wrote`)."""
        if self._keepalive is None:
            self._keepalive = Keepalive(self.beat, self._quiet)
        if not self._due:
            waiter = self._waiter = gen.next_change()
            try:
                await waiter
            finally:
                self._waiter = None
            if self._due:  # woken by the timer: still on the generation's waiting list
                gen.forget_waiter(waiter)
        due, self._due = self._due, False
        return due

    def close(self) -> None:
        """Stop the timer."""
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.close()
