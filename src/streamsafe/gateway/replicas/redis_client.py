"""The Redis client the gateway uses: redis-py's asyncio client, made to honour cancellation,
connected where a parsed ``--redis`` URL says (:func:`connect`: one node, the primary a
Sentinel group names, found again after a failover, or a Redis Cluster).

redis-py 8.1 can swallow the cancellation of the task awaiting a command: the command returns
its result and the task goes on as if never cancelled (seen on the relay's log appends, under
load: a replica shutting down cancelled its readers, and a reader went on relaying until its
answer ended, so the shutdown waited for it and never handed the generation over). A command
that returns while its task's cancellation is pending raises it here instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from streamsafe._redis_url import RedisTarget

__all__ = ["CancelSafeRedis", "CancelSafeRedisCluster", "RedisClient", "connect"]


class CancelSafeRedis(aioredis.Redis):
    """``redis.asyncio.Redis`` whose commands never swallow their task's cancellation."""

    #: Clients closed with this one (the sentinels a Sentinel-managed client asks).
    companions: tuple[aioredis.Redis, ...] = ()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        task = asyncio.current_task()
        before = task.cancelling() if task is not None else 0
        result = await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError  # requested while the command ran, and lost in it
        return result

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for other in self.companions:
            await other.aclose()


class CancelSafeRedisCluster(RedisCluster):
    """``redis.asyncio.cluster.RedisCluster`` whose commands never swallow their task's
    cancellation (as :class:`CancelSafeRedis`)."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        task = asyncio.current_task()
        before = task.cancelling() if task is not None else 0
        result = await super().execute_command(*args, **options)
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError
        return result


#: What :func:`connect` returns: the two share the commands the store uses (a cluster routes
#: each by its keys' slot, following MOVED and ASK redirections).
RedisClient = CancelSafeRedis | CancelSafeRedisCluster


def connect(target: RedisTarget, **options: Any) -> RedisClient:
    """A client of the Redis ``target`` names, with ``options`` (timeouts) added. With
    sentinels, a client of the primary they name for the service: each new connection asks
    them where it is, so after a failover the client reaches the promoted replica (the
    sentinels get the socket and TLS options, not the data nodes' credentials). With a
    cluster, a client of every primary, that learns the slots' layout from the first of the
    given nodes that answers and again after a node fails or a slot moves."""
    merged = {**target.options, **options}
    if target.cluster:
        nodes = [ClusterNode(host, port) for host, port in target.cluster]
        # No retry after a failed command (the retry count also bounds the reconnections):
        # a node that is away fails at once, as one Redis does, and the replicas' failure
        # policy decides what then; the client learns the layout anew at the next command.
        # Redirections (MOVED, ASK, TRYAGAIN while a slot migrates) are followed regardless.
        return CancelSafeRedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **merged)
    if not target.sentinels:
        # A pool of our own, as redis-py's from_url makes one: the client's constructor would
        # add its own retries (10, backing off), and a Redis that is away must fail at once
        # (the replicas' failure policy decides what then).
        connection_class: type[AbstractConnection] = Connection
        if "unix_socket_path" in merged:
            merged["path"] = merged.pop("unix_socket_path")
            connection_class = UnixDomainSocketConnection
        elif merged.pop("ssl", False):
            connection_class = SSLConnection
        alone = CancelSafeRedis(connection_pool=ConnectionPool(connection_class, **merged))
        alone.auto_close_connection_pool = True
        return alone
    assert target.service is not None
    own = {k: v for k, v in merged.items() if k.startswith(("socket_", "ssl"))}
    own["retry"] = Retry(NoBackoff(), 0)  # a sentinel that is away: ask the next one at once
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=own, **merged)  # type: ignore[no-untyped-call]
    client: CancelSafeRedis = sentinel.master_for(target.service, redis_class=CancelSafeRedis)
    client.companions = tuple(sentinel.sentinels)
    return client
