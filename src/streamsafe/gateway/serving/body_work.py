"""Request-body work that must not stall the event loop.

Every stream the gateway relays is written from its one event loop, so a request whose body
takes a second to parse and check pauses every other tenant's stream for that second (the
review measured 2.3-3.6 s per 4 MiB body of 1.39M empty arrays). Two rules keep the loop free:

- **Bounded**: a body may hold at most :data:`MAX_JSON_CONTAINERS` JSON objects and arrays,
  counted by C scans of the raw bytes before anything is parsed (:func:`exceeds_containers`).
  Parsing is one C call that holds the interpreter throughout, so this bound is what bounds it:
  about 8 ms at the limit in the worst shape (empty arrays), against 0.45 s for 1.39M of them.
- **Off the loop**: a body over :data:`INLINE_BODY_BYTES` is read on the gateway's body thread
  (:class:`BodyWorker`), where the interpreter hands the loop its turn every few milliseconds
  (``sys.getswitchinterval``, 5 ms) during the Python checks that follow the parse (nesting,
  messages, cost). One thread, so that at most one such body competes with the loop at a time;
  others wait their turn in its queue. A small body costs well under a millisecond and stays on
  the loop, where a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["INLINE_BODY_BYTES", "MAX_JSON_CONTAINERS", "BodyWorker", "exceeds_containers"]

#: Bodies up to this size are read on the event loop (16 KiB: at most ~0.3 ms to parse and
#: check, whatever they hold).
INLINE_BODY_BYTES = 16 * 1024
#: Most JSON objects and arrays a request body may hold (50,000: a 2,000-message conversation
#: with tool calls and content parts holds about 10,000). Past it: 400.
MAX_JSON_CONTAINERS = 50_000

#: A JSON string (escapes included) or an opening bracket.
_STRING_OR_OPEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[{]')

T = TypeVar("T")


def exceeds_containers(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` holds more than ``limit`` objects and arrays (brackets
    inside strings are not counted: a prompt of code is full of them). Two C scans decide
    where the brackets are few; otherwise the strings are skipped, a match at a time, and the
    count stops past ``limit``."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    count = 0
    for match in _STRING_OR_OPEN.finditer(raw):
        if match.end() - match.start() == 1:  # a bracket: a string is at least two bytes
            count += 1
            if count > limit:
                return True
    return False


class BodyWorker:
    """Runs body work on the loop for a small body and on one thread of its own for a large
    one (see the module docstring). Work handed over runs to its end even where its request is
    cancelled meanwhile (a thread cannot be stopped); :data:`MAX_JSON_CONTAINERS` bounds it."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` for a body of ``size`` bytes: here below :data:`INLINE_BODY_BYTES`,
        else on the body thread (its exception raised here)."""
        if size <= INLINE_BODY_BYTES:
            return fn(*args)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="streamsafe-body")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        """Stop the thread once the work it runs is done; work not yet begun is dropped."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
