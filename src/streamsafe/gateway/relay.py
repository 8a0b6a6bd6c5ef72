"""The upstream reader: one task per generation that waits for admission, sends the request
upstream and appends what comes back to the generation's log.

It decodes each network chunk once, appends the payloads of all the events the chunk completed
as one batch, and wakes the subscribers once per batch; payloads are relayed as the bytes
upstream sent, never re-encoded. How a generation ends is not its business: it calls ``finish``
(given by whoever owns the generations) with the final state, so it never touches lookup or
retention.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx2

from streamsafe.gateway.admission import Admission, Shed, Ticket
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.continuation import (
    continuation_body,
    is_role_chunk,
    read_partial,
)
from streamsafe.gateway.engines import Attempts, Engines, OneEngine
from streamsafe.gateway.errors import ERROR_PREFIXES, Failure, error_body
from streamsafe.gateway.generation import Generation, State
from streamsafe.gateway.metrics import Counters
from streamsafe.gateway.store import LeaseLost
from streamsafe.gateway.upstream import (
    Upstream,
    is_engine_death,
    parse_retry_after,
    read_bounded,
)
from streamsafe.sse import DONE, SSEDecoder, SSEError

__all__ = ["Finish", "Relay"]

log = logging.getLogger("streamsafe.gateway")

#: Called once a generation has ended, with its final state (done, failed or aborted).
Finish = Callable[[Generation, State], None]


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

    async def run(self, gen: Generation, cut: str | None = None) -> None:
        """Admit ``gen``, call upstream, and end it; the body of its reader task. Cancelling the
        task closes the upstream response, so the engine aborts the request. ``cut`` says why a
        generation whose log already holds events is run again (another replica ran it and is
        gone): it is continued from its log, like a broken stream."""
        ticket: Ticket | None = None
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
                ticket = await self.admission.acquire(gen.cost)
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
            if ticket is not None:
                self.admission.release(ticket)

    async def _call_upstream(
        self, gen: Generation, attempts: Attempts, cut: str | None = None
    ) -> None:
        body = gen.request.body
        while True:
            if cut is None:
                cut = await self._upstream_once(gen, body, attempts)
            if cut is None:
                return
            attempts.cut()
            # The upstream stream broke with no error and no [DONE] (a proxy or the connection
            # died). The engine aborted its copy when the connection closed, so continuing
            # the partial answer duplicates no work: it generates only the missing tokens.
            partial = None
            if gen.continuations < self.config.max_continuations:
                partial = await read_partial(gen.log)
            if partial is not None and partial.finished:  # only [DONE] was missing
                gen.length = await gen.log.append((DONE,))
                self._finish(gen, State.DONE)
                return
            continuation = continuation_body(gen.request, partial) if partial else None
            if continuation is None:
                await self._fail_mid_stream(gen, cut)
                return
            gen.continuations += 1
            self.counters.continued += 1
            log.info("%s: %s; continuing upstream (%d)", gen.id, cut, gen.continuations)
            body = continuation
            cut = None

    async def _upstream_once(self, gen: Generation, body: bytes, attempts: Attempts) -> str | None:
        """One upstream request for ``gen``. Returns why the stream broke where it can be
        continued, ``None`` where the generation has ended (done or failed)."""
        req = gen.request
        continuing = gen.continuations > 0
        try:
            response = await attempts.open(
                "POST",
                req.path,
                content=body,
                headers={"content-type": "application/json"},
                retry_connect=not req.no_upstream_retry,
            )
        except httpx2.HTTPError as exc:
            msg = f"upstream unreachable: {type(exc).__name__}"
            await self._fail(gen, Failure(503, error_body(msg, "service_unavailable", 503), 1))
            return None
        try:
            status = response.status_code
            gen.upstream_status = status
            if status != 200:
                body = await read_bounded(response)
                if status >= 500:
                    if is_engine_death(body):
                        attempts.engine_died(f"upstream {status}")
                    else:
                        attempts.suspect()
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                await self._fail(gen, Failure(status, body, retry_after))
                return None
            gen.wake()  # upstream accepted the request: an early commit may go now
            if gen.stream:
                return await self._pump(gen, response, attempts, skip_role=continuing)
            body = await response.aread()
            attempts.served()
            gen.length = await gen.log.append((body,))
            self._finish(gen, State.DONE)
            return None
        except httpx2.HTTPError as exc:
            cut = f"upstream connection failed: {type(exc).__name__}"
            if gen.stream and gen.upstream_status == 200 and not gen.finished:
                return cut
            await self._fail_mid_stream(gen, cut)
            return None
        finally:
            await response.aclose()

    async def _pump(
        self,
        gen: Generation,
        response: httpx2.Response,
        attempts: Attempts,
        *,
        skip_role: bool = False,
    ) -> str | None:
        """Relay the event stream; the hot path, once per network chunk."""
        decoder = SSEDecoder()
        log_ = gen.log
        # An in-process log is appended to without a coroutine per chunk.
        append_now = log_.append_nowait
        counters = self.counters
        errored = False
        served: Callable[[], None] | None = attempts.served
        try:
            async for chunk in response.aiter_raw():
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
                for p in payloads:
                    if p.startswith(ERROR_PREFIXES):
                        errored = True
                        if is_engine_death(p):
                            attempts.engine_died("error event")
                    elif b"\n" in p:
                        gen.multiline = True
                if append_now is not None:
                    gen.length = append_now(payloads)
                else:
                    gen.length = await log_.append(payloads)
                counters.events_relayed += len(payloads)
                gen.wake()
                if served is not None:  # once per stream: the engine delivered
                    served()
                    served = None
                if payloads[-1] == DONE:
                    self._finish(gen, State.FAILED if errored else State.DONE)
                    return None
        except SSEError as exc:
            await self._fail_mid_stream(gen, f"upstream sent a broken event stream: {exc}")
            return None
        if errored:
            await self._fail_mid_stream(gen, "upstream stream ended after an error event")
            return None
        return "upstream stream ended before [DONE]"

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

    async def _fail_mid_stream(self, gen: Generation, message: str) -> None:
        """After events went out: end the log with an error event and ``[DONE]`` (vLLM's way).
        A non-streaming generation has no events to follow, so it fails with 502 instead."""
        if gen.finished:
            return
        log.info("%s: failed mid-stream: %s", gen.id, message)
        if gen.stream:
            if message.startswith('{"error"'):
                payload = message.encode()
            else:
                payload = error_body(message, "upstream_error", 502)
            gen.length = await gen.log.append((payload, DONE))
        else:
            gen.failure = Failure(502, error_body(message, "upstream_error", 502))
        self._finish(gen, State.FAILED)
