"""Finished generations kept for replay and resume, within a byte and a count bound.

What a kept generation costs is what it holds (:attr:`Generation.kept_nbytes`: its log, its key
and a measured overhead), so many tiny answers cannot hide behind small logs. Past either bound
the oldest is let go first. How long one is kept is the registry's timer; this is the ledger
(see docs/design.md, Replay and resume).
"""

from __future__ import annotations

import collections

from streamsafe.gateway.generation import Generation

__all__ = ["Retention"]


class Retention:
    """The finished generations kept, oldest first, and the bytes they hold."""

    __slots__ = ("_kept", "bytes", "max_bytes", "max_generations")

    def __init__(self, max_bytes: int, max_generations: int) -> None:
        self.max_bytes = max_bytes
        self.max_generations = max_generations
        self._kept: collections.OrderedDict[str, Generation] = collections.OrderedDict()
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
        return evicted

    def drop(self, gen: Generation) -> None:
        """No longer keep ``gen`` (if it was kept)."""
        if self._kept.pop(gen.id, None) is not None:
            self.bytes -= gen.kept_nbytes
