"""An engine's breaker: where an engine is known down, new work fails fast instead of piling onto
it (see docs/design.md, Engine pool).

One per engine, a single upstream included (a pool of one). Sans-I/O: every time is a clock
reading passed in. Two things open it:

- **attempts**: consecutive failures (:attr:`EngineBreaker.failure_threshold`), or one where the
  engine said it died. It stays open for a cool-down, then half-opens: one probe attempt goes
  through; its success closes the breaker, its failure reopens it with a doubled cool-down (up to
  :attr:`EngineBreaker.max_cooldown`), so a flapping engine is tried less and less often.
- **the health probe** (:meth:`EngineBreaker.hold`): ``/health`` answered 5xx, or nothing, when
  the gateway asked (after a failure, when a stream went quiet, or for ``/ready``). The breaker is
  then held open, whatever the cool-down, until ``/health`` answers again
  (:meth:`EngineBreaker.let_go`): a frozen or dead engine takes no attempt, and no continuation.
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["BreakerState", "EngineBreaker"]


class BreakerState(enum.Enum):
    """Where an engine's breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclasses.dataclass(slots=True)
class EngineBreaker:
    """A per-engine breaker with half-open probes and a health hold (see the module)."""

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
    #: Held open by the health probe until ``/health`` answers (see :meth:`hold`).
    held: bool = False
    #: Whether failures alone prove the engine down: its health route does not cover it (Llama
    #: Stack masks an engine's death as an ordinary 500), so an open breaker is all anyone
    #: knows. Where it does cover it, an engine only cooling down after failures still takes
    #: traffic where no other engine can (see :meth:`down`).
    failures_prove_down: bool = False
    _current_cooldown: float = 0.0

    def allows(self, now: float) -> bool:
        """True if an attempt may go to this engine now (a half-open breaker admits one probe
        at a time; a held one none)."""
        if self.held:
            return False
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if now < self.open_until:
                return False
            self.state = BreakerState.HALF_OPEN
            self.probing = False
        return not self.probing

    def takes_traffic(self, now: float) -> bool:
        """:meth:`allows` without moving the breaker (a question, not an attempt)."""
        if self.held:
            return False
        if self.state is BreakerState.OPEN:
            return now >= self.open_until
        return not (self.state is BreakerState.HALF_OPEN and self.probing)

    def down(self, now: float) -> bool:
        """Whether the engine is known down: held by the health probe, or open after failures
        where failures are all anyone knows (:attr:`failures_prove_down`). An engine merely
        cooling down otherwise takes traffic where no other engine can ("panic", as Envoy
        calls it: turning every caller away for the breaker's sake would help no one)."""
        return self.held or (self.failures_prove_down and not self.takes_traffic(now))

    def on_attempt(self, now: float) -> None:
        """An attempt was sent; in half-open it is the probe."""
        if self.allows(now) and self.state is BreakerState.HALF_OPEN:
            self.probing = True

    def on_abandon(self) -> None:
        """An attempt ended with no verdict on the engine (its caller left, or it answered a
        4xx): a half-open breaker may send the next probe."""
        self.probing = False

    def on_success(self) -> bool:
        """An attempt got its first token (or a complete answer): the engine works. True if
        this closed the breaker."""
        was_closed = self.state is BreakerState.CLOSED and not self.held
        self.held = False  # an answer is a surer sign of life than a health probe
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.probing = False
        self._current_cooldown = 0.0
        return not was_closed

    def on_failure(self, now: float, *, dead: bool = False) -> bool:
        """An attempt failed on the engine's side; ``dead`` when the engine said it died (held
        down until :meth:`let_go`, with a cool-down's ``Retry-After``). True if this opened the
        breaker."""
        self.failures += 1
        if dead:
            return self.hold(now, self.cooldown)
        if self.state is BreakerState.HALF_OPEN:
            self._open(now, min(self.max_cooldown, max(self.cooldown, self._current_cooldown * 2)))
            return True
        if self.state is BreakerState.CLOSED and (dead or self.failures >= self.failure_threshold):
            self._open(now, self.cooldown)
            return True
        return False

    def hold(self, now: float, retry_after: float) -> bool:
        """The health probe found the engine down: open until :meth:`let_go`, telling callers
        to come back in ``retry_after`` seconds (the probe's interval). True if it was not
        already held."""
        was_held = self.held
        if not was_held:
            if self.state is not BreakerState.OPEN:
                self.trips += 1
            self.state = BreakerState.OPEN
            self.probing = False
        self.held = True
        self.open_until = now + retry_after
        return not was_held

    def let_go(self, *, close: bool) -> None:
        """``/health`` answers again: closed where it covers the engine (``close``), else
        half-open, so one attempt finds out whether the engine behind works."""
        self.held = False
        if close:
            self.on_success()
        else:
            self.state = BreakerState.HALF_OPEN
            self.probing = False

    def _open(self, now: float, cooldown: float) -> None:
        self.state = BreakerState.OPEN
        self.open_until = now + cooldown
        self._current_cooldown = cooldown
        self.probing = False
        self.trips += 1

    def retry_after(self, now: float) -> float:
        """Seconds until this engine takes traffic again (0 if it does now); for a held breaker,
        until the next health probe."""
        if self.state is BreakerState.OPEN:
            return max(0.0, self.open_until - now)
        return 0.0
