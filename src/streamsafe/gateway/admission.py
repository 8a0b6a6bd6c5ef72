"""Admission: a generation enters the engine only if it fits.

Two limits: generations running at once, and an estimate of engine memory (prompt tokens plus
max_tokens, the most a request can hold in the KV cache). What does not fit waits in a bounded
FIFO queue for a bounded time; past either bound it is shed with 429 and a ``Retry-After``
computed from the completion rate the gateway observes.

:class:`AdmissionCore` is the decision, sans-I/O: it takes the clock reading as an argument and
holds opaque waiters. :class:`Admission` wraps it with futures for the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from streamsafe.tokens import estimate_prompt_tokens

__all__ = ["Admission", "AdmissionCore", "Shed", "Ticket", "request_cost"]

#: Completions remembered to estimate the completion rate.
_RATE_WINDOW = 64
#: Bounds of Retry-After: at least 1 s (clients treat 0 as "now"), at most 60 s (Stainless
#: clients ignore anything longer and fall back to their own backoff).
RETRY_AFTER_MIN = 1
RETRY_AFTER_MAX = 60


def request_cost(body: Mapping[str, Any], default_max_tokens: int) -> int:
    """Engine memory a request may take, in tokens: estimated prompt tokens plus the
    completion limit it asks for (``max_completion_tokens``, ``max_tokens``, or the default),
    times ``n`` choices."""
    limit = body.get("max_completion_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        limit = body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        limit = default_max_tokens
    n = body.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    return (estimate_prompt_tokens(body) + limit) * choices


class Shed(Exception):
    """The request was not admitted; answer 429 with ``Retry-After: retry_after``."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class Ticket:
    """Proof of admission; give it back with :meth:`Admission.release` exactly once."""

    __slots__ = ("cost", "released")

    def __init__(self, cost: int) -> None:
        self.cost = cost
        self.released = False


class _Waiter:
    __slots__ = ("cost", "token")

    def __init__(self, cost: int, token: Any) -> None:
        self.cost = cost
        self.token = token


class AdmissionCore:
    """The admission decision, with no I/O and no clock of its own.

    Invariants: ``inflight <= max_inflight`` and ``memory <= max_memory_tokens`` (when set);
    waiters are admitted in arrival order (a large request at the head is not starved by small
    ones behind it); ``len(queue) <= queue_size``.
    """

    def __init__(
        self, max_inflight: int | None, max_memory_tokens: int | None, queue_size: int
    ) -> None:
        self.max_inflight = max_inflight
        self.max_memory_tokens = max_memory_tokens
        self.queue_size = queue_size
        self.inflight = 0
        self.memory = 0
        self.queue: collections.deque[_Waiter] = collections.deque()
        self._completions: collections.deque[float] = collections.deque(maxlen=_RATE_WINDOW)

    def can_ever_fit(self, cost: int) -> bool:
        """False if ``cost`` exceeds the whole memory budget: waiting would never help."""
        return self.max_memory_tokens is None or cost <= self.max_memory_tokens

    def _fits(self, cost: int) -> bool:
        if self.max_inflight is not None and self.inflight >= self.max_inflight:
            return False
        return self.max_memory_tokens is None or self.memory + cost <= self.max_memory_tokens

    def try_admit(self, cost: int) -> bool:
        """Admit at once if nobody waits and it fits."""
        if self.queue or not self._fits(cost):
            return False
        self.inflight += 1
        self.memory += cost
        return True

    def enqueue(self, cost: int, token: Any) -> _Waiter | None:
        """Queue a waiter carrying ``token``; ``None`` if the queue is full."""
        if len(self.queue) >= self.queue_size:
            return None
        waiter = _Waiter(cost, token)
        self.queue.append(waiter)
        return waiter

    def remove(self, waiter: _Waiter) -> list[_Waiter]:
        """Withdraw a waiter (timed out, cancelled); returns the waiters admitted because the
        head of the queue changed."""
        with contextlib.suppress(ValueError):  # already admitted
            self.queue.remove(waiter)
        return self._drain()

    def release(self, cost: int, now: float | None) -> list[_Waiter]:
        """A generation admitted with ``cost`` ended at ``now`` (``None``: it never ran, so it
        does not count as a completion); returns the waiters admitted in its place."""
        self.inflight -= 1
        self.memory -= cost
        if now is not None:
            self._completions.append(now)
        return self._drain()

    def _drain(self) -> list[_Waiter]:
        admitted = []
        while self.queue and self._fits(self.queue[0].cost):
            waiter = self.queue.popleft()
            self.inflight += 1
            self.memory += waiter.cost
            admitted.append(waiter)
        return admitted

    def completion_rate(self, now: float) -> float | None:
        """Completions per second over the recent window, or ``None`` before there are two."""
        done = self._completions
        if len(done) < 2:
            return None
        span = max(now, done[-1]) - done[0]
        return (len(done) - 1) / span if span > 0 else None

    def retry_after(self, now: float, fallback: float) -> int:
        """Seconds until a shed request could expect a place: the waiters ahead of it divided by
        the observed completion rate; ``fallback`` while no rate is known yet."""
        rate = self.completion_rate(now)
        est = (len(self.queue) + 1) / rate if rate else fallback
        return max(RETRY_AFTER_MIN, min(RETRY_AFTER_MAX, math.ceil(est)))


