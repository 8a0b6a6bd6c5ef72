"""Refused calls waiting together for one engine: the asyncio shell around
:mod:`.refusal_backoff` (see docs/design.md, Commit: refusals wait together).

An engine that answered 429 or 503 before any work is full. Its refused calls, and new calls
that arrive while it refuses, park here instead of asking it: one at a time, on the engine's
schedule, a call is let through as the probe, the one with the fewest asks first (so the
refusals spread over the waiting calls). The probe admitted (its first token) opens the gate as
the engine admits: one call at first, twice as many after each admission, so a recovering
engine is not hit by every waiter at once; where other generations of the gateway's run on the
engine, it stays full, and the end of one lets the next probe go. The probe refused, the next
one waits for the engine's next turn. A call that cannot ask again within its own bounds (asks,
deadline) gives up, with the ``Retry-After`` of the engine's next probe.

What counts as admitted: the first token (a plain call's 200), or no refusal within
:data:`PROBE_PATIENCE` of the ask (an engine refuses at once, vLLM in milliseconds; one that
took the request may queue it for long before its first token, and the calls behind it should
not wait for that). A generation the engine ran that ends makes room: the next probe goes at
once (:meth:`RefusalGate.room_made`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import weakref
from collections.abc import Callable

from streamsafe.gateway.engines.refusal_backoff import RefusalRules, Refusing, next_turn

__all__ = [
    "MOST_RELEASED",
    "PROBE_PATIENCE",
    "AskLedger",
    "AskLedgers",
    "RefusalGate",
    "RefusedCall",
]

#: The most calls let through at once while an engine recovers (the doubling stops there).
MOST_RELEASED = 64
#: Seconds after which an ask not refused counts as admitted (see the module).
PROBE_PATIENCE = 0.5
#: The line is woken this late for the engine's turn (an event loop may fire a timer up to its
#: clock's resolution early, and a call woken before its turn would wait again).
_EARLY = 0.002
#: A parked call plans again this long after the engine's turn should have woken it.
_LATE = 0.05


class AskLedger:
    """The refused asks of one logical call, shared by its identical copies: behind a server a
    client's retry comes as a fresh call with the same body while the copy it gave up on still
    waits here, and each copy asking on its own bounds multiplied them (three attempts of one
    stream cost a refusing engine 18 requests behind OGX). Copies of one call (same tenant, same
    body: :class:`AskLedgers`) count their asks
    together, so together they keep one call's bounds, and give up together."""

    __slots__ = ("__weakref__", "asks")

    def __init__(self) -> None:
        #: Clock readings of the asks that were refused.
        self.asks: tuple[float, ...] = ()


class AskLedgers:
    """The ledgers of the calls waiting or asking now, by tenant and body fingerprint: a copy of
    a call finds its siblings' (see :class:`AskLedger`); a ledger lasts as long as a generation
    holds it."""

    __slots__ = ("_by_call",)

    def __init__(self) -> None:
        self._by_call: weakref.WeakValueDictionary[tuple[str, bytes], AskLedger] = (
            weakref.WeakValueDictionary()
        )

    def of(self, tenant: str, fingerprint: bytes) -> AskLedger:
        """The ledger of the call ``tenant`` sends with the body of ``fingerprint``."""
        ledger = self._by_call.get((tenant, fingerprint))
        if ledger is None:
            ledger = self._by_call[tenant, fingerprint] = AskLedger()
        return ledger


class RefusedCall:
    """One generation's asks of a refusing engine: when it (with its identical copies, see
    :class:`AskLedger`) asked while refused (the bounds of :func:`~.refusal_backoff.next_turn`
    count them), and whether the gate let it through and awaits its outcome."""

    __slots__ = ("gate", "ledger", "patience", "seq")

    _arrivals = itertools.count()

    def __init__(self, ledger: AskLedger) -> None:
        #: Its place in arrival order (the line is by fewest asks, then arrival).
        self.seq = next(RefusedCall._arrivals)
        #: The asks it shares with its identical copies.
        self.ledger = ledger
        #: The gate it went through and whose outcome is not known yet.
        self.gate: RefusalGate | None = None
        #: The timer that counts it admitted if no refusal comes (:data:`PROBE_PATIENCE`).
        self.patience: asyncio.TimerHandle | None = None

    @property
    def asks(self) -> tuple[float, ...]:
        """Clock readings of its asks (and its copies') that were refused."""
        return self.ledger.asks

    @asks.setter
    def asks(self, asks: tuple[float, ...]) -> None:
        self.ledger.asks = asks


