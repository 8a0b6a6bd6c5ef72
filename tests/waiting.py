"""Waiting on a condition in tests against real servers: polled, bounded, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """The first truthy value of ``predicate()``, polled; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout} s: {what or predicate}")
        time.sleep(0.005)
