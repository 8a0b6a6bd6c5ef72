"""Waiting on a condition in tests against real servers: polled, bounded, never a fixed sleep.

The suite's one poller: ``wait_until`` fails when the condition is not met in time,
``poll`` hands back the last (falsy) value instead, for a caller that records it; each has an
``_async`` twin for a test on an event loop (its bound named ``within``), whose predicate may
be a coroutine function.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def poll(predicate: Callable[[], Any], timeout: float, every: float = 0.005) -> Any:
    """The first truthy value of ``predicate()``, asked every ``every`` s; its last (falsy)
    value once ``timeout`` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


What = str | Callable[[], object]


def _failure(within: float, what: What, predicate: Callable[[], Any]) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"condition not met in {within} s: {said or predicate}")


def wait_until(
    predicate: Callable[[], Any], timeout: float = 20.0, what: What = "", every: float = 0.005
) -> Any:
    """The first truthy value of ``predicate()``, polled; fails after ``timeout`` seconds,
    saying ``what`` (called then, where it is a function: the state at the failure)."""
    value = poll(predicate, timeout, every)
    if not value:
        raise _failure(timeout, what, predicate)
    return value


async def poll_async(predicate: Callable[[], Any], within: float, every: float = 0.005) -> Any:
    """:func:`poll` without blocking the event loop; ``predicate()`` is awaited where it
    returns an awaitable."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(every)


async def wait_until_async(
    predicate: Callable[[], Any], within: float = 20.0, what: What = "", every: float = 0.005
) -> Any:
    """:func:`wait_until` without blocking the event loop (see :func:`poll_async`)."""
    value = await poll_async(predicate, within, every)
    if not value:
        raise _failure(within, what, predicate)
    return value
