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
  one a replica still holds (:class:`StateLost`). Every replica renews its lifetime, so it
  lapses ``orphan_ttl`` after the last one, as every other key does.

A replica that has subscribers of a generation another replica writes waits for it with
:meth:`RedisStore.wait`: one ``XREAD BLOCK`` loop per bucket
(:class:`~streamsafe.gateway.replicas.redis_tail.RedisTail`) follows every such log and state
stream of that bucket at once, so followers cost no connection each (one Redis: one loop). The
scripts are in :mod:`~streamsafe.gateway.replicas.redis_scripts`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from streamsafe._redis_url import parse_redis_url
from streamsafe.gateway.replicas.record_seal import RecordSeal, Unreadable
from streamsafe.gateway.replicas.redis_client import RedisClient, connect
from streamsafe.gateway.replicas.redis_keys import CLUSTER_BUCKETS, KeyLayout
from streamsafe.gateway.replicas.redis_log import RedisEventLog, ReplicatedLog
from streamsafe.gateway.replicas.redis_scripts import Scripts, ms, text
from streamsafe.gateway.replicas.redis_tail import RedisTail

__all__ = ["REDIS_ERRORS", "RedisStore", "StateLost"]

#: What a lost Redis raises (connection errors are RedisError; a closed socket may be OSError).
REDIS_ERRORS = (RedisError, OSError)
#: Default key prefix: one Redis may serve several fleets under different prefixes.
DEFAULT_PREFIX = "ss:"


class StateLost(Exception):
    """Redis no longer holds the fleet's marker this replica knew (flushed, or restarted empty):
    it lost the claims, records and logs of the generations the replicas hold, so nothing it
    says is free may be taken as free until they wrote them back."""


