"""The Lua scripts of the Redis store, and the conversions of what goes to Redis and comes back.

Each script is one round trip that compares before it writes, so a replica never drops, extends
or appends to what another one owns. Every key a script names is in one hash slot (their names'
hash tags, :mod:`~streamsafe.gateway.replicas.redis_keys`), as a Redis Cluster requires.
:class:`Scripts` registers them on one client and calls them with named arguments instead of
``KEYS``/``ARGV`` lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline

from streamsafe.gateway.replicas.redis_client import RedisClient

__all__ = [
    "APPEND",
    "CLAIM",
    "EXPIRE",
    "FLEET",
    "HEARTBEAT",
    "PUT_RECORD",
    "RELEASE",
    "SET_STATE",
    "Scripts",
    "entry_offset",
    "ms",
    "text",
]

# KEYS[1] key; ARGV[1] expected value. Compare-and-delete: a replica releases only its own claim.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS[1] claim, KEYS[2] the fleet's marker; ARGV[1] generation id, ARGV[2] ttl in ms (0: none),
# ARGV[3] the fleet epoch the replica knows. {1} where the claim is the replica's now, {0, owner}
# where another generation holds it, {-1, epoch now ('' for none)} where the marker is not the
# one the replica knows: Redis lost the fleet's state (flushed, restarted empty), and a key free
# now may be one a replica still holds (nothing is claimed then).
CLAIM = """
local epoch = redis.call('HGET', KEYS[2], 'epoch')
if epoch ~= ARGV[3] then return {-1, epoch or ''} end
local set
if ARGV[2] == '0' then
  set = redis.call('SET', KEYS[1], ARGV[1], 'NX')
else
  set = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end
if set then return {1} end
return {0, redis.call('GET', KEYS[1])}
"""
# KEYS[1] the fleet's marker; ARGV[1] a new epoch, ARGV[2] this replica's secret check, ARGV[3]
# ttl in ms. Writes the marker where there is none, renews its lifetime; returns {epoch, check}.
FLEET = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'check', ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('HMGET', KEYS[1], 'epoch', 'check')
"""
# KEYS[1] key; ARGV[1] expected value, ARGV[2] ttl in ms. Compare-and-expire (lease renewal).
EXPIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS[1] log stream, KEYS[2] lease, KEYS[3] state stream, KEYS[4] meta hash; ARGV[1] expected
# length, ARGV[2] lease holder ('' for an unleased log), ARGV[3] lease ms, ARGV[4] ms the log
# lives unless its writer renews it (0: for ever), ARGV[5] the end the batch records ('' for
# none, 'done' or 'failed'), ARGV[6] the entries' field ('d' in clear, 's' sealed), ARGV[7..]
# payloads. Returns the new length; -1 if another replica holds the lease; -2 if nobody does and
# the log is not where the writer left it (Redis lost it); -100 - length if the log is not at the
# expected offset. A lease that lapsed with nobody taking it over is taken back (the writer was
# only slow). The append that creates the log sets its lifetime.
# An append that ends the log with [DONE] records the end in the same step ('failed' where an
# error event comes just before it, else 'done': the writer says which, as a sealed entry tells
# the script nothing), announced on the state stream: a [DONE] a subscriber may have been sent is
# never in Redis without the end on the record, so a replica whose owner died right after it
# never takes the finished answer for a broken one. Only on a record that exists (a log Redis
# lost the record of gets no record without a lifetime).
APPEND = """
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
local created = n == 0
local field = ARGV[6]
for i = 7, #ARGV do
  n = n + 1
  redis.call('XADD', KEYS[1], '0-' .. n, field, ARGV[i])
end
if created and ARGV[4] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
local state = ARGV[5]
if state ~= '' and redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('HSET', KEYS[4], 'state', state)
  redis.call('XADD', KEYS[3], '0-' .. (redis.call('XLEN', KEYS[3]) + 1), 'state', state)
  local ttl = redis.call('PTTL', KEYS[4])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) end
end
return n
"""
# KEYS[1] meta hash; ARGV[1] ttl in ms, ARGV[2..] field, value pairs. Writes the record with its
# lifetime in one step (a script, not a MULTI: redis-py's cluster transactions took an ASK, a
# slot on the move, for a MOVED, and failed).
PUT_RECORD = """
if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
"""
# KEYS[1] the heartbeats (a sorted set); ARGV[1] replica id, ARGV[2] now in ms, ARGV[3] ttl in
# ms. Scores this replica's heartbeat with when it lapses, drops the lapsed ones, lets the set
# lapse with the last replica; returns how many replicas are alive.
HEARTBEAT = """
local now = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('ZCARD', KEYS[1])
"""
# KEYS[1] state stream, KEYS[2] meta hash; ARGV[1] state, ARGV[2..] field, value pairs for the
# meta hash. Records the state and announces it on the state stream; returns the stream length.
SET_STATE = """
local fields = {'state', ARGV[1]}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(fields))
local n = redis.call('XLEN', KEYS[1]) + 1
redis.call('XADD', KEYS[1], '0-' .. n, 'state', ARGV[1])
return n
"""


