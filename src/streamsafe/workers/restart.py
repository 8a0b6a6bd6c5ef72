"""When a dead worker is replaced: pure, the clock passed in.

A worker that dies now and then is replaced at once: its clients resume on the others, and the
sooner it is back the sooner the load is spread again. One that keeps dying (a bad engine URL
that crashes it at start, memory it cannot get) would make the supervisor spin, starting a
Python process after another on the machine the others serve from: each death within
``window`` seconds of the one before doubles the wait, up to ``cap``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RestartBackoff"]


@dataclass(frozen=True)
class RestartBackoff:
    """How long to wait before replacing a dead worker, from the deaths seen so far."""

    #: Seconds before the second replacement within the window (the first is at once).
    first: float = 0.5
    #: The longest wait, seconds.
    cap: float = 30.0
    #: Seconds a death counts for.
    window: float = 60.0

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.cap) or self.window <= 0:
            raise ValueError("RestartBackoff wants 0 < first <= cap and window > 0")

    def recent(self, deaths: Sequence[float], now: float) -> int:
        """Deaths within the window before ``now``."""
        return sum(1 for t in deaths if 0 <= now - t < self.window)

    def delay(self, deaths: Sequence[float], now: float) -> float:
        """Seconds to wait, at ``now``, before starting the worker that replaces the last of
        ``deaths`` (the times workers died, the last one included)."""
        n = self.recent(deaths, now)
        if n <= 1:
            return 0.0
        # 2**(n - 2) grows past any cap long before it overflows a float: bound n first.
        return min(self.cap, self.first * 2.0 ** min(n - 2, 64))

    def forget(self, deaths: list[float], now: float) -> None:
        """Drop, in place, the deaths that no longer count (the list stays small)."""
        deaths[:] = [t for t in deaths if now - t < self.window]
