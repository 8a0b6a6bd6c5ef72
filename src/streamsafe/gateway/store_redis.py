"""Generations in Redis, shared by every gateway replica: the :class:`~.store.Store` interface on
redis-py's asyncio client.

Keys (every key of one generation carries the hash tag ``{gen_id}``, so they share a cluster
slot and one Lua script may touch them together):

- ``<prefix>k:<key>``: a claim (``SET NX PX``), released and expired by compare-and-delete /
  compare-and-expire scripts, so a replica never drops a key another one owns;
- ``<prefix>{gen}:log``: the event log, a Redis Stream whose entry ids are ``0-1, 0-2, ...``:
  entry ``0-(n+1)`` holds the payload with SSE id ``n``, so the id a client resumes from is the
  log offset and reading from it is one ``XRANGE``. Appends go through a script that checks the
  writer's lease and the expected offset, so a replica that lost its lease (paused, partitioned)
  cannot write into a log another replica has taken over;
- ``<prefix>{gen}:state``: the generation's state changes, a second stream (``0-1, 0-2, ...``)
  next to a hash ``<prefix>{gen}:meta`` holding the latest state and what a takeover needs;
- ``<prefix>{gen}:lease``: which replica runs the generation, renewed by that replica;
- ``<prefix>fp:<tenant>:<fingerprint>``: the newest live generation with that body, for unkeyed
  retries.

A replica that has subscribers of a generation another replica writes waits for it with
:meth:`RedisStore.wait`: one ``XREAD BLOCK`` loop per store (see :class:`_Tail`) follows every
such log and state stream at once, so followers cost no connection each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from streamsafe.gateway.store import LeaseLost, MemoryEventLog

__all__ = ["LogConflict", "LogLost", "RedisEventLog", "RedisStore", "ReplicatedLog"]

log = logging.getLogger("streamsafe.gateway")

#: Default key prefix: one Redis may serve several fleets under different prefixes.
DEFAULT_PREFIX = "ss:"
#: Field of a log entry that holds the payload.
_FIELD = b"d"

# KEYS[1] key; ARGV[1] expected value. Compare-and-delete: a replica releases only its own claim.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS[1] key; ARGV[1] expected value, ARGV[2] ttl in ms. Compare-and-expire (lease renewal).
_EXPIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS[1] log stream, KEYS[2] lease; ARGV[1] expected length, ARGV[2] lease holder ('' for an
# unleased log), ARGV[3] lease ms, ARGV[4..] payloads. Returns the new length; -1 if another
# replica holds the lease; -2 if nobody does and the log is not where the writer left it (Redis
# lost it); -100 - length if the log is not at the expected offset. A lease that lapsed with nobody
# taking it over is taken back (the writer was only slow).
_APPEND = """
local n = redis.call('XLEN', KEYS[1])
if ARGV[2] ~= '' then
  local holder = redis.call('GET', KEYS[2])
  if holder ~= ARGV[2] then
    if holder then return -1 end
    if n ~= tonumber(ARGV[1]) then return -2 end
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  end
end
if n ~= tonumber(ARGV[1]) then return -100 - n end
for i = 4, #ARGV do
  n = n + 1
  redis.call('XADD', KEYS[1], '0-' .. n, 'd', ARGV[i])
end
return n
"""
# KEYS[1] state stream, KEYS[2] meta hash; ARGV[1] state, ARGV[2..] field, value pairs for the
# meta hash. Records the state and announces it on the state stream; returns the stream length.
_SET_STATE = """
local fields = {'state', ARGV[1]}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(fields))
local n = redis.call('XLEN', KEYS[1]) + 1
redis.call('XADD', KEYS[1], '0-' .. n, 'state', ARGV[1])
return n
"""


class LogConflict(Exception):
    """A log is not at the offset its writer expected (two writers; the log is left as is)."""


class LogLost(Exception):
    """Redis no longer holds what the writer wrote (it restarted empty, or evicted the log):
    the writer's copy is the only one left."""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str | None:
    """A reply as text (the client returns bytes; ``None`` stays ``None``)."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _offset(entry_id: bytes | str) -> int:
    """The sequence part of a ``0-n`` stream id."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.rpartition("-")[2])


