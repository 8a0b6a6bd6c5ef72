"""Where generations live: key ownership and event logs.

:class:`Store` is the interface the registry uses; :class:`MemoryStore` implements it for one
process. The shape is Redis's, so a Redis implementation can follow without touching the registry:

- key ownership is :meth:`Store.claim` (``SET key gen NX PX ttl``) and :meth:`Store.release` (a
  compare-and-delete script), so with several gateway replicas exactly one owns a key;
- an event log is append-only and read from an offset (``XADD`` / ``XRANGE`` of a Redis Stream,
  with the offset as the entry id), so any replica can replay or resume it;
- finished logs get a time to live (``PEXPIRE``) and can be dropped early to cap memory.

Payloads are stored as the bytes upstream sent (one JSON chunk each), never re-encoded; in this
process compactly (:mod:`streamsafe.gateway.generations.event_log`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, Protocol

from streamsafe.gateway.generations.event_log import MemoryEventLog

__all__ = ["EventLog", "LeaseLost", "MemoryEventLog", "MemoryStore", "Store"]


class LeaseLost(Exception):
    """The writer of a shared log no longer holds the generation's lease: another replica took
    it over, so this one must stop writing (see :mod:`streamsafe.gateway.replicas.replicas`)."""


class EventLog(Protocol):
    """An append-only log of event payloads; the offset of an event is its SSE ``id``."""

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append payloads; return the new length."""
        ...

    async def read(self, start: int) -> list[bytes]:
        """Payloads from offset ``start`` to the end (empty if none yet)."""
        ...

    def append_nowait(self, payloads: Sequence[bytes]) -> int:
        """Take payloads on the relay's hot path, without a coroutine, and return the length
        readable in this process now. Every log a generation runs on has its events here (the
        role it was opened in says what more it does): a log of this process's alone appends
        them and returns the new length; a log shared through another store holds them for
        :meth:`write_behind` and returns 0 (nothing new to read yet)."""
        ...

    def append_one(self, payload: bytes) -> int:
        """Append one payload if that is cheap (the usual chunk of a stream) and return the new
        length, else change nothing and return 0 (the relay then uses :meth:`append_nowait`)."""
        ...

    def read_nowait(self, start: int) -> list[bytes]:
        """:meth:`read` without a coroutine, from this process's copy (a subscriber's
        per-chunk fast path)."""
        ...

    def write_behind(self, reading: asyncio.Future[Any]) -> AsyncGenerator[list[bytes]]:
        """Until ``reading`` (the attempt's read of its stream) is done and nothing is held:
        write what :meth:`append_nowait` held to the store behind this process's copy, and
        yield each batch once it is readable here (the relay publishes it then). A log of this
        process's alone holds nothing: it yields nothing."""
        ...

    @property
    def length(self) -> int:
        """Events appended so far (as known to this process)."""
        ...

    @property
    def nbytes(self) -> int:
        """Approximate memory held by the log."""
        ...


class Store(Protocol):
    """Key ownership and event logs, async so that a networked store fits behind it. Each
    opens its logs in its own role (:meth:`MemoryStore.log`, a log of this process's alone; a
    Redis store's, see :mod:`streamsafe.gateway.replicas.store_redis`): opening is not part of
    the interface, the fleet opens them (``new_log``)."""

    async def claim(self, key: str, gen_id: str, ttl: float | None = None) -> str | None:
        """Make ``gen_id`` the owner of ``key`` unless someone owns it; return the existing
        owner, or ``None`` if the claim succeeded (Redis ``SET NX``)."""
        ...

    async def owner(self, key: str) -> str | None:
        """The generation that owns ``key``, if any (and not expired)."""
        ...

    async def release(self, key: str, gen_id: str) -> None:
        """Drop ``key`` if ``gen_id`` still owns it (compare-and-delete)."""
        ...

    async def expire(self, key: str, gen_id: str, ttl: float) -> None:
        """Let ``key`` (if ``gen_id`` owns it) lapse ``ttl`` seconds from now."""
        ...

    async def drop_log(self, gen_id: str) -> None:
        """Forget a log (readers holding it may finish; nobody new finds it)."""
        ...


class MemoryStore:
    """:class:`Store` for one gateway process. ``clock`` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys: dict[str, tuple[str, float | None]] = {}
        self._logs: dict[str, MemoryEventLog] = {}

    def _live(self, key: str) -> str | None:
        entry = self._keys.get(key)
        if entry is None:
            return None
        gen_id, deadline = entry
        if deadline is not None and self._clock() >= deadline:
            del self._keys[key]
            return None
        return gen_id

    async def claim(self, key: str, gen_id: str, ttl: float | None = None) -> str | None:
        """``SET NX``: claim ``key`` or return its owner."""
        current = self._live(key)
        if current is not None:
            return current
        self._keys[key] = (gen_id, None if ttl is None else self._clock() + ttl)
        return None

    async def owner(self, key: str) -> str | None:
        """The owner of ``key``, if any."""
        return self._live(key)

    async def release(self, key: str, gen_id: str) -> None:
        """Compare-and-delete."""
        entry = self._keys.get(key)
        if entry is not None and entry[0] == gen_id:
            del self._keys[key]

    async def expire(self, key: str, gen_id: str, ttl: float) -> None:
        """Set the key's deadline if ``gen_id`` owns it."""
        entry = self._keys.get(key)
        if entry is not None and entry[0] == gen_id:
            self._keys[key] = (gen_id, self._clock() + ttl)

    def log(self, gen_id: str) -> MemoryEventLog:
        """The log of ``gen_id``, created on first use."""
        found = self._logs.get(gen_id)
        if found is None:
            found = self._logs[gen_id] = MemoryEventLog()
        return found

    async def drop_log(self, gen_id: str) -> None:
        """Forget the log of ``gen_id``."""
        self._logs.pop(gen_id, None)

    @property
    def log_count(self) -> int:
        """Logs held."""
        return len(self._logs)
