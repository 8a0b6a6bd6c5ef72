"""Writing a generation to one subscriber: when its stream commits, heartbeats, and framing.

A subscriber keeps its own cursor into the generation's log. Its loop reads from the cursor to
the end of the log, sends all of it in one body message, and waits for the next change. A
client that leaves is noticed at once, even while its generation is quiet: the server calls
:meth:`Subscriber.left` (:data:`~streamsafe._asgi.DISCONNECT_EXTENSION`), or, on a server that
does not offer that, a concurrent task watches for ``http.disconnect``.

When the headers go out, when a ``: keep-alive`` comment is due, and what a subscriber whose
generation is still queued is told (commit, a real 429 before any commit, or come back later) is
decided by :class:`~streamsafe.gateway.serving.pacing.Pacing` (see docs/design.md, Commit and
Admission); the loop in :func:`serve_stream` only relays. A subscriber that keeps up is served
from the relay's read callback instead (:mod:`streamsafe.gateway.generations.fanout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from streamsafe._asgi import (
    BodyWriter,
    Message,
    OnDisconnect,
    Receive,
    Scope,
    Send,
    on_disconnect,
    respond,
)
from streamsafe.gateway.admission.admission import Admission, retry_after_seconds
from streamsafe.gateway.admission.fair_queue import QUEUED
from streamsafe.gateway.errors import Failure, ResumePastEnd, error_body, send_failure
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.keepalive import KEEPALIVE_LINE, QuietWait
from streamsafe.gateway.serving.pacing import (
    COMMIT,
    HEARTBEAT,
    SHED,
    STEP_BACK,
    Pacing,
    StreamRules,
    heartbeat_within,
)
from streamsafe.sse import DONE, DONE_EVENT, encode_event, encode_events

__all__ = ["Subscriber", "serve_json", "serve_stream", "wait_for_change"]

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
        (:data:`~streamsafe._asgi.DISCONNECT_EXTENSION`, no task per request), else by a task
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
) -> None:
    """Answer a non-streaming request once its generation finished.

    With ``rules.json_keepalive`` (and a heartbeat), a call still waiting after ``commit_wait``
    is answered 200 at once and sent one space every heartbeat until its answer follows (JSON
    allows whitespace before a value), so a slow but healthy call never trips a client's read
    timeout. A client that states its read timeout (``x-stainless-read-timeout``) gets the
    first space and the next ones at least twice within it. The price: a failure after that
    arrives as a 200 whose body is the error object. ``admission`` is told of that commit, so a
    queued generation is not shed after it.
    """
    gen = sub.gen
    keepalive = rules is not None and rules.json_keepalive and rules.heartbeat > 0
    committed = False
    beat = heartbeat_within(rules.heartbeat, sub.patience) if rules is not None else 0.0
    first = min(rules.commit_wait, beat) if rules is not None else 0.0
    next_beat = time.monotonic() + first
    generation_header = (b"x-streamsafe-generation", gen.id.encode())
    while not sub.gone:
        version = gen.version
        if gen.finished:
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
            return
        if not keepalive:
            await gen.next_change()
            continue
        assert rules is not None
        now = time.monotonic()
        if now >= next_beat:
            if not committed:
                headers = [(b"content-type", b"application/json"), generation_header]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                committed = True
                if admission is not None and gen.waiter is not None:
                    admission.commit(gen.waiter)
            await send(_JSON_HEARTBEAT_MSG)
            next_beat = now + beat
            if gen.version != version:
                continue
        waiter = gen.next_change()
        try:
            async with asyncio.timeout(max(0.0, next_beat - now)):
                await waiter
        except TimeoutError:
            gen.forget_waiter(waiter)


async def serve_stream(
    sub: Subscriber,
    start: int,
    send: Send,
    rules: StreamRules,
    drop_done: bool,
    admission: Admission,
    reset_on_failure: Callable[[], None] | None = None,
    preamble: int = 0,
    writer: BodyWriter | None = None,
) -> None:
    """Relay ``sub``'s generation from event ``start`` on, as SSE with ids. ``drop_done`` leaves
    out ``data: [DONE]`` (Llama Stack's streams end without it). ``admission`` predicts a queued
    generation's wait, and is told of a commit or a refusal before it. ``reset_on_failure``: how
    to end a stream whose generation failed after commit instead of closing it cleanly (a reset,
    for clients that would read a clean end as a complete answer). The first ``preamble`` events
    come before the first token (Llama Stack's ``start`` event), so heartbeats go on past them.
    ``writer``: the server's direct body writer, with which a subscriber that keeps up is served
    from the relay's read callback (:mod:`streamsafe.gateway.generations.fanout`).

    Once events flow, a stream silent for a heartbeat interval (the engine stalled mid-answer)
    gets a ``: keep-alive`` comment too, from the fan-out's timer or, for a subscriber its own
    loop serves, from :class:`~streamsafe.gateway.generations.keepalive.QuietWait`'s: neither sets a
    timer per chunk."""
    # Heartbeats once events flow, every ``beat`` seconds of silence (0: heartbeats are off).
    beat = heartbeat_within(rules.heartbeat, sub.patience) if rules.heartbeat > 0 else 0.0
    quiet = QuietWait(beat)
    try:
        await _serve_stream(
            sub, start, send, rules, drop_done, admission, reset_on_failure, preamble, writer, quiet
        )
    finally:
        quiet.close()


async def _serve_stream(
    sub: Subscriber,
    start: int,
    send: Send,
    rules: StreamRules,
    drop_done: bool,
    admission: Admission,
    reset_on_failure: Callable[[], None] | None,
    preamble: int,
    writer: BodyWriter | None,
    quiet: QuietWait,
) -> None:
    """:func:`serve_stream`'s loop, ``quiet`` its wait once events flow."""
    gen = sub.gen
    pacing = Pacing(rules, start > preamble, time.monotonic(), sub.patience, sub.last_attempt)
    cursor = start
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        (b"x-stream-resumable", rules.resumable),
        (b"x-streamsafe-generation", gen.id.encode()),
    ]
    start_msg: Message = {"type": "http.response.start", "status": 200, "headers": headers}
    log_ = gen.log
    # An in-process log is read without a coroutine per chunk.
    read_now = log_.read_nowait
    while not sub.gone:
        version = gen.version
        if cursor < gen.length:
            batch = read_now(cursor) if read_now is not None else await log_.read(cursor)
            if not pacing.committed:
                await send(start_msg)
                pacing.committed = True
            n = len(batch)
            if drop_done and batch[-1] == DONE:
                batch.pop()
            if sub.rename is not None:
                batch = [sub.rename(p) for p in batch]
            body = encode_events(batch, cursor, gen.multiline)
            cursor += n
            pacing.flowing = cursor > preamble
            if gen.finished and cursor >= gen.length:  # the last events and the end: one write
                await _end(gen, send, start_msg, True, drop_done, reset_on_failure, body)
                return
            await send({"type": "http.response.body", "body": body, "more_body": True})
            quiet.wrote()
            continue
        if gen.finished:
            # A resume from past what the generation came to (its Last-Event-ID was never
            # sent) is refused as a finished generation's is, or told in an error event.
            past = ResumePastEnd(cursor - 1, gen.length).failure() if cursor > gen.length else None
            await _end(
                gen, send, start_msg, pacing.committed, drop_done, reset_on_failure, past=past
            )
            return
        place = gen.waiter
        queued = place is not None and place.state == QUEUED and not pacing.committed
        predicted = admission.predicted_wait(place) if queued and place is not None else None
        step, timeout = pacing.step(gen, time.monotonic(), predicted)
        if step == COMMIT:
            if place is not None:
                admission.commit(place)  # from now on its place is never shed
            await send(start_msg)
            continue
        if step == SHED and place is not None:
            # Refused before any commit: the relay fails the generation with a real 429.
            admission.shed(place, retry_after_seconds(pacing.retry_after, 1.0))
            continue
        if step == STEP_BACK:
            sub.hold = pacing.retry_after
            admission.shedding.note("queued callers are told to come back")
            await _send_step_back(send, pacing.retry_after)
            return
        if step == HEARTBEAT:
            await send(_HEARTBEAT_MSG)
        if gen.version != version:  # changed while a heartbeat or the headers went out
            continue
        if timeout is None and pacing.committed and pacing.flowing:
            if writer is not None and read_now is not None and sub.rename is None:
                # Caught up on a flowing stream: the relay writes what comes next itself, until
                # something else happens (see streamsafe.gateway.generations.fanout).
                cursor = await gen.fanout.serve(writer, cursor, quiet.beat)
                continue
            if quiet.beat > 0:
                if await quiet.wait(gen):
                    await send(_HEARTBEAT_MSG)
                    quiet.wrote()
                continue
        await wait_for_change(gen, timeout)


async def _send_step_back(send: Send, retry_after: float) -> None:
    """429 to a client that would time out before its place comes; the place is kept for its
    return. ``retry-after-ms`` (read by Stainless clients and streamsafe's) says it precisely."""
    msg = f"gateway at capacity; your place is kept: retry after {retry_after:.3g} s"
    headers = [
        (b"retry-after", str(retry_after_seconds(retry_after, 1.0)).encode()),
        (b"retry-after-ms", str(max(1, round(retry_after * 1000))).encode()),
    ]
    await respond(send, 429, error_body(msg, "rate_limit_error", 429), headers=headers)


async def wait_for_change(gen: Generation, limit: float | None) -> None:
    """Wait until ``gen`` changes, or at most ``limit`` seconds (``None``: no limit). Only the
    waits before events flow have a limit (commit, heartbeats), so this is off the per-chunk
    path."""
    waiter = gen.next_change()
    if limit is None:
        await waiter
        return
    # A timer that resolves the waiter costs less than asyncio.timeout's cancellation. Whether
    # it fired is recorded by the timer itself: neither the clock (uvloop's timers run on
    # millisecond ticks) nor the handle (uvloop answers a due deadline with a plain Handle,
    # which has no when()) can tell.
    expired = _Expiry(waiter)
    timer = asyncio.get_running_loop().call_later(max(0.0, limit), expired)
    await waiter
    timer.cancel()
    if expired.fired:  # woken by the timer: still on the waiting list
        gen.forget_waiter(waiter)


class _Expiry:
    """The timer's callback: resolve the waiter, remember that it did."""

    __slots__ = ("fired", "waiter")

    def __init__(self, waiter: asyncio.Future[None]) -> None:
        self.waiter = waiter
        self.fired = False

    def __call__(self) -> None:
        self.fired = True
        if not self.waiter.done():
            self.waiter.set_result(None)


async def _end(
    gen: Generation,
    send: Send,
    start_msg: Message,
    committed: bool,
    drop_done: bool,
    reset_on_failure: Callable[[], None] | None,
    last: bytes = b"",
    past: Failure | None = None,
) -> None:
    """Every event went out (but ``last``, the framed final events, sent with the end) and
    ``gen`` finished: close the stream. A failure before anything was committed keeps its real
    status; after commit it becomes an error event (vLLM's way), and the stream ends with
    ``reset_on_failure`` where one is given. ``past``: the subscriber resumed from past the
    end, which is its failure whatever the generation's."""
    failure = past or gen.failure
    if not committed:
        if failure is not None:
            await send_failure(send, failure)
            return
        await send(start_msg)
    reset = reset_on_failure if past is not None or gen.state is State.FAILED else None
    tail = last
    if failure is not None:
        tail += encode_event(failure.as_event())
        if not drop_done:
            tail += DONE_EVENT
    if reset is None:
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return
    if tail:
        await send({"type": "http.response.body", "body": tail, "more_body": True})
    reset()
