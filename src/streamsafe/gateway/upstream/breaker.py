"""The breakers: where an engine is known down, new work fails fast instead of piling onto it.

- :class:`Breaker`: the one upstream of a gateway without a pool. Open while the engine is known
  dead; :class:`~streamsafe.gateway.upstream.connection.Upstream` opens it and probes ``/health``
  until it answers.
- :class:`EngineBreaker`: one per engine of a pool, sans-I/O (times are clock readings passed
  in). Closed; open after consecutive failures or at once when the engine reports itself dead;
  half-open after a cool-down, letting one probe attempt through; the probe's success closes it
  (traffic returns to a recovered engine), its failure reopens it with a doubled cool-down.
- :class:`PoolBreaker`: the relay's fail-fast check over a pool, open only while no engine takes
  traffic.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Sequence

__all__ = ["Breaker", "BreakerState", "EngineBreaker", "PoolBreaker"]


class Breaker:
    """Open while the engine is known dead; ``probe_interval`` is the seconds between
    ``/health`` probes while open."""

    def __init__(self, probe_interval: float) -> None:
        self.probe_interval = probe_interval
        self.is_open = False
        self.trips = 0

    def trip(self) -> bool:
        """Open the breaker; True if it was closed."""
        if self.is_open:
            return False
        self.is_open = True
        self.trips += 1
        return True

    def close(self) -> None:
        """The engine answered healthy again."""
        self.is_open = False

    def retry_after(self) -> int:
        """Seconds a client should wait: the next probe, rounded up, at least 1."""
        return max(1, math.ceil(self.probe_interval))


class BreakerState(enum.Enum):
    """Where an engine's breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclasses.dataclass(slots=True)
class EngineBreaker:
    """A per-engine breaker with half-open probes (see the module). Times are clock readings
    passed in by the caller."""

    #: Consecutive failed attempts that open it (default 3: one unlucky reset is not an outage).
    failure_threshold: int = 3
    #: Seconds it stays open before the first probe (default 1, doubled after each failed
    #: probe up to ``max_cooldown``).
    cooldown: float = 1.0
    #: Longest cool-down (default 30 s: a recovered engine is back within half a minute).
    max_cooldown: float = 30.0
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    open_until: float = 0.0
    trips: int = 0
    probing: bool = False
    _current_cooldown: float = 0.0

    def allows(self, now: float) -> bool:
        """True if an attempt may go to this engine now (a half-open breaker admits one probe
        at a time)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if now < self.open_until:
                return False
            self.state = BreakerState.HALF_OPEN
            self.probing = False
        return not self.probing

    def on_attempt(self, now: float) -> None:
        """An attempt was sent; in half-open it is the probe."""
        if self.allows(now) and self.state is BreakerState.HALF_OPEN:
            self.probing = True

    def on_abandon(self) -> None:
        """An attempt ended with no verdict on the engine (its caller left): a half-open
        breaker may send the next probe."""
        self.probing = False

    def on_success(self) -> None:
        """An attempt got its first token (or a complete answer): the engine works."""
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.probing = False
        self._current_cooldown = 0.0

    def on_failure(self, now: float, *, dead: bool = False) -> None:
        """An attempt failed on the engine's side; ``dead`` when the engine said it died."""
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self._open(now, min(self.max_cooldown, max(self.cooldown, self._current_cooldown * 2)))
        elif self.state is BreakerState.CLOSED and (
            dead or self.failures >= self.failure_threshold
        ):
            self._open(now, self.cooldown)

    def _open(self, now: float, cooldown: float) -> None:
        self.state = BreakerState.OPEN
        self.open_until = now + cooldown
        self._current_cooldown = cooldown
        self.probing = False
        self.trips += 1

    def retry_after(self, now: float) -> float:
        """Seconds until this engine takes traffic again (0 if it does now)."""
        if self.state is BreakerState.OPEN:
            return max(0.0, self.open_until - now)
        return 0.0


class PoolBreaker:
    """The relay's fail-fast check over a pool's engine ``breakers``: "open" only while no
    engine takes traffic."""

    def __init__(self, breakers: Sequence[EngineBreaker], clock: Callable[[], float]) -> None:
        self._breakers = breakers
        self._clock = clock

    @property
    def is_open(self) -> bool:
        """True while every engine's breaker is open."""
        now = self._clock()
        return all(b.retry_after(now) > 0 for b in self._breakers)

    @property
    def trips(self) -> int:
        """Times any engine's breaker opened."""
        return sum(b.trips for b in self._breakers)

    def retry_after(self) -> int:
        """Seconds until the first engine takes traffic again, rounded up, at least 1."""
        now = self._clock()
        wait = min(b.retry_after(now) for b in self._breakers)
        return max(1, int(wait + 0.999))
