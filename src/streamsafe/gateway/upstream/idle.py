"""A connection pool's idle connections: those waiting for their next exchange.

An exchange (:class:`~streamsafe.gateway.upstream.exchange.Exchange`) puts its connection back
when its response completed and the connection may be kept alive; the pool
(:class:`~streamsafe.gateway.upstream.transport.ConnectionPool`) takes the newest for its next
request, and a connection that closed is forgotten.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Generic, TypeVar

__all__ = ["IdleConnections"]

C = TypeVar("C")


class IdleConnections(Generic[C]):
    """Idle connections, newest last, at most ``most`` (a burst's others are closed)."""

    __slots__ = ("_conns", "most")

    def __init__(self, most: int) -> None:
        self._conns: collections.deque[C] = collections.deque()
        self.most = most

    def __len__(self) -> int:
        return len(self._conns)

    def keep(self, conn: C) -> bool:
        """Keep ``conn`` for reuse, where there is room (False: the caller closes it)."""
        if len(self._conns) >= self.most:
            return False
        self._conns.append(conn)
        return True

    def take(self) -> C | None:
        """The newest idle connection, taken out (``None``: none is idle)."""
        return self._conns.pop() if self._conns else None

    def forget(self, conn: C) -> None:
        """``conn`` closed: no longer idle (nothing where it was in an exchange)."""
        with contextlib.suppress(ValueError):
            self._conns.remove(conn)
