"""Subscribers that keep up, written to from the upstream's read callback.

A subscriber's own loop (:func:`streamsafe.gateway.serving.subscriber.serve_stream`) reads the log
from its cursor and sends through the server, then waits for the next change: per chunk a future, a
task switch, a log read and a coroutine send. Once its stream is committed and flowing and it has
sent everything, it instead joins its generation's :class:`Fanout` and sleeps. From then on the
relay, right after appending a read's events to the log, encodes them once and writes them to every
member through the server's body writer (:data:`streamsafe.server.asgi.BODY_WRITER_EXTENSION`): no
task runs per chunk. A member is released back to its loop, cursor intact, whenever anything but
new events happens (:meth:`Fanout.release_all`: a state change, a disconnect, the end) or its
writer declines (the client's socket is backed up, so ``send`` must wait for it to drain); the loop
then goes on exactly as before, from the log. The events that end a stream (``[DONE]`` last) are
left to the loops too: each sends them with the end of its response in one write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from streamsafe.gateway.generations.keepalive import KEEPALIVE_LINE, Keepalive
from streamsafe.server.asgi import BodyWriter
from streamsafe.sse import DONE, encode_events

__all__ = ["Fanout"]


class _Member:
    __slots__ = ("cursor", "released", "writer")

    def __init__(self, writer: BodyWriter, cursor: int, released: asyncio.Future[None]) -> None:
        self.writer = writer
        self.cursor = cursor
        self.released = released


#: A fan-out's members: a list while it has some.
_Members = list[_Member] | tuple[()]


class Fanout:
    """The members of one generation (see the module docstring)."""

    __slots__ = ("_encode", "_heartbeat_bytes", "_keepalive", "_members")

    def __init__(
        self,
        encode: Callable[[Sequence[bytes], int, bool], bytes] = encode_events,
        heartbeat: bytes = KEEPALIVE_LINE,
    ) -> None:
        # The route's framing (see streamsafe.gateway.generations.framing).
        self._encode = encode
        self._heartbeat_bytes = heartbeat
        # A list only while it has members (see Generation._waiters).
        self._members: _Members = ()
        # Only while it has members with heartbeats on.
        self._keepalive: Keepalive | None = None

    def __bool__(self) -> bool:
        return bool(self._members)

    async def serve(self, writer: BodyWriter, cursor: int, beat: float = 0.0) -> int:
        """Join at ``cursor`` (the log's length: everything before went out) and return the
        cursor once released. ``beat``: the most seconds it may go without a byte (0: no
        heartbeats)."""
        released = asyncio.get_running_loop().create_future()
        member = _Member(writer, cursor, released)
        self._members = [*self._members, member]
        if beat > 0:
            keepalive = self._keepalive
            if keepalive is None:
                self._keepalive = Keepalive(beat, self._heartbeat)
            else:
                keepalive.tighten(beat)
        try:
            await released
        except asyncio.CancelledError:
            self._remove(member)
            raise
        return member.cursor

    def publish(self, payloads: Sequence[bytes], first: int, multiline: bool) -> None:
        """Write ``payloads`` (the log's events ``first, first + 1, ...``, just appended) to
        every member; release the members that cannot take them. The events that end the
        stream (``[DONE]`` last) are left to the members' own loops, which send them with the
        end in one write (and frame ``[DONE]`` as the route wants)."""
        members = self._members
        if not members:
            return
        if payloads[-1] == DONE:
            # The end follows at once: each loop sends these events and the end in one write.
            self.release_all()
            return
        self._write(members, self._encode(payloads, first, multiline), first, first + len(payloads))

    def publish_one(self, payload: bytes, index: int) -> None:
        """:meth:`publish` of one single-line payload that does not end the stream (the usual
        read, see :meth:`streamsafe.gateway.relay.stream_sink.StreamSink.take_one`), framed as
        OpenAI's: a route of another framing never takes that path."""
        members = self._members
        if members:
            self._write(members, b"id: %d\ndata: %s\n\n" % (index, payload), index, index + 1)

    def _write(self, members: _Members, body: bytes, first: int, after: int) -> None:
        keepalive = self._keepalive
        if keepalive is not None:
            keepalive.last = keepalive.clock()  # Keepalive.wrote(), without a call per chunk
        declined: list[_Member] | None = None
        for member in members:
            if member.cursor == first and member.writer(body):
                member.cursor = after
                continue
            if declined is None:
                declined = []
            declined.append(member)
        if declined is not None:
            for member in declined:
                self._remove(member)
                member.released.set_result(None)

    def _heartbeat(self) -> None:
        """The generation was silent a heartbeat interval: a comment line to every member. A
        writer that declines leaves the member as it is: its client has bytes to read."""
        beat = self._heartbeat_bytes
        for member in self._members:
            member.writer(beat)

    def release_all(self) -> None:
        """Hand every member back to its own loop."""
        members = self._members
        if members:
            self._members = ()
            self._stop_keepalive()
            for member in members:
                if not member.released.done():
                    member.released.set_result(None)

    def _remove(self, member: _Member) -> None:
        self._members = [m for m in self._members if m is not member] or ()
        if not self._members:
            self._stop_keepalive()

    def _stop_keepalive(self) -> None:
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.close()
