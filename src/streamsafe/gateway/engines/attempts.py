"""One generation's attempts across the engines (a single upstream is a pool of one; see
docs/design.md, Engine pool and Failover).

:meth:`Attempts.open_stream` (a streaming completion, on the hot stream reader) and
:meth:`Attempts.open` (anything else) each send one request: they pick an engine
(:mod:`~streamsafe.gateway.engines.pool`), send, and turn a failure before the first token into
the generation's plan's verdict (:mod:`~streamsafe.gateway.engines.attempt_plan`): the answer to
pass on, or :class:`AskAgain` (the same engine after a wait, another, the larger model), which
the relay's one loop carries out. The relay then says what happened: the first token came
(:meth:`Attempts.first_token_came`), the attempt failed (:meth:`Attempts.failed`; ``shun`` where
the engine stayed silent past the first-token timeout: not asked again for this generation), the
engine shed it (:meth:`Attempts.full`), the stream broke and is continued (:meth:`Attempts.cut`:
on another engine of the same model where there is one, never on another model).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from streamsafe.gateway.engines.answers import Refused, answer_response
from streamsafe.gateway.engines.attempt_end import Fact, Told
from streamsafe.gateway.engines.attempt_outcomes import AttemptOutcomes
from streamsafe.gateway.engines.attempt_plan import (
    Again,
    AttemptPlan,
    Stop,
    Verdict,
    Where,
)
from streamsafe.gateway.engines.engine_choice import EngineChoice
from streamsafe.gateway.engines.engine_shell import EngineShell
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.pool import Unavailable
from streamsafe.gateway.engines.refusal_gate import RefusedCall
from streamsafe.gateway.engines.sends import (
    H,
    Sender,
    Sent,
    event_sender,
    model_of,
    never_connected,
    request_sender,
    with_model,
)
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.upstream.connection import NotConnected, Upstream, is_engine_death
from streamsafe.gateway.upstream.exchange import Exchange
from streamsafe.gateway.upstream.transport import Response
from streamsafe.retry import REFUSAL_STATUSES, retry_after_seconds

__all__ = ["AskAgain", "Attempts"]

log = logging.getLogger("streamsafe.gateway")


@dataclass(frozen=True, slots=True)
class AskAgain:
    """An ask failed before its first token and the plan says ask again within the round:
    after ``delay`` seconds (``None``: at once, on the engine it picks next). ``why``: how it
    failed; ``status``: the engine's, where it answered one."""

    delay: float | None
    why: str
    status: int | None = None


