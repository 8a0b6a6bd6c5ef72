"""Writing a generation to one subscriber: when its stream commits, heartbeats, and framing.

A subscriber keeps its own cursor into the generation's log. Its loop reads from the cursor to
the end of the log, sends all of it in one body message, and waits for the next change. A
concurrent task watches for ``http.disconnect``, so a client that leaves is noticed at once, even
while its generation is quiet.

When the headers go out and when a ``: keep-alive`` comment is due is decided by
:class:`Pacing` (see docs/design.md, Commit); the loop in :func:`serve_stream` only relays.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from streamsafe._asgi import Message, Receive, Send, respond
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.errors import error_body, send_failure
from streamsafe.gateway.generation import Generation, State
from streamsafe.sse import DONE, DONE_EVENT, encode_event, encode_events

__all__ = [
    "COMMIT",
    "HEARTBEAT",
    "WAIT",
    "Pacing",
    "StreamRules",
    "Subscriber",
    "serve_json",
    "serve_stream",
]

# One comment line with no blank line after it: a blank line would end an event, and the
# Stainless clients' decoders (llama-stack-client, openai) dispatch an empty event there once an
# ``id:`` has been seen, which llama-stack-client then fails to JSON-decode. A comment line is
# ignored and the next event's lines simply follow it.
_HEARTBEAT = b": keep-alive\n"
_HEARTBEAT_MSG: Message = {"type": "http.response.body", "body": _HEARTBEAT, "more_body": True}
_JSON_HEARTBEAT_MSG: Message = {"type": "http.response.body", "body": b" ", "more_body": True}
_SSE_END: Message = {"type": "http.response.body", "body": b"", "more_body": False}

#: What :meth:`Pacing.step` asks for before the subscriber waits.
WAIT, COMMIT, HEARTBEAT = 0, 1, 2


class Subscriber:
    """One client reading one generation; ``gone`` once it disconnected."""

    __slots__ = ("gen", "gone")

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.gone = False

    async def watch(self, receive: Receive) -> None:
        """Wait for ``http.disconnect``, then mark the subscriber gone and wake its loop."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                self.gen.wake()
                return


@dataclass(frozen=True, slots=True)
class StreamRules:
    """The gateway-wide settings of every streaming subscriber."""

    #: Commit before the first event (``commit="early"``).
    early: bool
    #: Seconds between heartbeats before the first event (0: none).
    heartbeat: float
    #: Seconds an early commit waits for upstream to accept before committing anyway: one
    #: heartbeat interval, at most 1 s, so the headers and then the heartbeats reach a client
    #: whose request waits in the queue long before its read timeout.
    commit_wait: float
    #: The ``x-stream-resumable`` header value.
    resumable: bytes
    #: Keep a waiting non-streaming call's connection alive with whitespace (see
    #: :func:`serve_json`).
    json_keepalive: bool = False

    @classmethod
    def from_config(cls, config: GatewayConfig) -> StreamRules:
        """The rules ``config`` sets."""
        heartbeat = config.heartbeat
        return cls(
            early=config.commit == "early",
            heartbeat=heartbeat,
            commit_wait=min(heartbeat, 1.0) if heartbeat > 0 else 1.0,
            resumable=b"true" if config.keep_finished > 0 else b"false",
            json_keepalive=config.json_keepalive,
        )


