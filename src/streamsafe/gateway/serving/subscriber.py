"""Writing a generation to one subscriber: when its stream commits, heartbeats, and framing.

A subscriber keeps its own cursor into the generation's log. Its loop reads from the cursor to
the end of the log, sends all of it in one body message, and waits for the next change. A
client that leaves is noticed at once, even while its generation is quiet: the server calls
:meth:`Subscriber.left` (:data:`~streamsafe.server.asgi.DISCONNECT_EXTENSION`), or, on a server that
does not offer that, a concurrent task watches for ``http.disconnect``.

When the headers go out, when a ``: keep-alive`` comment is due, and what a subscriber whose
generation is still queued is told (commit, a real 429 before any commit, or come back later) is
decided by :class:`~streamsafe.gateway.serving.pacing.Pacing` (see docs/design.md, Commit and
Admission); the loop in :func:`serve_stream` only relays, and ends the stream as
:mod:`streamsafe.gateway.serving.stream_terms` says. A subscriber that keeps up is served from
the relay's read callback instead (:mod:`streamsafe.gateway.generations.fanout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from streamsafe.gateway.admission.admission import Admission, retry_after_seconds
from streamsafe.gateway.admission.fair_queue import QUEUED
from streamsafe.gateway.errors import ResumePastEnd, error_body, send_failure
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.keepalive import KEEPALIVE_LINE, QuietWait
from streamsafe.gateway.generations.waiting import wait_for_change
from streamsafe.gateway.serving.pacing import (
    COMMIT,
    HEARTBEAT,
    SHED,
    STEP_BACK,
    Pacing,
    StreamRules,
    heartbeat_within,
)
from streamsafe.gateway.serving.stream_terms import StreamTerms, end_stream, send_step_back
from streamsafe.server.asgi import (
    InterimWriter,
    Message,
    OnDisconnect,
    Receive,
    Scope,
    Send,
    on_disconnect,
    respond,
)
from streamsafe.sse import DONE

__all__ = ["Subscriber", "serve_json", "serve_stream"]

# A bare comment line (see streamsafe.gateway.generations.keepalive.KEEPALIVE_LINE for why no blank
# line).
_HEARTBEAT_MSG: Message = {"type": "http.response.body", "body": KEEPALIVE_LINE, "more_body": True}
_JSON_HEARTBEAT_MSG: Message = {"type": "http.response.body", "body": b" ", "more_body": True}


class Subscriber:
    """One client reading one generation; ``gone`` once it disconnected."""

    __slots__ = (
        "_notice",
        "_watcher",
        "gen",
        "gone",
        "hold",
        "last_attempt",
        "patience",
        "rename",
    )

    def __init__(
        self, gen: Generation, patience: float | None = None, last_attempt: bool = False
    ) -> None:
        self.gen = gen
        self.gone = False
        #: The client's read timeout, where it said (``x-stainless-read-timeout``).
        self.patience = patience
        #: It said it is its client's last attempt: never told to come back.
        self.last_attempt = last_attempt
        #: Seconds after which it was told to come back (0: it was not).
        self.hold = 0.0
        #: Rewrites each payload before it is sent (a completion id of its own, see
        #: :mod:`streamsafe.gateway.serving.completion_id`); ``None``: the bytes as logged.
        self.rename: Callable[[bytes], bytes] | None = None
        self._notice: OnDisconnect | None = None
        self._watcher: asyncio.Task[None] | None = None

    def listen(self, scope: Scope, receive: Receive) -> None:
        """Learn at once when the client leaves: told by the server where it offers that
        (:data:`~streamsafe.server.asgi.DISCONNECT_EXTENSION`, no task per request), else by a task
        waiting on ``receive()`` (:meth:`watch`). :meth:`unlisten` when done."""
        notice = on_disconnect(scope)
        if notice is not None:
            notice(self.left)
            self._notice = notice
        else:
            self._watcher = asyncio.get_running_loop().create_task(self.watch(receive))

    async def unlisten(self) -> None:
        """Stop what :meth:`listen` started."""
        notice, watcher = self._notice, self._watcher
        self._notice = self._watcher = None
        if notice is not None:
            notice(None)
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def left(self) -> None:
        """The client disconnected: mark the subscriber gone and wake its loop."""
        self.gone = True
        self.gen.wake()

    async def watch(self, receive: Receive) -> None:
        """Wait for ``http.disconnect``, then :meth:`left` (for a server that offers no
        disconnect notice)."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.left()
                return


