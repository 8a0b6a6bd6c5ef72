"""When a call an engine refused (429 or 503 before any work) may ask it again: the decision,
sans-I/O (see docs/design.md, Commit: refusals wait together).

An engine that refuses is full. Its refused calls do not each poll it: they wait together, and
one probe at a time asks again, on a schedule that belongs to the engine (:class:`Refusing`):
exponential backoff with full jitter (the retry core's :class:`~streamsafe.retry.RetryPolicy`),
the engine's ``Retry-After`` honoured up to a cap, and never more than ``window_asks`` asks
within ``window`` seconds. Each call has bounds of its own (:func:`next_turn`): at most
``most_asks`` engine requests while refused, none within ``window`` of its ``window_asks``-th
last, none past its deadline. A call that cannot ask again within them gives up at once with the
``Retry-After`` of the engine's next probe, rather than waiting for nothing.

Every function takes the clock reading and the random draw as arguments: no clock, no
randomness, no sleeping here (the asyncio shell is :mod:`.refusal_gate`).
"""

from __future__ import annotations

import dataclasses
import math

from streamsafe.retry import RetryPolicy

__all__ = ["REFUSAL_BACKOFF", "RefusalRules", "Refusing", "Turn", "next_turn"]

#: The wait after each refusal in a row (see :attr:`RefusalRules.backoff`): capped at 2 s, so
#: that a call's six asks come at most 2 s apart and find an engine that is up 2 s of every few
#: (a flapping engine: the crash-test suite's 2 s up, 3 s down), while its ``Retry-After`` and
#: the 4-in-3-s window keep them from hammering it. With 8 s waits a call refused through one
#: down period could spend its asks in the next ones and fail where the engine was up between.
REFUSAL_BACKOFF = RetryPolicy(initial_delay=1.0, max_delay=2.0, max_retry_after=10.0)


@dataclasses.dataclass(frozen=True, slots=True)
class RefusalRules:
    """How refused calls ask a full engine again. The defaults are the public crash-test suite's
    bounds for one call that is never admitted ("back off with jitter, never hammer the
    provider")."""

    most_asks: int = 6
    """Engine requests one call makes while refused, its first included (default 6); then it
    gets the refusal, with ``Retry-After``."""
    window: float = 3.0
    """Seconds of the sliding window that ``window_asks`` bounds (default 3)."""
    window_asks: int = 4
    """Asks within any ``window`` seconds, per call and per engine (default 4)."""
    backoff: RetryPolicy = REFUSAL_BACKOFF
    """The wait after each refusal in a row: full jitter over ``initial_delay * 2**n`` capped at
    ``max_delay`` (1, 2, 2, ... s), never shorter than the engine's ``Retry-After`` up to
    ``max_retry_after`` (10 s: an engine that asks for longer is waited for that long at most,
    and a call's own deadline decides whether it waits at all)."""

    def __post_init__(self) -> None:
        if self.most_asks < 1 or self.window_asks < 1:
            raise ValueError("most_asks and window_asks must be >= 1")
        if not self.window >= 0:
            raise ValueError("window must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True)
class Refusing:
    """An engine that refused and has admitted nothing since: an immutable value; each refusal
    makes the next one (:meth:`refused`)."""

    refusals: int = 0
    """Refusals in a row of the asks its schedule sent (the backoff's exponent)."""
    next_at: float = 0.0
    """The earliest clock reading at which the engine is asked again."""
    asks: tuple[float, ...] = ()
    """Its latest asks (at most ``window_asks``), oldest first."""

    def refused(
        self, now: float, retry_after: float | None, rand: float, rules: RefusalRules
    ) -> Refusing:
        """The engine refused an ask at ``now`` (saying ``retry_after`` seconds, or nothing);
        ``rand`` is a draw in ``[0, 1)`` for the jitter."""
        asks = (*self.asks, now)[-rules.window_asks :]
        asked = 0.0
        if retry_after is not None and math.isfinite(retry_after):
            asked = min(max(retry_after, 0.0), rules.backoff.max_retry_after)
        if self.refusals and now < self.next_at:
            # An ask the schedule did not send (a call that asked before it met the refusal,
            # a burst's first asks): it says what the last probe's refusal said, so it neither
            # grows the backoff nor moves the next probe, but for its Retry-After and the window.
            refusals, at = self.refusals, max(self.next_at, now + asked)
        else:
            refusals, at = (
                self.refusals + 1,
                now + max(rules.backoff.backoff(self.refusals, rand), asked),
            )
        if len(asks) >= rules.window_asks:
            at = max(at, asks[0] + rules.window)
        return Refusing(refusals, at, asks)

    def room(self, now: float) -> Refusing:
        """A generation the engine ran ended at ``now``: it has room for one more, so the next
        probe goes now rather than on the backoff's schedule (each ask a completion earned is
        no hammering; a call's own bounds still hold), and the backoff and the engine's window
        start over: an engine that completes work is full, not refusing for good, and its pace
        is its completions' (a probe that lost the race for the room is asked again soon)."""
        return Refusing(0, min(self.next_at, now), ())

    def took(self, now: float, rand: float, rules: RefusalRules) -> Refusing:
        """The engine took a probe at ``now`` while other generations of the gateway's run on
        it: it had room for that one. The next probe waits for the next of them to end
        (:meth:`room`), or at most the backoff's first step (``rand`` its jitter): asking at
        once would only be refused, and cost a waiting call one of its asks."""
        return Refusing(0, now + rules.backoff.backoff(0, rand), ())

    def retry_after(self, now: float) -> float:
        """Seconds until the engine is asked again, at least 1: the ``Retry-After`` its refused
        callers get."""
        return max(1.0, self.next_at - now)


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    """A refused call's next ask: at ``at`` (``go``), or never (it gives up, and its caller
    is told to come back in ``retry_after`` seconds)."""

    go: bool
    at: float = 0.0
    retry_after: float = 1.0


def next_turn(
    engine: Refusing | None,
    asks: tuple[float, ...],
    now: float,
    deadline: float | None,
    rules: RefusalRules,
    room_expected: bool = False,
) -> Turn:
    """When a call whose engine asks (while refused) came at the clock readings ``asks`` may ask
    again: not before the engine's next probe (``engine``; ``None`` where it admits again), nor
    within ``window`` of its own ``window_asks``-th last ask. It gives up where it spent
    ``most_asks``, or where that time falls past ``deadline`` and waiting could not help: at
    once, unless ``room_expected`` (generations run on the engine, and the end of one lets the
    next probe go sooner, :meth:`Refusing.room`), then at ``deadline``. A turn past the deadline
    is waited for only until the deadline (the caller plans again then)."""
    retry_after = 1.0 if engine is None else engine.retry_after(now)
    if len(asks) >= rules.most_asks:
        return Turn(False, retry_after=retry_after)
    at = now if engine is None else max(now, engine.next_at)
    if len(asks) >= rules.window_asks:
        at = max(at, asks[-rules.window_asks] + rules.window)
    if deadline is not None and at > deadline and (not room_expected or now >= deadline):
        return Turn(False, retry_after=max(retry_after, at - now))
    return Turn(True, at)
