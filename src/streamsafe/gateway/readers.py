"""The task that reads each generation this process holds: upstream, for one it runs (the
relay), or its owner's log, for one another replica runs and this one mirrors (a follower); and
the moves between the two when a lease changes hands (see docs/design.md, Replicas).

A follower says how it ended instead of calling back: the mirror ended (moved to its owner's
end), or this replica took it over from a dead owner, and it is run here from its log. A
reader that loses its lease follows the new owner. Both kinds are started here, so the calls go
one way: the registry and the finding of generations call in; nothing here calls them back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from streamsafe.gateway.abandonment import Abandonment
from streamsafe.gateway.ended_generations import EndedGenerations
from streamsafe.gateway.generations.fleet import Reach
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.generation_index import GenerationIndex
from streamsafe.gateway.generations.logged_end import logged_end
from streamsafe.gateway.generations.roles import Followed
from streamsafe.gateway.generations.running import Running
from streamsafe.gateway.generations.store import LeaseLost
from streamsafe.gateway.relay.relay import Relay

__all__ = ["Readers"]

log = logging.getLogger("streamsafe.gateway")


class Readers:
    """Starts and passes between the reader tasks of one registry's ``generations``: a
    ``relay`` run for each one it runs (its end told to ``running``), a follower for each one
    it mirrors, as its role gives it (:mod:`~streamsafe.gateway.generations.roles`; its end
    handed to ``keeping``); one taken over waits out its grace period in ``abandonment`` where
    nobody reads it yet. ``clock`` stamps a mirror's creation (the registry's)."""

    def __init__(
        self,
        generations: GenerationIndex,
        relay: Relay,
        running: Running,
        abandonment: Abandonment,
        keeping: EndedGenerations,
        clock: Callable[[], float],
    ) -> None:
        self._generations = generations
        self._relay = relay
        self._running = running
        self._abandonment = abandonment
        self._keeping = keeping
        self._clock = clock

    def run(self, gen: Generation, cut: str | None = None) -> None:
        """Start ``gen``'s reader task (``cut``: why one taken over from another replica is run
        again, from its log)."""
        gen.task = asyncio.get_running_loop().create_task(self._run(gen, cut), name=gen.id)

    async def _run(self, gen: Generation, cut: str | None) -> None:
        """The reader task of a generation this replica runs."""
        try:
            if cut is not None and await self._ended_in_log(gen):
                return
            await self._relay.run(gen, cut)
        except LeaseLost:
            # Another replica took it over (this one paused past its lease): follow it.
            log.warning("%s: lease lost while running; following the new owner", gen.id)
            gen.lease_lost()
            self._running.moved(gen)
            self._follow(gen, gen.role.follow(gen))
        finally:
            # The task is ending: let go of it. The exception it may end with (a cancellation,
            # once abandoned) holds these frames and so this generation; with the generation
            # holding the task, all of it would wait for the garbage collector.
            if gen.task is asyncio.current_task():
                gen.task = None

    async def _ended_in_log(self, gen: Generation) -> bool:
        """End ``gen``, taken over from a dead owner, where its log already holds its whole
        answer (see :mod:`~streamsafe.gateway.generations.logged_end`): the owner died after the
        end went out, before its record said so. True where it was ended."""
        ended = logged_end(gen, await gen.log.read(max(0, gen.length - 2)))
        if ended is None:
            return False
        log.info(
            "%s: taken over with its answer whole in the log; ended %s, not run again",
            gen.id,
            ended.state.value,
            extra={"fields": {"event": "takeover_whole", "generation": gen.id}},
        )
        if ended.owed:
            gen.appended(await gen.log.append(ended.owed))
        self._running.end(gen, ended.state)
        return True

    # -- other replicas' generations ------------------------------------------------------------

    async def mirror(
        self, reach: Reach, gen_id: str, key: str | None, wait: float
    ) -> Generation | None:
        """A copy here of the generation ``gen_id`` another replica runs (or ran), followed
        until it ends; ``None`` where ``reach`` finds none (its record waited for ``wait``
        seconds)."""
        gen = await reach.find(gen_id, key, self._clock(), wait)
        if gen is None:
            return None
        current = self._generations.get(gen_id)
        if current is not None:  # mirrored meanwhile by a concurrent request
            return current
        self._generations.add(gen)
        if gen.finished:
            self._keeping.mirror_ended(gen)
        else:
            self._follow(gen, gen.role.follow(gen))
        return gen

    def _follow(self, gen: Generation, follower: Awaitable[Followed]) -> None:
        """Run ``gen``'s follower as a task (the fleet holds it, and cancels it when ``gen`` is
        forgotten or the fleet closes); what it ends with is acted on here."""
        asyncio.get_running_loop().create_task(
            self._followed(gen, follower), name=f"follow-{gen.id}"
        )

    async def _followed(self, gen: Generation, follower: Awaitable[Followed]) -> None:
        followed = await follower
        if followed is Followed.TAKEN_OVER:
            self._take_over(gen)
        elif followed is Followed.ENDED:
            self._keeping.mirror_ended(gen)
        # Unfollowed: forgotten here before it began; nothing is left to do.

    def _take_over(self, gen: Generation) -> None:
        """This replica took over ``gen`` from a dead owner: run it from its log."""
        self._running.started(gen)
        if gen.subscribers == 0 and gen.timer is None:
            self._abandonment.grace(gen)
        self.run(gen, "the replica that ran it is gone")
