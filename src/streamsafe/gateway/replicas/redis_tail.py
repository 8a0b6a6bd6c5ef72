"""Following other replicas' generations in Redis: one ``XREAD BLOCK`` over every followed
stream of a bucket (:mod:`~streamsafe.gateway.replicas.redis_keys`), on a client of its own, so
followers cost no connection each. One Redis has one bucket, so one read follows everything; a
Redis Cluster refuses a read across hash slots, so there it is one read per bucket followed (64
at most), each on the node that holds its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import RedisError

from streamsafe.gateway.replicas.redis_client import RedisClient
from streamsafe.gateway.replicas.redis_scripts import entry_offset, text

__all__ = ["RedisTail"]

#: Milliseconds the nudge stream outlives its last nudge (an XREAD blocked on an absent stream
#: simply waits for its next entry).
_NUDGE_TTL_MS = 60_000

log = logging.getLogger("streamsafe.gateway")


class _Bucket:
    """What one bucket's read follows: the waiters of each stream, and where the read in flight
    reads each from."""

    __slots__ = ("nudge_key", "nudge_seen", "reading", "task", "waiters")

    def __init__(self, nudge_key: str) -> None:
        self.nudge_key = nudge_key
        self.nudge_seen = "0-0"
        self.waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self.reading: dict[str, int] = {}
        self.task: asyncio.Task[None] | None = None


class RedisTail:
    """One ``XREAD BLOCK`` per bucket over every followed stream of it, on a client of its own.

    A waiter names a bucket, streams of that bucket and the last entry it has seen of each; the
    bucket's loop blocks on all its followed streams at once (each from the lowest cursor any
    waiter holds) plus a nudge stream of its own in that bucket, and resolves the waiters whose
    stream moved past their cursor. A waiter that needs a stream the blocked read does not cover
    yet writes to the nudge stream, which ends the block so the next read includes it. A
    bucket's loop starts with its first waiter and ends when it has none left (so a replica
    holds a blocked connection per bucket it follows, not per bucket), or at :meth:`close`.
    """

    #: Longest single block (ms): bounds how long a lost wake-up could delay a follower.
    BLOCK_MS = 2000

    def __init__(
        self,
        redis: RedisClient,
        connect: Callable[..., RedisClient],
        nudge_key: Callable[[int], str],
    ) -> None:
        #: The store's client, for the nudge (the blocked reads have a client of their own,
        #: made by ``connect(socket_timeout=...)``).
        self._store_redis = redis
        self._connect = connect
        self._nudge_key = nudge_key
        self._buckets: dict[int, _Bucket] = {}
        self._redis: RedisClient | None = None
        self._closed = False

    async def wait(self, bucket: int, entries: Sequence[tuple[str, int]], max_wait: float) -> bool:
        """Wait until one of the streams in ``entries`` (stream key, entries seen), all in
        ``bucket``, holds more than its cursor; ``False`` if ``max_wait`` seconds passed
        first."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        followed = self._buckets.get(bucket)
        if followed is None:
            followed = self._buckets[bucket] = _Bucket(self._nudge_key(bucket))
        nudge = False
        for key, cursor in entries:
            followed.waiters.setdefault(key, []).append((cursor, fut))
            reading = followed.reading.get(key)
            nudge = nudge or reading is None or reading > cursor
        if followed.task is None:
            followed.task = loop.create_task(self._run(bucket, followed), name="redis-tail")
        elif nudge:
            # The nudge stream is this process's own: it expires, so that a replica that is gone
            # (a restart makes a new one) leaves nothing behind in Redis.
            pipe = self._store_redis.pipeline(transaction=False)
            pipe.xadd(followed.nudge_key, {"n": 1}, maxlen=1, approximate=False)
            pipe.pexpire(followed.nudge_key, _NUDGE_TTL_MS)
            await pipe.execute()
        try:
            async with asyncio.timeout(max_wait):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            for key, _ in entries:
                _drop(followed, key, fut)

    def _client(self) -> RedisClient:
        """The blocked reads' client (a blocking read holds its connection, so the tail has a
        client of its own; a cluster client opens one per node and read in flight)."""
        if self._redis is None:
            self._redis = self._connect(socket_timeout=self.BLOCK_MS / 1000 + 5)
        return self._redis

    async def _run(self, bucket: int, followed: _Bucket) -> None:
        redis_ = self._client()
        failures = 0
        try:
            while followed.waiters and not self._closed:
                streams: dict[Any, Any] = {followed.nudge_key: followed.nudge_seen}
                for key, waiters in followed.waiters.items():
                    streams[key] = f"0-{min(c for c, _ in waiters)}"
                followed.reading = {
                    k: entry_offset(v) for k, v in streams.items() if k != followed.nudge_key
                }
                try:
                    result: Any = await redis_.xread(streams, block=self.BLOCK_MS)
                    failures = 0
                except (RedisError, OSError) as exc:
                    # Wake everyone (they re-read and see the error themselves), then back off.
                    failures += 1
                    log.warning("redis tail: %s", exc)
                    _wake_all(followed)
                    await asyncio.sleep(min(1.0, 0.05 * 2**failures))
                    continue
                for raw_key, entries in result or ():
                    name = text(raw_key)
                    last = entries[-1][0]
                    if name == followed.nudge_key:
                        followed.nudge_seen = text(last) or "0-0"
                    elif name is not None:
                        _wake(followed, name, entry_offset(last))
        finally:
            # No await between the last look at the waiters and here: a waiter that comes
            # after finds no loop and starts one.
            followed.reading = {}
            followed.task = None
            if self._buckets.get(bucket) is followed and not followed.waiters:
                del self._buckets[bucket]

    async def close(self) -> None:
        """Wake every waiter, stop the loops and close their client."""
        self._closed = True
        tasks = []
        for followed in self._buckets.values():
            _wake_all(followed)
            if followed.task is not None:
                tasks.append(followed.task)
        for task in tasks:
            # redis-py can let a cancellation go by while it reconnects (the loop then sat in a
            # 7 s read after a Redis restart, one in three runs): ask again until it has ended.
            while not task.done():
                task.cancel()
                await asyncio.wait((task,), timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError):
                await task
        redis_, self._redis = self._redis, None
        if redis_ is not None:
            with contextlib.suppress(RedisError, OSError):
                await redis_.aclose()


def _drop(followed: _Bucket, key: str, fut: asyncio.Future[None]) -> None:
    waiters = followed.waiters.get(key)
    if waiters is None:
        return
    waiters[:] = [w for w in waiters if w[1] is not fut]
    if not waiters:
        del followed.waiters[key]


def _wake(followed: _Bucket, key: str, upto: int) -> None:
    waiters = followed.waiters.get(key)
    if not waiters:
        return
    for cursor, fut in waiters:
        if cursor < upto and not fut.done():
            fut.set_result(None)


def _wake_all(followed: _Bucket) -> None:
    for waiters in followed.waiters.values():
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(None)
