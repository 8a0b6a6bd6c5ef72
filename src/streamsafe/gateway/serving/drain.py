"""The drain at shutdown: what runs is let finish for a while, then the rest is ended (handed
over to another replica, or ended with an error event), and the readers get a moment to write
that end. The gateway stops taking new work before it starts (:meth:`Gateway.drain
<streamsafe.gateway.app.Gateway.drain>`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

__all__ = ["LiveWork", "let_finish"]

log = logging.getLogger("streamsafe.gateway")

#: Seconds the readers of the generations a drain ended get to write that end.
_LAST_WORDS_S = 2.0
#: How often a drain looks again: what it waits for ends in many places (generations, readers,
#: pass-through), and 50 ms is nothing next to the seconds a drain takes.
_POLL_S = 0.05


class LiveWork(Protocol):
    """What a drain watches and ends (:class:`~streamsafe.gateway.registry.Registry`)."""

    @property
    def live_generations(self) -> int:
        """Generations queued or running."""
        ...

    @property
    def subscribers(self) -> int:
        """Subscribers connected to any generation."""
        ...

    async def end_live(self, message: str) -> int:
        """End every generation this process runs; how many were."""
        ...


async def let_finish(
    work: LiveWork, busy: Callable[[], int], limit: float, *, hand_over: bool
) -> None:
    """Wait until nothing is ``busy``, for at most ``limit`` seconds; then end the generations
    still live in ``work`` (``hand_over``: another replica continues them) and give their
    readers a moment to write the end."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    log.warning(
        "draining: no new work; waiting up to %g s for %d generation(s) and %d reader(s)",
        limit,
        work.live_generations,
        work.subscribers,
        extra={"fields": {"event": "drain_begun"}},
    )
    while busy() and loop.time() - started < limit:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S)
    ended = 0
    timed_out = busy() > 0
    if work.live_generations:
        how = "handed over" if hand_over else "ended with an error event"
        ended = await work.end_live("the gateway is shutting down")
        log.log(
            logging.WARNING if timed_out else logging.INFO,
            "%s: %d generation(s) %s",
            "drain timeout" if timed_out else "nobody here reads the rest",
            ended,
            how,
            extra={
                "fields": {
                    "event": "drain_timeout" if timed_out else "drain_handover",
                    "ended": ended,
                }
            },
        )
        # Their readers get the end; give them a moment to write it.
        until = loop.time() + _LAST_WORDS_S
        while busy() and loop.time() < until:  # noqa: ASYNC110
            await asyncio.sleep(_POLL_S)
    log.info(
        "drained in %.1f s",
        loop.time() - started,
        extra={"fields": {"event": "drained", "ended": ended}},
    )