#: What the fleet's check seals (see :meth:`RedisStore.fleet_check`).
_CHECK = b"streamsafe fleet check"


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
        #: The fleet epoch this replica knows, one per bucket (``None`` until it first read the
        #: marker, and after it found one gone).
        self.epochs: tuple[str, ...] | None = None
        #: Seconds the fleet's marker outlives its last renewal (the replicas' ``orphan_ttl``).
        self.marker_ttl = 3600.0
        #: Whether this replica reads the fleet's records, as the marker's check last said
        #: (``None`` until it was read). Where it does not, it does not find the others' keys
        #: either (they are named with another secret's hash).
        self.reads_fleet: bool | None = None

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
        :class:`StateLost` (and claims nothing) where the fleet's marker is not the one this
        replica knew: Redis lost the claims."""
        name = self.claim_key(key)
        bucket = self.keys.bucket_of(name)
        epoch = (self.epochs or await self._known_epochs())[bucket]
        px = 0 if ttl is None else ms(ttl)
        got = await self._scripts.claim(name, self.keys.fleet_key(bucket), gen_id, px, epoch)
        if got[0] == -1:
            self._lost(bucket, epoch, got[1])
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

    # -- subscribers on other replicas ------------------------------------------------------------

    async def set_presence(self, gen_ids: Iterable[str], ttl: float) -> None:
        """Say that this replica has subscribers of ``gen_ids`` for the next ``ttl`` seconds
        (one pipeline), so their owner does not abort them as abandoned."""
        ids = list(gen_ids)
        if not ids:
            return
        until = int((time.time() + ttl) * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            for gen_id in ids:
                pipe.zadd(self.presence_key(gen_id), {self.replica_id: until})
                pipe.pexpire(self.presence_key(gen_id), ms(ttl))
            await pipe.execute()

    async def clear_presence(self, gen_id: str) -> None:
        """This replica has no subscriber of ``gen_id`` any more."""
        await self.redis.zrem(self.presence_key(gen_id), self.replica_id)

    async def remote_subscribers(self, gen_id: str) -> int:
        """How many other replicas say they have subscribers of ``gen_id`` now."""
        now = int(time.time() * 1000)
        members: Any = await self.redis.zrangebyscore(self.presence_key(gen_id), now, "+inf")
        return sum(1 for m in members if text(m) != self.replica_id)

    async def heartbeat(self, ttl: float) -> int:
        """Say this replica is alive for ``ttl`` seconds; return how many replicas are (one
        script on a sorted set scored by when each heartbeat lapses, gone with the last
        replica)."""
        now = int(time.time() * 1000)
        return await self._scripts.heartbeat(self.keys.heartbeat_key(), self.replica_id, now, ttl)

    # -- the unkeyed-retry index ----------------------------------------------------------------

    async def index_fingerprint(
        self, tenant: str, fingerprint: bytes, gen_id: str, ttl: float
    ) -> None:
        """Make ``gen_id`` the newest generation with this body for ``tenant``."""
        await self.redis.set(self.fingerprint_key(tenant, fingerprint), gen_id, px=ms(ttl))

    async def find_fingerprint(self, tenant: str, fingerprint: bytes) -> str | None:
        """The newest generation with this body for ``tenant``, if any. Raises
        :class:`StateLost` where the fleet's marker is not the one this replica knew (the index
        was lost with it: none found says nothing)."""
        name = self.fingerprint_key(tenant, fingerprint)
        bucket = self.keys.bucket_of(name)
        epoch = (self.epochs or await self._known_epochs())[bucket]
        async with self.redis.pipeline(transaction=False) as pipe:  # one slot: one node
            pipe.get(name)
            pipe.hget(self.keys.fleet_key(bucket), "epoch")
            found, now = await pipe.execute()
        if text(now) != epoch:
            self._lost(bucket, epoch, now)
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

    # -- the fleet's marker ---------------------------------------------------------------------

    def fleet_check(self) -> bytes:
        """What this replica writes as the fleet's check: a constant sealed with its secret
        (empty without one). A replica whose secret cannot open the check, or that has none
        where the check is sealed, cannot read the records the others write."""
        return b"" if self.seal is None else self.seal.seal("fleet", "check", _CHECK)

    def opens(self, check: bytes) -> bool:
        """Whether this replica reads the records of a fleet whose check is ``check``."""
        if self.seal is None or not check:
            return self.seal is None and not check
        try:
            return self.seal.open("fleet", "check", check) == _CHECK
        except Unreadable:
            return False

    async def fleet_marker(self) -> tuple[str, ...]:
        """The fleet's epoch in every bucket (one pipeline), its marker written with a new
        epoch and this replica's check where Redis holds none; its lifetime renewed
        (``marker_ttl``). Whether this replica reads the fleet's records is what every bucket's
        check says (:attr:`reads_fleet`)."""
        epoch = os.urandom(8).hex()
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys.fleet_keys():
                self._scripts.fleet_in(pipe, key, epoch, self.fleet_check(), self.marker_ttl)
            markers = await pipe.execute()
        self.reads_fleet = all(self.opens(check or b"") for _, check in markers)
        return tuple(text(epoch) or "" for epoch, _ in markers)

    async def _known_epochs(self) -> tuple[str, ...]:
        """The fleet's epochs, read (or written) for a replica that knows none yet."""
        self.epochs = await self.fleet_marker()
        return self.epochs

    def _lost(self, bucket: int, known: str, now: Any) -> None:
        self.epochs = None  # the next claim reads (or writes) the marker anew
        found = text(now) or "none"
        where = f" in bucket {bucket}" if self.keys.buckets > 1 else ""
        msg = (
            f"redis lost the fleet's state (fleet marker{where} {found}, this replica knew {known})"
        )
        raise StateLost(msg)

    # -- lifecycle ------------------------------------------------------------------------------

    async def ping(self) -> bool:
        """True if Redis answers."""
        try:
            return bool(await self.redis.ping())
        except REDIS_ERRORS:
            return False

    async def run_id(self) -> str | None:
        """The Redis server's run id (``INFO server``), new at every start: a change says Redis
        restarted (and may have come back empty); ``None`` if unknown. On a cluster, the run
        ids of its primaries together: a primary that restarted, or a replica promoted in a
        failover, changes it."""
        values = await self._info("server", "run_id")
        if values is None:
            return None
        return ",".join(sorted(str(v) for v in values))

    async def used_memory(self) -> int | None:
        """Bytes Redis uses (``INFO memory``; a cluster's primaries together), for fleet-level
        figures; ``None`` if unknown."""
        values = await self._info("memory", "used_memory")
        return None if values is None else sum(int(v) for v in values)

    async def _info(self, section: str, field: str) -> list[Any] | None:
        """``field`` of ``INFO section`` of every data node (one, or a cluster's primaries);
        ``None`` where one did not answer or say it."""
        try:
            if isinstance(self.redis, RedisCluster):
                nodes = RedisCluster.PRIMARIES
                found: Any = await self.redis.info(section, target_nodes=nodes)
                infos = list(found.values())
            else:
                infos = [await self.redis.info(section)]
        except REDIS_ERRORS:
            return None
        values = [info.get(field) for info in infos]
        return None if not values or None in values else values

    async def close(self) -> None:
        """Stop following and close the connections."""
        await self._tail.close()
        await self.redis.aclose()
