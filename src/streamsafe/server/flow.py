"""A connection's flow control: writes wait while the client is not reading (for at most
``ServerLimits.send_timeout``, then the connection is reset), and reading pauses while the app
has not taken the request body that came (:data:`HIGH_WATER`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from streamsafe.server.limits import ServerLimits

__all__ = ["HIGH_WATER", "FlowControl", "reset"]

#: Request body bytes held for an app that has not read them before reading is paused.
HIGH_WATER = 64 * 1024


def reset(transport: asyncio.Transport) -> None:
    """Close ``transport`` with a TCP RST (SO_LINGER 0): what it still holds to send is
    dropped, by the kernel too, rather than sent to a client that may never read it."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class FlowControl:
    """A connection's flow control: writes pause while the transport's buffer is over its
    high-water mark (:meth:`drain` waits for it to empty), reading while the app has not taken
    what came. Mixed into the connection's protocol, which sets the attributes below."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    limits: ServerLimits
    write_paused: bool
    read_paused: bool
    _drained: asyncio.Future[None] | None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def drain(self) -> asyncio.Future[None]:
        """Done once the transport's write buffer is back under its low-water mark."""
        if self._drained is None:
            self._drained = self.loop.create_future()
        return self._drained

    async def writable(self) -> None:
        """Until the client took enough of what was written (:meth:`drain`); past
        ``limits.send_timeout`` it is taken for gone and the connection is aborted, so that a
        client that stopped reading holds neither its connection nor what the app keeps for it
        (a generation's log, its subscriber) for longer than that."""
        try:
            await asyncio.wait_for(asyncio.shield(self.drain()), self.limits.send_timeout)
        except TimeoutError:
            reset(self.transport)  # a plain close would leave the kernel sending what is queued

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
