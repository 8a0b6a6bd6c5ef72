"""The generations this process runs, while they are live: counted, their request bodies held
within their budget, and ended in one place (see docs/design.md, Coalescing).

The registry starts them here (or hands over one taken over from a dead replica); the relay
and the grace periods end them here, through the narrow
:class:`~streamsafe.gateway.generations.owner.Owner` they were given at construction. An end
moves the generation (:meth:`Generation.end <streamsafe.gateway.generations.generation.
Generation.end>`), wakes its subscribers, counts it, ends its trace, and hands it to
:class:`~streamsafe.gateway.ended_generations.EndedGenerations`, which keeps it for replay or
forgets it. Nothing here calls the relay, the registry or the grace periods back: the calls go
one way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from streamsafe.gateway.admission.body_budget import BodyBudget
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.errors import Failure
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.refusals import EngineRefusals
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.tracing import Tracing

__all__ = ["Keeper", "Running"]


class Keeper(Protocol):
    """What becomes of a generation once it ended (the registry's
    :class:`~streamsafe.gateway.ended_generations.EndedGenerations`)."""

    def ended(self, gen: Generation, state: State) -> None:
        """``gen`` ended in ``state`` (its subscribers were woken): tell the fleet, then keep it
        for replay or forget it."""


class Running:
    """The live generations of one registry (an
    :class:`~streamsafe.gateway.generations.owner.Owner`): ``count`` of them, their request
    bodies within ``config.max_live_body_bytes``; each one's end counted in ``counters`` and
    handed to ``keeping``; a refusal that is its callers' answer noted in ``refusals``.
    ``clock`` stamps the end (the registry's)."""

    def __init__(
        self,
        config: GatewayConfig,
        counters: Counters,
        keeping: Keeper,
        refusals: EngineRefusals,
        clock: Callable[[], float],
    ) -> None:
        self._counters = counters
        self._keeping = keeping
        self._refusals = refusals
        self._clock = clock
        self._tracing = Tracing(config.tracing)
        #: Generations queued or running here.
        self.count = 0
        #: The request bodies they hold, bounded in all (max_live_body_bytes).
        self.bodies = BodyBudget(config.max_live_body_bytes)

    def started(self, gen: Generation) -> None:
        """``gen`` runs here now: started, or taken over from a dead replica."""
        self.count += 1
        self.bodies.hold(gen.id, gen.tenant, len(gen.request.body))

    def moved(self, gen: Generation) -> None:
        """``gen`` runs elsewhere now (another replica took its lease): no longer counted."""
        self.count -= 1
        self.bodies.drop(gen.id)

    def end(self, gen: Generation, state: State, failure: Failure | None = None) -> None:
        """``gen`` ended (told by the relay, or by an abort): move it, wake its subscribers,
        then keep it for replay or forget it (see
        :meth:`Owner.end <streamsafe.gateway.generations.owner.Owner.end>`)."""
        if gen.finished:
            return
        gen.end(state, failure)
        gen.finished_at = self._clock()
        self.count -= 1
        self.bodies.drop(gen.id)
        counters = self._counters
        if state is State.DONE:
            counters.generations_completed += 1
            self._refusals.served()
        elif state is State.FAILED:
            counters.generations_failed += 1
        gen.wake()
        if gen.trace is not None:
            facts = {
                "state": state.value,
                "attempts": gen.attempts,
                "continuations": gen.continuations,
                "engine": gen.engine,
                "events": gen.length,
            }
            self._tracing.end_generation(gen.trace, facts)
            gen.trace = None
        self._keeping.ended(gen, state)

    def refused(self, gen: Generation) -> None:
        """``gen`` ended with the engine's refusal, its callers' answer: their retries get it
        too while the engine refuses (see
        :class:`~streamsafe.gateway.generations.refusals.EngineRefusals`)."""
        if gen.failure is not None:
            self._refusals.note(gen.tenant, gen.fingerprint, gen.failure, self._clock())
