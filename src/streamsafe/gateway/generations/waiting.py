"""Waiting for a generation's next change, for at most a while: the waits before a stream's
events flow (its commit, its heartbeats) have a limit; a timer resolves the waiter, which costs
less than ``asyncio.timeout``'s cancellation."""

from __future__ import annotations

import asyncio

from streamsafe.gateway.generations.generation import Generation

__all__ = ["wait_for_change"]


async def wait_for_change(gen: Generation, limit: float | None) -> None:
    """Wait until ``gen`` changes, or at most ``limit`` seconds (``None``: no limit). Only the
    waits before events flow have a limit (commit, heartbeats), so this is off the per-chunk
    path."""
    waiter = gen.next_change()
    if limit is None:
        await waiter
        return
    # A timer that resolves the waiter costs less than asyncio.timeout's cancellation. Whether
    # it fired is recorded by the timer itself: neither the clock (uvloop's timers run on
    # millisecond ticks) nor the handle (uvloop answers a due deadline with a plain Handle,
    # which has no when()) can tell.
    expired = _Expiry(waiter)
    timer = asyncio.get_running_loop().call_later(max(0.0, limit), expired)
    await waiter
    timer.cancel()
    if expired.fired:  # woken by the timer: still on the waiting list
        gen.forget_waiter(waiter)


class _Expiry:
    """The timer's callback: resolve the waiter, remember that it did."""

    __slots__ = ("fired", "waiter")

    def __init__(self, waiter: asyncio.Future[None]) -> None:
        self.waiter = waiter
        self.fired = False

    def __call__(self) -> None:
        self.fired = True
        if not self.waiter.done():
            self.waiter.set_result(None)