class RedisEventLog:
    """One generation's event log in a Redis Stream. ``length`` is what this process last saw
    (it grows by appends and reads), so a follower learns the length by reading."""

    __slots__ = ("_key", "_lease_key", "_length", "_nbytes", "_store", "lease_holder", "lease_ms")

    #: Every read and append is a round trip: no coroutine-free fast path.
    append_nowait = None
    append_one = None
    read_nowait = None

    def __init__(
        self, store: RedisStore, gen_id: str, lease_holder: str = "", lease: float = 3.0
    ) -> None:
        self._store = store
        self._key = store.log_key(gen_id)
        self._lease_key = store.lease_key(gen_id)
        self._length = 0
        self._nbytes = 0
        #: Appends are fenced by this lease value ('' for none): see :class:`RedisStore`.
        self.lease_holder = lease_holder
        #: The lease an append takes back where it lapsed with nobody taking it over.
        self.lease_ms = _ms(lease)

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append payloads at the offset this writer last saw; return the new length. Raises
        :class:`LeaseLost` if another replica holds the lease, :class:`LogLost` if Redis lost
        the log, and :class:`LogConflict` if the log moved under the writer."""
        if not payloads:
            return self._length
        n: int = await self._store._append(
            keys=[self._key, self._lease_key],
            args=[self._length, self.lease_holder, self.lease_ms, *payloads],
        )
        if n == -1:
            raise LeaseLost(self._key)
        if n == -2:
            raise LogLost(self._key)
        if n < 0:
            held = -100 - n
            raise LogConflict(f"{self._key} holds {held} events, writer expected {self._length}")
        self._length = n
        self._nbytes += sum(map(len, payloads))
        return n

    async def read(self, start: int) -> list[bytes]:
        """Payloads from offset ``start`` on (one ``XRANGE``)."""
        entries: Any = await self._store.redis.xrange(self._key, min=f"0-{start + 1}", max="+")
        if entries:
            self._length = max(self._length, _offset(entries[-1][0]))
        return [fields[_FIELD] for _, fields in entries]

    async def sync(self) -> int:
        """Learn the log's length from Redis (a writer that takes a log over starts here)."""
        self._length = int(await self._store.redis.xlen(self._key))
        return self._length

    @property
    def length(self) -> int:
        """Events appended or read so far, as known to this process."""
        return self._length

    @property
    def nbytes(self) -> int:
        """Payload bytes this process appended (what its share of the kept memory is)."""
        return self._nbytes


class ReplicatedLog:
    """A log in Redis with a copy in this process: subscribers here read the copy without a
    round trip, other replicas read Redis.

    The writer appends to Redis first (fenced by its lease) and then to the copy, so nothing
    reaches a subscriber here that the other replicas cannot read. A follower copies what another
    replica wrote with :meth:`pull`. If Redis fails under the writer, the log is *detached*: it
    goes on in this process alone (its subscribers here lose nothing) and ``detached`` says so.
    """

    __slots__ = ("detached", "local", "on_detach", "remote")

    #: Writes need a round trip to Redis.
    append_nowait = None
    append_one = None

    def __init__(self, remote: RedisEventLog) -> None:
        self.remote = remote
        self.local = MemoryEventLog()
        #: Redis failed under an append; the log goes on in this process only.
        self.detached = False
        #: Told why the log detached (the replica's Redis failure policy starts there).
        self.on_detach: Callable[[BaseException], None] | None = None

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append to Redis, then to the copy; return the new length. :class:`LeaseLost`
        propagates (another replica writes this log now); a Redis failure detaches the log."""
        if not self.detached:
            try:
                await self.remote.append(payloads)
            except (RedisError, OSError, LogLost) as exc:
                log.warning("redis failed under a log append (%r); going on locally", exc)
                self.detached = True
                if self.on_detach is not None:
                    self.on_detach(exc)
        return self.local.append_nowait(payloads)

    async def read(self, start: int) -> list[bytes]:
        """Payloads from ``start`` on, from the copy."""
        return self.local.read_nowait(start)

    def read_nowait(self, start: int) -> list[bytes]:
        """Payloads from ``start`` on, from the copy, without a coroutine."""
        return self.local.read_nowait(start)

    async def pull(self) -> list[bytes]:
        """Copy what Redis holds past the copy's end; return the new payloads."""
        new = await self.remote.read(self.local.length)
        if new:
            self.local.append_nowait(new)
        return new

    async def take_over(self, lease_holder: str) -> int:
        """Become the writer (after winning the lease): copy the whole log, fence appends
        with ``lease_holder``, and return the length."""
        await self.pull()
        self.remote.lease_holder = lease_holder
        return await self.remote.sync()

    @property
    def length(self) -> int:
        """Events in the copy."""
        return self.local.length

    @property
    def nbytes(self) -> int:
        """Bytes the copy holds."""
        return self.local.nbytes


