"""The Redis client the gateway uses: redis-py's asyncio client, made to honour cancellation.

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

__all__ = ["CancelSafeRedis"]


class CancelSafeRedis(aioredis.Redis):
    """``redis.asyncio.Redis`` whose commands never swallow their task's cancellation."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        task = asyncio.current_task()
        before = task.cancelling() if task is not None else 0
        result = await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError  # requested while the command ran, and lost in it
        return result
