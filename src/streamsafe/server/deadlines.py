"""What the client of a connection owes and by when: the deadlines of a connection facing the
network, and the count of its address's connections owing a request.

One timer per connection, armed for whichever deadline runs now: the first byte of a new
connection (``FIRST_BYTE_S``: past it a silent connection owes a request like one that began),
the header section (``ServerLimits.header_timeout`` from its first byte), the body (each read
within ``body_timeout``, the whole at ``min_body_rate`` or faster; not counted while the app is
not reading) and a kept-alive connection's idle time (``keep_alive_timeout``). A connection
owing a request is counted for its client address (:mod:`streamsafe.server.unfinished`), and
refused past the address's share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamsafe.server.cycle import RequestCycle
from streamsafe.server.limits import FIRST_BYTE_S, ServerLimits
from streamsafe.server.unfinished import UnfinishedRequests

__all__ = ["Deadlines"]


class Deadlines:
    """A connection's deadlines and what it owes (see the module). Mixed into the connection's
    protocol, :class:`~streamsafe.server.protocol.HttpProtocol`, which sets the attributes
    below, arms the deadline that runs at each step of a request, and refuses (``_reject``)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    limits: ServerLimits
    unfinished: UnfinishedRequests
    read_paused: bool
    current: RequestCycle | None
    parsing: RequestCycle | None
    _timer: asyncio.TimerHandle | None
    _idle: bool
    _in_headers: bool
    _got_bytes: bool
    _owing: bool
    _client_key: str
    _body_began: float
    _body_read: float
    _body_bytes: int

    if TYPE_CHECKING:

        def closed(self) -> None: ...

        def _reject(self, status: int, message: str, retry_after: int | None = None) -> None: ...

    # -- the one timer -----------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        self._idle = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_timeout(self) -> None:
        self._timer = None
        self._idle = False
        if self.current is None and not self._got_bytes:
            self.transport.close()

    def _first_byte_deadline(self) -> None:
        """A new connection that sent nothing in its first ``FIRST_BYTE_S`` holds a place with no
        request: it counts as owing one from now on, and past its address's share it is refused.
        Then the header deadline runs on, counted from the accept."""
        self._timer = None
        if not self._got_bytes and not self._owe():
            self.closed()
            self._reject(503, self._unfinished_message())
            return
        left = self.limits.header_timeout - FIRST_BYTE_S
        if left > 0:
            self._arm(left, self._header_deadline)
        else:
            self._header_deadline()

    def _header_deadline(self) -> None:
        self._timer = None
        if self._in_headers and self._got_bytes:
            self._reject(408, "the request headers did not arrive in time")
        elif self._in_headers and self.current is None:
            # A connection that never sent a byte: close it as a kept-alive one is closed.
            self.transport.close()

    def _body_due(self) -> float:
        """When the body being read must be whole: ``body_timeout`` after its head, moved on a
        second for every ``min_body_rate`` bytes that came."""
        limits = self.limits
        if not limits.min_body_rate:
            return float("inf")
        return self._body_began + limits.body_timeout + self._body_bytes / limits.min_body_rate

    def _arm_body_deadline(self, now: float) -> None:
        """Arm the body's timer: the next read is due within ``body_timeout``, the whole body
        by :meth:`_body_due`."""
        idle_left = self._body_read + self.limits.body_timeout - now
        self._arm(max(0.0, min(idle_left, self._body_due() - now)), self._body_deadline)

    def _body_deadline(self) -> None:
        self._timer = None
        cycle = self.parsing
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.read_paused:
            # The app is not reading: not the client's delay. The body's time starts again.
            self._body_began = self._body_read = now
            self._body_bytes = 0
            self._arm_body_deadline(now)
            return
        if now >= self._body_read + self.limits.body_timeout:
            message = "the request body stopped arriving"
        elif now >= self._body_due():
            rate = self.limits.min_body_rate
            message = f"the request body arrived slower than {rate:g} bytes a second"
        else:  # the timer fired a little early
            self._arm_body_deadline(now)
            return
        if cycle.started:
            cycle.lost()
            self.transport.close()
        else:
            cycle.lost()
            self._reject(408, message)

    # -- requests still arriving, per client address ----------------------------------------------

    def _owe(self) -> bool:
        """This connection owes a request (one began, or it sent nothing in its first second):
        counted for its address; ``False`` where the address already holds its share of the
        cap."""
        if not self._owing:
            self._owing = self.unfinished.begin(self._client_key)
        return self._owing

    def _settle(self) -> None:
        """This connection no longer owes a request: it is whole, answered, or gone."""
        if self._owing:
            self._owing = False
            self.unfinished.end(self._client_key)

    def _unfinished_message(self) -> str:
        held = self.limits.max_unfinished_per_client
        return (
            f"this client address holds {held} connections with requests still arriving, its "
            "limit: finish them or open fewer connections at once"
        )
