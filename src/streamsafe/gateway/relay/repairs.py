"""What the relay's loop does between the rounds of a generation's asks: repairs.

A round that broke (cut, stalled, malformed, dropped before its answer) or that the engine
refused before any work is repaired by another round where the generation's plan allows it
(:meth:`Repairs.after_break`): only the stream's end was missing (it is appended), a shed waits
with the engine's other refused calls at its refusal gate (:meth:`Repairs.refusal_turn`, before
each round), a refusal that says when is waited out, a broken answer is continued from its log,
and a request that relayed nothing is asked again as it was. Where nothing can repair it, the
generation ends with the clearest error its callers can still be told. The loop itself, and each
request it sends, are :class:`~streamsafe.gateway.relay.relay.Relay`'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from streamsafe.gateway.admission.shed_log import ShedLog
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.engines.attempts import Attempts
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.errors import Failure, error_body
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.owner import Owner
from streamsafe.gateway.generations.request import Continuation
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.relay.continuation import Partial, continuation_for, owed_end, read_partial
from streamsafe.gateway.relay.endings import BrokenAttempt, GenerationFailer
from streamsafe.gateway.relay.messages_continuation import (
    MessagesPartial,
    messages_continuation,
    messages_owed_end,
    read_messages_partial,
)
from streamsafe.gateway.upstream.wire import Wire
from streamsafe.retry import REFUSAL_STATUSES

__all__ = ["Repair", "Repairs"]

log = logging.getLogger("streamsafe.gateway")

#: Longest Retry-After a refused continuation waits for; past it the stream ends with an error
#: (an engine that asks for longer is not coming back while its caller reads).
_MAX_REFUSAL_WAIT = 10.0
_MESSAGES = Wire.ANTHROPIC_MESSAGES


@dataclass(slots=True)
class Repair:
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


class Repairs:
    """Repairs the broken or refused rounds of the generations a relay runs (see the module):
    ``endings`` end the ones nothing repairs, their ``owner`` is told of a refusal that is its
    callers' answer, ``counters`` count the continuations and sheds."""

    def __init__(
        self,
        config: GatewayConfig,
        engines: Engines,
        counters: Counters,
        owner: Owner,
        endings: GenerationFailer,
    ) -> None:
        self.config = config
        self.engines = engines
        self.counters = counters
        self._owner = owner
        self._endings = endings
        #: Episodes of the engine shedding load, logged as they begin and end.
        self.engine_shedding = ShedLog("engine")

    async def after_break(
        self, gen: Generation, broken: BrokenAttempt, attempts: Attempts, repair: Repair
    ) -> bool:
        """The round ended with ``broken``: whether another round repairs it (its next ask is
        then set: the request as it was, or the continuation of the partial answer); else
        ``gen`` has ended (whole, where only the stream's end was missing, or with an error)."""
        if broken.quiet_since is not None:  # it relayed events: the stall began at the last
            repair.quiet_since = broken.quiet_since
        attempts.cut()
        partial = await _read_partial(gen)
        if partial is not None and partial.finished:  # only the end was missing
            await self._append_owed_end(gen, attempts, partial)
            return False
        shed = broken.failure is not None and broken.failure.status in REFUSAL_STATUSES
        if await self._gives_up(gen, broken, attempts, repair, shed):
            return False
        if shed:
            # Refused before any work: it waits with the engine's other refused calls
            # (refusal_turn, before its next round), costing no continuation.
            self.counters.engine_sheds += 1
            self.engine_shedding.note(broken.why)
            repair.refused = broken
            return True
        if broken.retry_after is not None:
            if not await self._wait_out(gen, broken, repair):
                return False
        elif not await self._next_ask(gen, broken, attempts, partial):
            return False
        self._count_continuation(gen, broken, attempts)
        return True

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
        repair: Repair,
        shed: bool,
    ) -> bool:
        """Whether ``gen`` ends with ``broken`` (it is then ended): its refusal is the caller's
        answer (``engine_refusals`` ``answer``), the total timeout passed, its plan allows no
        more (a shed's is told at the engine's gate, :meth:`refusal_turn`), or no engine can
        go on."""
        if shed and repair.shed_since is None:
            repair.shed_since = asyncio.get_running_loop().time()
        if shed and self.config.engine_refusals == "answer":
            # Its caller retries by itself: the refusal is its answer, and its retries get the
            # same from the registry while the engine refuses (see refusals.py).
            await self._endings.fail_broken(gen, broken)
            self._owner.refused(gen)
            return True
        stranded = attempts.choice.stranded()
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

    async def refusal_turn(self, gen: Generation, attempts: Attempts, repair: Repair) -> bool:
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
            choice = attempts.choice
            found = self.engines.refusing(choice.answering_model or choice.model)
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

    async def _wait_out(self, gen: Generation, broken: BrokenAttempt, repair: Repair) -> bool:
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
