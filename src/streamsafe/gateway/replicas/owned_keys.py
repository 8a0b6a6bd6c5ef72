"""The Redis keys of the generations this replica runs (see
:mod:`~streamsafe.gateway.replicas.replicas`): written when one starts (its record, its lease, its
body's index), kept alive while it runs, given a finished generation's lifetime when it ends, and
written back whole after Redis was away.

Every key of a running generation outlives this replica's last renewal of it by ``orphan_ttl``
(renewed every third of it), so a generation whose replica died and that nobody took over leaves
nothing in Redis after it. A finished one's keys last ``keep_finished`` (replay), or two leases
where there is nothing to replay (a mirror still copying its end has that long).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.store import LeaseLost
from streamsafe.gateway.replicas.generation_record import record_of
from streamsafe.gateway.replicas.redis_log import ReplicatedLog
from streamsafe.gateway.replicas.store_redis import RedisStore

__all__ = ["OwnedKeys"]


class OwnedKeys:
    """The keys of this replica's generations in ``store`` (see the module); ``lease``,
    ``keep_finished`` and ``orphan_ttl`` in seconds, as :class:`Replicas` takes them."""

    def __init__(
        self,
        store: RedisStore,
        *,
        lease: float,
        keep_finished: float,
        orphan_ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.lease = lease
        self.keep_finished = keep_finished
        self.orphan_ttl = orphan_ttl
        self._clock = clock
        self._kept_at = clock()
        # Held while the keys' lifetimes are written (a renewal, a generation's end): a renewal
        # in flight must not give a generation that ended meanwhile its running lifetime back.
        self._lifetimes = asyncio.Lock()

    async def publish(self, gen: Generation) -> None:
        """Make ``gen`` findable by every replica and take its lease (one round trip each)."""
        store = self.store
        await store.put_generation(gen.id, record_of(gen, store.seal), self.orphan_ttl)
        if not await store.take_lease(gen.id, self.lease):
            raise LeaseLost(gen.id)  # ids are unique per process: only a bug gets here
        await store.index_fingerprint(gen.tenant, gen.fingerprint, gen.id, self.orphan_ttl)

    def keep_due(self) -> bool:
        """Whether a third of ``orphan_ttl`` went by since the running keys were last kept."""
        return self._clock() - self._kept_at >= self.orphan_ttl / 3

    async def keep(self, running: Iterable[Generation]) -> None:
        """Renew the lifetime of every key of the ``running`` generations (those that end
        meanwhile wait for it, then give their keys a finished generation's lifetime)."""
        self._kept_at = self._clock()
        store = self.store
        async with self._lifetimes:
            keys = [
                (
                    gen.id,
                    None if gen.key is None else store.claim_key(gen.key),
                    store.fingerprint_key(gen.tenant, gen.fingerprint),
                )
                for gen in running
            ]
            await store.keep_generations(keys, self.orphan_ttl)

    async def record_end(self, gen: Generation) -> None:
        """Record how ``gen`` ended and give its keys the lifetime of a finished generation
        (its claim too: a failed one's is released when the registry forgets it)."""
        store = self.store
        fields: dict[str, bytes | str | int] = {}
        failure = gen.failure
        if failure is not None:
            fields = {"status": failure.status, "error": failure.body}
            if failure.retry_after is not None:
                fields["retry_after"] = failure.retry_after
        async with self._lifetimes:
            await store.set_state(gen.id, gen.state.value, fields)
            keep = self.keep_finished
            if gen.state is State.DONE and keep > 0:
                await store.expire_generation(gen.id, keep)
                await store.expire_fingerprint(gen.tenant, gen.fingerprint, gen.id, keep)
                if gen.key is not None:
                    await store.expire(gen.key, gen.id, keep)
            else:
                await store.unindex_fingerprint(gen.tenant, gen.fingerprint, gen.id)
                await store.expire_generation(gen.id, max(self.lease * 2, 1.0))
            await store.release_lease(gen.id)

    async def let_go(self, gen: Generation) -> None:
        """``gen``, kept for replay, is no longer kept: its keys lapse two leases from now
        instead of ``keep_finished`` after it ended."""
        store = self.store
        async with self._lifetimes:
            await store.unindex_fingerprint(gen.tenant, gen.fingerprint, gen.id)
            await store.expire_generation(gen.id, max(self.lease * 2, 1.0))

    async def write_back(self, gen: Generation, log_: ReplicatedLog) -> bool:
        """Put ``gen`` back into Redis (record, lease, key, body index, its whole ``log_``) for a
        Redis that restarted empty or lost writes while it was away; ``False`` (nothing written)
        where another replica took its lease meanwhile. The log goes back to Redis once Redis
        holds all of it."""
        store = self.store
        lease_key = store.lease_key(gen.id)
        await store.redis.set(lease_key, store.replica_id, nx=True, px=int(self.lease * 1000))
        if await store.lease_holder(gen.id) != store.replica_id:
            return False
        ttl = self.orphan_ttl
        await store.put_generation(gen.id, record_of(gen, store.seal), ttl)
        if gen.key is not None and (gen.live or (gen.state is State.DONE and self.keep_finished)):
            # Not for one that ended with nothing to replay: the registry forgot it and its key
            # (a retry starts over), and nothing would release the claim.
            await store.redis.set(store.claim_key(gen.key), gen.id, nx=True, px=int(ttl * 1000))
        await store.index_fingerprint(gen.tenant, gen.fingerprint, gen.id, ttl)
        if gen.live and not log_.detached:
            # Its relay appends to Redis itself, and learning the log's length here would race
            # with those appends (a length read before an append and answered after it left
            # the writer one entry behind: its next append found the log moved). If Redis
            # lost the log, that next append says so and detaches it; the write-back that
            # follows writes it whole.
            return True
        await log_.remote.sync()
        # The relay goes on appending to the copy meanwhile: write until Redis has it all,
        # then (with no await in between) let appends go to Redis again.
        while missing := log_.local.read_nowait(at := log_.remote.length):
            # Redis may hold less than this replica last appended: what comes before is the
            # copy's (an error event there makes a [DONE] alone a failed end).
            before = log_.local.read_nowait(at - 1)[0] if at else b""
            await log_.remote.append(missing, before)
        log_.detached = False
        return True
