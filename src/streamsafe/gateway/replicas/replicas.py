"""Replicas: gateway processes that share their generations through Redis (see docs/design.md,
Replicas).

The replica that starts a generation *owns* it: it runs it upstream, writes its log to Redis
(:class:`~streamsafe.gateway.replicas.redis_log.ReplicatedLog`) and holds a lease on it that it
renews every third of the lease (its keys and their lifetimes:
:mod:`~streamsafe.gateway.replicas.owned_keys`). Any other replica that gets a request for it (a
retry, a ``Last-Event-ID`` resume, a replay) *mirrors* it
(:mod:`~streamsafe.gateway.replicas.mirrors`): one follower task per generation copies the log as
it grows (woken by ``XREAD BLOCK``) and its subscribers read the copy. Mirrors say in Redis that
they have subscribers, so the owner does not abort a generation nobody reads *on the owner*.

When an owner dies (kill -9, a lost host), its lease lapses; the first follower that notices
takes the lease (``SET NX``), and with it the generation: it continues it upstream from the log,
like a broken stream (see docs/design.md, Continuation), and its subscribers, wherever they
reconnect, see every token once. A replica whose lease was taken while it still ran (a long
pause) cannot write any more (appends are fenced by the lease) and becomes a mirror itself.

Redis failure policy: a replica that cannot reach Redis goes on with per-replica state. Live
generations go on in this process (their logs detach from Redis, nothing their subscribers here
were sent is lost); new requests get generations of this replica only, so during the outage a
retry that lands on another replica is not recognised. Every failure is counted
(``redis_errors``) and ``redis_degraded`` is 1 while Redis is away; a probe brings the replica
back to Redis when it answers, and the generations it still runs, those it started meanwhile
included, are written back to Redis (record, lease and the whole log), so a mirror elsewhere that
lost them can go on and a retry or resume on any replica finds them
(:mod:`~streamsafe.gateway.replicas.outage`). A Redis that restarted, or lost the fleet's state,
or that this replica cannot read (another secret), is watched for in
:mod:`~streamsafe.gateway.replicas.state_watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

from streamsafe.gateway.errors import FleetUnsafe
from streamsafe.gateway.generations.fleet import Followed, ReplicaCounters
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.solo import LocalReach
from streamsafe.gateway.generations.store import MemoryStore
from streamsafe.gateway.replicas.fleet_marker import StateLost
from streamsafe.gateway.replicas.mirrors import Mirrors
from streamsafe.gateway.replicas.outage import Outage
from streamsafe.gateway.replicas.owned_keys import OwnedKeys
from streamsafe.gateway.replicas.record_seal import Unreadable, Unsealable
from streamsafe.gateway.replicas.redis_log import ReplicatedLog
from streamsafe.gateway.replicas.redis_server import REDIS_ERRORS
from streamsafe.gateway.replicas.roles import Mirror, Shared, SharedOwner
from streamsafe.gateway.replicas.state_watch import StateWatch
from streamsafe.gateway.replicas.store_redis import RedisStore

__all__ = ["Replicas"]

log = logging.getLogger("streamsafe.gateway")


class Replicas:
    """This replica's link to the others (see the module), a
    :class:`~streamsafe.gateway.generations.fleet.Fleet`. ``lease`` is the owner lease in
    seconds (default 3: a dead owner's generations move within about 3 s, and a renewal every
    second survives a slow Redis round trip)."""

    #: The failures of Redis, which leave this replica with per-replica state (:meth:`failed`),
    #: a Redis that lost the fleet's state among them.
    errors: tuple[type[BaseException], ...] = (*REDIS_ERRORS, StateLost)
    #: A replica that stops gives up its leases: another continues what it ran.
    hands_over = True

    def __init__(
        self,
        store: RedisStore,
        *,
        lease: float = 3.0,
        keep_finished: float = 300.0,
        orphan_ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease <= 0:
            raise ValueError("lease must be > 0")
        if orphan_ttl < 3 * lease:
            raise ValueError("orphan_ttl must be at least three leases")
        self.store = store
        store.marker.ttl = orphan_ttl  # the fleet's marker lapses as its other keys do
        self.lease = lease
        self.keep_finished = keep_finished
        #: Whether Redis still holds the fleet's state, and this replica reads it.
        self.watch = StateWatch(store, lease=lease, clock=clock)
        #: Seconds every key of a running generation outlives this replica's last renewal of it
        #: (see :mod:`~streamsafe.gateway.replicas.owned_keys`).
        self.orphan_ttl = orphan_ttl
        #: The keys of the generations this replica runs.
        self.keys = OwnedKeys(
            store, lease=lease, keep_finished=keep_finished, orphan_ttl=orphan_ttl, clock=clock
        )
        self.counters = ReplicaCounters()
        #: The generations this replica runs, by id.
        self._owned: dict[str, Generation] = {}
        #: Redis away and back: failures counted, the probe, the write-back.
        self.outage = Outage(store, self.keys, self._owned, self.counters, self.watch)
        #: True once this replica shuts down: what it runs is handed over, not ended.
        self.closing = False
        #: Replicas whose heartbeat is live in Redis (this one included), as last seen.
        self.fleet_replicas = 0
        #: Bytes Redis used, as last seen (``INFO memory``).
        self.redis_used_memory = 0
        # The roles a generation has here (see replicas/roles.py), set where it moves.
        self._shared = Shared(self)
        self._owner = SharedOwner(self)
        self._mirror = Mirror(self)
        #: The generations other replicas run that this one copies.
        self.mirrors = Mirrors(store, lease=lease, failed=self.failed, clock=clock)
        #: Where generations are opened while Redis is away: keys in this process, logs
        #: detached from the start (written back once Redis answers), leases renewed then.
        self.alone = LocalReach(
            MemoryStore(clock), new_log=partial(self.new_log, detached=True), own=self.own
        )
        self._renewer: asyncio.Task[None] | None = None

    @property
    def replica_id(self) -> str:
        """This replica's lease value."""
        return self.store.replica_id

    # -- Redis failures -------------------------------------------------------------------------

    @property
    def held(self) -> Iterable[Generation]:
        """The generations this process holds (the registry's index), for a write-back after
        Redis restarted: those this replica ran and keeps for replay."""
        return self.outage.held

    @held.setter
    def held(self, held: Iterable[Generation]) -> None:
        self.outage.held = held

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable: new generations are this replica's only."""
        return self.outage.degraded

    def failed(self, exc: BaseException) -> None:
        """Redis failed under an operation: count it, go on with per-replica state, and probe
        until it answers again (:class:`~streamsafe.gateway.replicas.outage.Outage`). Where
        Redis lost the fleet's state, what this replica keeps for replay is written back too,
        and new generations a retry may duplicate wait (:meth:`StateWatch.lost`)."""
        if isinstance(exc, StateLost):
            self.outage.resync(self.held)
            self.watch.lost(exc, self.fleet_replicas)
        self.outage.failed(exc)

    def refusal(self) -> FleetUnsafe | None:
        """Why a generation that may duplicate one the fleet holds must not start now; ``None``
        where it may (see :meth:`StateWatch.refusal`)."""
        return self.watch.refusal()

    @property
    def trouble(self) -> str | None:
        """Why this replica is not ready to share generations (``/ready`` answers 503; see
        :attr:`StateWatch.trouble`)."""
        return self.watch.trouble

    # -- owning ---------------------------------------------------------------------------------

    def new_log(self, gen_id: str, detached: bool = False) -> ReplicatedLog:
        """The log of a generation this replica starts; ``detached`` while Redis is away (the
        log stays in this process until the write-back after the outage writes it to Redis)."""
        log_ = self.store.replicated_log(
            gen_id, writer=True, lease=self.lease, keep=self.orphan_ttl
        )
        log_.on_detach = self.failed
        log_.detached = detached
        return log_

    async def publish(self, gen: Generation) -> None:
        """Make ``gen`` findable by every replica and take its lease (one round trip each)."""
        await self.keys.publish(gen)
        self.own(gen)

    def own(self, gen: Generation) -> None:
        """This replica runs ``gen`` now: renew its lease until it ends."""
        self._owned[gen.id] = gen
        gen.role = self._owner
        self.mirrors.forget(gen)
        self.start()

    def disown(self, gen: Generation) -> None:
        """This replica no longer runs ``gen`` (its lease went to another)."""
        self._owned.pop(gen.id, None)
        gen.role = self._shared

    def lost_lease(self, gen: Generation) -> Awaitable[Followed]:
        """Another replica took ``gen``'s lease while this one ran it (it paused past the
        lease): follow the new owner (:meth:`follow`, whose follower this returns)."""
        assert isinstance(gen.log, ReplicatedLog)
        self.counters.leases_lost += 1
        gen.log.remote.lease_holder = ""
        self.disown(gen)
        return self.follow(gen)

    async def finished(self, gen: Generation) -> None:
        """``gen``, which this replica ran, ended: record how, keep it for replay
        ``keep_finished`` seconds (or drop what a retry must not find), give up the lease.
        While Redis is away this waits for the write-back."""
        self._owned.pop(gen.id, None)
        gen.role = self._shared
        await self.outage.record_end(gen)

    async def let_go(self, gen: Generation) -> None:
        """``gen``, which this replica ran and kept for replay, is no longer kept (evicted, or
        its time is up): let its keys in Redis lapse too, two leases from now (a mirror still
        copying its end has that long), instead of ``keep_finished`` after it ended."""
        await self.keys.let_go(gen)

    async def hand_over(self, gen: Generation) -> None:
        """This replica stops (a graceful shutdown) while ``gen`` runs: give up its lease and
        leave its record live, so a replica that follows it, or the next request for it, takes it
        over and continues it from the log."""
        self._owned.pop(gen.id, None)
        gen.role = self._shared
        if self.degraded:
            return
        try:
            await self.store.release_lease(gen.id)
        except REDIS_ERRORS as exc:
            self.failed(exc)

    async def followed_elsewhere(self, gen: Generation) -> bool:
        """True if another replica has subscribers of ``gen`` (so it is not abandoned)."""
        if self.degraded:
            return False
        try:
            return await self.store.presence.remote_subscribers(gen.id) > 0
        except REDIS_ERRORS as exc:
            self.failed(exc)
            return False

    def start(self) -> None:
        """Start renewing (leases, presence, this replica's heartbeat); otherwise the first
        generation owned or mirrored starts it."""
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Every third of the lease: renew the leases of generations this replica runs, the
        presence of its mirrors' subscribers, and its heartbeat (which gives the fleet's
        figures); every third of ``orphan_ttl``, the lifetime of their keys; until
        :meth:`close`."""
        period = self.lease / 3
        while True:
            if not self.degraded:
                try:
                    await self._renew_once()
                except REDIS_ERRORS as exc:
                    self.failed(exc)
            await asyncio.sleep(period)

    async def _renew_once(self) -> None:
        """One round of :meth:`_renew` (the first as this replica starts: it reads the fleet's
        marker before it serves for long)."""
        # The marker first: who waits after Redis lost the fleet's state depends on the fleet
        # as the last heartbeat saw it (a flush took the heartbeats with it).
        state_lost = await self.watch.check()
        if state_lost is not None:
            self.failed(state_lost)
        lost = await self.store.renew_leases(list(self._owned), self.lease)
        await self.store.presence.announce(self.mirrors.followed(), self.lease * 2)
        self.fleet_replicas = await self.store.presence.heartbeat(self.lease * 2)
        self.redis_used_memory = await self.store.server.used_memory() or 0
        restarted = self.watch.restarted(await self.store.server.run_id())
        if restarted is not None:
            # Taken as an outage that just ended: what this replica runs and keeps for replay
            # is written back.
            self.outage.resync(self.held)
            self.failed(restarted)
        if restarted is not None or state_lost is not None:
            return
        if self.keys.keep_due():
            await self._keep_owned()
        for gen_id in lost:
            if gen_id in self._owned:
                self.counters.leases_lost += 1
                log.warning("%s: lease lost to another replica", gen_id)

    async def _keep_owned(self) -> None:
        """Renew the lifetime of every key of the generations this replica runs."""
        await self.keys.keep(self._owned.values())

    # -- mirroring (see :mod:`streamsafe.gateway.replicas.mirrors`)
    # -----------------------------------------

    async def find(
        self, gen_id: str, key: str | None, created_at: float, wait: float = 0.0
    ) -> Generation | None:
        """A mirror of another replica's generation ``gen_id`` (not yet followed), or ``None``
        where Redis does not hold it (see :meth:`Mirrors.find`). Raises
        :class:`~streamsafe.gateway.errors.FleetUnsafe` where this replica cannot read its
        record: it runs elsewhere, so taking its key over would run it twice."""
        try:
            gen = await self.mirrors.find(gen_id, key, created_at, wait)
        except Unreadable as exc:
            why = str(exc)
            if isinstance(exc, Unsealable):
                why += "; every gateway replica needs the same --redis-secret"
            log.error("%s", why, extra={"fields": {"event": "redis_record_unreadable"}})
            msg = f"this gateway replica cannot read the generation this request belongs to: {why}"
            raise FleetUnsafe(msg) from None
        if gen is not None:
            gen.role = self._shared  # its log is in Redis; a mirror once followed
        return gen

    async def find_fingerprint(self, tenant: str, fingerprint: bytes) -> str | None:
        """The newest generation with this body for ``tenant``, on any replica."""
        return await self.store.find_fingerprint(tenant, fingerprint)

    def follow(self, gen: Generation) -> Awaitable[Followed]:
        """Copy ``gen``'s log as its owner writes it: returns its follower, which returns how
        it ended (see :meth:`Fleet.follow <streamsafe.gateway.generations.fleet.Fleet.follow>`);
        one taken over from a dead owner is this replica's from then on."""
        self.counters.mirrored += 1
        gen.role = self._mirror
        follower = self.mirrors.follow(gen)
        self.start()
        return self._followed(gen, follower)

    async def _followed(self, gen: Generation, follower: Awaitable[Followed]) -> Followed:
        followed = await follower
        if followed is Followed.TAKEN_OVER:
            self.counters.taken_over += 1
            self.own(gen)
        return followed

    def unfollow(self, gen: Generation) -> None:
        """Stop copying ``gen`` (forgotten here)."""
        self.mirrors.unfollow(gen)
        gen.role = self._shared

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop following and renewing; give up the leases this replica holds."""
        tasks = [t for t in (self._renewer, self.outage.probe, *self.mirrors.followers()) if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, *REDIS_ERRORS):
                await task
        for gen_id in list(self._owned):
            with contextlib.suppress(*REDIS_ERRORS):
                await self.store.release_lease(gen_id)
        await self.store.close()
