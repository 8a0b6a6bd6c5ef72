"""When shedding begins and when it ends: two log lines an operator sees, not one per refusal
(INFO: shedding is the gateway working as meant under load, not a fault).

The gateway refuses work it cannot hold (admission's 429s, a queued caller told to come back)
and an engine may refuse work too (429/503 before any work). Each refusal is counted in
``/stats``; what an operator must notice at the default log level is the change: shedding
begun (with the first reason), and shedding ended once nothing was refused for
:data:`QUIET_S` seconds (with how many were refused meanwhile). One timer per episode, none per
request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

__all__ = ["QUIET_S", "ShedLog"]

log = logging.getLogger("streamsafe.gateway")

#: Seconds without a refusal after which shedding counts as ended.
QUIET_S = 10.0


class ShedLog:
    """Episodes of shedding by ``what`` (``"gateway"``, ``"engine"``), logged as they begin and
    end. ``clock`` and ``quiet`` are injectable for tests."""

    __slots__ = ("_clock", "_timer", "active", "count", "last", "quiet", "since", "what")

    def __init__(
        self, what: str, *, quiet: float = QUIET_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.what = what
        self.quiet = quiet
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        #: Shedding now.
        self.active = False
        #: Refusals in the current (or last) episode.
        self.count = 0
        self.since = 0.0
        self.last = 0.0

    def note(self, reason: str) -> None:
        """One more refusal, for ``reason``."""
        now = self._clock()
        self.last = now
        self.count += 1
        if self.active:
            return
        self.active = True
        self.since = now
        self.count = 1
        log.info(
            "%s shedding begun: %s",
            self.what,
            reason,
            extra={"fields": {"event": "shedding_begun", "by": self.what}},
        )
        self._schedule(self.quiet)

    def _check(self) -> None:
        self._timer = None
        left = self.last + self.quiet - self._clock()
        if left > 0:
            self._schedule(left)
            return
        self.active = False
        log.info(
            "%s shedding ended: %d refused in %.1f s",
            self.what,
            self.count,
            self.last - self.since,
            extra={"fields": {"event": "shedding_ended", "by": self.what, "refused": self.count}},
        )

    def _schedule(self, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # noted outside a loop (a test of the pure parts): no timer
            return
        self._timer = loop.call_later(delay, self._check)

    def close(self) -> None:
        """Stop the timer (shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