async def serve_json(
    sub: Subscriber,
    send: Send,
    rules: StreamRules | None = None,
    admission: Admission | None = None,
    interim: InterimWriter | None = None,
) -> None:
    """Answer a non-streaming request once its generation finished.

    A client that states its read timeout (``x-stainless-read-timeout``: every Stainless SDK,
    all of them httpx-based) is kept alive by default with ``interim``, the server's
    ``102 Processing`` writer: one at least twice within its timeout while the answer is not
    there, so a slow but healthy call never trips it and is never retried, and the answer,
    an error too, still comes with its own status (docs/design.md, Commit).

    With ``rules.json_keepalive`` (and a heartbeat), for any client, a call still waiting after
    ``commit_wait`` is answered 200 at once and sent one space every heartbeat until its answer
    follows (JSON allows whitespace before a value). The price: a failure after that arrives as
    a 200 whose body is the error object. ``admission`` is told of that commit, so a queued
    generation is not shed after it.
    """
    gen = sub.gen
    keepalive = rules is not None and rules.json_keepalive and rules.heartbeat > 0
    processing = (
        not keepalive
        and interim is not None
        and rules is not None
        and rules.heartbeat > 0
        and sub.patience is not None
    )
    committed = False
    beat = heartbeat_within(rules.heartbeat, sub.patience) if rules is not None else 0.0
    first = min(rules.commit_wait, beat) if keepalive and rules is not None else beat
    next_beat = time.monotonic() + first
    generation_header = (b"x-streamsafe-generation", gen.id.encode())
    while not sub.gone:
        version = gen.version
        if gen.finished:
            await _send_answer(sub, send, committed, generation_header)
            return
        if not keepalive and not processing:
            await gen.next_change()
            continue
        assert rules is not None
        now = time.monotonic()
        if now >= next_beat and processing:
            assert interim is not None
            processing = interim()  # False: the client left, nothing more to keep alive
            next_beat = now + beat
        elif now >= next_beat:
            if not committed:
                await _commit_json(gen, send, admission, generation_header)
                committed = True
            await send(_JSON_HEARTBEAT_MSG)
            next_beat = now + beat
            if gen.version != version:
                continue
        await _next_change_within(gen, max(0.0, next_beat - now))


async def _commit_json(
    gen: Generation,
    send: Send,
    admission: Admission | None,
    generation_header: tuple[bytes, bytes],
) -> None:
    """Answer a JSON call that waited past ``commit_wait`` 200 at once (its body follows,
    whitespace first); its place in admission is committed, never shed after that."""
    headers = [(b"content-type", b"application/json"), generation_header]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if admission is not None and gen.waiter is not None:
        admission.commit(gen.waiter)


async def _next_change_within(gen: Generation, seconds: float) -> None:
    """Until the generation changes, or ``seconds`` passed (its waiter then let go)."""
    waiter = gen.next_change()
    try:
        async with asyncio.timeout(seconds):
            await waiter
    except TimeoutError:
        gen.forget_waiter(waiter)


async def _send_answer(
    sub: Subscriber, send: Send, committed: bool, generation_header: tuple[bytes, bytes]
) -> None:
    """Send the finished generation's answer: the whole body after a committed 200 (a failure
    as its error object), else with its own status."""
    gen = sub.gen
    if gen.failure is not None:
        status, body = gen.failure.status, gen.failure.body
    elif gen.state is State.DONE:
        status, (body,) = 200, await gen.log.read(0)
        if sub.rename is not None:
            body = sub.rename(body)
    else:
        status = 502
        body = error_body("the generation was aborted", "upstream_error", 502)
    if committed:
        await send({"type": "http.response.body", "body": body, "more_body": False})
    elif gen.failure is not None:
        await send_failure(send, gen.failure)
    else:
        headers = [generation_header] if status == 200 else []
        await respond(send, status, body, headers=headers)


async def serve_stream(sub: Subscriber, start: int, send: Send, terms: StreamTerms) -> None:
    """Relay ``sub``'s generation from event ``start`` on, as SSE with ids, under ``terms``.

    Once events flow, a stream silent for a heartbeat interval (the engine stalled mid-answer)
    gets a ``: keep-alive`` comment too, from the fan-out's timer or, for a subscriber its own
    loop serves, from :class:`~streamsafe.gateway.generations.keepalive.QuietWait`'s: neither sets a
    timer per chunk."""
    stream = _Stream(sub, start, send, terms)
    try:
        await stream.run()
    finally:
        stream.quiet.close()


#: What :meth:`_Stream._pace` asks of the loop: wait for a change, go round again, or stop.
_WAIT, _AGAIN, _STOP = 0, 1, 2