class RefusalGate:
    """One engine's refused calls (see the module). ``clock`` and ``rand`` (a draw in
    ``[0, 1)`` for the jitter) are injectable for tests."""

    def __init__(
        self,
        rules: RefusalRules | None = None,
        clock: Callable[[], float] | None = None,
        rand: Callable[[], float] = random.random,
        patience: float = PROBE_PATIENCE,
    ) -> None:
        self.rules = rules or RefusalRules()
        self.patience = patience
        self._clock = clock
        self._rand = rand
        #: The engine's refusal state; ``None`` while it admits.
        self.state: Refusing | None = None
        #: The status of its latest refusal (429: rate limited, 503: overloaded).
        self.status = 503
        #: Generations of the gateway's running on the engine (their ends make room).
        self.running = 0
        #: Calls let through whose outcome is not known yet.
        self._in_flight = 0
        #: How many may be in flight at once while the engine admits again.
        self._released = 1
        self._waiting = 0
        #: Parked calls, woken in line: fewest asks first (so the engine's refusals spread
        #: over the waiting calls, none spending its asks alone), then arrival.
        self._changed: list[tuple[tuple[int, int], asyncio.Future[None]]] = []
        #: Wakes the line when the engine's next probe is due.
        self._due: asyncio.TimerHandle | None = None

    @property
    def active(self) -> bool:
        """True while the engine refuses or calls still wait here: a new call parks too."""
        return self.state is not None or self._waiting > 0

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def retry_after(self) -> float:
        """Seconds until the engine is asked again (at least 1)."""
        state = self.state
        return 1.0 if state is None else state.retry_after(self._now())

    async def turn(self, call: RefusedCall, deadline: float | None) -> float | None:
        """Wait until ``call`` may ask the engine: ``None`` when it goes now (the gate then
        awaits its outcome: :meth:`refused`, :meth:`admitted` or :meth:`done`), else the
        seconds its caller is told to wait (it gives up)."""
        self._waiting += 1
        try:
            while True:
                now = self._now()
                room = self.running > 0
                turn = next_turn(self.state, call.asks, now, deadline, self.rules, room)
                if not turn.go:
                    return turn.retry_after
                limit = 1 if self.state is not None else self._released
                if turn.at <= now and self._in_flight < limit:
                    self._in_flight += 1
                    call.gate = self
                    loop = asyncio.get_running_loop()
                    call.patience = loop.call_later(self.patience, self._not_refused, call)
                    return None
                # The engine's turn wakes the line in order (see _schedule); the call's own
                # window and its deadline are its own timeouts.
                state = self.state
                if turn.at <= now:
                    until = math.inf  # blocked by the one in flight: woken by its outcome
                elif state is None or turn.at > state.next_at:
                    until = turn.at  # its own window
                else:
                    # The engine's turn: _schedule wakes the line, in order; this is only a
                    # net under it (a timer may fire a hair early).
                    until = turn.at + _LATE
                if deadline is not None:
                    until = min(until, deadline)
                within = None if until == math.inf else max(0.0, until - now)
                await self._wait_change(call, within)
        finally:
            self._waiting -= 1
            self._settle()

    def refused(self, call: RefusedCall, status: int, retry_after: float | None) -> None:
        """The engine refused ``call``'s ask now with ``status`` (429 or 503), saying
        ``retry_after`` seconds or nothing: it is full again, and the gate closes until its next
        turn."""
        self.status = status
        now = self._now()
        call.asks = (*call.asks, now)
        self._land(call)
        state = self.state or Refusing()
        self.state = state.refused(now, retry_after, self._rand(), self.rules)
        self._released = 1
        self._schedule()
        self._wake()

    def admitted(self, call: RefusedCall, *, runs: bool = False) -> None:
        """The engine admitted a call (its first token came, or no refusal in time): the gate
        opens, twice as wide as after the last admission while calls wait. ``runs``: a
        generation of the gateway's runs there now, until :meth:`room_made`."""
        if runs:
            self.running += 1
        self._land(call)  # where the gate let it through
        state = self.state
        if state is not None and runs and self.running > 1:
            # Full, but working: the ends of the others say when there is room.
            self.state = state.took(self._now(), self._rand(), self.rules)
            self._schedule()
        elif state is not None:
            self.state = None
            self._released = 1
        elif self._waiting and self.running <= int(runs):
            # Doubling finds the room of an engine coming back; where generations of the
            # gateway's run there, their ends say when there is room (room_made).
            self._released = min(MOST_RELEASED, self._released * 2)
        self._wake()

    def room_made(self) -> None:
        """A generation that ran on the engine (:meth:`admitted` with ``runs``) ended: the
        next probe goes now."""
        self.running = max(0, self.running - 1)
        state = self.state
        if state is not None:
            self.state = state.room(self._now())
            self._schedule()
            self._wake()

    def done(self, call: RefusedCall) -> None:
        """``call``'s ask ended otherwise (failed, cancelled): its place goes to the next."""
        if call.gate is self:
            self._land(call)
            self._wake()

    def _not_refused(self, call: RefusedCall) -> None:
        call.patience = None
        if call.gate is self:
            self.admitted(call)

    def _land(self, call: RefusedCall) -> None:
        if call.gate is self:
            call.gate = None
            self._in_flight -= 1
            if call.patience is not None:
                call.patience.cancel()
                call.patience = None

    def _settle(self) -> None:
        # Nobody waits and the engine admits: back to letting everything through.
        if not self._waiting and self.state is None:
            self._released = 1

    def _schedule(self) -> None:
        """Wake the line when the engine's next probe is due."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        state = self.state
        if state is not None:
            loop = asyncio.get_running_loop()
            due = max(0.0, state.next_at - self._now()) + _EARLY
            self._due = loop.call_later(due, self._wake)

    async def _wait_change(self, call: RefusedCall, within: float | None) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = ((len(call.asks), call.seq), fut)
        self._changed.append(entry)
        try:
            async with asyncio.timeout(within):
                await fut
        except TimeoutError:
            pass
        finally:
            if entry in self._changed:
                self._changed.remove(entry)

    def _wake(self) -> None:
        # In line: the tasks resume in the order their futures are resolved.
        waiters, self._changed = self._changed, []
        waiters.sort(key=lambda entry: entry[0])
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(None)
