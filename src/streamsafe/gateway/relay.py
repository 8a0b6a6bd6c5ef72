"""The upstream reader: one task per generation that waits for admission, sends the request
upstream and appends what comes back to the generation's log.

A stream is read on the hot path (:mod:`streamsafe.gateway.event_stream`): each network read is
decoded once, in the connection's read callback, where the payloads of all the events it
completed are appended as one batch and the subscribers woken once, with no task switch; payloads
are relayed as the bytes upstream sent, never re-encoded (but for a continued stream's usage
chunk, made to count the whole answer). How a generation ends is not its business: it calls
``finish`` (given by whoever owns the generations) with the final state, so it never touches
lookup or retention.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx2

from streamsafe.gateway.admission import Admission, Shed, Waiter
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.continuation import (
    continuation_body,
    read_partial,
)
from streamsafe.gateway.errors import Failure, error_body
from streamsafe.gateway.event_stream import UpstreamClosed
from streamsafe.gateway.generation import Generation, State
from streamsafe.gateway.metrics import Counters
from streamsafe.gateway.stream_sink import StreamSink
from streamsafe.gateway.upstream import (
    MAX_ERROR_BODY,
    AttemptWatch,
    Upstream,
    UpstreamStalled,
    UpstreamTimeouts,
    is_engine_death,
    parse_retry_after,
    read_bounded,
)
from streamsafe.gateway.upstream_kinds import ends_answer
from streamsafe.sse import DONE

__all__ = ["BrokenAttempt", "Finish", "Relay"]

log = logging.getLogger("streamsafe.gateway")

#: Called once a generation has ended, with its final state (done, failed or aborted).
Finish = Callable[[Generation, State], None]
#: Longest Retry-After a refused continuation waits for; past it the stream ends with an error
#: (an engine that asks for longer is not coming back while its caller reads).
_MAX_REFUSAL_WAIT = 10.0


@dataclass(slots=True)
class BrokenAttempt:
    """Why an upstream attempt broke where another attempt may repair it: cut or ended early,
    stalled past a deadline, a malformed chunk, dropped before its answer, or a continuation
    refused before any work."""

    why: str
    #: The status a caller not yet answered gets if no attempt repairs it.
    status: int
    #: The upstream's own refusal, where it answered one.
    failure: Failure | None = None
    #: Seconds to wait before asking again (a refusal before any work).
    retry_after: int | None = None
    #: The deadline that passed, for a stall.
    stalled: UpstreamStalled | None = None


class Relay:
    """Runs generations upstream. ``finish`` is told how each one ended; ``counters`` counts
    what happened on the way; ``clock`` stamps admission (injectable for tests)."""

    def __init__(
        self,
        config: GatewayConfig,
        admission: Admission,
        upstream: Upstream,
        counters: Counters,
        finish: Finish,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.admission = admission
        self.upstream = upstream
        self.counters = counters
        self._finish = finish
        self._clock = clock
        #: The bounds every upstream attempt keeps (see :class:`AttemptWatch`).
        self.timeouts = UpstreamTimeouts(
            first_token=config.first_token_timeout,
            idle=config.idle_timeout,
            total=config.total_timeout,
        )

    async def run(self, gen: Generation) -> None:
        """Admit ``gen``, call upstream, and end it; the body of its reader task. Cancelling the
        task closes the upstream response, so the engine aborts the request."""
        admission = self.admission
        waiter: Waiter | None = None
        try:
            if self.upstream.breaker.is_open:
                await self._fail_dead(gen)
                return
            try:
                waiter = gen.waiter = admission.request(gen.tenant, gen.cost)
                if gen.subscribers == 0:
                    admission.set_active(waiter, False)
                gen.wake()  # its subscribers plan their wait with the place it got
                await admission.wait(waiter)
            except Shed as exc:
                self.counters.shed += 1
                msg = f"gateway at capacity ({exc.reason}); retry after {exc.retry_after} s"
                await self._fail(
                    gen, Failure(429, error_body(msg, "rate_limit_error", 429), exc.retry_after)
                )
                return
            except ValueError as exc:
                await self._fail(
                    gen, Failure(400, error_body(str(exc), "invalid_request_error", 400))
                )
                return
            if self.upstream.breaker.is_open:
                await self._fail_dead(gen)
                return
            gen.state = State.RUNNING
            gen.admitted_at = self._clock()
            self.counters.generations_started += 1
            gen.wake()
            await self._call_upstream(gen)
        except asyncio.CancelledError:
            if not gen.finished:
                self._finish(gen, State.ABORTED)
            raise
        except Exception as exc:  # a bug must not leave subscribers hanging
            log.exception("%s: reader failed", gen.id)
            await self._fail_mid_stream(gen, f"gateway error: {type(exc).__name__}")
        finally:
            if waiter is not None:
                admission.release(waiter)
                gen.waiter = None

    async def _call_upstream(self, gen: Generation) -> None:
        """The attempts of one generation: the first, then, for one that broke (cut, stalled,
        malformed, dropped before its answer) or a continuation refused before any work, more
        within ``max_continuations`` and the total timeout. A broken stream is continued from
        its log, so nothing is generated twice; an attempt that relayed nothing is asked again
        as it was (the engine aborted what it lost)."""
        timeouts = self.timeouts
        loop = asyncio.get_running_loop()
        total_deadline = None if timeouts.total is None else loop.time() + timeouts.total
        body = gen.request.body
        tries = 0
        while True:
            broken = await self.attempt(gen, body, total_deadline)
            if broken is None:
                return
            # Only a stream the upstream ends with [DONE] (OpenAI's format) reads back as a
            # partial answer; Llama Stack's streams end in their own way, told apart in _stream.
            route = gen.request.route
            partial = None
            if gen.stream and gen.length and (route is None or route.upstream_done):
                partial = await read_partial(gen.log)
            if partial is not None and partial.finished:  # only [DONE] was missing
                gen.length = await gen.log.append((DONE,))
                self.upstream.succeeded()
                self._finish(gen, State.DONE)
                return
            if (
                (broken.stalled is not None and broken.stalled.phase == "total")
                or tries >= self.config.max_continuations
                or self.upstream.breaker.is_open
            ):
                await self._fail_broken(gen, broken)
                return
            if broken.retry_after is not None:
                # Refused before any work: wait as told, within the total timeout.
                wait = min(float(broken.retry_after), _MAX_REFUSAL_WAIT)
                if total_deadline is not None and loop.time() + wait >= total_deadline:
                    await self._fail_broken(gen, broken)
                    return
                await asyncio.sleep(wait)
                if self.upstream.breaker.is_open:
                    await self._fail_broken(gen, broken)
                    return
            elif gen.length == 0:
                body = gen.request.body
            else:
                # Where the upstream cannot continue a partial answer (Llama Stack, a generic
                # OpenAI server), the subscribers get an error event: never an answer that
                # looks whole but is not.
                continuation = None
                if partial is not None and self.upstream.kind.can_continue:
                    continuation = continuation_body(gen.request, partial)
                if partial is None or continuation is None:
                    await self._fail_broken(gen, broken)
                    return
                body = continuation
                gen.tokens_before = partial.chunks
            tries += 1
            gen.continuations += 1
            self.counters.continued += 1
            log.info("%s: %s; asking upstream again (%d)", gen.id, broken.why, tries)

    async def attempt(
        self, gen: Generation, body: bytes, total_deadline: float | None = None
    ) -> BrokenAttempt | None:
        """One upstream request for ``gen`` with ``body``, within the upstream timeouts.
        Returns why it broke where another attempt may repair it (this engine or, for a pool,
        another), ``None`` where the generation has ended (done or failed)."""
        req = gen.request
        continuing = gen.continuations > 0 and gen.length > 0
        response: httpx2.Response | None = None
        try:
            async with AttemptWatch(self.timeouts, total_deadline) as watch:
                if gen.stream:
                    return await self._stream(gen, body, watch, continuing)
                try:
                    response = await self.upstream.open(
                        "POST",
                        req.path,
                        content=body,
                        headers={"content-type": "application/json"},
                        retry_connect=not req.no_upstream_retry,
                    )
                except httpx2.ConnectError as exc:
                    msg = f"upstream unreachable: {type(exc).__name__}"
                    failure = Failure(503, error_body(msg, "service_unavailable", 503), 1)
                    if gen.length:
                        return BrokenAttempt(msg, 503, failure=failure)
                    await self._fail(gen, failure)
                    return None
                except httpx2.HTTPError as exc:
                    # Connected, then the connection closed or reset before any answer: the
                    # engine dropped the request (it aborts what it loses), so asking again
                    # duplicates nothing.
                    why = f"upstream closed the connection before answering ({type(exc).__name__})"
                    self.upstream.failed(why)
                    return BrokenAttempt(why, 502)
                status = response.status_code
                gen.upstream_status = status
                if status != 200:
                    error = await read_bounded(response)
                    retry_after = response.headers.get("retry-after")
                    return await self._refused(gen, status, error, retry_after, continuing)
                gen.wake()  # upstream accepted the request
                body = await response.aread()
                gen.length = await gen.log.append((body,))
                self.upstream.succeeded()
                self._finish(gen, State.DONE)
                return None
        except UpstreamStalled as exc:
            self.counters.upstream_timeouts += 1
            if exc.phase != "total":
                self.upstream.failed(str(exc))
            return BrokenAttempt(str(exc), 504, stalled=exc)
        except httpx2.HTTPError as exc:
            why = f"upstream connection failed: {type(exc).__name__}"
            self.upstream.failed(why)
            return BrokenAttempt(why, 502)
        finally:
            if response is not None:
                await response.aclose()

    async def _refused(
        self,
        gen: Generation,
        status: int,
        body: bytes,
        retry_after_header: str | None,
        continuing: bool,
    ) -> BrokenAttempt | None:
        """An error status from upstream, with its (bounded) body. Before any event it is the
        caller's answer; a continuation refused before any work (429, or a 5xx that is not the
        engine's death) is asked again after ``Retry-After``."""
        dead = status >= 500 and is_engine_death(body)
        if status >= 500:
            self.counters.upstream_failures += 1
        if dead:
            self.upstream.engine_died(f"upstream {status}")
        elif status >= 500:
            self.upstream.failed(f"upstream {status}")
        retry_after = parse_retry_after(retry_after_header)
        failure = Failure(status, body, retry_after)
        if continuing and not dead and (status == 429 or status >= 500):
            why = f"upstream refused the continuation with {status}"
            return BrokenAttempt(why, status, failure=failure, retry_after=retry_after or 0)
        await self._fail(gen, failure)
        return None

    async def _stream(
        self, gen: Generation, body: bytes, watch: AttemptWatch, continuing: bool
    ) -> BrokenAttempt | None:
        """One attempt of a streaming completion, on the hot path: the response is parsed in
        the connection's read callback, where each read's events are checked, appended and the
        subscribers woken (:class:`~streamsafe.gateway.stream_sink.StreamSink`); this task only
        waits for the end.

        A stream ends whole with ``[DONE]``, or, where the upstream sends none (Llama Stack), at
        the end of the body right after the event that closes an answer; a ``[DONE]`` is then
        appended to the log, so every whole stream in a log ends alike. An error event counts as
        an upstream failure where it stands for one (Llama Stack's masked 500s)."""
        req = gen.request
        try:
            conn = await self.upstream.open_events(
                req.path, body, retry_connect=not req.no_upstream_retry
            )
        except OSError as exc:
            msg = f"upstream unreachable: {type(exc).__name__}"
            failure = Failure(503, error_body(msg, "service_unavailable", 503), 1)
            if gen.length:
                return BrokenAttempt(msg, 503, failure=failure)
            await self._fail(gen, failure)
            return None
        sink = StreamSink(
            gen,
            watch,
            continuing,
            stop=conn.close,
            upstream=self.upstream,
            counters=self.counters,
            finish=self._finish,
        )
        try:
            try:
                await conn.head()
            except UpstreamClosed as exc:
                # Connected, then closed or reset before any answer: the engine dropped the
                # request (it aborts what it loses), so asking again duplicates nothing.
                why = f"upstream closed the connection before answering ({exc})"
                self.upstream.failed(why)
                return BrokenAttempt(why, 502)
            status = conn.status
            gen.upstream_status = status
            self.upstream.alive_at = asyncio.get_running_loop().time()
            if status != 200:
                error = await conn.read_body(MAX_ERROR_BODY)
                retry_after = conn.header(b"retry-after")
                return await self._refused(gen, status, error, _latin1(retry_after), continuing)
            gen.wake()  # upstream accepted the request: an early commit may go now
            end = conn.stream_events(sink.events, on_read=watch.chunk)
            while not sink.in_process and not end.done():
                await asyncio.wait((end, sink.ready()), return_when=asyncio.FIRST_COMPLETED)
                await sink.flush()
            broke = await end
            await sink.flush()
            if sink.malformed:
                return BrokenAttempt("upstream sent a malformed chunk", 502)
            if sink.done or gen.finished:
                return None
            route = gen.request.route
            if broke is None and route is not None and not route.upstream_done:
                # Llama Stack's streams just end: after their last event, or after an error
                # event.
                if sink.errored or ends_answer(route.wire, sink.last):
                    gen.length = await gen.log.append((DONE,))
                    if not sink.errored:
                        self.upstream.succeeded()
                    self._finish(gen, State.FAILED if sink.errored else State.DONE)
                    return None
                return BrokenAttempt("upstream stream ended before the answer was complete", 502)
            if sink.errored:
                await self._fail_mid_stream(gen, "upstream stream ended after an error event")
                return None
            if broke is not None and broke.startswith("upstream sent a broken event stream"):
                await self._fail_mid_stream(gen, broke)
                return None
            if broke is not None:
                why = f"upstream connection failed: {broke}"
                self.upstream.failed(why)
                return BrokenAttempt(why, 502)
            return BrokenAttempt("upstream stream ended before [DONE]", 502)
        finally:
            conn.release(finished=sink.done)

    # -- endings --------------------------------------------------------------------------------

    async def _fail_dead(self, gen: Generation) -> None:
        self.counters.breaker_rejections += 1
        retry_after = self.upstream.breaker.retry_after()
        msg = f"engine is down; retry after {retry_after} s"
        await self._fail(
            gen, Failure(503, error_body(msg, "service_unavailable", 503), retry_after)
        )

    async def _fail(self, gen: Generation, failure: Failure) -> None:
        """Failure before any event: answered with its real status where not yet committed."""
        if gen.length:
            await self._fail_mid_stream(gen, failure.as_event().decode())
            return
        gen.failure = failure
        self._finish(gen, State.FAILED)

    async def _fail_broken(self, gen: Generation, broken: BrokenAttempt) -> None:
        """No attempt left to repair ``broken``: before any event the caller gets a real status
        (the upstream's own refusal where it gave one), after them an error event."""
        if gen.length:
            await self._fail_mid_stream(gen, broken.why, broken.status)
            return
        failure = broken.failure or Failure(
            broken.status, error_body(broken.why, "upstream_error", broken.status)
        )
        await self._fail(gen, failure)

    async def _fail_mid_stream(self, gen: Generation, message: str, status: int = 502) -> None:
        """After events went out: end the log with an error event and ``[DONE]`` (vLLM's way).
        A non-streaming generation has no events to follow, so it fails with ``status``
        instead."""
        if gen.finished:
            return
        log.info("%s: failed mid-stream: %s", gen.id, message)
        if gen.stream:
            if message.startswith('{"error"'):
                payload = message.encode()
            else:
                payload = error_body(message, "upstream_error", status)
            gen.length = await gen.log.append((payload, DONE))
        else:
            gen.failure = Failure(status, error_body(message, "upstream_error", status))
        self._finish(gen, State.FAILED)


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")
