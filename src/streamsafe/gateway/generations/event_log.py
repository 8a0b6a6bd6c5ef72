"""The in-process event log, compact: one growing buffer and a few numbers per event.

A list of ``bytes`` costs a Python object (33 bytes of header) and a list slot per event on top of
its payload; for a chat stream that is most of the gateway's memory per live stream. Here the
payloads live in one ``bytearray``, and each is stored as its difference from the one before:
the lengths of the prefix and the suffix it shares with it, and the bytes in between. Consecutive
chunks of one completion share everything but their few bytes of content (id, model, created,
the JSON around the delta), so a chunk takes about its content plus 12 bytes.

Reading back rebuilds payloads from the nearest full one: every 64th event is stored whole, so a
resume from any offset decodes at most 63 differences, and the last 16 payloads are kept as they
arrived, so a subscriber that keeps up (the hot path) reads without rebuilding anything.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from array import array
from collections.abc import AsyncGenerator, Sequence
from typing import Any

__all__ = ["MemoryEventLog"]

#: Every this many events one is stored whole: the most differences a read from any offset
#: decodes.
_KEYFRAME = 64
#: Payloads kept as they arrived, for subscribers that keep up.
_RECENT = 16
#: Shared prefix and suffix lengths are stored as 16-bit numbers.
_MAX_SHARED = 0xFFFF
#: Shared bytes worth remembering as the template of the next chunks.
_MIN_TEMPLATE = 16
#: Bytes of bookkeeping per event: one 64-bit number, its end offset in the buffer (the high 32
#: bits) and the two shared lengths (16 bits each). One number, not three arrays: one append
#: per event, and two objects fewer per log for the garbage collector to walk. A log past 4 GiB
#: overflows the number (the array refuses it).
_PER_EVENT = 8


class MemoryEventLog:
    """An append-only log of payloads held in this process (see the module). Every access is on
    the one event loop, so no lock is needed."""

    __slots__ = ("_buf", "_ends", "_last", "_last_fits", "_recent", "_template")

    def __init__(self) -> None:
        self._buf = bytearray()
        # Per event: end of its stored bytes in _buf << 32 | bytes shared with the previous
        # payload's start << 16 | bytes shared with its end.
        self._ends = array("Q")
        self._recent: collections.deque[bytes] = collections.deque(maxlen=_RECENT)
        self._last = b""
        # The bytes consecutive payloads were last found to share at their start and end (the
        # JSON around a chunk's content), and whether the last payload has them: checking a new
        # payload against them costs two C calls, where finding what it shares costs more.
        self._template = (b"", b"")
        self._last_fits = False

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append payloads; return the new length."""
        return self.append_nowait(payloads)

    async def read(self, start: int) -> list[bytes]:
        """Payloads from ``start`` on."""
        return self.read_nowait(start)

    def append_nowait(self, payloads: Sequence[bytes]) -> int:
        """:meth:`append` without a coroutine: the relay's per-chunk path (every generation's
        log has its events in this process; see
        :meth:`~streamsafe.gateway.generations.store.EventLog.append_nowait`)."""
        if len(payloads) == 1:
            length = self.append_one(payloads[0])
            if length:
                return length
        ends = self._ends
        buf = self._buf
        prev = self._last
        head, tail = self._template
        fits = self._last_fits
        for p in payloads:
            n = len(p)
            if len(ends) % _KEYFRAME == 0:
                a = b = 0
                buf += p
                fits = p.startswith(head) and p.endswith(tail) and n >= len(head) + len(tail)
            elif (
                fits
                and (head or tail)
                and p.startswith(head)
                and p.endswith(tail)
                and n >= len(head) + len(tail)
            ):
                # The usual chunk: the same JSON around a few bytes of content.
                a, b = len(head), len(tail)
                buf += p[a : n - b]
            else:
                a, b = _shared(prev, p)
                buf += p[a : n - b]
                if a + b >= _MIN_TEMPLATE:
                    head, tail = p[:a], p[n - b :] if b else b""
                fits = p.startswith(head) and p.endswith(tail) and n >= len(head) + len(tail)
            ends.append(len(buf) << 32 | a << 16 | b)
            prev = p
        self._last = prev
        self._template = (head, tail)
        self._last_fits = fits
        self._recent.extend(payloads)
        return len(ends)

    def append_one(self, p: bytes) -> int:
        """Append ``p`` if it is the usual chunk (the same JSON around its content as the last
        one, not due to be stored whole) and return the new length; else change nothing and
        return 0 (:meth:`append_nowait` takes any payload). The relay's per-read fast path."""
        ends = self._ends
        if self._last_fits and len(ends) % _KEYFRAME:
            head, tail = self._template
            a, b, n = len(head), len(tail), len(p)
            if 0 < a + b <= n and p.startswith(head) and p.endswith(tail):
                buf = self._buf
                buf += p[a : n - b]
                ends.append(len(buf) << 32 | a << 16 | b)
                self._last = p
                self._recent.append(p)
                return len(ends)
        return 0

    async def write_behind(self, reading: asyncio.Future[Any]) -> AsyncGenerator[list[bytes]]:
        """Nothing: a log of this process's alone holds nothing to write behind (its events
        were readable as :meth:`append_nowait` took them)."""
        nothing: tuple[list[bytes], ...] = ()
        for held in nothing:
            yield held

    def read_nowait(self, start: int) -> list[bytes]:
        """:meth:`read` without a coroutine (see :meth:`append_nowait`)."""
        n = len(self._ends)
        recent = self._recent
        first_recent = n - len(recent)
        if start >= first_recent:
            if start >= n:
                return []
            return list(itertools.islice(recent, start - first_recent, None))
        out = self._rebuild(start, first_recent)
        out.extend(recent)
        return out

    def _rebuild(self, start: int, stop: int) -> list[bytes]:
        """Payloads ``start`` to ``stop`` (exclusive), decoded from the keyframe before
        ``start``."""
        ends = self._ends
        out: list[bytes] = []
        prev = b""
        with memoryview(self._buf) as view:
            begin = ends[start - start % _KEYFRAME - 1] >> 32 if start >= _KEYFRAME else 0
            for i in range(start - start % _KEYFRAME, stop):
                entry = ends[i]
                end, a, b = entry >> 32, entry >> 16 & 0xFFFF, entry & 0xFFFF
                middle = view[begin:end]
                prev = b"".join((prev[:a], middle, prev[len(prev) - b :] if b else b""))
                begin = end
                if i >= start:
                    out.append(prev)
        return out

    @property
    def length(self) -> int:
        """Events appended so far."""
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        """Memory the log holds: its buffer, bookkeeping per event, and the recent payloads."""
        recent = sum(map(len, self._recent)) + 41 * len(self._recent)
        return len(self._buf) + _PER_EVENT * len(self._ends) + recent


def _shared(prev: bytes, p: bytes) -> tuple[int, int]:
    """Lengths of the longest prefix, then the longest suffix, that ``p`` shares with ``prev``
    (not overlapping in either), from the first differing byte at each end, found by XOR of the
    two as big numbers (in C: no loop over bytes in Python)."""
    limit = min(len(prev), len(p))
    diff = int.from_bytes(prev[:limit], "big") ^ int.from_bytes(p[:limit], "big")
    a = limit - (diff.bit_length() + 7) // 8
    rest = limit - a
    b = 0
    if rest:
        diff = int.from_bytes(prev[-rest:], "little") ^ int.from_bytes(p[-rest:], "little")
        b = rest - (diff.bit_length() + 7) // 8
    return min(a, _MAX_SHARED), min(b, _MAX_SHARED)
