"""Generations in Redis, shared by every gateway replica: the
:class:`~streamsafe.gateway.generations.store.Store` interface on redis-py's asyncio client.

Keys (named by :class:`~streamsafe.gateway.replicas.redis_keys.KeyLayout`; each carries a hash
tag, ``{t}`` below, that puts it in the slot of the keys a script touches with it, so the store
runs on a Redis Cluster too):

- ``<prefix>{t}k:<hash of the key>``: a claim (``SET NX PX``), released and expired by
  compare-and-delete / compare-and-expire scripts, so a replica never drops a key another one
  owns. No caller-chosen string is part of a key name: an idempotency key is named by its
  HMAC-SHA256 under a key derived from ``--redis-secret``, or its SHA-256 without one
  (:func:`~streamsafe.gateway.replicas.record_seal.key_name`);
- ``<prefix>{t}<gen>:log``: the event log, a Redis Stream whose entry ids are ``0-1, 0-2, ...``:
  entry ``0-(n+1)`` holds the payload with SSE id ``n``, so the id a client resumes from is the
  log offset and reading from it is one ``XRANGE``. Appends are fenced by the writer's lease,
  and each entry is sealed with the replicas' secret where they share one
  (:mod:`~streamsafe.gateway.replicas.redis_log`);
- ``<prefix>{t}<gen>:state``: the generation's state changes, a second stream (``0-1, 0-2,
  ...``) next to a hash ``<prefix>{t}<gen>:meta`` holding the latest state and what a takeover
  needs;
- ``<prefix>{t}<gen>:lease``: which replica runs the generation, renewed by that replica;
- ``<prefix>{t}fp:<hash of the tenant and the fingerprint>``: the newest live generation with
  that body, for unkeyed retries (the fingerprint, an unkeyed hash of the body, is hashed again
  with the secret's key where there is one: a guess of a prompt cannot be tested against it);
- ``<prefix>{t}fleet``: the fleet's marker, one copy per bucket (one on one Redis), a hash of an
  ``epoch`` (random, written by the first replica that finds none) and a ``check`` sealed with
  the replicas' secret (empty without one). A claim and a look-up by body check their bucket's
  epoch in the same round trip: a Redis that lost the marker (flushed, restarted empty, a
  cluster node that came back empty) lost every claim with it, and a key found free then may be
  one a replica still holds (:class:`~streamsafe.gateway.replicas.fleet_marker.StateLost`).
  Every replica renews its lifetime, so it lapses ``orphan_ttl`` after the last one, as every
  other key does (:mod:`~streamsafe.gateway.replicas.fleet_marker`).

A replica that has subscribers of a generation another replica writes waits for it with
:meth:`RedisStore.wait`: one ``XREAD BLOCK`` loop per bucket
(:class:`~streamsafe.gateway.replicas.redis_tail.RedisTail`) follows every such log and state
stream of that bucket at once, so followers cost no connection each (one Redis: one loop). The
scripts are in :mod:`~streamsafe.gateway.replicas.redis_scripts`; the server as a whole (does it
answer, did it restart, its memory) in :mod:`~streamsafe.gateway.replicas.redis_server`; the
replicas' heartbeats and their presence as readers in :mod:`~streamsafe.gateway.replicas.presence`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from streamsafe._redis_url import parse_redis_url
from streamsafe.gateway.replicas.fleet_marker import FleetMarker
from streamsafe.gateway.replicas.presence import Presence
from streamsafe.gateway.replicas.record_seal import RecordSeal
from streamsafe.gateway.replicas.redis_client import RedisClient, connect
from streamsafe.gateway.replicas.redis_keys import CLUSTER_BUCKETS, KeyLayout
from streamsafe.gateway.replicas.redis_log import RedisEventLog, ReplicatedLog
from streamsafe.gateway.replicas.redis_scripts import Scripts, ms, text
from streamsafe.gateway.replicas.redis_server import RedisServer
from streamsafe.gateway.replicas.redis_tail import RedisTail

__all__ = ["RedisStore"]

#: Default key prefix: one Redis may serve several fleets under different prefixes.
DEFAULT_PREFIX = "ss:"


class RedisStore:
    """:class:`~streamsafe.gateway.generations.store.Store` in Redis (see the module). ``url`` is a
    ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://`` or ``redis+cluster://`` URL
    (:mod:`streamsafe._redis_url`; a bad one raises ``ValueError``); ``ca_certs``: the CA file
    a ``rediss://`` URL that names none is verified against. ``buckets``: how many hash tags the
    keys are spread over (default: one on one Redis,
    :data:`~streamsafe.gateway.replicas.redis_keys.CLUSTER_BUCKETS` on a cluster; every replica
    of a fleet must use the same).

    Every method is one round trip (a command, a script or a pipeline). Redis errors
    (:class:`redis.exceptions.RedisError`, connection errors included) propagate: what to do when
    Redis is away is the registry's policy, not the store's. ``socket_timeout`` (default 1 s)
    bounds each round trip: a frozen Redis (SIGSTOP, a partition without a reset) is taken for
    away after it, so a request waits that long at most before the replica serves with its own
    state (it waited 5 s).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 1.0,
        secret: str | None = None,
        ca_certs: str | None = None,
        buckets: int | None = None,
    ) -> None:
        self.url = url
        self.target = target = parse_redis_url(url, ca_certs=ca_certs)
        #: Seals the prompt, the provider data and the key in generation records, and their
        #: event logs, with the secret the replicas share; hashes the caller's strings in key
        #: names with it (``None``: no secret; see
        #: :mod:`streamsafe.gateway.replicas.record_seal`).
        self.seal = RecordSeal(secret) if secret else None
        self.prefix = prefix
        if buckets is None:
            buckets = CLUSTER_BUCKETS if target.cluster else 1
        #: The key names, spread over hash tags (:mod:`~streamsafe.gateway.replicas.redis_keys`).
        self.keys = KeyLayout(prefix, self.seal, buckets)
        #: Unique per store object: the lease value of generations this replica runs.
        self.replica_id = os.urandom(6).hex()
        self.redis: RedisClient = connect(
            target, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._scripts = Scripts(self.redis)
        self._tail = RedisTail(self.redis, partial(connect, target), self.nudge_key)
        #: The fleet's marker as this replica knows it: whether Redis still holds the fleet's
        #: state, and whether this replica reads its records
        #: (:mod:`~streamsafe.gateway.replicas.fleet_marker`).
        self.marker = FleetMarker(self.redis, self._scripts, self.keys, self.seal)
        #: The server as a whole: does it answer, did it restart, how much memory it uses
        #: (:mod:`~streamsafe.gateway.replicas.redis_server`).
        self.server = RedisServer(self.redis)
        #: This replica's heartbeat, and its presence as a reader of generations others run
        #: (:mod:`~streamsafe.gateway.replicas.presence`).
        self.presence = Presence(self.redis, self._scripts, self.keys, self.replica_id)

    # -- key names ------------------------------------------------------------------------------

    def claim_key(self, key: str) -> str:
        """Redis key of the claim of idempotency key ``key`` (named by a hash of it)."""
        return self.keys.claim_key(key)

    def log_key(self, gen_id: str) -> str:
        """Redis key of a generation's event log."""
        return self.keys.log_key(gen_id)

    def state_key(self, gen_id: str) -> str:
        """Redis key of a generation's state stream."""
        return self.keys.state_key(gen_id)

    def meta_key(self, gen_id: str) -> str:
        """Redis key of a generation's metadata hash."""
        return self.keys.meta_key(gen_id)

    def lease_key(self, gen_id: str) -> str:
        """Redis key of a generation's lease."""
        return self.keys.lease_key(gen_id)

    def presence_key(self, gen_id: str) -> str:
        """Redis key of the replicas that have subscribers of a generation (a sorted set
        scored by when each presence lapses)."""
        return self.keys.presence_key(gen_id)

    def nudge_key(self, bucket: int = 0) -> str:
        """Redis key of this replica's nudge stream in ``bucket`` (what wakes its blocked read
        of that bucket, see :class:`~streamsafe.gateway.replicas.redis_tail.RedisTail`)."""
        return self.keys.nudge_key(self.replica_id, bucket)

    def fingerprint_key(self, tenant: str, fingerprint: bytes) -> str:
        """Redis key of the unkeyed-retry index entry of ``(tenant, fingerprint)`` (named by a
        hash of both)."""
        return self.keys.fingerprint_key(tenant, fingerprint)

    # -- claims (Store) -------------------------------------------------------------------------

    async def claim(self, key: str, gen_id: str, ttl: float | None = None) -> str | None:
        """``SET key gen_id NX [PX ttl]``; the current owner if the key was taken. Raises
        :class:`~.fleet_marker.StateLost` (and claims nothing) where the fleet's marker is not
        the one this replica knew: Redis lost the claims."""
        name = self.claim_key(key)
        bucket = self.keys.bucket_of(name)
        epoch = await self.marker.epoch(bucket)
        px = 0 if ttl is None else ms(ttl)
        got = await self._scripts.claim(name, self.keys.fleet_key(bucket), gen_id, px, epoch)
        if got[0] == -1:
            self.marker.lost(bucket, epoch, got[1])
        return None if got[0] == 1 else text(got[1])

    async def owner(self, key: str) -> str | None:
        """The generation that owns ``key``, if any."""
        return text(await self.redis.get(self.claim_key(key)))

    async def release(self, key: str, gen_id: str) -> None:
        """Compare-and-delete."""
        await self._scripts.release(self.claim_key(key), gen_id)

    async def expire(self, key: str, gen_id: str, ttl: float) -> None:
        """Compare-and-expire."""
        await self._scripts.expire(self.claim_key(key), gen_id, ttl)

    # -- logs (Store) ---------------------------------------------------------------------------

    def log(
        self, gen_id: str, lease_holder: str = "", lease: float = 3.0, keep: float | None = None
    ) -> RedisEventLog:
        """A handle on the log of ``gen_id``; appends are fenced by ``lease_holder`` where
        given (a lease of ``lease`` seconds); the append that creates the log lets it lapse
        ``keep`` seconds later unless renewed (``None``: it stays)."""
        key, lease_key = self.log_key(gen_id), self.lease_key(gen_id)
        return RedisEventLog(
            self.redis,
            self._scripts,
            key,
            lease_key,
            lease_holder,
            lease,
            keep,
            state_key=self.state_key(gen_id),
            meta_key=self.meta_key(gen_id),
            gen_id=gen_id,
            seal=self.seal,
        )

    def replicated_log(
        self, gen_id: str, *, writer: bool, lease: float = 3.0, keep: float | None = None
    ) -> ReplicatedLog:
        """The log of ``gen_id`` with a copy here; a ``writer``'s appends are fenced by this
        replica's lease (of ``lease`` seconds) and create the log with a lifetime of ``keep``
        seconds (see :meth:`log`)."""
        holder = self.replica_id if writer else ""
        return ReplicatedLog(self.log(gen_id, holder, lease, keep))

    async def drop_log(self, gen_id: str) -> None:
        """Delete a generation: log, state, metadata and lease."""
        await self.redis.delete(
            self.log_key(gen_id),
            self.state_key(gen_id),
            self.meta_key(gen_id),
            self.lease_key(gen_id),
            self.presence_key(gen_id),
        )

    # -- leases ---------------------------------------------------------------------------------

    async def take_lease(self, gen_id: str, ttl: float) -> bool:
        """Become the replica that runs ``gen_id`` unless a live lease names another."""
        name = self.lease_key(gen_id)
        return bool(await self.redis.set(name, self.replica_id, nx=True, px=ms(ttl)))

    async def lease_holder(self, gen_id: str) -> str | None:
        """The replica that runs ``gen_id``, if its lease is live."""
        return text(await self.redis.get(self.lease_key(gen_id)))

    async def renew_leases(self, gen_ids: Iterable[str], ttl: float) -> list[str]:
        """Extend this replica's leases on ``gen_ids`` by ``ttl`` (one pipeline); return the
        ids whose lease was no longer this replica's."""
        ids = list(gen_ids)
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for gen_id in ids:
                self._scripts.expire_in(pipe, self.lease_key(gen_id), self.replica_id, ttl)
            results = await pipe.execute()
        return [gen_id for gen_id, ok in zip(ids, results, strict=True) if not ok]

    async def release_lease(self, gen_id: str) -> None:
        """Give up the lease on ``gen_id`` if this replica holds it."""
        await self._scripts.release(self.lease_key(gen_id), self.replica_id)

    # -- generation metadata and state ----------------------------------------------------------

    async def put_generation(
        self, gen_id: str, fields: Mapping[str, bytes | str | int], ttl: float
    ) -> None:
        """Record what another replica needs to attach to or take over ``gen_id`` (request,
        fingerprint, state); the record lapses after ``ttl`` unless extended."""
        await self._scripts.put_record(self.meta_key(gen_id), fields, ttl)

    async def generation(self, gen_id: str) -> dict[str, bytes] | None:
        """The metadata of ``gen_id``, or ``None`` if Redis no longer holds it."""
        raw: Any = await self.redis.hgetall(self.meta_key(gen_id))
        if not raw:
            return None
        return {k.decode(): v for k, v in raw.items()}

    async def set_state(
        self, gen_id: str, state: str, fields: Mapping[str, bytes | str | int] | None = None
    ) -> int:
        """Record a state change (plus ``fields``) and wake the replicas that follow
        ``gen_id``; return how many state changes it has had."""
        return await self._scripts.set_state(
            self.state_key(gen_id), self.meta_key(gen_id), state, fields or {}
        )

    async def state_changes(self, gen_id: str) -> int:
        """How many state changes ``gen_id`` has had (what :meth:`wait` compares against)."""
        return int(await self.redis.xlen(self.state_key(gen_id)))

    async def keep_generations(
        self, generations: Iterable[tuple[str, str | None, str | None]], ttl: float
    ) -> None:
        """Let every key of the running generations ``(gen_id, claim key, fingerprint key)``
        lapse ``ttl`` seconds from now (one pipeline; the claim and the fingerprint entry only
        where they still name the generation): what a replica renews while it runs them, so
        that their keys are gone ``ttl`` after it died if no replica took them over."""
        gens = list(generations)
        if not gens:
            return
        px = ms(ttl)
        async with self.redis.pipeline(transaction=False) as pipe:
            for gen_id, claim, fingerprint in gens:
                pipe.pexpire(self.log_key(gen_id), px)
                pipe.pexpire(self.meta_key(gen_id), px)
                for name in (claim, fingerprint):
                    if name is not None:
                        self._scripts.expire_in(pipe, name, gen_id, ttl)
            await pipe.execute()

    async def expire_generation(self, gen_id: str, ttl: float) -> None:
        """Let every key of ``gen_id`` lapse ``ttl`` seconds from now (a finished generation is
        kept for replay that long)."""
        px = ms(ttl)
        async with self.redis.pipeline(transaction=False) as pipe:
            for name in (self.log_key(gen_id), self.state_key(gen_id), self.meta_key(gen_id)):
                pipe.pexpire(name, px)
            await pipe.execute()

    # -- the unkeyed-retry index ----------------------------------------------------------------

    async def index_fingerprint(
        self, tenant: str, fingerprint: bytes, gen_id: str, ttl: float
    ) -> None:
        """Make ``gen_id`` the newest generation with this body for ``tenant``."""
        await self.redis.set(self.fingerprint_key(tenant, fingerprint), gen_id, px=ms(ttl))

    async def find_fingerprint(self, tenant: str, fingerprint: bytes) -> str | None:
        """The newest generation with this body for ``tenant``, if any. Raises
        :class:`~.fleet_marker.StateLost` where the fleet's marker is not the one this replica
        knew (the index was lost with it: none found says nothing)."""
        name = self.fingerprint_key(tenant, fingerprint)
        bucket = self.keys.bucket_of(name)
        epoch = await self.marker.epoch(bucket)
        async with self.redis.pipeline(transaction=False) as pipe:  # one slot: one node
            pipe.get(name)
            pipe.hget(self.keys.fleet_key(bucket), "epoch")
            found, now = await pipe.execute()
        if text(now) != epoch:
            self.marker.lost(bucket, epoch, now)
        return text(found)

    async def unindex_fingerprint(self, tenant: str, fingerprint: bytes, gen_id: str) -> None:
        """Drop the index entry if it still names ``gen_id`` (compare-and-delete)."""
        await self._scripts.release(self.fingerprint_key(tenant, fingerprint), gen_id)

    async def expire_fingerprint(
        self, tenant: str, fingerprint: bytes, gen_id: str, ttl: float
    ) -> None:
        """Let the index entry lapse after ``ttl`` if it still names ``gen_id``."""
        await self._scripts.expire(self.fingerprint_key(tenant, fingerprint), gen_id, ttl)

    # -- following another replica's generation -------------------------------------------------

    async def wait(self, gen_id: str, length: int, state_changes: int, max_wait: float) -> bool:
        """Wait until the log of ``gen_id`` holds more than ``length`` events or it had more
        than ``state_changes`` state changes; ``False`` if ``max_wait`` seconds passed first.
        Spurious wake-ups are allowed (the caller re-reads)."""
        entries = ((self.log_key(gen_id), length), (self.state_key(gen_id), state_changes))
        return await self._tail.wait(self.keys.gen_bucket(gen_id), entries, max_wait)

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop following and close the connections."""
        await self._tail.close()
        await self.redis.aclose()