class RedisStore:
    """:class:`~.store.Store` in Redis (see the module). ``url`` is a ``redis://`` URL.

    Every method is one round trip (a command, a script or a pipeline). Redis errors
    (:class:`redis.exceptions.RedisError`, connection errors included) propagate: what to do when
    Redis is away is the registry's policy, not the store's.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 5.0,
    ) -> None:
        self.url = url
        self.prefix = prefix
        #: Unique per store object: the lease value of generations this replica runs.
        self.replica_id = os.urandom(6).hex()
        self.redis: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._release = self.redis.register_script(_RELEASE)
        self._expire = self.redis.register_script(_EXPIRE)
        self._append = self.redis.register_script(_APPEND)
        self._set_state = self.redis.register_script(_SET_STATE)
        self._tail = _Tail(self)

    # -- key names ------------------------------------------------------------------------------

    def claim_key(self, key: str) -> str:
        """Redis key of a claim."""
        return f"{self.prefix}k:{key}"

    def log_key(self, gen_id: str) -> str:
        """Redis key of a generation's event log."""
        return f"{self.prefix}{{{gen_id}}}:log"

    def state_key(self, gen_id: str) -> str:
        """Redis key of a generation's state stream."""
        return f"{self.prefix}{{{gen_id}}}:state"

    def meta_key(self, gen_id: str) -> str:
        """Redis key of a generation's metadata hash."""
        return f"{self.prefix}{{{gen_id}}}:meta"

    def lease_key(self, gen_id: str) -> str:
        """Redis key of a generation's lease."""
        return f"{self.prefix}{{{gen_id}}}:lease"

    def presence_key(self, gen_id: str) -> str:
        """Redis key of the replicas that have subscribers of a generation (a sorted set
        scored by when each presence lapses)."""
        return f"{self.prefix}{{{gen_id}}}:subs"

    def fingerprint_key(self, tenant: str, fingerprint: bytes) -> str:
        """Redis key of the unkeyed-retry index entry of ``(tenant, fingerprint)``."""
        return f"{self.prefix}fp:{tenant}:{fingerprint.hex()}"

    # -- claims (Store) -------------------------------------------------------------------------

    async def claim(self, key: str, gen_id: str, ttl: float | None = None) -> str | None:
        """``SET key gen_id NX [PX ttl]``; the current owner if the key was taken."""
        name = self.claim_key(key)
        while True:
            if await self.redis.set(name, gen_id, nx=True, px=None if ttl is None else _ms(ttl)):
                return None
            current = _text(await self.redis.get(name))
            if current is not None:
                return current
            # The owner's key lapsed between the two commands: try again.

    async def owner(self, key: str) -> str | None:
        """The generation that owns ``key``, if any."""
        return _text(await self.redis.get(self.claim_key(key)))

    async def release(self, key: str, gen_id: str) -> None:
        """Compare-and-delete."""
        await self._release(keys=[self.claim_key(key)], args=[gen_id])

    async def expire(self, key: str, gen_id: str, ttl: float) -> None:
        """Compare-and-expire."""
        await self._expire(keys=[self.claim_key(key)], args=[gen_id, _ms(ttl)])

    # -- logs (Store) ---------------------------------------------------------------------------

    def log(self, gen_id: str, lease_holder: str = "", lease: float = 3.0) -> RedisEventLog:
        """A handle on the log of ``gen_id``; appends are fenced by ``lease_holder`` where
        given (a lease of ``lease`` seconds)."""
        return RedisEventLog(self, gen_id, lease_holder, lease)

    def replicated_log(self, gen_id: str, *, writer: bool, lease: float = 3.0) -> ReplicatedLog:
        """The log of ``gen_id`` with a copy here; a ``writer``'s appends are fenced by this
        replica's lease (of ``lease`` seconds)."""
        return ReplicatedLog(self.log(gen_id, self.replica_id if writer else "", lease))

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
        return bool(await self.redis.set(name, self.replica_id, nx=True, px=_ms(ttl)))

    async def lease_holder(self, gen_id: str) -> str | None:
        """The replica that runs ``gen_id``, if its lease is live."""
        return _text(await self.redis.get(self.lease_key(gen_id)))

    async def renew_leases(self, gen_ids: Iterable[str], ttl: float) -> list[str]:
        """Extend this replica's leases on ``gen_ids`` by ``ttl`` (one pipeline); return the
        ids whose lease was no longer this replica's."""
        ids = list(gen_ids)
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for gen_id in ids:
                await self._expire(
                    keys=[self.lease_key(gen_id)], args=[self.replica_id, _ms(ttl)], client=pipe
                )
            results = await pipe.execute()
        return [gen_id for gen_id, ok in zip(ids, results, strict=True) if not ok]

    async def release_lease(self, gen_id: str) -> None:
        """Give up the lease on ``gen_id`` if this replica holds it."""
        await self._release(keys=[self.lease_key(gen_id)], args=[self.replica_id])

    # -- generation metadata and state ----------------------------------------------------------

    async def put_generation(
        self, gen_id: str, fields: Mapping[str, bytes | str | int], ttl: float
    ) -> None:
        """Record what another replica needs to attach to or take over ``gen_id`` (request,
        fingerprint, state); the record lapses after ``ttl`` unless extended."""
        async with self.redis.pipeline(transaction=True) as pipe:
            mapping: dict[Any, Any] = dict(fields)
            pipe.hset(self.meta_key(gen_id), mapping=mapping)
            pipe.pexpire(self.meta_key(gen_id), _ms(ttl))
            await pipe.execute()

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
        args: list[bytes | str | int] = [state]
        for name, value in (fields or {}).items():
            args += [name, value]
        result = await self._set_state(
            keys=[self.state_key(gen_id), self.meta_key(gen_id)], args=args
        )
        return int(result)

    async def state_changes(self, gen_id: str) -> int:
        """How many state changes ``gen_id`` has had (what :meth:`wait` compares against)."""
        return int(await self.redis.xlen(self.state_key(gen_id)))

    async def expire_generation(self, gen_id: str, ttl: float) -> None:
        """Let every key of ``gen_id`` lapse ``ttl`` seconds from now (a finished generation is
        kept for replay that long)."""
        ms = _ms(ttl)
        async with self.redis.pipeline(transaction=False) as pipe:
            for name in (self.log_key(gen_id), self.state_key(gen_id), self.meta_key(gen_id)):
                pipe.pexpire(name, ms)
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
                pipe.pexpire(self.presence_key(gen_id), _ms(ttl))
            await pipe.execute()

    async def clear_presence(self, gen_id: str) -> None:
        """This replica has no subscriber of ``gen_id`` any more."""
        await self.redis.zrem(self.presence_key(gen_id), self.replica_id)

    async def remote_subscribers(self, gen_id: str) -> int:
        """How many other replicas say they have subscribers of ``gen_id`` now."""
        now = int(time.time() * 1000)
        members: Any = await self.redis.zrangebyscore(self.presence_key(gen_id), now, "+inf")
        return sum(1 for m in members if _text(m) != self.replica_id)

    async def heartbeat(self, ttl: float) -> int:
        """Say this replica is alive for ``ttl`` seconds; return how many replicas are (one
        pipeline on a sorted set scored by when each heartbeat lapses)."""
        now = int(time.time() * 1000)
        key = f"{self.prefix}replicas"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {self.replica_id: now + _ms(ttl)})
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.zcard(key)
            results = await pipe.execute()
        return int(results[-1])

    # -- the unkeyed-retry index ----------------------------------------------------------------

    async def index_fingerprint(
        self, tenant: str, fingerprint: bytes, gen_id: str, ttl: float
    ) -> None:
        """Make ``gen_id`` the newest generation with this body for ``tenant``."""
        await self.redis.set(self.fingerprint_key(tenant, fingerprint), gen_id, px=_ms(ttl))

    async def find_fingerprint(self, tenant: str, fingerprint: bytes) -> str | None:
        """The newest generation with this body for ``tenant``, if any."""
        return _text(await self.redis.get(self.fingerprint_key(tenant, fingerprint)))

    async def unindex_fingerprint(self, tenant: str, fingerprint: bytes, gen_id: str) -> None:
        """Drop the index entry if it still names ``gen_id`` (compare-and-delete)."""
        await self._release(keys=[self.fingerprint_key(tenant, fingerprint)], args=[gen_id])

    async def expire_fingerprint(
        self, tenant: str, fingerprint: bytes, gen_id: str, ttl: float
    ) -> None:
        """Let the index entry lapse after ``ttl`` if it still names ``gen_id``."""
        await self._expire(
            keys=[self.fingerprint_key(tenant, fingerprint)], args=[gen_id, _ms(ttl)]
        )

    # -- following another replica's generation -------------------------------------------------

    async def wait(self, gen_id: str, length: int, state_changes: int, max_wait: float) -> bool:
        """Wait until the log of ``gen_id`` holds more than ``length`` events or it had more
        than ``state_changes`` state changes; ``False`` if ``max_wait`` seconds passed first.
        Spurious wake-ups are allowed (the caller re-reads)."""
        return await self._tail.wait(gen_id, length, state_changes, max_wait)

    # -- lifecycle ------------------------------------------------------------------------------

    async def ping(self) -> bool:
        """True if Redis answers."""
        try:
            return bool(await self.redis.ping())
        except (RedisError, OSError):
            return False

    async def used_memory(self) -> int | None:
        """Bytes Redis uses (``INFO memory``), for fleet-level figures; ``None`` if unknown."""
        try:
            info = await self.redis.info("memory")
        except (RedisError, OSError):
            return None
        value = info.get("used_memory")
        return int(value) if value is not None else None

    async def close(self) -> None:
        """Stop following and close the connections."""
        await self._tail.close()
        await self.redis.aclose()


