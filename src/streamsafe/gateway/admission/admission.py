"""Admission: a generation enters the engine only if it fits, in a fair order across tenants.

The decisions are pure: :mod:`~streamsafe.gateway.admission.fair_queue` (:class:`AdmissionCore`: the
two limits, the bounded queue and its fair order across tenants) and
:mod:`~streamsafe.gateway.serving.wait_plan` (:func:`plan_wait`: what a queued subscriber does
before its response is committed). This module is their shell on the event loop: :class:`Admission`
wraps the core with a future per waiter, and a request the queue cannot take is shed with 429 and a
``Retry-After`` from the predicted wait (:func:`retry_after_seconds`). :func:`request_cost` is
the engine memory a request may take.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from streamsafe.gateway.admission.fair_queue import ADMITTED, QUEUED, SHED, AdmissionCore, Waiter
from streamsafe.gateway.admission.shed_log import ShedLog
from streamsafe.request_cost import MAX_REQUEST_COST, read_cost

__all__ = ["MAX_REQUEST_COST", "Admission", "Shed", "request_cost", "retry_after_seconds"]

#: Bounds of Retry-After: at least 1 s (clients treat 0 as "now"), at most 60 s (Stainless
#: clients ignore anything longer and fall back to their own backoff).
RETRY_AFTER_MIN = 1
RETRY_AFTER_MAX = 60


def request_cost(body: Mapping[str, Any], default_max_tokens: int, *, chat: bool = True) -> int:
    """Engine memory an OpenAI chat (``chat``) or completions request may take, in tokens, read
    as vLLM reads it (:func:`streamsafe.request_cost.read_cost`): every prompt plus the
    completion limit (``default_max_tokens`` where a chat gives none), times ``n``; at most
    :data:`MAX_REQUEST_COST`. Raises :class:`~streamsafe.request_cost.InvalidField` where the
    engine would answer 400."""
    return read_cost(body, chat=chat).tokens(default_max_tokens)


def retry_after_seconds(wait: float | None, fallback: float) -> int:
    """``Retry-After`` for a predicted ``wait`` (``fallback`` when none is known), whole seconds
    within [1, 60]."""
    est = fallback if wait is None else wait
    return max(RETRY_AFTER_MIN, min(RETRY_AFTER_MAX, math.ceil(est)))


class Shed(Exception):
    """The request was not admitted; answer 429 with ``Retry-After: retry_after``."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class Admission:
    """:class:`AdmissionCore` on the event loop: :meth:`request` takes a place in the queue,
    :meth:`wait` waits for it (bounded by ``queue_timeout`` until committed) and raises
    :class:`Shed` where it is refused."""

    def __init__(
        self,
        *,
        max_inflight: int | None,
        max_memory_tokens: int | None,
        queue_size: int,
        queue_timeout: float,
        weights: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = AdmissionCore(max_inflight, max_memory_tokens, queue_size, weights)
        self.queue_timeout = queue_timeout
        self._clock = clock
        #: Episodes of refusals, logged as they begin and end.
        self.shedding = ShedLog("gateway")

    @property
    def queued(self) -> int:
        """Requests waiting for admission (dormant ones included)."""
        return self.core.queued

    @property
    def inflight(self) -> int:
        """Generations admitted and not yet released."""
        return self.core.inflight

    @property
    def memory(self) -> int:
        """Estimated engine memory held by admitted generations, in tokens."""
        return self.core.memory

    def retry_after(self, waiter: Waiter | None = None, tenant: str = "") -> int:
        """Retry-After (seconds) for a request shed now."""
        wait = self.core.predicted_wait(waiter, tenant)
        return retry_after_seconds(wait, max(1.0, self.queue_timeout))

    def predicted_wait(self, waiter: Waiter) -> float | None:
        """Seconds until ``waiter`` is expected to be admitted (see the core)."""
        return self.core.predicted_wait(waiter)

    def request(self, tenant: str, cost: int) -> Waiter:
        """Take a place for a generation of ``cost`` tokens: admitted at once or queued.
        Raises :class:`Shed` where the queue is full for this tenant, ``ValueError`` where the
        request can never fit."""
        core = self.core
        if not core.can_ever_fit(cost):
            raise ValueError(
                f"request needs about {cost} tokens of engine memory, more than the "
                f"{core.max_memory_tokens} the gateway admits at once; lower max_tokens or "
                "send fewer or shorter prompts"
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter, changed = core.request(tenant, cost, fut, self._clock())
        self._wake(changed)
        if waiter.state == SHED:
            self.shedding.note("the admission queue is full")
            raise Shed("admission queue is full", self.retry_after(tenant=tenant))
        if waiter.state == ADMITTED:
            fut.set_result(None)
        return waiter

    async def wait(self, waiter: Waiter) -> None:
        """Wait until ``waiter`` is admitted. Until it is committed the wait is bounded by
        ``queue_timeout`` from its request; past that, :class:`Shed`."""
        fut: asyncio.Future[None] = waiter.token
        try:
            while not fut.done():
                if waiter.committed:
                    await asyncio.shield(fut)
                    break
                left = waiter.since + self.queue_timeout - self._clock()
                if left <= 0:
                    self.shed(waiter)
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await asyncio.shield(fut)
        except asyncio.CancelledError:
            self.cancel(waiter)
            raise
        fut.result()  # raises Shed where the queue shed it

    def shed(self, waiter: Waiter, retry_after: int | None = None) -> None:
        """Refuse a queued, uncommitted waiter now: its :meth:`wait` raises :class:`Shed`."""
        if waiter.state != QUEUED or waiter.committed:
            return
        if retry_after is None:
            retry_after = self.retry_after(waiter)
        waited = self._clock() - waiter.since
        self._wake(self.core.withdraw(waiter, self._clock()))
        waiter.state = SHED
        self.shedding.note(f"no place within {waited:.3g} s")
        if not waiter.token.done():
            waiter.token.set_exception(Shed(f"no place within {waited:.3g} s", retry_after))

    def cancel(self, waiter: Waiter) -> None:
        """The generation is gone before or while holding a place: free it."""
        if waiter.state == QUEUED:
            self._wake(self.core.withdraw(waiter, self._clock()))
        else:
            self.release(waiter, ran=False)
        fut = waiter.token
        if not fut.done():
            fut.cancel()

    def set_active(self, waiter: Waiter, active: bool, *, expected: bool = False) -> None:
        """Nobody (``False``) or somebody again (``True``) waits for ``waiter``."""
        self._wake(self.core.set_active(waiter, active, self._clock(), expected=expected))

    def commit(self, waiter: Waiter) -> None:
        """A response went out for ``waiter``: it is never shed after this."""
        self.core.commit(waiter)

    def release(self, waiter: Waiter, *, ran: bool = True) -> None:
        """Give a place back (no effect unless admitted; so idempotent)."""
        self._wake(self.core.release(waiter, self._clock(), ran=ran))

    def _wake(self, changed: list[Waiter]) -> None:
        i = 0
        while i < len(changed):
            waiter = changed[i]
            i += 1
            fut = waiter.token
            if waiter.state == SHED:
                self.shedding.note("the admission queue is full")
                if not fut.done():
                    fut.set_exception(Shed("admission queue is full", self.retry_after()))
            elif fut.done():
                # Its task was cancelled in the same instant: hand the place straight on.
                changed.extend(self.core.release(waiter, self._clock(), ran=False))
            else:
                fut.set_result(None)
