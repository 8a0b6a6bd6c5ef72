"""The upstream reader: one task per generation that waits for admission, sends the request
upstream and appends what comes back to the generation's log.

One loop (:meth:`Relay._call_upstream`) sends every request of a generation upstream, one per turn,
through the generation's :class:`~streamsafe.gateway.engines.attempts.Attempts` (one engine being
a pool of one), told what each did, and carries out its plan's verdicts: another ask within the
round (the same engine after a wait, another engine, the larger model, a connect retry), or, for
a round that broke or was refused, what :mod:`~streamsafe.gateway.relay.repairs` says (a wait at
the engine's refusal gate, a continuation of a broken answer, or the end).

A stream is read on the hot path (:mod:`streamsafe.gateway.relay.stream_reader`): payloads are
relayed as the bytes upstream sent, never re-encoded (but for a continued stream's usage chunk,
made to count the whole answer). What an end means for the process is not its business: it
tells the generation's :class:`~streamsafe.gateway.generations.owner.Owner` (given once, at
construction) the final state, so it never touches lookup or retention.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from streamsafe.gateway.admission.admission import Admission, Shed
from streamsafe.gateway.admission.fair_queue import Waiter
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.engines.attempts import AskAgain, Attempts
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.errors import Failure, error_body
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.owner import Owner
from streamsafe.gateway.generations.store import LeaseLost
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.relay.attempt_watch import AttemptWatch, UpstreamStalled, UpstreamTimeouts
from streamsafe.gateway.relay.endings import BrokenAttempt, GenerationFailer
from streamsafe.gateway.relay.repairs import Repair, Repairs
from streamsafe.gateway.relay.stream_reader import StreamReader
from streamsafe.gateway.tracing import Tracing
from streamsafe.gateway.upstream.errors import UpstreamError
from streamsafe.gateway.upstream.exchange import Exchange
from streamsafe.gateway.upstream.transport import Answer, Response

__all__ = ["BrokenAttempt", "Relay"]

log = logging.getLogger("streamsafe.gateway")


class Relay:
    """Runs generations upstream. Their ``owner`` is told how each one ended, and of a refusal
    that is its callers' answer; ``counters`` counts what happened on the way; ``clock`` stamps
    admission (injectable for tests)."""

    def __init__(
        self,
        config: GatewayConfig,
        admission: Admission,
        engines: Engines,
        counters: Counters,
        owner: Owner,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.admission = admission
        #: The engines (one upstream is a pool of one).
        self.engines = engines
        self.counters = counters
        self._owner = owner
        self._endings = GenerationFailer(counters, owner, engines.retry_after)
        self._streams = StreamReader(counters, owner, self._endings)
        self._clock = clock
        #: What follows a round that broke or was refused (see :mod:`.repairs`).
        self._repairs = Repairs(config, engines, counters, owner, self._endings)
        self.tracing = Tracing(config.tracing)
        #: The bounds every upstream attempt keeps (see :class:`AttemptWatch`).
        self.timeouts = UpstreamTimeouts(
            first_token=config.first_token_timeout,
            idle=config.idle_timeout,
            total=config.total_timeout,
            stall=config.stall_timeout,
        )
        #: A non-streamed answer's headers come when the whole answer is done, so neither a
        #: first-token nor an idle bound tells a stalled engine from a long answer there: only
        #: the total bounds it (cutting it would only make the engine start it over).
        self.whole_answer_timeouts = UpstreamTimeouts(None, None, config.total_timeout, stall=None)

    async def run(self, gen: Generation, cut: str | None = None) -> None:
        """Admit ``gen``, call upstream, and end it; the body of its reader task. Cancelling the
        task closes the upstream response, so the engine aborts the request. ``cut`` says why a
        generation whose log already holds events is run again (another replica ran it and is
        gone): it is continued from its log, like a broken stream."""
        waiter: Waiter | None = None
        attempts = Attempts(self.engines, gen.request.body, gen.cost, gen, self.counters)
        try:
            if cut is not None and gen.request.withheld:
                # Its provider data was kept out of Redis: continuing it here would run it under
                # other credentials than its caller's.
                msg = (
                    f"{cut}, and the credentials it came with were not kept (no --redis-secret);"
                    " send it again"
                )
                await self._endings.fail(
                    gen, Failure(503, error_body(msg, "service_unavailable", 503), 1)
                )
                return
            waiter = await self._admit(gen)
            if waiter is None:
                return
            gen.admitted()
            gen.admitted_at = self._clock()
            self.counters.generations_started += 1
            gen.wake()
            await self._call_upstream(gen, attempts, cut if gen.length else None)
        except asyncio.CancelledError:
            if not gen.finished:
                self._owner.end(gen, State.ABORTED)
            raise
        except LeaseLost:
            raise  # another replica runs it now; this one must not write a word more
        except Exception as exc:  # a bug must not leave subscribers hanging
            await self._bug(gen, exc)
        finally:
            attempts.release()
            waiter = waiter or gen.waiter
            if waiter is not None:
                self.admission.release(waiter)
                gen.waiter = None

    async def _admit(self, gen: Generation) -> Waiter | None:
        """Wait for ``gen``'s place (its subscribers plan their wait with it); ``None`` where it
        ended instead: every engine known down, shed, or a request admission refuses."""
        if self.engines.all_down():
            await self._endings.fail_dead(gen, self.engines.why_down())
            return None
        admission = self.admission
        try:
            waiter = gen.waiter = admission.request(gen.tenant, gen.cost)
            if gen.subscribers == 0:
                admission.set_active(waiter, False)
            gen.wake()
            await admission.wait(waiter)
        except Shed as exc:
            self.counters.shed += 1
            msg = f"gateway at capacity ({exc.reason}); retry after {exc.retry_after} s"
            await self._endings.fail(
                gen, Failure(429, error_body(msg, "rate_limit_error", 429), exc.retry_after)
            )
            return None
        except ValueError as exc:
            await self._endings.fail(
                gen, Failure(400, error_body(str(exc), "invalid_request_error", 400))
            )
            return None
        if self.engines.all_down():
            await self._endings.fail_dead(gen, self.engines.why_down())
            return None
        return waiter

    async def _bug(self, gen: Generation, exc: Exception) -> None:
        """A bug must not leave subscribers hanging: the generation ends with an error."""
        log.exception("%s: reader failed", gen.id)
        why = f"gateway error: {type(exc).__name__}"
        try:
            await self._endings.fail_mid_stream(gen, why)
        except Exception:  # the log cannot take the error event either
            log.exception("%s: failing it failed too", gen.id)
            if not gen.finished:  # its subscribers end with the error all the same
                failure = Failure(502, error_body(why, "upstream_error", 502))
                self._owner.end(gen, State.FAILED, failure)

    async def _call_upstream(
        self, gen: Generation, attempts: Attempts, cut: str | None = None
    ) -> None:
        """The one loop that sends a generation's requests upstream, one per turn, as its plan
        (``attempts.plan``) says: within a round, an ask that failed before its first token is
        asked again where the plan says (:class:`AskAgain`: the same engine after a wait,
        another, the larger model, a connect retry); a round that broke (cut, stalled,
        malformed, dropped before its answer) or was refused before any work starts another,
        within ``max_continuations`` and the total timeout. A broken stream is continued from
        its log, so nothing is generated twice; an attempt that relayed nothing is asked again
        as it was (the engine aborted what it lost). The next round goes to another engine of
        the model where there is one (what follows a broken round is :mod:`.repairs`).
        ``cut``: the generation broke elsewhere (its replica died) and is continued first."""
        loop = asyncio.get_running_loop()
        total = attempts.plan.bounds.total
        repair = Repair(None if total is None else loop.time() + total)
        again: AskAgain | None = None  # the last turn's ask is asked again (within its round)
        while True:
            if cut is not None:
                broken: BrokenAttempt | None = BrokenAttempt(cut, 502)
                cut = None
            else:
                if again is None:
                    if not await self._repairs.refusal_turn(gen, attempts, repair):
                        return
                    repair.round_began = loop.time()
                asked = await self._ask(gen, attempts, repair, again)
                if isinstance(asked, AskAgain):
                    again = asked
                    continue
                again = None
                broken = asked
            if broken is None or not await self._repairs.after_break(gen, broken, attempts, repair):
                return

    async def _ask(
        self, gen: Generation, attempts: Attempts, repair: Repair, again: AskAgain | None
    ) -> BrokenAttempt | AskAgain | None:
        """One upstream request for ``gen`` (its request, or the continuation it has), within the
        upstream timeouts. Returns why it broke where another round may repair it (this engine
        or, for a pool, another), :class:`AskAgain` where it failed before its first token and
        the plan asks again within the round, ``None`` where the generation has ended (done or
        failed). ``again``: the last ask of the round said to ask again, after its ``delay``
        (waited here, within the round's deadlines). The generation's place at its engine's
        refusal gate is given up once its round ends (not between the asks of one round).
        Traced as one span where tracing is on (see :mod:`.tracing`)."""
        tracing = self.tracing
        span = None
        if tracing.enabled:
            if gen.trace is None:  # taken over from another replica: a trace of its own here
                gen.trace = tracing.generation(gen.id)
            continuing = gen.continuations > 0 and gen.length > 0
            span = tracing.attempt(gen.trace, attempts.plan.asks + 1, continuing)
        asked: BrokenAttempt | AskAgain | None = None
        try:
            asked = await self._attempt(gen, attempts, repair, again)
            return asked
        finally:
            if span is not None:
                self._end_span(span, gen, attempts, asked)
            call = attempts.refused_call
            if call.gate is not None and not isinstance(asked, AskAgain):
                call.gate.done(call)

    def _end_span(
        self,
        span: object,
        gen: Generation,
        attempts: Attempts,
        asked: BrokenAttempt | AskAgain | None,
    ) -> None:
        """End an ask's trace span: its engine, the upstream's status, and why it broke."""
        engine = gen.engine or attempts.upstream.base_url
        status, why = gen.upstream_status, None
        if isinstance(asked, AskAgain):
            status, why = asked.status, f"{asked.why} before its first token; asked again"
        elif asked is not None:
            why = asked.why
        self.tracing.end_attempt(span, gen.trace, engine, status, why)

    async def _attempt(
        self, gen: Generation, attempts: Attempts, repair: Repair, again: AskAgain | None
    ) -> BrokenAttempt | AskAgain | None:
        """:meth:`_ask`, untraced; a broken attempt that relayed events says when it went
        quiet (``quiet_since``), so the next one keeps the stall's bound. The first-token bound
        counts from the round's start: the asks of one round share it."""
        bounds = self.timeouts if gen.stream else self.whole_answer_timeouts
        stall = bounds.stall
        quiet = repair.quiet_since
        watch = AttemptWatch(
            bounds,
            repair.total_deadline,
            None if stall is None or quiet is None else quiet + stall,
            since=repair.round_began,
        )
        broken = await self._watched_attempt(gen, attempts, watch, again)
        if isinstance(broken, BrokenAttempt) and watch.flowing and gen.length > 0:
            broken.quiet_since = watch.last_read
        return broken

    async def _watched_attempt(
        self, gen: Generation, attempts: Attempts, watch: AttemptWatch, again: AskAgain | None
    ) -> BrokenAttempt | AskAgain | None:
        continuing = gen.continuations > 0 and gen.length > 0
        ask = gen.continuation
        path, body = (gen.request.path, gen.request.body) if ask is None else (ask.path, ask.body)
        response: Response | None = None
        try:
            async with watch:
                if again is not None and again.delay is not None:
                    await self.engines.sleep(again.delay)  # as the plan said, within the bounds
                if gen.stream:
                    return await self._streams.attempt(gen, path, body, watch, continuing, attempts)
                opened = await self._streams.open(gen, path, body, watch, continuing, attempts)
                if not isinstance(opened, Exchange | Answer):
                    return opened
                response = opened
                attempts.admitted()  # a plain refusal comes as a status: a 200 took it
                gen.wake()  # upstream accepted the request
                body = await response.read_body()
                attempts.first_token_came()
                gen.appended(await gen.log.append((body,)))
                attempts.answered_whole()
                self._owner.end(gen, State.DONE)
                return None
        except UpstreamStalled as exc:
            self.counters.upstream_timeouts += 1
            if exc.phase != "total":
                # An engine silent past the first-token timeout is not asked again for this
                # generation: asking it again would only wait as long once more.
                attempts.failed(str(exc), shun=exc.phase in ("first_token", "stall"))
            status = 503 if exc.phase == "engine_down" else 504
            return BrokenAttempt(str(exc), status, stalled=exc)
        except UpstreamError as exc:
            why = f"upstream connection failed: {type(exc).__name__}"
            attempts.failed(why)
            return BrokenAttempt(why, 502)
        finally:
            if response is not None:
                response.release()
