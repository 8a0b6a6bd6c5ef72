"""A connection pool's connections: every one open, and the idle ones among them.

An exchange (:class:`~streamsafe.gateway.upstream.exchange.Exchange`) is counted open from its
connection's start to its end, and puts its connection back among the idle ones when its
response completed and the connection may be kept alive; the pool
(:class:`~streamsafe.gateway.upstream.transport.ConnectionPool`) takes the newest idle one for
its next request, and asks the open ones when the engine last sent anything (an engine busy
with other streams is not one that froze; see :mod:`~streamsafe.gateway.upstream.health`).
"""

from __future__ import annotations

import collections
import contextlib
from typing import Generic, TypeVar

__all__ = ["PoolConnections"]

C = TypeVar("C")


class PoolConnections(Generic[C]):
    """Open connections, and the idle ones among them, newest last, at most ``most`` (a
    burst's others are closed)."""

    __slots__ = ("_idle", "most", "open")

    def __init__(self, most: int) -> None:
        self._idle: collections.deque[C] = collections.deque()
        self.most = most
        #: Every connection open now (idle or in an exchange).
        self.open: set[C] = set()

    def __len__(self) -> int:
        """Idle connections."""
        return len(self._idle)

    def opened(self, conn: C) -> None:
        """``conn`` connected."""
        self.open.add(conn)

    def keep(self, conn: C) -> bool:
        """Keep ``conn`` for reuse, where there is room (False: the caller closes it)."""
        if len(self._idle) >= self.most:
            return False
        self._idle.append(conn)
        return True

    def take(self) -> C | None:
        """The newest idle connection, taken out (``None``: none is idle)."""
        return self._idle.pop() if self._idle else None

    def closed(self, conn: C) -> None:
        """``conn`` closed: neither open nor idle any more."""
        self.open.discard(conn)
        with contextlib.suppress(ValueError):  # not idle: in an exchange
            self._idle.remove(conn)