class Pacing:
    """The commit and heartbeat rules of one streaming subscriber, fed the clock's reading.

    Headers go out with the first event; under early commit, also once upstream accepted the
    request or ``commit_wait`` after admission (or creation, while queued), whichever is first,
    so heartbeats cover the queue and the first token alike (a slow but healthy request must
    never trip a client's read timeout). Heartbeats stop once events flow.
    """

    __slots__ = ("_next_beat", "_rules", "committed", "flowing")

    def __init__(self, rules: StreamRules, flowing: bool) -> None:
        self._rules = rules
        self._next_beat = 0.0
        #: The response headers went out.
        self.committed = False
        #: Events went out (or the stream resumes past some): no more heartbeats.
        self.flowing = flowing

    def step(self, gen: Generation, now: float) -> tuple[int, float | None]:
        """What to send before waiting (:data:`WAIT`: nothing, :data:`COMMIT`: the headers,
        :data:`HEARTBEAT`) and the most seconds to wait for ``gen`` to change (``None``: no
        limit). After :data:`COMMIT`, ask again before waiting."""
        rules = self._rules
        if not self.committed:
            if rules.early and gen.live:
                since = gen.admitted_at if gen.admitted_at is not None else gen.created_at
                deadline = since + rules.commit_wait
                if gen.upstream_status == 200 or now >= deadline:
                    self.committed = True
                    self._next_beat = now + rules.heartbeat
                    return COMMIT, None
                return WAIT, deadline - now
            return WAIT, None
        if not self.flowing and rules.heartbeat > 0:
            if now >= self._next_beat:
                self._next_beat = now + rules.heartbeat
                return HEARTBEAT, rules.heartbeat
            return WAIT, self._next_beat - now
        return WAIT, None


async def serve_json(sub: Subscriber, send: Send, rules: StreamRules | None = None) -> None:
    """Answer a non-streaming request once its generation finished.

    With ``rules.json_keepalive`` (and a heartbeat), a call still waiting after ``commit_wait``
    is answered 200 at once and sent one space every heartbeat until its answer follows (JSON
    allows whitespace before a value), so a slow but healthy call never trips a client's read
    timeout. The price: a failure after that arrives as a 200 whose body is the error object.
    """
    gen = sub.gen
    keepalive = rules is not None and rules.json_keepalive and rules.heartbeat > 0
    committed = False
    next_beat = time.monotonic() + (rules.commit_wait if rules is not None else 0.0)
    generation_header = (b"x-streamsafe-generation", gen.id.encode())
    while not sub.gone:
        version = gen.version
        if gen.finished:
            if gen.failure is not None:
                status, body = gen.failure.status, gen.failure.body
            elif gen.state is State.DONE:
                status, (body,) = 200, await gen.log.read(0)
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
            await send(_JSON_HEARTBEAT_MSG)
            next_beat = now + rules.heartbeat
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
    preamble: int = 0,
) -> None:
    """Relay ``sub``'s generation from event ``start`` on, as SSE with ids. ``drop_done`` leaves
    out ``data: [DONE]`` (Llama Stack's streams end without it). The first ``preamble`` events
    come before the first token (Llama Stack's ``start`` event), so heartbeats go on past them."""
    gen = sub.gen
    pacing = Pacing(rules, flowing=start > preamble)
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
            body = encode_events(batch, cursor, gen.multiline)
            cursor += n
            pacing.flowing = cursor > preamble
            await send({"type": "http.response.body", "body": body, "more_body": True})
            continue
        if gen.finished:
            await _end(gen, send, start_msg, pacing.committed, drop_done)
            return
        step, timeout = pacing.step(gen, time.monotonic())
        if step == COMMIT:
            await send(start_msg)
            continue
        if step == HEARTBEAT:
            await send(_HEARTBEAT_MSG)
        if gen.version != version:  # changed while a heartbeat or the headers went out
            continue
        waiter = gen.next_change()
        if timeout is None:
            await waiter
        else:
            try:
                async with asyncio.timeout(max(0.0, timeout)):
                    await waiter
            except TimeoutError:
                gen.forget_waiter(waiter)


async def _end(
    gen: Generation, send: Send, start_msg: Message, committed: bool, drop_done: bool
) -> None:
    """Every event went out and ``gen`` finished: close the stream. A failure before anything
    was committed keeps its real status; after commit it becomes an error event (vLLM's way)."""
    failure = gen.failure
    if not committed:
        if failure is not None:
            await send_failure(send, failure)
            return
        await send(start_msg)
    if failure is not None:
        tail = encode_event(failure.as_event())
        if not drop_done:
            tail += DONE_EVENT
        await send({"type": "http.response.body", "body": tail, "more_body": False})
    else:
        await send(_SSE_END)
