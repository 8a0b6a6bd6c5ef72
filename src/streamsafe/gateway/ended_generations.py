"""What becomes of a generation once it ended: the fleet is told, then it is kept for replay and
resume within a time and memory bound, or forgotten: here, in the store and in Redis (see
docs/design.md, Replay and resume).

:class:`~streamsafe.gateway.generations.running.Running` ends a generation this process runs
(its state, its subscribers woken) and hands it here; a mirror (another replica ran it), ended
as its owner's record says, is handed here too, its copy kept a moment for a reconnect. The
store bookkeeping this starts runs in the background, owned here and awaited at shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.generations.fleet import Reach
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.generation_index import GenerationIndex
from streamsafe.gateway.generations.retention import Retention
from streamsafe.gateway.generations.roles import MIRROR_KEPT
from streamsafe.gateway.metrics.counters import Counters

__all__ = ["MIRROR_KEPT", "EndedGenerations"]


class EndedGenerations:
    """The finished generations of one registry: ``kept`` for replay, the rest forgotten from
    ``generations`` and from the fleet, as each one's role says
    (:mod:`~streamsafe.gateway.generations.roles`). Keys and logs of this process's own (a
    process alone's, or a replica's while Redis was away) are in the store of ``alone``."""

    def __init__(
        self,
        config: GatewayConfig,
        generations: GenerationIndex,
        counters: Counters,
        clock: Callable[[], float],
        alone: Reach,
    ) -> None:
        self._config = config
        self._generations = generations
        self._counters = counters
        self._own_store = alone.store
        #: Finished generations kept for replay, and when each goes.
        self.kept = Retention(
            config.max_kept_bytes,
            config.max_kept_generations,
            config.keep_finished,
            lambda gen: self.spawn(self.forget(gen)),
            clock,
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def ended(self, gen: Generation, state: State) -> None:
        """``gen`` ended in ``state`` (its subscribers were woken): tell the fleet, then keep it
        for replay or forget it."""
        told = gen.role.ended(gen, state)
        if told is not None:
            self.spawn(told)
        if state is State.ABORTED or gen.failure is not None or self._config.keep_finished <= 0:
            # Nothing worth replaying (or replay is off): a later attempt starts over.
            self.spawn(self.forget(gen))
            return
        self._keep(gen)

    def mirror_ended(self, gen: Generation) -> None:
        """A mirrored generation ended (its copy moved to its owner's end): its subscribers
        here finish from the copy; the copy goes soon after (Redis keeps the generation for
        replay)."""
        gen.wake()
        if gen.timer is not None:
            gen.timer.cancel()
        gen.timer = asyncio.get_running_loop().call_later(
            MIRROR_KEPT, lambda: self.spawn(self.forget(gen))
        )

    def _keep(self, gen: Generation) -> None:
        # A replay needs the log and the fingerprint, not the request body (up to the body
        # limit) nor the reader task: let them go, so what is kept is what is counted.
        gen.request.body = b""
        gen.task = None
        if gen.timer is not None:  # a grace period still running: nothing left to abort
            gen.timer.cancel()
            gen.timer = None
        for oldest in self.kept.keep(gen):  # its retention time is the ledger's
            self._counters.evicted += 1
            self.spawn(self.forget(oldest))
        lapse = gen.role.kept(gen, self._own_store, self._config.keep_finished)
        if lapse is not None:
            self.spawn(lapse)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run store bookkeeping in the background; owned here and awaited by :meth:`settle`."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the bookkeeping still running (shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def forget(self, gen: Generation) -> None:
        """Nobody can find ``gen`` any more; subscribers holding it read on undisturbed."""
        if gen.finished and gen.timer is not None:
            gen.timer.cancel()
            gen.timer = None
        self.kept.drop(gen)
        self._generations.drop(gen)
        if gen.key is not None:  # where it was claimed here (no Redis, or Redis away)
            await self._own_store.release(gen.key, gen.id)
        await gen.role.forgotten(gen, self._own_store)
