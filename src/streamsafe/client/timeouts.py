"""Timeouts as one small value object, per phase of a call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["Timeouts"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds allowed per phase of a call (``None``: no limit).

    A call goes through ``pool`` (waiting for a free connection), ``connect``, ``write`` (sending
    the request), ``first_byte`` (until the response headers: this is where a server queues or
    prefills), then ``idle`` (the longest gap between two reads of the body: keep-alive comments
    are bytes, so a healthy slow stream with heartbeats never trips it), and ``total`` (every
    attempt, wait and resume of the call together).
    """

    connect: float | None = 5.0
    """Default 5 s, as llama-stack-client: a reachable server accepts well within it."""
    write: float | None = 30.0
    """Default 30 s: request bodies here are small."""
    pool: float | None = 30.0
    """Default 30 s."""
    first_byte: float | None = 60.0
    """Default 60 s, the read timeout of llama-stack-client: a queued request behind a gateway
    that sends keep-alives gets its headers early, a bare engine may take this long."""
    idle: float | None = 60.0
    """Default 60 s between two reads of a body."""
    total: float | None = None
    """Default ``None``: a long generation is legitimate; set it to bound a call end to end."""

    @classmethod
    def of(cls, value: Any) -> Timeouts:
        """A :class:`Timeouts` from a number (every phase but ``total``; as openai-python's
        ``timeout=``), ``None`` (no limits), a :class:`Timeouts`, or an ``httpx.Timeout`` /
        ``httpx2.Timeout`` (its ``read`` bounds both the first byte and every gap after)."""
        if isinstance(value, Timeouts):
            return value
        if value is None:
            return cls(None, None, None, None, None, None)
        if all(hasattr(value, phase) for phase in ("connect", "read", "write", "pool")):
            read = value.read
            return cls(value.connect, value.write, value.pool, read, read)
        v = float(value)
        return cls(connect=v, write=v, pool=v, first_byte=v, idle=v)

    def replace(self, **changes: Any) -> Timeouts:
        """A copy with some phases changed."""
        return dataclasses.replace(self, **changes)
