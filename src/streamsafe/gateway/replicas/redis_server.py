"""The Redis server behind the store, as a whole (see
:mod:`~streamsafe.gateway.replicas.store_redis`): whether it answers, which run of it answers (a
new run id says it restarted, and may have come back empty), and how much memory it uses. What a
lost Redis raises is :data:`REDIS_ERRORS`.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from streamsafe.gateway.replicas.redis_client import RedisClient

__all__ = ["REDIS_ERRORS", "RedisServer"]

#: What a lost Redis raises (connection errors are RedisError; a closed socket may be OSError).
REDIS_ERRORS = (RedisError, OSError)


class RedisServer:
    """The Redis server(s) ``redis`` talks to (see the module): one node, or a cluster's
    primaries together. Each method is one round trip and never raises: an answer it did not
    get is ``False`` or ``None``."""

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis

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