class _Stream:
    """:func:`serve_stream`'s loop: send what the log holds past the cursor, end the stream, or
    pace a subscriber still waiting for events (commit, heartbeat, shed, told to come back),
    then wait for the next change."""

    __slots__ = (
        "cursor",
        "gen",
        "heartbeat",
        "pacing",
        "quiet",
        "read_now",
        "send",
        "start_msg",
        "sub",
        "terms",
    )

    def __init__(self, sub: Subscriber, start: int, send: Send, terms: StreamTerms) -> None:
        gen = sub.gen
        rules = terms.rules
        self.sub, self.gen, self.send, self.terms = sub, gen, send, terms
        self.cursor = start
        self.pacing = Pacing(
            rules, start > terms.preamble, time.monotonic(), sub.patience, sub.last_attempt
        )
        # Heartbeats once events flow, every ``beat`` seconds of silence (0: heartbeats are off).
        beat = heartbeat_within(rules.heartbeat, sub.patience) if rules.heartbeat > 0 else 0.0
        self.quiet = QuietWait(beat)
        framing = terms.framing
        self.heartbeat: Message = (
            _HEARTBEAT_MSG
            if framing.heartbeat == KEEPALIVE_LINE
            else {"type": "http.response.body", "body": framing.heartbeat, "more_body": True}
        )
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            (b"x-stream-resumable", rules.resumable),
            (b"x-streamsafe-generation", gen.id.encode()),
        ]
        self.start_msg: Message = {"type": "http.response.start", "status": 200, "headers": headers}
        # Every log has its events in this process: read without a coroutine per chunk.
        self.read_now = gen.log.read_nowait

    async def run(self) -> None:
        sub, gen = self.sub, self.gen
        while not sub.gone:
            version = gen.version
            if self.cursor < gen.length:
                if await self._send_events():
                    return
                continue
            if gen.finished:
                await self._end_at_cursor()
                return
            then, limit = await self._pace()
            if then == _STOP:
                return
            if then == _AGAIN or gen.version != version:  # changed while something went out
                continue
            await self._wait(limit)

    async def _send_events(self) -> bool:
        """Send the events past the cursor in one body message (the stream's end with them
        where they are its last); ``True`` once the stream ended."""
        gen, sub, terms, pacing = self.gen, self.sub, self.terms, self.pacing
        cursor = self.cursor
        batch = self.read_now(cursor)
        if not pacing.committed:
            await self.send(self.start_msg)
            pacing.committed = True
        n = len(batch)
        if terms.drop_done and batch[-1] == DONE:
            batch.pop()
        if sub.rename is not None:
            batch = [sub.rename(p) for p in batch]
        body = terms.framing.encode(batch, cursor, gen.multiline)
        self.cursor = cursor = cursor + n
        pacing.flowing = cursor > terms.preamble
        if gen.finished and cursor >= gen.length:  # the last events and the end: one write
            await end_stream(gen, self.send, self.start_msg, True, terms, body)
            return True
        await self.send({"type": "http.response.body", "body": body, "more_body": True})
        self.quiet.wrote()
        return False

    async def _end_at_cursor(self) -> None:
        """The generation finished and every event went out: end the stream. A resume from
        past what the generation came to (its Last-Event-ID was never sent) is refused as a
        finished generation's is, or told in an error event."""
        gen, cursor = self.gen, self.cursor
        past = ResumePastEnd(cursor - 1, gen.length).failure() if cursor > gen.length else None
        committed = self.pacing.committed
        await end_stream(gen, self.send, self.start_msg, committed, self.terms, past=past)

    async def _pace(self) -> tuple[int, float | None]:
        """Ask the pacing what a subscriber with nothing to send does now; what the loop does
        next (:data:`_WAIT`, :data:`_AGAIN`, :data:`_STOP`), and the most seconds to wait
        (``None``: no limit)."""
        gen, pacing, admission = self.gen, self.pacing, self.terms.admission
        place = gen.waiter
        queued = place is not None and place.state == QUEUED and not pacing.committed
        predicted = admission.predicted_wait(place) if queued and place is not None else None
        step, timeout = pacing.step(gen, time.monotonic(), predicted)
        if step == COMMIT:
            if place is not None:
                admission.commit(place)  # from now on its place is never shed
            await self.send(self.start_msg)
            return _AGAIN, None
        if step == SHED and place is not None:
            # Refused before any commit: the relay fails the generation with a real 429.
            admission.shed(place, retry_after_seconds(pacing.retry_after, 1.0))
            return _AGAIN, None
        if step == STEP_BACK:
            self.sub.hold = pacing.retry_after
            admission.shedding.note("queued callers are told to come back")
            await send_step_back(self.send, pacing.retry_after)
            return _STOP, None
        if step == HEARTBEAT:
            await self.send(self.heartbeat)
        return _WAIT, timeout

    async def _wait(self, limit: float | None) -> None:
        """Wait for the generation's next change, at most ``limit`` seconds. Caught up on a
        flowing stream, the relay writes what comes next itself where it can (see
        :mod:`streamsafe.gateway.generations.fanout`), until something else happens; else a
        silent stream gets its heartbeats from :class:`QuietWait`."""
        gen, pacing, quiet = self.gen, self.pacing, self.quiet
        if limit is None and pacing.committed and pacing.flowing:
            writer = self.terms.writer
            if writer is not None and self.sub.rename is None:
                self.cursor = await gen.fanout.serve(writer, self.cursor, quiet.beat)
                return
            if quiet.beat > 0:
                if await quiet.wait(gen):
                    await self.send(self.heartbeat)
                    quiet.wrote()
                return
        await wait_for_change(gen, limit)