def ms(seconds: float) -> int:
    """``seconds`` as whole milliseconds, at least 1 (Redis refuses a ``PX`` of 0)."""
    return max(1, int(seconds * 1000))


def text(value: Any) -> str | None:
    """A reply as text (the client returns bytes; ``None`` stays ``None``)."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def entry_offset(entry_id: bytes | str) -> int:
    """The sequence part of a ``0-n`` stream id."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.rpartition("-")[2])


class Scripts:
    """The scripts above, registered on ``redis`` (each call one round trip: ``EVALSHA``, the
    script loaded where a node does not know it), or queued on a pipeline (``EVAL`` with the
    script's text: a pipeline on a cluster goes to several nodes, and one that never ran the
    script, a replica promoted meanwhile, would refuse its hash)."""

    def __init__(self, redis: RedisClient) -> None:
        self._release = redis.register_script(RELEASE)
        self._expire = redis.register_script(EXPIRE)
        self._append = redis.register_script(APPEND)
        self._set_state = redis.register_script(SET_STATE)
        self._claim = redis.register_script(CLAIM)
        self._put_record = redis.register_script(PUT_RECORD)
        self._heartbeat = redis.register_script(HEARTBEAT)

    async def claim(self, key: str, marker: str, gen_id: str, ttl_ms: int, epoch: str) -> Any:
        """:data:`CLAIM`: ``[1]``, ``[0, owner]`` or ``[-1, epoch now]``."""
        return await self._claim(keys=[key, marker], args=[gen_id, ttl_ms, epoch])

    @staticmethod
    def fleet_in(
        pipe: Pipeline | ClusterPipeline, marker: str, epoch: str, check: bytes, ttl: float
    ) -> None:
        """Queue :data:`FLEET` on ``pipe``: its result, ``[epoch, check]`` of the marker
        (written where there was none), comes with the pipeline's."""
        pipe.eval(FLEET, 1, marker, epoch, check, ms(ttl))

    async def put_record(
        self, meta_key: str, fields: Mapping[str, bytes | str | int], ttl: float
    ) -> None:
        """:data:`PUT_RECORD`: ``fields`` into the hash ``meta_key``, lapsing after ``ttl``."""
        args: list[bytes | str | int] = [ms(ttl)]
        for name, value in fields.items():
            args += [name, value]
        await self._put_record(keys=[meta_key], args=args)

    async def heartbeat(self, key: str, replica_id: str, now_ms: int, ttl: float) -> int:
        """:data:`HEARTBEAT`: how many replicas are alive."""
        return int(await self._heartbeat(keys=[key], args=[replica_id, now_ms, ms(ttl)]))

    async def release(self, key: str, value: str) -> int:
        """Delete ``key`` if it holds ``value``; 1 if it did."""
        return int(await self._release(keys=[key], args=[value]))

    async def expire(self, key: str, value: str, ttl: float) -> int:
        """Let ``key`` lapse ``ttl`` seconds from now if it holds ``value``; 1 if it did."""
        return int(await self._expire(keys=[key], args=[value, ms(ttl)]))

    @staticmethod
    def expire_in(pipe: Pipeline | ClusterPipeline, key: str, value: str, ttl: float) -> None:
        """Queue :data:`EXPIRE` on ``pipe`` (its result, 1 where ``key`` held ``value``, comes
        with the pipeline's)."""
        pipe.eval(EXPIRE, 1, key, value, ms(ttl))

    async def append(
        self,
        log_key: str,
        lease_key: str,
        state_key: str,
        meta_key: str,
        expected: int,
        lease_holder: str,
        lease_ms: int,
        keep_ms: int,
        end: str,
        field: bytes,
        payloads: Sequence[bytes],
    ) -> int:
        """:data:`APPEND`: the new length, or the negative code it returns."""
        args: list[bytes | str | int] = [
            expected,
            lease_holder,
            lease_ms,
            keep_ms,
            end,
            field,
            *payloads,
        ]
        keys = [log_key, lease_key, state_key, meta_key]
        return int(await self._append(keys=keys, args=args))

    async def set_state(
        self, state_key: str, meta_key: str, state: str, fields: Mapping[str, bytes | str | int]
    ) -> int:
        """:data:`SET_STATE`: the state stream's new length."""
        args: list[bytes | str | int] = [state]
        for name, value in fields.items():
            args += [name, value]
        return int(await self._set_state(keys=[state_key, meta_key], args=args))
