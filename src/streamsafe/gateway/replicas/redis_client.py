"""The Redis client the gateway uses: redis-py's asyncio client, made to honour cancellation,
connected where a parsed ``--redis`` URL says (:func:`connect`: one node, the primary a
Sentinel group names, found again after a failover, or a Redis Cluster).

redis-py 8.1 can swallow the cancellation of the task awaiting a command: the command returns
its result and the task goes on as if never cancelled (seen on the relay's log appends, under
load: a replica shutting down cancelled its readers, and a reader went on relaying until its
answer ended, so the shutdown waited for it and never handed the generation over). A command
that returns while its task's cancellation is pending raises it here instead.

A pooled connection the server closed (Redis restarted, a Sentinel failover, the server's idle
``timeout``) is connected anew before a command goes on it. redis-py checks that only where its
maintenance notifications are off, and they are on by default with RESP3 (``"auto"``): a
replica's next command after a Redis restart failed, the replica counted an outage, and a keyed
retry that came in that moment ran a second generation (a restart is lost state, met by the
fleet's marker, not an outage). The gateway uses no maintenance notifications (a Redis
Enterprise feature), so they are off here, and a cluster node's connections, which redis-py
never checks, are checked as they are taken (:class:`_CheckedConnection`).
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
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.maint_notifications import MaintNotificationsConfig

from streamsafe._redis_url import RedisTarget

__all__ = ["CancelSafeRedis", "CancelSafeRedisCluster", "RedisClient", "connect"]

#: Maintenance notifications off: redis-py then checks a pooled connection before a command
#: goes on it, and connects anew one the server closed (see the module).
_NO_MAINTENANCE = MaintNotificationsConfig(enabled=False)


class _Checked(AbstractConnection):
    """A cluster node's connection, connected anew as it is taken (redis-py asks
    :meth:`should_reconnect` then) where the server closed it meanwhile."""

    def should_reconnect(self) -> bool:
        reader = self._reader  # the socket's StreamReader, None until connected
        return bool(self._should_reconnect) or (reader is not None and reader.at_eof())


class _CheckedConnection(_Checked, Connection):
    """:class:`_Checked` over TCP."""


class _CheckedSSLConnection(_Checked, SSLConnection):
    """:class:`_Checked` over TLS."""


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
    cancellation (as :class:`CancelSafeRedis`), and that follows a redirection while a slot
    moves on one connection (:meth:`_execute_command`)."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        task = asyncio.current_task()
        before = task.cancelling() if task is not None else 0
        if self._initialize:
            # redis-py 8.1 learns the layout under a lock, but commands sent while it first
            # does so failed (connection lost, 14 of 20 concurrent reads): they wait for it here.
            await self.initialize()
        result = await super().execute_command(*args, **options)
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError
        return result

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        """One command on the node that holds its slot, following redirections while the slot
        moves (redis-py's own loop, with its ways that broke under concurrent commands left
        out). An ``ASK`` (the key moved to the node importing the slot) sends ``ASKING`` and
        the command together on one connection: redis-py sent them on two pooled connections,
        so the command went without it (and bounced back as ``MOVED`` until it gave up) while
        another command got the stale ``ASKING``, which makes the importing node answer for a
        key it does not hold yet (a lease found free, a log found empty). A ``MOVED`` updates
        that slot's node and never closes every connection; ``TRYAGAIN`` (a command's keys
        split between the two nodes mid-move) is asked again shortly; a lost node is
        learned anew at the next command, as redis-py does."""
        asking = False
        for _ in range(self.RedisClusterRequestTTL):
            try:
                if asking:
                    return await _asked(target_node, *args, **kwargs)
                return await target_node.execute_command(*args, **kwargs)
            except MovedError as e:  # before AskError, which it is a kind of
                await self.nodes_manager.move_slot(e)
                target_node = self.nodes_manager.get_node_from_slot(e.slot_id)
                asking = False
            except AskError as e:
                found = self.get_node(host=e.host, port=e.port)
                if found is None:  # a node it does not know: learn the layout anew
                    self._initialize = True
                    raise
                target_node, asking = found, True
            except TryAgainError:
                await asyncio.sleep(_TRY_AGAIN_S)
            except (RedisConnectionError, RedisTimeoutError):
                target_node.update_active_connections_for_reconnect()
                await target_node.disconnect_free_connections()
                self.nodes_manager.move_node_to_end_of_cached_nodes(target_node.name)
                self._initialize = True
                raise
            except (ClusterDownError, SlotNotCoveredError):
                self._initialize = True  # a failover under way: learn the layout anew
                raise
        raise ClusterError("TTL exhausted.")


async def _asked(node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
    """``ASKING`` and the command, pipelined on one connection of ``node``."""
    connection = node.acquire_connection()
    try:
        await node.disconnect_if_needed(connection)
        await connection.send_packed_command(connection.pack_commands([("ASKING",), args]))
        try:
            await connection.read_response()
        except ResponseError:
            await node.parse_response(connection, args[0], **kwargs)  # read, and dropped
            raise
        return await node.parse_response(connection, args[0], **kwargs)
    except ResponseError:
        raise  # a reply, read whole: the connection is fine
    except BaseException:
        await connection.disconnect()  # its replies may be half read
        raise
    finally:
        node.release(connection)


#: Seconds between two tries of a command whose keys are split between two nodes while their
#: slot moves (16 tries in all, as redis-py makes).
_TRY_AGAIN_S = 0.02


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
        # Redirections (MOVED, ASK, TRYAGAIN while a slot migrates) are followed regardless;
        # a MOVED updates where that slot is, and never closes every connection to learn the
        # whole layout again (reinitialize_steps=0): redis-py did so at every fifth, and the
        # commands in flight meanwhile, the blocked reads among them, failed.
        # No cap on a node's connections, as one Redis's pool has none: redis-py's 100 refused
        # the 101st command in flight to a node (MaxConnectionsError), a hundred streams'
        # appends at once.
        cluster = CancelSafeRedisCluster(
            startup_nodes=nodes,
            retry=Retry(NoBackoff(), 0),
            reinitialize_steps=0,
            max_connections=2**31,
            maint_notifications_config=_NO_MAINTENANCE,
            **merged,
        )
        # The nodes it learns (the given ones too, made anew as it first learns the layout)
        # take connections that are checked as they are taken (see the module).
        kwargs = cluster.nodes_manager.connection_kwargs
        tls = kwargs.get("connection_class") is SSLConnection
        kwargs["connection_class"] = _CheckedSSLConnection if tls else _CheckedConnection
        return cluster
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
        pool = ConnectionPool(
            connection_class, maint_notifications_config=_NO_MAINTENANCE, **merged
        )
        alone = CancelSafeRedis(connection_pool=pool)
        alone.auto_close_connection_pool = True
        return alone
    assert target.service is not None
    own = {k: v for k, v in merged.items() if k.startswith(("socket_", "ssl"))}
    own["retry"] = Retry(NoBackoff(), 0)  # a sentinel that is away: ask the next one at once
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=own, **merged)  # type: ignore[no-untyped-call]
    client: CancelSafeRedis = sentinel.master_for(
        target.service, redis_class=CancelSafeRedis, maint_notifications_config=_NO_MAINTENANCE
    )
    client.companions = tuple(sentinel.sentinels)
    return client
