"""Following other replicas' generations in Redis: one ``XREAD BLOCK`` over every followed
stream, on its own connection, so followers cost no connection each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from streamsafe.gateway.replicas.redis_scripts import entry_offset, text

__all__ = ["RedisTail"]

#: Milliseconds the nudge stream outlives its last nudge (an XREAD blocked on an absent stream
#: simply waits for its next entry).
_NUDGE_TTL_MS = 60_000

log = logging.getLogger("streamsafe.gateway")


class RedisTail:
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

    def __init__(
        self, redis: aioredis.Redis, connect: Callable[..., aioredis.Redis], nudge_key: str
    ) -> None:
        #: The store's client, for the nudge (the blocked read has a client of its own, made
        #: by ``connect(socket_timeout=...)``).
        self._store_redis = redis
        self._connect = connect
        self._nudge_key = nudge_key
        self._nudge_seen = "0-0"
        self._waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self._reading: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._redis: aioredis.Redis | None = None

    async def wait(self, entries: Sequence[tuple[str, int]], max_wait: float) -> bool:
        """Wait until one of the streams in ``entries`` (stream key, entries seen) holds more
        than its cursor; ``False`` if ``max_wait`` seconds passed first."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        nudge = False
        for key, cursor in entries:
            self._waiters.setdefault(key, []).append((cursor, fut))
            reading = self._reading.get(key)
            nudge = nudge or reading is None or reading > cursor
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="redis-tail")
        elif nudge:
            # The nudge stream is this process's own: it expires, so that a replica that is gone
            # (a restart makes a new one) leaves nothing behind in Redis.
            pipe = self._store_redis.pipeline(transaction=False)
            pipe.xadd(self._nudge_key, {"n": 1}, maxlen=1, approximate=False)
            pipe.pexpire(self._nudge_key, _NUDGE_TTL_MS)
            await pipe.execute()
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
        self._redis = redis_ = self._connect(socket_timeout=self.BLOCK_MS / 1000 + 5)
        failures = 0
        try:
            while True:  # until close(): a waiter never finds the loop on its way out
                streams: dict[Any, Any] = {self._nudge_key: self._nudge_seen}
                for key, waiters in self._waiters.items():
                    streams[key] = f"0-{min(c for c, _ in waiters)}"
                self._reading = {
                    k: entry_offset(v) for k, v in streams.items() if k != self._nudge_key
                }
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
                    name = text(raw_key)
                    last = entries[-1][0]
                    if name == self._nudge_key:
                        self._nudge_seen = text(last) or "0-0"
                    elif name is not None:
                        self._wake(name, entry_offset(last))
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
        """Wake every waiter and stop the loop."""
        self._wake_all()
        task, self._task = self._task, None
        if task is not None:
            # redis-py can let a cancellation go by while it reconnects (the loop then sat in a
            # 7 s read after a Redis restart, one in three runs): ask again until it has ended.
            while not task.done():
                task.cancel()
                await asyncio.wait((task,), timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError):
                await task