class Admission:
    """:class:`AdmissionCore` on the event loop: :meth:`acquire` waits its turn (bounded) and
    returns a :class:`Ticket`, or raises :class:`Shed`."""

    def __init__(
        self,
        *,
        max_inflight: int | None,
        max_memory_tokens: int | None,
        queue_size: int,
        queue_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = AdmissionCore(max_inflight, max_memory_tokens, queue_size)
        self.queue_timeout = queue_timeout
        self._clock = clock

    @property
    def queued(self) -> int:
        """Requests waiting for admission."""
        return len(self.core.queue)

    @property
    def inflight(self) -> int:
        """Generations admitted and not yet released."""
        return self.core.inflight

    @property
    def memory(self) -> int:
        """Estimated engine memory held by admitted generations, in tokens."""
        return self.core.memory

    def retry_after(self) -> int:
        """Retry-After (seconds) for a request shed now."""
        return self.core.retry_after(self._clock(), fallback=max(1.0, self.queue_timeout))

    async def acquire(self, cost: int) -> Ticket:
        """Wait for a place for a generation of ``cost`` tokens."""
        core = self.core
        if not core.can_ever_fit(cost):
            raise ValueError(
                f"request needs about {cost} tokens of engine memory, more than the "
                f"{core.max_memory_tokens} the gateway admits at once; lower max_tokens"
            )
        if core.try_admit(cost):
            return Ticket(cost)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = core.enqueue(cost, fut)
        if waiter is None:
            raise Shed("admission queue is full", self.retry_after())
        try:
            async with asyncio.timeout(self.queue_timeout):
                await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return Ticket(cost)  # admitted in the same instant the wait ran out
            self._wake(core.remove(waiter))
            raise Shed(f"no place within {self.queue_timeout:g} s", self.retry_after()) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(Ticket(cost))
            else:
                self._wake(core.remove(waiter))
            raise
        return Ticket(cost)

    def release(self, ticket: Ticket) -> None:
        """Give a place back (idempotent per ticket)."""
        if ticket.released:
            return
        ticket.released = True
        self._wake(self.core.release(ticket.cost, self._clock()))

    def _wake(self, admitted: list[_Waiter]) -> None:
        i = 0
        while i < len(admitted):
            waiter = admitted[i]
            i += 1
            if waiter.token.done():
                # Its task was cancelled in the same instant: hand the place straight on.
                admitted.extend(self.core.release(waiter.cost, None))
            else:
                waiter.token.set_result(None)
