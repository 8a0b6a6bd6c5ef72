"""What nobody reads is stopped: a live generation's grace period after its last subscriber
left, and the abort of its upstream request once the grace is over (see docs/design.md,
Abandonment and grace).

A subscriber told to come back later (a step-back 429) holds the generation that much longer.
A mirror (another replica runs it) is only forgotten here after the grace; its owner decides
about the upstream request, and does not abort one whose subscribers moved to another replica.
"""

from __future__ import annotations

import asyncio
import logging

from streamsafe.gateway.admission.admission import Admission
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.ended_generations import EndedGenerations
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.owner import Owner
from streamsafe.gateway.metrics.counters import Counters

__all__ = ["Abandonment"]

log = logging.getLogger("streamsafe.gateway")


class Abandonment:
    """The grace periods of one registry's generations. An abort ends a generation through
    its ``owner``; a mirror nobody reads is forgotten by ``keeping``, which runs that
    bookkeeping in the background."""

    def __init__(
        self,
        config: GatewayConfig,
        admission: Admission,
        counters: Counters,
        owner: Owner,
        keeping: EndedGenerations,
    ) -> None:
        self._config = config
        self._admission = admission
        self._counters = counters
        self._owner = owner
        self._keeping = keeping

    def left(self, gen: Generation, hold: float = 0.0) -> None:
        """The last subscriber left live ``gen``: a queued one keeps its place but is passed
        over (docs/design.md, Admission); the grace period starts, ``hold`` seconds later where
        the subscriber was told to come back then."""
        if gen.waiter is not None:
            # Told to come back (hold): it may run ahead of an idle engine; else it waits.
            self._admission.set_active(gen.waiter, False, expected=hold > 0)
        self.grace(gen, hold)

    def grace(self, gen: Generation, hold: float = 0.0) -> None:
        """``gen`` has no subscriber here: start its grace period, ``hold`` seconds later where
        the subscriber was told to come back then (for a mirror: forget the copy after it)."""
        role = gen.role
        loop = asyncio.get_running_loop()
        forget_after = role.forget_unread
        if forget_after is not None:
            role.subscribers_changed(gen)
            gen.timer = loop.call_later(
                max(self._config.grace + hold, forget_after),
                lambda: self._keeping.spawn(self._keeping.forget(gen)),
            )
            return
        grace = self._config.grace + hold
        if grace <= 0:
            self._over(gen)
        else:
            gen.timer = loop.call_later(grace, self._over, gen)

    def _over(self, gen: Generation) -> None:
        gen.timer = None
        if gen.subscribers > 0 or gen.finished:
            return
        if gen.role.read_by_fleet:  # subscribers on another replica may read it
            self._keeping.spawn(self._abort_unless_followed(gen))
            return
        self._abort(gen)

    async def _abort_unless_followed(self, gen: Generation) -> None:
        """Abort ``gen`` unless subscribers on another replica read it; then ask again after
        another grace period."""
        again = await gen.role.read_elsewhere(gen)
        if again is not None:
            if gen.subscribers == 0 and not gen.finished and gen.timer is None:
                gen.timer = asyncio.get_running_loop().call_later(
                    max(self._config.grace, again), self._over, gen
                )
            return
        self._abort(gen)

    def _abort(self, gen: Generation) -> None:
        if gen.subscribers > 0 or gen.finished:
            return
        log.info("%s: no subscriber left after the grace period; aborting upstream", gen.id)
        self._counters.generations_aborted += 1
        self._owner.end(gen, State.ABORTED)
        if gen.task is not None:
            gen.task.cancel()  # closes the upstream response: the engine aborts the request
