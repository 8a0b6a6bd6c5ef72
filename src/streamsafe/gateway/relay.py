"""The upstream reader: one task per generation that waits for admission, sends the request
upstream and appends what comes back to the generation's log.

It decodes each network chunk once, appends the payloads of all the events the chunk completed
as one batch, and wakes the subscribers once per batch; payloads are relayed as the bytes
upstream sent, never re-encoded (but for a continued stream's usage chunk, made to count the whole
answer). How a generation ends is not its business: it calls ``finish``
(given by whoever owns the generations) with the final state, so it never touches lookup or
retention.
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
    is_role_chunk,
    read_partial,
    whole_usage,
)
from streamsafe.gateway.engines import Attempts, Engines, OneEngine
from streamsafe.gateway.errors import ERROR_PREFIXES, Failure, error_body
from streamsafe.gateway.generation import Generation, State
from streamsafe.gateway.metrics import Counters
from streamsafe.gateway.store import LeaseLost
from streamsafe.gateway.upstream import (
    AttemptWatch,
    Upstream,
    UpstreamStalled,
    UpstreamTimeouts,
    is_engine_death,
    parse_retry_after,
    read_bounded,
)
from streamsafe.gateway.upstream_kinds import ends_answer, parse_error_event
from streamsafe.sse import DONE, SSEDecoder, SSEError

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
        engines: Engines | None = None,
    ) -> None:
        self.config = config
        self.admission = admission
        self.upstream = upstream
        #: The engine pool, where the gateway has several engines (else ``upstream`` alone).
        self.engines = engines
        self._breaker = engines.breaker if engines is not None else upstream.breaker
        self.counters = counters
        self._finish = finish
        self._clock = clock
        #: The bounds every upstream attempt keeps (see :class:`AttemptWatch`).
        self.timeouts = UpstreamTimeouts(
            first_token=config.first_token_timeout,
            idle=config.idle_timeout,
            total=config.total_timeout,
        )

    async def run(self, gen: Generation, cut: str | None = None) -> None:
        """Admit ``gen``, call upstream, and end it; the body of its reader task. Cancelling the
        task closes the upstream response, so the engine aborts the request. ``cut`` says why a
        generation whose log already holds events is run again (another replica ran it and is
        gone): it is continued from its log, like a broken stream."""
        admission = self.admission
        waiter: Waiter | None = None
        engines = self.engines
        attempts: Attempts = (
            engines.for_generation(gen.request.body, gen.cost)
            if engines is not None
            else OneEngine(self.upstream)
        )
        try:
            if self._breaker.is_open:
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
            if self._breaker.is_open:
                await self._fail_dead(gen)
                return
            gen.state = State.RUNNING
            gen.admitted_at = self._clock()
            self.counters.generations_started += 1
            gen.wake()
            await self._call_upstream(gen, attempts, cut if gen.length else None)
        except asyncio.CancelledError:
            if not gen.finished:
                self._finish(gen, State.ABORTED)
            raise
        except LeaseLost:
            raise  # another replica runs it now; this one must not write a word more
        except Exception as exc:  # a bug must not leave subscribers hanging
            log.exception("%s: reader failed", gen.id)
            await self._fail_mid_stream(gen, f"gateway error: {type(exc).__name__}")
        finally:
            attempts.release()
            if waiter is not None:
                admission.release(waiter)
                gen.waiter = None

    async def _call_upstream(
        self, gen: Generation, attempts: Attempts, cut: str | None = None
    ) -> None:
        """The attempts of one generation: the first, then, for one that broke (cut, stalled,
        malformed, dropped before its answer) or a continuation refused before any work, more
        within ``max_continuations`` and the total timeout. A broken stream is continued from
        its log, so nothing is generated twice; an attempt that relayed nothing is asked again
        as it was (the engine aborted what it lost). With a pool, the next attempt goes to another
        engine where there is one. ``cut``: the generation broke elsewhere (its replica died)
        and is continued first."""
        timeouts = self.timeouts
        loop = asyncio.get_running_loop()
        total_deadline = None if timeouts.total is None else loop.time() + timeouts.total
        body = gen.request.body
        tries = 0
        while True:
            if cut is not None:
                broken: BrokenAttempt | None = BrokenAttempt(cut, 502)
                cut = None
            else:
                broken = await self.attempt(gen, body, attempts, total_deadline)
            if broken is None:
                return
            attempts.cut()
            # Only a stream the upstream ends with [DONE] (OpenAI's format) reads back as a
            # partial answer; Llama Stack's streams end in their own way, told apart in _pump.
            route = gen.request.route
            partial = None
            if gen.stream and gen.length and (route is None or route.upstream_done):
                partial = await read_partial(gen.log)
            if partial is not None and partial.finished:  # only [DONE] was missing
                gen.length = await gen.log.append((DONE,))
                attempts.succeeded()
                self._finish(gen, State.DONE)
                return
            if (
                (broken.stalled is not None and broken.stalled.phase == "total")
                or tries >= self.config.max_continuations
                or self._breaker.is_open
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
                if self._breaker.is_open:
                    await self._fail_broken(gen, broken)
                    return
            elif gen.length == 0:
                body = gen.request.body
            else:
                # Where the upstream cannot continue a partial answer (Llama Stack, a generic
                # OpenAI server), the subscribers get an error event: never an answer that
                # looks whole but is not.
                continuation = None
                if partial is not None and attempts.upstream.kind.can_continue:
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
        self,
        gen: Generation,
        body: bytes,
        attempts: Attempts,
        total_deadline: float | None = None,
    ) -> BrokenAttempt | None:
        """One upstream request for ``gen`` with ``body``, within the upstream timeouts.
        Returns why it broke where another attempt may repair it (this engine or, for a pool,
        another), ``None`` where the generation has ended (done or failed)."""
        req = gen.request
        continuing = gen.continuations > 0 and gen.length > 0
        response: httpx2.Response | None = None
        try:
            async with AttemptWatch(self.timeouts, total_deadline) as watch:
                try:
                    response = await attempts.open(
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
                    attempts.failed(why)
                    return BrokenAttempt(why, 502)
                status = response.status_code
                gen.upstream_status = status
                if status != 200:
                    return await self._refused(gen, response, continuing, attempts)
                gen.wake()  # upstream accepted the request: an early commit may go now
                if gen.stream:
                    return await self._pump(gen, response, watch, continuing, attempts)
                body = await response.aread()
                attempts.served()
                gen.length = await gen.log.append((body,))
                attempts.succeeded()
                self._finish(gen, State.DONE)
                return None
        except UpstreamStalled as exc:
            self.counters.upstream_timeouts += 1
            if exc.phase != "total":
                attempts.failed(str(exc))
            return BrokenAttempt(str(exc), 504, stalled=exc)
        except httpx2.HTTPError as exc:
            why = f"upstream connection failed: {type(exc).__name__}"
            attempts.failed(why)
            return BrokenAttempt(why, 502)
        finally:
            if response is not None:
                await response.aclose()

    async def _refused(
        self, gen: Generation, response: httpx2.Response, continuing: bool, attempts: Attempts
    ) -> BrokenAttempt | None:
        """An error status from upstream. Before any event it is the caller's answer; a
        continuation refused before any work (429, or a 5xx that is not the engine's death) is
        asked again after ``Retry-After``."""
        status = response.status_code
        body = await read_bounded(response)
        dead = status >= 500 and is_engine_death(body)
        if status >= 500:
            self.counters.upstream_failures += 1
        if dead:
            attempts.engine_died(f"upstream {status}")
        elif status >= 500:
            attempts.failed(f"upstream {status}")
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        failure = Failure(status, body, retry_after)
        if continuing and not dead and (status == 429 or status >= 500):
            why = f"upstream refused the continuation with {status}"
            return BrokenAttempt(why, status, failure=failure, retry_after=retry_after or 0)
        await self._fail(gen, failure)
        return None

    async def _pump(
        self,
        gen: Generation,
        response: httpx2.Response,
        watch: AttemptWatch,
        continuing: bool,
        attempts: Attempts,
    ) -> BrokenAttempt | None:
        """Relay the event stream; the hot path, once per network chunk.

        A stream ends whole with ``[DONE]``, or, where the upstream sends none (Llama Stack), at
        the end of the body right after the event that closes an answer; a ``[DONE]`` is then
        appended to the log, so every whole stream in a log ends alike. An error event counts as
        an upstream failure where it stands for one (Llama Stack's masked 500s)."""
        decoder = SSEDecoder()
        log_ = gen.log
        # An in-process log is appended to without a coroutine per chunk.
        append_now = log_.append_nowait
        counters = self.counters
        kind = attempts.upstream.kind  # the engine of this attempt (each probed on its own)
        route = gen.request.route
        errored = False
        skip_role = continuing
        tokens_before = gen.tokens_before if continuing else 0
        # Events before the engine's first token (Llama Stack's start event) do not end the
        # first-token wait.
        preamble = route.preamble if route is not None else 0
        last = b""
        try:
            async for chunk in response.aiter_raw():
                watch.chunk()
                events = decoder.feed(chunk)
                if not events:
                    continue
                payloads = [ev.raw for ev in events]
                if skip_role:
                    # A continuation opens with the assistant's role chunk again; the log has
                    # it already.
                    skip_role = False
                    if is_role_chunk(payloads[0]):
                        del payloads[0]
                        if not payloads:
                            continue
                malformed = None
                for i, p in enumerate(payloads):
                    if p.startswith(ERROR_PREFIXES):
                        errored = True
                        if is_engine_death(p):
                            attempts.engine_died("error event")
                        else:
                            error = parse_error_event(kind, p)
                            if error is not None and error.upstream_failure:
                                counters.upstream_failures += 1
                                attempts.failed(f"error event {error.status}")
                    elif p[:1] != b"{" or p[-1:] != b"}":
                        # Not a JSON object: a chunk cut off or garbled, never relayed (a
                        # check of its ends only: parsing every chunk would cost the hot path).
                        if p != DONE:
                            malformed = i
                            break
                    elif b"\n" in p:
                        gen.multiline = True
                    elif tokens_before and b'"usage"' in p:
                        payloads[i] = whole_usage(p, tokens_before)
                if malformed is not None:
                    del payloads[malformed:]
                if payloads:
                    if append_now is not None:
                        gen.length = append_now(payloads)
                    else:
                        gen.length = await log_.append(payloads)
                    counters.events_relayed += len(payloads)
                    gen.wake()
                    last = payloads[-1]
                    if not watch.flowing and gen.length > preamble:
                        watch.first_event()
                        attempts.served()  # the engine delivered: its breaker closes
                if malformed is not None:
                    return BrokenAttempt("upstream sent a malformed chunk", 502)
                if last == DONE:
                    if not errored:
                        attempts.succeeded()
                    self._finish(gen, State.FAILED if errored else State.DONE)
                    return None
        except SSEError as exc:
            await self._fail_mid_stream(gen, f"upstream sent a broken event stream: {exc}")
            return None
        if route is not None and not route.upstream_done:
            # Llama Stack's streams just end: after their last event, or after an error event.
            if errored or ends_answer(route.wire, last):
                gen.length = await log_.append((DONE,))
                if not errored:
                    attempts.succeeded()
                self._finish(gen, State.FAILED if errored else State.DONE)
                return None
            return BrokenAttempt("upstream stream ended before the answer was complete", 502)
        if errored:
            await self._fail_mid_stream(gen, "upstream stream ended after an error event")
            return None
        return BrokenAttempt("upstream stream ended before [DONE]", 502)

    # -- endings --------------------------------------------------------------------------------

    async def _fail_dead(self, gen: Generation) -> None:
        self.counters.breaker_rejections += 1
        retry_after = self._breaker.retry_after()
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
