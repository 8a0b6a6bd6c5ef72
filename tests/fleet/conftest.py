"""Fleet test fixtures: a real redis-server for the session, a private one for a test that kills
it, and stores with a key prefix of their own so tests never see each other's keys."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fleet_helpers import RedisProcess, redis_binary

from streamsafe.gateway.replicas.store_redis import RedisStore


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """A redis-server shared by the session's tests (do not kill it: use ``own_redis``)."""
    server = RedisProcess(redis_binary()).start()
    yield server
    server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    """A redis-server for one test, which may kill and restart it."""
    server = RedisProcess(redis_binary()).start()
    yield server
    server.stop()


@pytest.fixture
async def make_store(
    redis_server: RedisProcess,
) -> AsyncIterator[Callable[..., RedisStore]]:
    """make_store(url=None, secret=None) -> a RedisStore under this test's own prefix (one
    replica each), sealing with ``secret`` where given."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    stores: list[RedisStore] = []

    def _make(url: str | None = None, secret: str | None = None) -> RedisStore:
        store = RedisStore(url or redis_server.url, prefix=prefix, secret=secret)
        stores.append(store)
        return store

    yield _make
    for store in stores:
        await store.close()
