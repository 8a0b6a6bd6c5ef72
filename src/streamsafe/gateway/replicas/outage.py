"""A Redis outage, as one replica lives it (see :mod:`~streamsafe.gateway.replicas.replicas`,
Redis failure policy): every failure is counted and leaves the replica *degraded* (per-replica
state); a probe waits for Redis to answer again, and then the generations this replica runs, and
the ends of those that finished meanwhile, are written back to Redis (record, lease, key, the
whole log), so a mirror elsewhere that lost them goes on and a retry or resume on any replica
finds them. A Redis that restarted, or lost the fleet's state, is an outage that just ended: what
this replica keeps for replay is written back with the rest (:meth:`Outage.resync`). So is a
Redis found to be another one when it answers again (a Sentinel failover promoted a replica,
which may lack the old primary's last writes): the probe asks its run id before it writes back,
so no retry on another replica finds it restored and its generations missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from streamsafe.gateway.generations.fleet import ReplicaCounters
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.replicas.owned_keys import OwnedKeys
from streamsafe.gateway.replicas.redis_log import ReplicatedLog
from streamsafe.gateway.replicas.redis_server import REDIS_ERRORS
from streamsafe.gateway.replicas.state_watch import StateWatch
from streamsafe.gateway.replicas.store_redis import RedisStore

__all__ = ["Outage"]

log = logging.getLogger("streamsafe.gateway")


class Outage:
    """Whether Redis is away for this replica, and the way back (see the module). ``owned``:
    the generations this replica runs (its :class:`Replicas`' own, read here); their keys are
    written back through ``keys``; failures counted in ``counters``."""

    def __init__(
        self,
        store: RedisStore,
        keys: OwnedKeys,
        owned: Mapping[str, Generation],
        counters: ReplicaCounters,
        watch: StateWatch,
    ) -> None:
        self.store = store
        self._watch = watch
        #: The generations this process holds (the registry's index): those this replica ran
        #: and keeps for replay are written back after Redis restarted.
        self.held: Iterable[Generation] = ()
        self.keys = keys
        self._owned = owned
        self.counters = counters
        #: True while Redis is unreachable: new generations are this replica's only.
        self.degraded = False
        self._probe: asyncio.Task[None] | None = None
        #: Generations that ended while Redis was away, to record once it is back.
        self._unsynced: dict[str, Generation] = {}

    @property
    def probe(self) -> asyncio.Task[None] | None:
        """The task that waits for Redis to answer again, if one was started."""
        return self._probe

    def failed(self, exc: BaseException) -> None:
        """Redis failed under an operation: count it, go on with per-replica state, and probe
        until it answers again."""
        self.counters.redis_errors += 1
        if not self.degraded:
            log.warning(
                "redis degraded: unreachable (%s); serving with per-replica state",
                exc,
                extra={"fields": {"event": "redis_degraded"}},
            )
            self.degraded = True
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_back())

    async def record_end(self, gen: Generation) -> None:
        """Record how ``gen``, which this replica ran, ended (see
        :meth:`OwnedKeys.record_end`); while Redis is away, or where it fails, with the
        write-back."""
        if self.degraded:
            self._unsynced[gen.id] = gen
            return
        try:
            await self.keys.record_end(gen)
        except REDIS_ERRORS as exc:
            self._unsynced[gen.id] = gen
            self.failed(exc)

    def resync(self, held: Iterable[Generation]) -> None:
        """Have the finished generations of ``held`` this replica ran and keeps for replay
        written back with the rest (:meth:`_write_back`): their ends are recorded again with
        their keys."""
        for gen in held:
            log_ = gen.log
            if (
                gen.state is State.DONE
                and gen.id not in self._owned
                and isinstance(log_, ReplicatedLog)
                and log_.remote.lease_holder == self.store.replica_id
            ):
                self._unsynced[gen.id] = gen  # its end is recorded again with its keys

    async def _probe_until_back(self) -> None:
        delay = 0.05
        while not await self.store.server.ping():
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)
        try:
            restarted = self._watch.restarted(await self.store.server.run_id())
            if restarted is not None:  # another Redis, or one back empty: what it kept too
                log.warning("%s: writing back what this replica keeps for replay", restarted)
                self.resync(self.held)
            await self._write_back()
        except REDIS_ERRORS as exc:
            self.counters.redis_errors += 1
            log.warning("redis failed again while generations were written back: %s", exc)
            self._probe = None
            self.failed(exc)
            return
        self.degraded = False
        log.info(
            "redis restored: reachable again; generations are shared again",
            extra={"fields": {"event": "redis_restored"}},
        )

    async def _write_back(self) -> None:
        """Put the generations this replica runs, or finished while Redis was away, back into
        Redis (record, lease, key, whole log, final state), for a Redis that restarted empty or
        lost writes meanwhile; mirrors elsewhere then go on from where their copy ends. That
        includes the generations started while Redis was away (their logs detached from the
        start): a retry or resume on another replica finds them once they are back."""
        done: set[str] = set()
        while True:
            # Generations started meanwhile (while this ran, Redis still counted as away) are
            # written back too, and so are the ends of those that finished meanwhile, written
            # back already or not: each pass takes what is left. The last look and the return
            # have no await between them.
            todo = [gen for gen in self._owned.values() if gen.id not in done]
            todo += self._unsynced.values()
            if not todo:
                return
            done.update(gen.id for gen in todo)
            for gen in todo:
                await self._write_back_one(gen)

    async def _write_back_one(self, gen: Generation) -> None:
        """Write one generation back (see :meth:`_write_back`)."""
        log_ = gen.log
        if not isinstance(log_, ReplicatedLog):
            self._unsynced.pop(gen.id, None)
            return
        if not await self.keys.write_back(gen, log_):
            log_.detached = False  # its next append meets the lease taken meanwhile
            self._unsynced.pop(gen.id, None)
            return  # another replica took it over while Redis was away: it writes now
        if gen.id in self._unsynced:
            await self.keys.record_end(gen)
            del self._unsynced[gen.id]  # kept for the next write-back where that failed
