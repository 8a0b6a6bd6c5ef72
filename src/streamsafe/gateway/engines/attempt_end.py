"""What the facts told of one attempt mean for its engine and its generation's plan, decided in
one pure table (see docs/design.md, Failover): facts in (:class:`Fact`), actions out
(:class:`Actions`), with what was told of the attempt so far (:class:`Told`) as the state.

The facts come from where they are seen (the ask sees a status, the stream reader a reset, the
sink an error event, the relay a cut), so one end can be seen twice: a 503 is the ask's status
and the relay's answer; a stream that failed is cut next. The table makes each count once:

- the breaker hears an attempt fail once (a failure, a connect given up, a cut), and never
  after the engine shed it (full is not failing, nor is a 4xx, the caller's); an engine that
  says it died is always told (it is held down until its ``/health`` answers);
- a shed is told to the engine (its load, its refusal gate) once;
- the engine's refusal gate hears the attempt admitted once (its first token, or a plain
  call's 200);
- the plan's latest ask ends with the last fact that says how (a stream served, then cut,
  failed), except that a cut keeps an end already told (a shed or a failure stays one).

:class:`~streamsafe.gateway.engines.attempt_outcomes.AttemptOutcomes` carries the actions out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from streamsafe.gateway.engines.attempt_plan import Outcome

__all__ = ["Actions", "Fact", "Told", "tell"]


class Fact(enum.Enum):
    """What was seen of the current attempt."""

    ADMITTED = "admitted"
    """The engine took it (a plain call's 200: a refusal would have been its status)."""
    SERVED = "served"
    """Its first token came (the engine works), or its answer ended whole."""
    FAILED = "failed"
    """It failed on the engine's side: a 5xx, a reset, a stall, an error event for a 5xx."""
    DIED = "died"
    """The engine said it died (its engine core is gone)."""
    SHED = "shed"
    """The engine shed it (429 or 503, as a status or in-band): full, not failing."""
    ANSWERED = "answered"
    """It ended with a 4xx: the caller's answer, no verdict on the engine."""
    NOT_CONNECTED = "not-connected"
    """No connection was made (the engine never saw it); a connect retry may follow."""
    GAVE_UP = "gave-up"
    """No connection could be made, and no more connects follow."""
    CUT = "cut"
    """The stream broke and another attempt follows (a continuation)."""


@dataclass(frozen=True, slots=True)
class Told:
    """What the current attempt's engine was told of it so far (nothing, as it begins)."""

    failure: bool = False
    """Its breaker heard the attempt fail, or the engine shed it (either way, not again)."""
    shed: bool = False
    """The engine's load and refusal gate heard it shed."""
    admitted: bool = False
    """The engine's refusal gate heard it admitted."""


@dataclass(frozen=True, slots=True)
class Actions:
    """What one fact asks for: the new :class:`Told`, and what to tell whom."""

    told: Told
    outcome: Outcome | None = None
    """The plan's latest ask now ends so (``None``: as it was)."""
    succeeded: bool = False
    """The engine's breaker closes (it delivered)."""
    failure: bool = False
    """The engine's breaker hears a failure."""
    dead: bool = False
    """... and the engine is held down until its ``/health`` answers."""
    shed: bool = False
    """The engine said full: its load (new work elsewhere for its ``Retry-After``) and its
    refusal gate (the generation waits there) hear it."""
    neutral: bool = False
    """The engine's breaker hears the attempt ended with no verdict on the engine (a 4xx is
    the caller's; full is not failing)."""
    admit: bool = False
    """The engine's refusal gate hears the attempt admitted (a generation waiting to be refused
    no longer waits)."""


def tell(told: Told, fact: Fact, last: Outcome | None) -> Actions:
    """What ``fact`` means for an attempt its engine was ``told`` of so far, whose plan's
    latest ask ended ``last`` (``None``: not yet) (see the module)."""
    if fact is Fact.SERVED:
        admitted = Told(told.failure, told.shed, admitted=True)
        return Actions(admitted, Outcome.SERVED, succeeded=True, admit=not told.admitted)
    if fact is Fact.ADMITTED:
        return Actions(Told(told.failure, told.shed, admitted=True), admit=not told.admitted)
    if fact is Fact.SHED:
        if told.shed:
            return Actions(told)
        return Actions(Told(True, True, told.admitted), Outcome.REFUSED, shed=True, neutral=True)
    if fact is Fact.ANSWERED:
        return Actions(told, Outcome.ANSWERED, neutral=True)
    if fact is Fact.NOT_CONNECTED:  # counted by the connects; the breaker hears the give-up
        return Actions(told, Outcome.NOT_CONNECTED)
    failed = Told(True, told.shed, told.admitted)
    if fact is Fact.DIED:
        return Actions(failed, Outcome.FAILED, failure=True, dead=True)
    if fact is Fact.FAILED:
        return Actions(failed, Outcome.FAILED, failure=not told.failure)
    if fact is Fact.GAVE_UP:  # the plan noted each connect that was not made
        return Actions(failed, failure=not told.failure)
    # Fact.CUT: an end already told (a shed, a failure) stays the ask's.
    outcome = Outcome.FAILED if last is None or last is Outcome.SERVED else None
    return Actions(failed, outcome, failure=not told.failure)