class _Tail:
    """One ``XREAD BLOCK`` over every followed stream, on its own connection.

    A waiter names a stream and the last entry it has seen; the loop blocks on all followed
    streams at once (each from the lowest cursor any waiter holds) plus a nudge stream of its
    own, and resolves the waiters whose stream moved past their cursor. A waiter that needs a
    stream the blocked read does not cover yet writes to the nudge stream, which ends the block
    so the next read includes it. The loop starts with the first waiter and runs until
    :meth:`close`.
    """

    #: Longest single block (ms): bounds how long a lost wake-up could delay a follower.
    BLOCK_MS = 2000

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._nudge_key = f"{store.prefix}nudge:{store.replica_id}"
        self._nudge_seen = "0-0"
        self._waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self._reading: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._redis: aioredis.Redis | None = None

    async def wait(self, gen_id: str, length: int, state_changes: int, max_wait: float) -> bool:
        store = self._store
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        entries = ((store.log_key(gen_id), length), (store.state_key(gen_id), state_changes))
        nudge = False
        for key, cursor in entries:
            self._waiters.setdefault(key, []).append((cursor, fut))
            reading = self._reading.get(key)
            nudge = nudge or reading is None or reading > cursor
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="redis-tail")
        elif nudge:
            await store.redis.xadd(self._nudge_key, {"n": 1}, maxlen=1, approximate=False)
        try:
            async with asyncio.timeout(max_wait):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            for key, _ in entries:
                self._drop(key, fut)

    def _drop(self, key: str, fut: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(key)
        if waiters is None:
            return
        waiters[:] = [w for w in waiters if w[1] is not fut]
        if not waiters:
            del self._waiters[key]

    async def _run(self) -> None:
        # A blocking read holds its connection, so the tail has a client of its own.
        self._redis = redis_ = aioredis.Redis.from_url(
            self._store.url, socket_timeout=self.BLOCK_MS / 1000 + 5
        )
        failures = 0
        try:
            while True:  # until close(): a waiter never finds the loop on its way out
                streams: dict[Any, Any] = {self._nudge_key: self._nudge_seen}
                for key, waiters in self._waiters.items():
                    streams[key] = f"0-{min(c for c, _ in waiters)}"
                self._reading = {k: _offset(v) for k, v in streams.items() if k != self._nudge_key}
                try:
                    result: Any = await redis_.xread(streams, block=self.BLOCK_MS)
                    failures = 0
                except (RedisError, OSError) as exc:
                    # Wake everyone (they re-read and see the error themselves), then back off.
                    failures += 1
                    log.warning("redis tail: %s", exc)
                    self._wake_all()
                    await asyncio.sleep(min(1.0, 0.05 * 2**failures))
                    continue
                for raw_key, entries in result or ():
                    name = _text(raw_key)
                    last = entries[-1][0]
                    if name == self._nudge_key:
                        self._nudge_seen = _text(last) or "0-0"
                    elif name is not None:
                        self._wake(name, _offset(last))
        finally:
            self._reading = {}
            self._redis = None
            with contextlib.suppress(RedisError, OSError):
                await redis_.aclose()

    def _wake(self, key: str, upto: int) -> None:
        waiters = self._waiters.get(key)
        if not waiters:
            return
        for cursor, fut in waiters:
            if cursor < upto and not fut.done():
                fut.set_result(None)

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for _, fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def close(self) -> None:
        self._wake_all()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