class Attempts(AttemptOutcomes):
    """One generation's attempts across the engines (see the module); what the relay tells
    of each is :class:`~streamsafe.gateway.engines.attempt_outcomes.AttemptOutcomes`."""

    __slots__ = (
        "_connecting_again",
        "_cost",
        "_counters",
        "_current",
        "_engines",
        "_failed_why",
        "_gen",
        "_last",
        "_same_engine",
        "_started",
        "choice",
        "plan",
        "refused_call",
    )

    def __init__(
        self,
        engines: Engines,
        body: bytes,
        cost: int,
        gen: Generation,
        counters: Counters,
    ) -> None:
        self._engines = engines
        self._gen = gen
        self._counters = counters
        #: Where its asks go: the model, the engines left, the pick (see :mod:`.engine_choice`).
        self.choice = EngineChoice(engines, model_of(body), cost)
        self._cost = cost
        self._current: EngineShell | None = None
        #: The engine a cut stream is leaving (its continuation's engine is logged with it).
        self._cut_from: EngineShell | None = None
        self._held: EngineShell | None = None
        #: What the current attempt's engine was told of it so far (see :mod:`.attempt_end`).
        self._told = Told()
        #: Why the latest attempt failed over (logged with the engine it moves to).
        self._failed_why = ""
        #: The last ask's answer or error in the round: what the round ends with where no
        #: engine is left.
        self._last: Refused | Exception | None = None
        #: Whether the next ask repeats the last one's connect, or its engine (see :meth:`_ask`).
        self._connecting_again = self._same_engine = False
        self._started = engines.clock()
        #: Every request this generation sends upstream, decided in one value: its bounds,
        #: its history (see :mod:`.attempt_plan`).
        self.plan = AttemptPlan(engines.bounds, self._started)
        #: This generation's asks of engines that refuse (see :mod:`.refusal_gate`), counted
        #: with those of its identical copies.
        self.refused_call = RefusedCall(engines.ledgers.of(gen.tenant, gen.fingerprint))

    # -- sending ----------------------------------------------------------------------------------

    async def open_stream(
        self,
        path: str,
        body: bytes,
        headers: bytes,
        *,
        retry_connect: bool = True,
        on_engine: Callable[[Upstream], None] | None = None,
    ) -> Exchange | Refused | AskAgain:
        """POST a streaming completion on the hot stream reader, once: the exchange with its
        200 head read (its body unread, for the caller to release), the refusal to pass on, or
        :class:`AskAgain` where it failed before its first token and the plan says to ask again.
        Raises ``OSError`` where no engine could be reached (``UpstreamClosed`` where one
        dropped the request before answering). ``on_engine`` is told the engine it goes to."""

        send = event_sender(path, headers)
        return await self._ask(send, body, on_engine, retry_connect)

    async def open(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        retry_connect: bool = True,
        on_engine: Callable[[Upstream], None] | None = None,
    ) -> Response | AskAgain:
        """Send a request (a non-streamed completion), once: a 200 response, its body unread,
        the answer to pass on, or :class:`AskAgain` (see :meth:`open_stream`). Raises the last
        transport error where no engine could be reached. ``on_engine`` is told the engine it
        goes to."""

        send = request_sender(method, path, headers)
        asked = await self._ask(send, content or b"", on_engine, retry_connect)
        if isinstance(asked, AskAgain | Exchange):
            return asked
        return answer_response(asked)

    async def _ask(
        self,
        send: Sender[H],
        content: bytes,
        on_engine: Callable[[Upstream], None] | None,
        retry_connect: bool,
    ) -> H | Refused | AskAgain:
        """One request upstream: pick its engine (the same one again where the plan said so;
        a wait for room where the pool is full), send, and turn how it ended into the plan's
        verdict. Nothing here asks twice: where the plan says to ask again within the round (a
        connection never made: the same engine after a backoff; a failure before the first
        token: the same engine, another, the larger model), :class:`AskAgain` says when, and
        the relay's one loop asks (``Relay._call_upstream``)."""
        engines = self._engines
        if self.plan.starts_round:
            self._start_round()
        engine = await self._engine()
        if not isinstance(engine, EngineShell):
            if isinstance(engine, Exception):
                raise engine
            return engine
        upstream = engine.upstream
        if not self._connecting_again:  # a connect retry repeats the attempt: not a new one
            self._begin(engine)
            upstream.requests += 1  # one request per attempt, however many connects
        if on_engine is not None:
            on_engine(upstream)
        self._plan(self.plan.asked(engine.spec.url, engines.clock()))
        choice = self.choice
        assert choice.picked is not None
        served = choice.picked.model  # the pool may pick a fallback of the round's model
        body = content if served == choice.model else with_model(content, served)
        sent = await self._send(engine, send, body)
        self._connecting_again = False
        if isinstance(sent, Sent):
            assert sent.handle is not None
            return sent.handle
        if isinstance(sent, NotConnected):
            again = self._connect_again(engine, sent, retry_connect)
            if again is not None:
                return again
            return self._failed(engine, self._not_connected(engine, sent))
        return self._failed(engine, sent)

    def _connect_again(
        self, engine: EngineShell, failed: NotConnected, retry_connect: bool
    ) -> AskAgain | None:
        """No connection was made: the same engine again after the plan's backoff, where the
        plan allows a connect retry (else ``None``)."""
        upstream = engine.upstream
        again = self.plan.after_not_connected(
            retryable=failed.retryable,
            budget_allows=self._engines.budget.allow_retry(),
            allowed=retry_connect,
        )
        if not isinstance(again, Again):
            return None
        n = self.plan.connect_retries + 1
        self._plan(again.plan)
        upstream.connect_retries_done += 1
        msg = "upstream %s: %s; retry %d in %.2f s"
        log.info(msg, upstream.base_url, failed.why, n, again.delay)
        self._connecting_again = True  # the pick stays: the same engine once more
        return AskAgain(again.delay, f"not connected ({failed.why})")

    def _failed(self, engine: EngineShell, failed: Refused | Exception) -> Refused | AskAgain:
        """The ask to ``engine`` ended with ``failed`` before its first token: the plan's
        verdict, :class:`AskAgain` (the same engine after a wait, another, the larger model), or
        ``failed`` itself as the round's end (raised where it is an error)."""
        self._last = failed
        self.release()  # this attempt holds nothing on the engine any more
        verdict = self._after(failed)
        if isinstance(verdict, Stop):
            if isinstance(failed, Exception):
                raise failed
            return failed
        self._plan(verdict.plan)
        status = failed.status if isinstance(failed, Refused) else None
        self._failed_why = f"answered {status}" if status else type(failed).__name__
        if verdict.where is Where.SAME_ENGINE:
            if status in REFUSAL_STATUSES:
                self._counters.engine_sheds += 1  # waited out, as the relay's waits are
            self._same_engine = True  # the pick stays, if its breaker still allows it then
            return AskAgain(verdict.delay, self._failed_why, status)
        if verdict.where is Where.LARGER_MODEL:
            self.choice.larger_model()
        else:
            self.choice.tried(engine)
        return AskAgain(None, self._failed_why, status)

    def _start_round(self) -> None:
        """A round begins (the first ask, a continuation, an ask after a wait for room): its
        model is the answer's where one began, nothing of an earlier round is its last
        answer, and the engine is picked afresh."""
        self.choice.start_round()
        self._last = None
        self._connecting_again = self._same_engine = False
        self.release()  # a continuation weighs again on whichever engine it goes to

    async def _engine(self) -> EngineShell | Refused | Exception:
        """The engine of this ask: the one the last ask went to where the plan said so (and,
        after a failure that said when, its breaker still allows it), else a pick (see
        :meth:`EngineChoice.choose`). Where none is left, what the round ends with: the last
        engine's own answer, where it gave one."""
        choice = self.choice
        if self._same_engine:
            self._same_engine = False
            if not choice.keep_pick():
                self._plan(self.plan.elsewhere())
        found = await choice.choose(self._started, first=self.plan.attempts == 0)
        if isinstance(found, Unavailable):
            return self._last or choice.unavailable(found)
        return found

    async def _send(
        self,
        engine: EngineShell,
        send: Sender[H],
        body: bytes,
    ) -> Sent[H] | Refused | Exception:
        """One request to ``engine``: its open 200, or the refusal or transport error it ended
        with (``NotConnected`` where no connection was made), told to the engine's breaker,
        counted in the retry budget and noted in the plan."""
        budget = self._engines.budget
        upstream = engine.upstream
        try:
            sent = await send(upstream, body)
        except NotConnected as exc:
            self._tell(engine, Fact.NOT_CONNECTED)  # counted in the budget by it
            return exc
        except OSError as exc:  # streamsafe.gateway.upstream.errors
            self._tell(engine, Fact.FAILED, type(exc).__name__)
            if not never_connected(exc):  # a refused connect was counted by its retries
                budget.record_failure()
            return exc
        refused = sent.refused
        if refused is None:
            budget.record_success()
            return sent
        status = refused.status
        if status >= 500 or status == 429:
            budget.record_failure()
        if status in REFUSAL_STATUSES:
            self.full(retry_after_seconds(refused.retry_after, time.time()), status)
        elif status >= 500:
            died = Fact.DIED if is_engine_death(refused.body) else Fact.FAILED
            self._tell(engine, died, f"status {status}")
        else:
            self._tell(engine, Fact.ANSWERED)  # a 4xx is the caller's: no verdict on the engine
        return refused

    def _not_connected(self, engine: EngineShell, failed: NotConnected) -> Exception:
        """No more connects to ``engine`` for this attempt: it counts as unreachable, and the
        attempt as failed with the connect's own error (what the plan and the caller see)."""
        engine.upstream.gave_up_connecting(failed.why)
        cause = failed.cause
        self._tell(engine, Fact.GAVE_UP, type(cause).__name__)
        return cause

    def _after(self, failed: Refused | Exception) -> Verdict:
        """The plan's verdict on an attempt that ended with ``failed`` before its first token
        (see :meth:`AttemptPlan.after_failure`)."""
        engines = self._engines
        refused = failed if isinstance(failed, Refused) else None
        return self.plan.after_failure(
            refused.status if refused is not None else None,
            refused.body if refused is not None else b"",
            retry_after=retry_after_seconds(refused.retry_after, time.time()) if refused else None,
            now=engines.clock(),
            budget_allows=engines.budget.allow_retry(),
            larger_model=self.choice.may_grow(),
        )

    def _plan(self, plan: AttemptPlan) -> None:
        """The generation's plan is now ``plan`` (its record shows it: the access line)."""
        self.plan = plan
        self._gen.plan = plan

    @property
    def attempts(self) -> int:
        """Attempts of the current round (its plan's: a continuation's round has its own)."""
        return self.plan.attempts

    def _begin(self, engine: EngineShell) -> None:
        """An attempt goes to ``engine``: counted, logged where a cut stream moves, and its
        memory held there (routing and room see it)."""
        engines = self._engines
        current = self._current
        if self.attempts and current is not None and engine is not current:
            engines.failovers += 1
            why = f"{self._failed_why} before the first token"
            _moved(logging.INFO, "failover", self._gen, current, engine, why)
        cut_from, self._cut_from = self._cut_from, None
        if cut_from is not None and cut_from is not engine:
            engines.migrations += 1
            _moved(logging.WARNING, "migration", self._gen, cut_from, engine, "stream cut")
        self._current = engine
        self._told = Told()
        self._hold(engine)
        self._gen.attempts += 1
        self._gen.engine = engine.spec.url

    def _hold(self, engine: EngineShell) -> None:
        """Count this generation's memory on ``engine`` (routing weighs it) until it ends."""
        self.release()
        self._held = engine
        engine.load.memory += self._cost


def _moved(
    level: int, event: str, gen: Generation, source: EngineShell, target: EngineShell, why: str
) -> None:
    """One line naming both engines where a generation's attempt moves between them."""
    gen_id = gen.id
    fields = {"event": event, "generation": gen_id, "engine": target.spec.url}
    msg = "%s: engine %s %s; on to engine %s"
    log.log(level, msg, gen_id, source.spec.url, why, target.spec.url, extra={"fields": fields})
