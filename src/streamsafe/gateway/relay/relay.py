"""The upstream reader: one task per generation that waits for admission, sends the request
upstream and appends what comes back to the generation's log.

One loop (:meth:`Relay.run`'s) sends every request of a generation upstream, one per turn,
through the generation's :class:`~streamsafe.gateway.engines.attempts.Attempts` (one engine being
a pool of one), told what each did, and carries out its plan's verdicts: another ask within the
round (the same engine after a wait, another engine, the larger model, a connect retry), a wait
at the engine's refusal gate, a continuation of a broken answer, or the end. A
stream is read on the hot path (:mod:`streamsafe.gateway.relay.stream_reader`): payloads are relayed
as the bytes upstream sent, never re-encoded (but for a continued stream's usage chunk, made to
count the whole answer). What an end means for the process is not its business: it tells the
generation's :class:`~streamsafe.gateway.generations.owner.Owner` (given once, at construction)
the final state, so it never touches lookup or retention.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from streamsafe.gateway.admission.admission import Admission, Shed
from streamsafe.gateway.admission.fair_queue import Waiter
from streamsafe.gateway.admission.shed_log import ShedLog
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.engines.attempts import AskAgain, Attempts
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.errors import Failure, error_body
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.owner import Owner
from streamsafe.gateway.generations.request import Continuation
from streamsafe.gateway.generations.store import LeaseLost
from streamsafe.gateway.metrics import Counters
from streamsafe.gateway.relay.attempt_watch import AttemptWatch, UpstreamStalled, UpstreamTimeouts
from streamsafe.gateway.relay.continuation import Partial, continuation_for, owed_end, read_partial
from streamsafe.gateway.relay.endings import BrokenAttempt, GenerationFailer
from streamsafe.gateway.relay.messages_continuation import (
    MessagesPartial,
    messages_continuation,
    messages_owed_end,
    read_messages_partial,
)
from streamsafe.gateway.relay.stream_reader import StreamReader
from streamsafe.gateway.tracing import Tracing
from streamsafe.gateway.upstream.errors import UpstreamError
from streamsafe.gateway.upstream.transport import Answer, Exchange, Response
from streamsafe.gateway.upstream.wire import Wire
from streamsafe.retry import REFUSAL_STATUSES

__all__ = ["BrokenAttempt", "Relay"]

log = logging.getLogger("streamsafe.gateway")

#: Longest Retry-After a refused continuation waits for; past it the stream ends with an error
#: (an engine that asks for longer is not coming back while its caller reads).
_MAX_REFUSAL_WAIT = 10.0
_MESSAGES = Wire.ANTHROPIC_MESSAGES


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
        #: Episodes of the engine shedding load, logged as they begin and end.
        self.engine_shedding = ShedLog("engine")
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
        the model where there is one. ``cut``: the generation broke elsewhere (its replica
        died) and is continued first."""
        # Long because it is that one loop: each turn's outcome is carried out where it is read.
        loop = asyncio.get_running_loop()
        total = attempts.plan.bounds.total
        repair = _Repair(None if total is None else loop.time() + total)
        within_round = False  # the last turn's ask is asked again (AskAgain)
        while True:
            if cut is not None:
                broken: BrokenAttempt | None = BrokenAttempt(cut, 502)
                cut = None
            else:
                if not within_round:
                    if not await self._refusal_turn(gen, attempts, repair):
                        return
                    repair.round_began = loop.time()
                asked = await self._ask(gen, attempts, repair)
                within_round = isinstance(asked, AskAgain)
                if isinstance(asked, AskAgain):
                    if asked.delay is not None:
                        await self.engines.sleep(asked.delay)
                    continue
                broken = asked
            if broken is None:
                return
            if broken.quiet_since is not None:  # it relayed events: the stall began at the last
                repair.quiet_since = broken.quiet_since
            attempts.cut()
            partial = await _read_partial(gen)
            if partial is not None and partial.finished:  # only the end was missing
                await self._append_owed_end(gen, attempts, partial)
                return
            shed = broken.failure is not None and broken.failure.status in REFUSAL_STATUSES
            if await self._gives_up(gen, broken, attempts, repair, shed):
                return
            if shed:
                # Refused before any work: it waits with the engine's other refused calls
                # (_refusal_turn, at the top of the loop), costing no continuation.
                self.counters.engine_sheds += 1
                self.engine_shedding.note(broken.why)
                repair.refused = broken
                continue
            if broken.retry_after is not None:
                if not await self._wait_out(gen, broken, repair):
                    return
            elif not await self._next_ask(gen, broken, attempts, partial):
                return
            self._count_continuation(gen, broken, attempts)

    async def _ask(
        self, gen: Generation, attempts: Attempts, repair: _Repair
    ) -> BrokenAttempt | AskAgain | None:
        """One request upstream (see :meth:`attempt`); the generation's place at its engine's
        refusal gate is given up once its round ends (not between the asks of one round)."""
        asked: BrokenAttempt | AskAgain | None = None
        try:
            asked = await self.attempt(gen, attempts, repair)
            return asked
        finally:
            call = attempts.refused_call
            if call.gate is not None and not isinstance(asked, AskAgain):
                call.gate.done(call)

    async def _append_owed_end(
        self, gen: Generation, attempts: Attempts, partial: Partial | MessagesPartial
    ) -> None:
        """The attempt broke with only the stream's end missing: append what the engine owed
        (the finish, the usage where it can be recovered) and finish the generation."""
        if isinstance(partial, MessagesPartial):
            end = messages_owed_end(partial)
        else:
            end = await owed_end(gen.request, partial, attempts.upstream.prompt_tokens)
        self.counters.usage_recovered += len(end) > 1
        gen.appended(await gen.log.append(end))
        attempts.answered_whole()
        self._owner.end(gen, State.DONE)

    def _count_continuation(
        self, gen: Generation, broken: BrokenAttempt, attempts: Attempts
    ) -> None:
        """One more attempt continues the generation (its plan counted it)."""
        gen.continuations += 1
        self.counters.continued += 1
        log.info(
            "%s: %s; asking upstream again (%d)",
            gen.id,
            broken.why,
            attempts.plan.continued,
            extra={"fields": {"event": "continuation", "generation": gen.id}},
        )

    async def _gives_up(
        self,
        gen: Generation,
        broken: BrokenAttempt,
        attempts: Attempts,
        repair: _Repair,
        shed: bool,
    ) -> bool:
        """Whether ``gen`` ends with ``broken`` (it is then ended): its refusal is the caller's
        answer (``engine_refusals`` ``answer``), the total timeout passed, its plan allows no
        more (a shed's is told at the engine's gate, :meth:`_refusal_turn`), or no engine can
        go on."""
        if shed and repair.shed_since is None:
            repair.shed_since = asyncio.get_running_loop().time()
        if shed and self.config.engine_refusals == "answer":
            # Its caller retries by itself: the refusal is its answer, and its retries get the
            # same from the registry while the engine refuses (see refusals.py).
            await self._endings.fail_broken(gen, broken)
            self._owner.refused(gen)
            return True
        stranded = attempts.stranded()
        if stranded is not None:
            # Every engine that could go on is down or silent: a clear error now, not a wait
            # for a timeout on an engine known gone (docs/design.md, Failover).
            broken.why = f"{broken.why}; {stranded}"
        repair.spent = attempts.again(shed=shed)
        if (
            (broken.stalled is not None and broken.stalled.phase in ("total", "stall"))
            or (repair.spent is not None and not shed)
            or self.engines.all_down()
            or stranded is not None
        ):
            await self._endings.fail_broken(gen, broken)
            return True
        return False

    async def _refusal_turn(self, gen: Generation, attempts: Attempts, repair: _Repair) -> bool:
        """Before each attempt: where its engine refuses (it refused this generation, or every
        engine of its model refuses others now), wait with the engine's other refused calls for
        this one's turn to ask (see :mod:`~streamsafe.gateway.engines.refusal_gate`), within the
        queue timeout from the first refusal it met and the total timeout. False where ``gen``
        ended instead: it gave up, every waiter with the refusal and the ``Retry-After`` of the
        engine's next probe, marked final (the gateway asked again for its caller)."""
        refused = repair.refused
        if refused is not None:
            gate = attempts.gate
        elif self.config.engine_refusals == "answer":
            return True  # a refusal is the caller's answer: nobody waits here
        else:
            found = self.engines.refusing(attempts.answering_model or attempts.model)
            if found is None:
                return True
            gate = found
        if not gen.refused:
            gen.refused = True
            gen.wake()  # its early commit waits now (see pacing)
        loop = asyncio.get_running_loop()
        if repair.shed_since is None:
            repair.shed_since = loop.time()
        deadline = repair.shed_since + attempts.plan.bounds.queue_timeout
        if repair.total_deadline is not None:
            deadline = min(deadline, repair.total_deadline)
        if refused is not None and repair.spent is not None:
            wait: float | None = gate.retry_after()  # its plan allows no more asks
        else:
            wait = await gate.turn(attempts.refused_call, deadline)
        if wait is None and not self.engines.all_down():
            repair.refused = None
            return True
        seconds = max(1, math.ceil(wait if wait is not None else self.engines.retry_after()))
        if refused is not None:
            failure = refused.failure
            if failure is not None:
                refused.failure = Failure(failure.status, failure.body, seconds, final=True)
            await self._endings.fail_broken(gen, refused)
        else:
            status = gate.status
            kind = "rate_limit_error" if status == 429 else "service_unavailable"
            msg = f"the engine refuses new work ({status}); retry after {seconds} s"
            body = error_body(msg, kind, status)
            await self._endings.fail(gen, Failure(status, body, seconds, final=True))
        self._owner.refused(gen)
        return False

    async def _wait_out(self, gen: Generation, broken: BrokenAttempt, repair: _Repair) -> bool:
        """Refused before any work other than by a shed (a 5xx with ``Retry-After``, where
        its caller can no longer be told its status): wait as told, within the total timeout.
        False where ``gen`` ended instead."""
        assert broken.retry_after is not None
        loop = asyncio.get_running_loop()
        wait = min(float(broken.retry_after), _MAX_REFUSAL_WAIT)
        until = loop.time() + wait
        deadline = repair.total_deadline
        if deadline is not None and until >= deadline:
            await self._endings.fail_broken(gen, broken)
            return False
        await asyncio.sleep(wait)
        if self.engines.all_down():
            await self._endings.fail_broken(gen, broken)
            return False
        return True

    async def _next_ask(
        self,
        gen: Generation,
        broken: BrokenAttempt,
        attempts: Attempts,
        partial: Partial | MessagesPartial | None,
    ) -> bool:
        """What the next attempt asks: the request as it was where nothing of the answer was
        relayed (at most the events the upstream sends before the first token, which the next
        attempt repeats and the sink drops; the engine aborted what it lost), else the
        continuation of the partial answer. False where it cannot be continued (Llama Stack, a
        generic OpenAI server): ``gen`` ends with an error event, never an answer that looks
        whole but is not."""
        route = gen.request.route
        if gen.length <= route.preamble:
            gen.continuation = None
            return True
        continuation: Continuation | str
        if isinstance(partial, MessagesPartial):  # asked again, whatever the upstream
            continuation = messages_continuation(gen.request, partial)
        elif not attempts.upstream.kind.can_continue:
            await self._endings.fail_broken(gen, broken)
            return False
        else:
            continuation = continuation_for(gen.request, partial)
        if isinstance(continuation, str):
            broken.why = f"{broken.why}; it cannot be continued exactly: {continuation}"
            await self._endings.fail_broken(gen, broken)
            return False
        gen.continuation = continuation
        return True

    async def attempt(
        self, gen: Generation, attempts: Attempts, repair: _Repair
    ) -> BrokenAttempt | AskAgain | None:
        """One upstream request for ``gen`` (its request, or the continuation it has), within the
        upstream timeouts. Returns why it broke where another round may repair it (this engine
        or, for a pool, another), :class:`AskAgain` where it failed before its first token and
        the plan asks again within the round, ``None`` where the generation has ended (done or
        failed). Traced as one span where tracing is on (see :mod:`.tracing`)."""
        tracing = self.tracing
        if not tracing.enabled:
            return await self._attempt(gen, attempts, repair)
        if gen.trace is None:  # taken over from another replica: a trace of its own here
            gen.trace = tracing.generation(gen.id)
        continuing = gen.continuations > 0 and gen.length > 0
        span = tracing.attempt(gen.trace, attempts.plan.asks + 1, continuing)
        broken: BrokenAttempt | AskAgain | None = None
        try:
            broken = await self._attempt(gen, attempts, repair)
            return broken
        finally:
            engine = gen.engine or attempts.upstream.base_url
            why = None
            if isinstance(broken, AskAgain):
                why = f"failed before its first token ({attempts.plan.summary()})"
            elif broken is not None:
                why = broken.why
            tracing.end_attempt(span, gen.trace, engine, gen.upstream_status, why)

    async def _attempt(
        self, gen: Generation, attempts: Attempts, repair: _Repair
    ) -> BrokenAttempt | AskAgain | None:
        """:meth:`attempt`, untraced; a broken attempt that relayed events says when it went
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
        broken = await self._watched_attempt(gen, attempts, watch)
        if isinstance(broken, BrokenAttempt) and watch.flowing and gen.length > 0:
            broken.quiet_since = watch.last_read
        return broken

    async def _watched_attempt(
        self, gen: Generation, attempts: Attempts, watch: AttemptWatch
    ) -> BrokenAttempt | AskAgain | None:
        continuing = gen.continuations > 0 and gen.length > 0
        ask = gen.continuation
        path, body = (gen.request.path, gen.request.body) if ask is None else (ask.path, ask.body)
        response: Response | None = None
        try:
            async with watch:
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


@dataclass(slots=True)
class _Repair:
    """How far one generation's repairs have gone: continuations asked, when the engine first
    shed it (it waits for room from then on at most ``queue_timeout``, as in the gateway's own
    queue, and sheds cost no continuation), and the total deadline."""

    total_deadline: float | None
    #: Loop time the current round began (its asks share one first-token bound from it).
    round_began: float | None = None
    #: Why its plan allows no more asks, where it does not (a shed then gives up at the gate).
    spent: str | None = None
    #: Loop time of the answer's last event before the latest break (``None``: none relayed
    #: yet): the next attempt must send its first event within ``stall_timeout`` of it.
    quiet_since: float | None = None
    shed_since: float | None = None
    #: The latest attempt the engine refused (shed), which the next waits at its gate for.
    refused: BrokenAttempt | None = None


async def _read_partial(gen: Generation) -> Partial | MessagesPartial | None:
    """The answer a broken attempt left in the log, read back; ``None`` where nothing was
    logged or the stream is not one that reads back. Only a stream the upstream ends with
    [DONE] (OpenAI's format) or Anthropic's messages does; Llama Stack's streams end in their
    own way (see stream_reader)."""
    route = gen.request.route
    if not gen.stream or not gen.length:
        return None
    if route.wire is _MESSAGES:
        return await read_messages_partial(gen.log)
    if route.upstream_done:
        return await read_partial(gen.log)
    return None
