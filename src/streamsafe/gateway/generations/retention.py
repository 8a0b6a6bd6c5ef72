"""Finished generations kept for replay and resume, within a byte and a count bound.

What a kept generation costs is what it holds (:attr:`Generation.kept_nbytes`: its log, its key
and a measured overhead), so many tiny answers cannot hide behind small logs. Past either bound
the oldest is let go first, and each one goes once it was kept for the retention time. They
are kept in the order they finish, so the oldest is always the next one due: one timer serves
them all, not one each (a timer per generation kept was two more objects each for the garbage
collector to walk, see docs/benchmarks.md). The ledger (:meth:`Retention.keep`,
:meth:`~Retention.due`, :meth:`~Retention.expired`) is fed the clock's reading; the timer runs
on the event loop (see docs/design.md, Replay and resume).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from streamsafe.gateway.generations.generation import Generation

__all__ = ["Retention"]


class Retention:
    """The finished generations kept, oldest first, and the bytes they hold. With ``forget``,
    each is let go ``keep_for`` seconds after its ``finished_at`` (on ``clock``) and handed to
    it, by a timer on the running event loop; without, the ledger alone."""

    __slots__ = (
        "_clock",
        "_forget",
        "_kept",
        "_timer",
        "bytes",
        "keep_for",
        "max_bytes",
        "max_generations",
    )

    def __init__(
        self,
        max_bytes: int,
        max_generations: int,
        keep_for: float = 0.0,
        forget: Callable[[Generation], None] | None = None,
        clock: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_generations = max_generations
        self.keep_for = keep_for
        self._forget = forget
        self._clock = clock
        self._kept: collections.OrderedDict[str, Generation] = collections.OrderedDict()
        self._timer: asyncio.TimerHandle | None = None
        #: Bytes held by the generations kept.
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, gen: Generation) -> list[Generation]:
        """Keep ``gen``; return the oldest generations it pushed past a bound (no longer kept
        here: the caller forgets them)."""
        self._kept[gen.id] = gen
        self.bytes += gen.kept_nbytes
        evicted: list[Generation] = []
        while self._kept and (
            self.bytes > self.max_bytes or len(self._kept) > self.max_generations
        ):
            oldest = next(iter(self._kept.values()))
            self.drop(oldest)
            evicted.append(oldest)
        if self._timer is None and self._forget is not None:
            self._arm()
        return evicted

    def due(self) -> float | None:
        """When the oldest generation kept will have been kept ``keep_for`` seconds (on the
        clock of its ``finished_at``); ``None`` when none is kept."""
        for oldest in self._kept.values():
            return (oldest.finished_at or 0.0) + self.keep_for
        return None

    def expired(self, now: float) -> list[Generation]:
        """The generations kept ``keep_for`` seconds or longer at ``now``, oldest first (no
        longer kept here: the caller forgets them)."""
        out: list[Generation] = []
        kept = self._kept
        while kept:
            oldest = next(iter(kept.values()))
            if (oldest.finished_at or 0.0) + self.keep_for > now:
                break
            self.drop(oldest)
            out.append(oldest)
        return out

    def _arm(self) -> None:
        due = self.due()
        if due is not None:
            # At least 10 ms: each firing lets go of every generation due by then.
            delay = max(due - self._clock(), 0.01)
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._timer = None
        forget = self._forget
        assert forget is not None
        for gen in self.expired(self._clock()):
            forget(gen)
        self._arm()

    def close(self) -> None:
        """Stop the timer (the process shuts down)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def drop(self, gen: Generation) -> None:
        """No longer keep ``gen`` (if it was kept)."""
        if self._kept.pop(gen.id, None) is not None:
            self.bytes -= gen.kept_nbytes
