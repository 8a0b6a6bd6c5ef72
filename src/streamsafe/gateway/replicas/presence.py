"""Which replicas are alive, and which read what (see
:mod:`~streamsafe.gateway.replicas.store_redis`): each replica's heartbeat, and its presence as a
reader of generations other replicas run.

A mirror says in Redis that it has subscribers of a generation (a sorted set per generation,
scored by when each replica's presence lapses), so the owner does not abort a generation nobody
reads *on the owner*. The heartbeats are one sorted set scored the same way, gone with the last
replica; how many are live is the fleet's size as the replicas see it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from streamsafe.gateway.replicas.redis_client import RedisClient
from streamsafe.gateway.replicas.redis_keys import KeyLayout
from streamsafe.gateway.replicas.redis_scripts import Scripts, ms, text

__all__ = ["Presence"]


class Presence:
    """This replica's heartbeat and presence (see the module), in ``redis`` under the key names
    of ``keys``, as ``replica_id``. Every method is one round trip."""

    def __init__(
        self, redis: RedisClient, scripts: Scripts, keys: KeyLayout, replica_id: str
    ) -> None:
        self.redis = redis
        self._scripts = scripts
        self.keys = keys
        self.replica_id = replica_id

    async def announce(self, gen_ids: Iterable[str], ttl: float) -> None:
        """Say that this replica has subscribers of ``gen_ids`` for the next ``ttl`` seconds
        (one pipeline), so their owner does not abort them as abandoned."""
        ids = list(gen_ids)
        if not ids:
            return
        until = int((time.time() + ttl) * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            for gen_id in ids:
                pipe.zadd(self.keys.presence_key(gen_id), {self.replica_id: until})
                pipe.pexpire(self.keys.presence_key(gen_id), ms(ttl))
            await pipe.execute()

    async def withdraw(self, gen_id: str) -> None:
        """This replica has no subscriber of ``gen_id`` any more."""
        await self.redis.zrem(self.keys.presence_key(gen_id), self.replica_id)

    async def remote_subscribers(self, gen_id: str) -> int:
        """How many other replicas say they have subscribers of ``gen_id`` now."""
        now = int(time.time() * 1000)
        name = self.keys.presence_key(gen_id)
        members: Any = await self.redis.zrangebyscore(name, now, "+inf")
        return sum(1 for m in members if text(m) != self.replica_id)

    async def heartbeat(self, ttl: float) -> int:
        """Say this replica is alive for ``ttl`` seconds; return how many replicas are (one
        script on a sorted set scored by when each heartbeat lapses, gone with the last
        replica)."""
        now = int(time.time() * 1000)
        return await self._scripts.heartbeat(self.keys.heartbeat_key(), self.replica_id, now, ttl)
