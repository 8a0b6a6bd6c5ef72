"""The gateway's Redis client honours the cancellation of the task awaiting a command, even where
redis-py lets a command return after the task was cancelled (seen under load on the relay's log
appends: a replica shutting down waited for an answer to end instead of handing it over); and
the cluster client a ``redis+cluster://`` URL makes, built without connecting."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection

from streamsafe._redis_url import parse_redis_url
from streamsafe.gateway.replicas.redis_client import (
    CancelSafeRedis,
    CancelSafeRedisCluster,
    connect,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _swallowing(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """redis-py's command path, made to lose a cancellation that arrives while it waits for the
    server (as it did, nondeterministically), answering ``b"OK"`` all the same."""
    started = asyncio.Event()

    async def execute_command(self: aioredis.Redis, *args: Any, **options: Any) -> Any:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):  # lost: the task never sees it
            await asyncio.sleep(10)
        return b"OK"

    monkeypatch.setattr(aioredis.Redis, "execute_command", execute_command)
    return started


@pytest.mark.parametrize("cls", [aioredis.Redis, CancelSafeRedis])
def test_a_cancellation_lost_inside_a_command_is_raised(
    monkeypatch: pytest.MonkeyPatch, cls: type[aioredis.Redis]
) -> None:
    async def run() -> bool:
        started = _swallowing(monkeypatch)
        client = cls.from_url("redis://127.0.0.1:1/0")
        task = asyncio.create_task(client.set("k", "v"))
        await started.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    cancelled = asyncio.run(run())
    # The plain client shows the failure this guards against; ours raises the cancellation.
    assert cancelled is (cls is CancelSafeRedis)


def test_a_command_that_completes_returns_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    async def execute_command(self: aioredis.Redis, *args: Any, **options: Any) -> Any:
        await asyncio.sleep(0)
        return b"OK"

    monkeypatch.setattr(aioredis.Redis, "execute_command", execute_command)

    async def run() -> Any:
        return await CancelSafeRedis.from_url("redis://127.0.0.1:1/0").set("k", "v")

    assert asyncio.run(run()) == b"OK"  # what the command answered, untouched


def test_a_cluster_url_makes_a_cluster_client_with_the_urls_tls_and_credentials() -> None:
    url = "rediss+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001?ssl_ca_certs=/ca.pem"
    client = connect(parse_redis_url(url), socket_timeout=1.0)  # connects at its first command
    assert isinstance(client, CancelSafeRedisCluster)
    nodes = client.nodes_manager
    assert sorted(nodes.startup_nodes) == ["127.0.0.1:7000", "127.0.0.1:7001"]
    options = nodes.connection_kwargs
    # TLS, on connections checked as they are taken (the server may have closed them).
    assert issubclass(options["connection_class"], SSLConnection)
    assert options["connection_class"] is not SSLConnection
    assert (options["ssl_ca_certs"], options["password"], options["socket_timeout"]) == (
        "/ca.pem",
        "pw",
        1.0,
    )
    # A command that fails is not sent again (the failure policy decides), and a node takes
    # as many commands in flight as come.
    assert client.retry.get_retries() == 0
    assert all(node.max_connections == 2**31 for node in nodes.startup_nodes.values())


def test_the_redis_py_internals_the_cluster_client_borrows_are_where_it_takes_them() -> None:
    # CancelSafeRedisCluster replaces redis-py's private redirection loop and reads its private
    # state: a redis-py that moved any of it must fail here, not under a slot migration.
    import inspect

    from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster

    assert "_execute_command" in inspect.getsource(RedisCluster.execute_command)
    assert list(inspect.signature(RedisCluster._execute_command).parameters)[:2] == [
        "self",
        "target_node",
    ]
    assert "self._initialize" in inspect.getsource(RedisCluster.__init__)
    assert isinstance(RedisCluster.RedisClusterRequestTTL, int)
    for name in ("move_slot", "get_node_from_slot", "move_node_to_end_of_cached_nodes"):
        assert callable(getattr(NodesManager, name)), name
    for name in (
        "acquire_connection",
        "release",
        "disconnect_if_needed",
        "parse_response",
        "execute_command",
        "update_active_connections_for_reconnect",
        "disconnect_free_connections",
    ):
        assert callable(getattr(ClusterNode, name)), name
    # A node's connection is checked as it is taken: redis-py asks should_reconnect() there,
    # and the check reads the connection's reader and reconnect flag.
    assert "disconnect_if_needed" in inspect.getsource(ClusterNode.execute_command)
    assert "should_reconnect" in inspect.getsource(ClusterNode.disconnect_if_needed)
    assert "self.connection_kwargs" in inspect.getsource(NodesManager.initialize)


def test_a_pooled_connection_is_checked_before_a_command_goes_on_it() -> None:
    # redis-py checks a pooled connection (data left, or closed by the server) only where its
    # maintenance notifications are off: the pools connect() makes have them off.
    import inspect

    from redis.asyncio.connection import ConnectionPool

    source = inspect.getsource(ConnectionPool.ensure_connection)
    assert "can_read" in source and "maint_notifications_enabled" in source
    for url in ("redis://127.0.0.1:1/0", "unix:///tmp/redis.sock", "rediss://127.0.0.1:1/0"):
        pool = connect(parse_redis_url(url)).connection_pool
        assert not pool.maint_notifications_enabled(), url
    cluster = connect(parse_redis_url("redis+cluster://127.0.0.1:7000"))
    assert not cluster.maint_notifications_config.enabled
    conn = cluster.nodes_manager.connection_kwargs["connection_class"](host="127.0.0.1", port=1)
    assert conn.should_reconnect() is False  # not connected: nothing to check yet
    assert conn._reader is None and conn._should_reconnect is False
