"""Every request one generation may send upstream, decided in one place: an immutable value
(see docs/design.md, What a call may cost the engine).

urllib3's ``Retry`` is the model: an :class:`AttemptPlan` holds the bounds (:class:`PlanBounds`)
and the history of what happened (one :class:`Ask` per request sent: its engine, its kind, its
outcome, its clock reading). Each question (may it ask again, where, after how long) is answered
by a verdict: :class:`Again`, carrying the next plan, or :class:`Stop`, with the reason. One loop
carries the verdicts out, the relay's (``Relay._call_upstream``): each
turn sends one request through :class:`~streamsafe.gateway.engines.attempts.Attempts` (the I/O
shell that picks the engine, sends, and asks the plan), then waits or reads as the verdict says;
none keeps a counter of its own.

The asks come in rounds. A round starts with the generation's first ask, a continuation of a
broken answer (or a request asked again after an attempt that relayed nothing), or an ask after
the engine shed it and it waited for room. Within a round, an attempt failed before its first
token is asked again on the same engine or another (:func:`~.failover.failover_step`'s rules),
and a connection that was never made is retried on the same engine after a backoff. So the most
a generation may send upstream is::

    rounds (1 + continuations + refusal asks - 1) x attempts per round x (1 + connect retries)

Sans-I/O: no clock, no randomness, no sleeping here; clock readings and the retry budget's
answer are arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools

from streamsafe.gateway.engines.failover import Failover, failover_step
from streamsafe.gateway.engines.refusal_backoff import RefusalRules

__all__ = [
    "Again",
    "Ask",
    "AskKind",
    "AttemptPlan",
    "Outcome",
    "PlanBounds",
    "Stop",
    "Verdict",
    "Where",
]


#: The refusal gate's default per-call bounds (one value, frozen, shared).
_REFUSAL_RULES = RefusalRules()


class AskKind(enum.Enum):
    """Why a request went upstream."""

    FIRST = "first"
    """The generation's first ask."""
    CONNECT_RETRY = "connect-retry"
    """The same request again after a connection that was never made (the engine saw nothing)."""
    SAME_ENGINE = "same-engine"
    """Again on the same engine, which said when (a 500, a short ``Retry-After``)."""
    FAILOVER = "failover"
    """On another engine (or the larger model) after a failure before the first token."""
    WAIT_FOR_ROOM = "wait-for-room"
    """After the engine shed the generation and it waited at the engine's refusal gate."""
    CONTINUATION = "continuation"
    """After a broken attempt: the partial answer continued, or the request asked again."""


#: The kinds that start a round (the others repeat an attempt within one).
_ROUND_KINDS = frozenset((AskKind.FIRST, AskKind.WAIT_FOR_ROOM, AskKind.CONTINUATION))


class Outcome(enum.Enum):
    """What became of one ask."""

    NOT_CONNECTED = "not-connected"
    """No connection was made (refused, unreachable, TLS): the engine never saw it."""
    REFUSED = "refused"
    """The engine shed it before any work (429 or 503, as a status or an error event)."""
    FAILED = "failed"
    """A 5xx, a reset, a timeout, an error event."""
    ANSWERED = "answered"
    """A 4xx, the caller's answer (passed on as it is)."""
    SERVED = "served"
    """The engine took it (its first token, or a plain call's 200)."""


class Where(enum.Enum):
    """Where the next ask goes."""

    SAME_ENGINE = "same-engine"
    OTHER_ENGINE = "other-engine"
    LARGER_MODEL = "larger-model"
    GATE = "gate"
    """Wherever the engine's refusal gate lets it go, when it does."""
    ANY = "any"
    """Wherever the pool picks (a continuation goes elsewhere where it can)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PlanBounds:
    """The bounds of one generation's asks; the defaults are the gateway's (``GatewayConfig``)."""

    connect_retries: int = 2
    """Retries of a connection that was never made, per attempt (default 2), spent from the
    gateway's retry budget too: a dead engine is not hit three times per request."""
    connect_backoff: float = 0.05
    """Seconds before the first connect retry, doubling each time (default 0.05)."""
    failover_attempts: int = 3
    """Attempts per round before a first token, across the pool (default 3: the first plus two,
    as the Stainless clients' own retries); a same-engine retry and the larger model count."""
    failover_window: float = 30.0
    """Seconds from the generation's start within which a failed attempt is asked again
    (default 30, half the read timeout of the Stainless clients)."""
    same_engine_retries: int = 1
    """Retries on the same engine per round, for a failure that says when (default 1)."""
    max_same_engine_wait: float = 2.0
    """The longest ``Retry-After`` waited for on the same engine (default 2 s); longer goes
    elsewhere."""
    continuations: int = 5
    """Rounds after a broken attempt (``--max-continuations``, default 5)."""
    refusals: RefusalRules = _REFUSAL_RULES
    """The refusal gate's per-call bounds: ``most_asks`` (6) engine requests refused, never
    ``window_asks`` (4) within ``window`` (3 s); the gate uses this same value."""
    queue_timeout: float = 20.0
    """Seconds it may wait for room from the first refusal it met (default 20)."""
    total: float | None = 600.0
    """Seconds the generation may take upstream in all (default 600; ``None`` for none)."""

    def __post_init__(self) -> None:
        if self.failover_attempts < 1:
            raise ValueError("failover_attempts must be >= 1")
        if min(self.connect_retries, self.same_engine_retries, self.continuations) < 0:
            raise ValueError("connect_retries, same_engine_retries and continuations must be >= 0")

    @property
    def most_rounds(self) -> int:
        """The first round, one per continuation, and one per wait for room (a refusal comes
        before each, and the gate allows ``most_asks`` refusals, the first included)."""
        return 1 + self.continuations + self.refusals.most_asks - 1

    @property
    def most_asks(self) -> int:
        """The most requests one generation may send upstream (99 with the defaults)."""
        return self.most_rounds * self.failover_attempts * (1 + self.connect_retries)

    def describe(self) -> str:
        """The bound and how it is made, for a log line or ``/stats``."""
        return (
            f"{self.most_asks} = {self.most_rounds} rounds x {self.failover_attempts} attempts"
            f" x {1 + self.connect_retries} connects"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Ask:
    """One request sent upstream for the generation."""

    engine: str
    kind: AskKind
    at: float
    outcome: Outcome | None = None
    """``None`` until its outcome is known (a stream still running, or ended whole)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Again:
    """Ask again: ``where``, after ``delay`` seconds; ``plan`` is the plan to ask with."""

    plan: AttemptPlan
    where: Where
    delay: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    """Ask no more: ``reason`` says which bound or answer ended it."""

    reason: str


Verdict = Again | Stop


@dataclasses.dataclass(frozen=True, slots=True)
class AttemptPlan:
    """One generation's asks: bounds, history, and the answers (see the module). A new plan
    for each change; nothing here mutates."""

    bounds: PlanBounds
    started: float
    """Clock reading of the generation's start (the failover window counts from it)."""
    history: tuple[Ask, ...] = ()
    next_kind: AskKind = AskKind.FIRST
    """The kind the next ask is recorded as."""
    round_start: int = 0
    """Index in :attr:`history` of the current round's first ask."""
    continued: int = 0
    """Continuation rounds granted (:meth:`after_break`), whether or not each got to ask."""
    waited: int = 0
    """Rounds granted after a shed, to wait for room at the engine's gate."""

    # -- what happened ----------------------------------------------------------------------------

    def asked(self, engine: str, now: float) -> AttemptPlan:
        """A request went to ``engine`` at ``now`` (as :attr:`next_kind`). After it, by default,
        a failure is retried on another engine, within the round."""
        ask = Ask(engine, self.next_kind, now)
        return dataclasses.replace(self, history=(*self.history, ask), next_kind=AskKind.FAILOVER)

    def ended(self, outcome: Outcome) -> AttemptPlan:
        """The latest ask ended with ``outcome`` (a later fact replaces an earlier one: a
        stream served, then cut, failed)."""
        if not self.history:
            return self
        last = dataclasses.replace(self.history[-1], outcome=outcome)
        return dataclasses.replace(self, history=(*self.history[:-1], last))

    @property
    def starts_round(self) -> bool:
        """Whether the next ask begins a round (the first, a continuation, an ask after a wait
        for room) rather than repeating an attempt within one."""
        return self.next_kind in _ROUND_KINDS

    @property
    def asks(self) -> int:
        """Requests sent upstream so far."""
        return len(self.history)

    @property
    def most_asks(self) -> int:
        """The most requests its bounds allow (:attr:`PlanBounds.most_asks`)."""
        return self.bounds.most_asks

    @property
    def attempts(self) -> int:
        """Attempts in the current round (connect retries repeat an attempt, not counted)."""
        return sum(a.kind is not AskKind.CONNECT_RETRY for a in self.history[self.round_start :])

    @property
    def connect_retries(self) -> int:
        """Connect retries of the current attempt so far."""
        done = 0
        for ask in reversed(self.history):
            if ask.kind is not AskKind.CONNECT_RETRY:
                break
            done += 1
        return done

    @property
    def refused_asks(self) -> tuple[float, ...]:
        """Clock readings of the asks an engine shed."""
        return tuple(a.at for a in self.history if a.outcome is Outcome.REFUSED)

    def count(self, kind: AskKind) -> int:
        """Asks of ``kind`` so far."""
        return sum(a.kind is kind for a in self.history)

    def summary(self) -> str:
        """The history in one short phrase for the access line: the kinds after the first in
        order, repeats counted (``"connect-retry x2, failover"``); empty for one ask."""
        parts = []
        for name, run in itertools.groupby(ask.kind.value for ask in self.history[1:]):
            times = sum(1 for _ in run)
            parts.append(name if times == 1 else f"{name} x{times}")
        return ", ".join(parts)

    # -- the answers ----------------------------------------------------------------------------

    def after_not_connected(
        self, *, retryable: bool, budget_allows: bool, allowed: bool = True
    ) -> Verdict:
        """The latest ask made no connection: the same engine after the backoff, within
        ``connect_retries`` per attempt and the retry budget; never where ``retryable`` is false
        (a TLS failure: the certificate will not have changed) or the caller said no connect
        retry (``allowed``)."""
        done = self.connect_retries
        bounds = self.bounds
        if not allowed:
            return Stop("connect retries off for this request")
        if not retryable:
            return Stop("connection failed for good (TLS)")
        if done >= bounds.connect_retries:
            return Stop(f"connect retries spent ({bounds.connect_retries})")
        if not budget_allows:
            return Stop("retry budget spent")
        plan = dataclasses.replace(self, next_kind=AskKind.CONNECT_RETRY)
        return Again(plan, Where.SAME_ENGINE, bounds.connect_backoff * 2**done)

    def after_failure(
        self,
        status: int | None,
        body: bytes,
        *,
        retry_after: float | None,
        now: float,
        budget_allows: bool,
        larger_model: bool,
        sheds_answered: bool = True,
    ) -> Verdict:
        """An attempt failed before its first token with ``status`` (``None``: a transport
        failure) and error ``body``: the same engine, another one, the larger model, or none
        (:func:`~.failover.failover_step`'s rules), within ``failover_attempts`` per round,
        ``same_engine_retries`` per round and the failover window."""
        bounds = self.bounds
        same = sum(a.kind is AskKind.SAME_ENGINE for a in self.history[self.round_start :])
        step = failover_step(
            status,
            body,
            retry_after=retry_after,
            sheds_answered=sheds_answered,
            same_engine_tries=same,
            same_engine_retries=bounds.same_engine_retries,
            attempts=self.attempts,
            max_attempts=bounds.failover_attempts,
            now=now,
            deadline=self.started + bounds.failover_window,
            budget_allows=budget_allows,
            larger_model=larger_model,
            max_same_engine_wait=bounds.max_same_engine_wait,
        )
        if step.action is Failover.PASS_THROUGH:
            return Stop(_why_no_failover(self, status, now, budget_allows))
        if step.action is Failover.SAME_ENGINE:
            plan = dataclasses.replace(self, next_kind=AskKind.SAME_ENGINE)
            return Again(plan, Where.SAME_ENGINE, step.delay)
        where = Where.LARGER_MODEL if step.action is Failover.LARGER_MODEL else Where.OTHER_ENGINE
        return Again(dataclasses.replace(self, next_kind=AskKind.FAILOVER), where)

    def elsewhere(self) -> AttemptPlan:
        """The same engine could not be asked after all (its breaker opened meanwhile): the
        next ask goes to another engine, a failover."""
        return dataclasses.replace(self, next_kind=AskKind.FAILOVER)

    def after_break(self, *, shed: bool) -> Verdict:
        """A round ended without an answer: the engine shed it (``shed``: it waits for room at
        the engine's gate, which says when), or it broke (a continuation, within
        ``continuations``). Either starts a new round."""
        bounds = self.bounds
        if shed:
            most = bounds.refusals.most_asks
            if len(self.refused_asks) >= most or self.waited >= most - 1:
                return Stop(f"refused {len(self.refused_asks)} times (at most {most} asks)")
            plan = dataclasses.replace(self._round(AskKind.WAIT_FOR_ROOM), waited=self.waited + 1)
            return Again(plan, Where.GATE)
        if self.continued >= bounds.continuations:
            return Stop(f"continuations spent ({bounds.continuations})")
        plan = dataclasses.replace(self._round(AskKind.CONTINUATION), continued=self.continued + 1)
        return Again(plan, Where.ANY)

    def _round(self, kind: AskKind) -> AttemptPlan:
        """A new round whose first ask is of ``kind``."""
        return dataclasses.replace(self, next_kind=kind, round_start=len(self.history))


def _why_no_failover(plan: AttemptPlan, status: int | None, now: float, budget: bool) -> str:
    """Why :func:`~.failover.failover_step` passed the failure through."""
    bounds = plan.bounds
    if status is not None and 400 <= status < 500 and status != 429:
        return f"answered {status}"
    if plan.attempts >= bounds.failover_attempts:
        return f"failover attempts spent ({bounds.failover_attempts})"
    if not budget:
        return "retry budget spent"
    if now >= plan.started + bounds.failover_window:
        return f"failover window passed ({bounds.failover_window:g} s)"
    return f"answered {status}" if status is not None else "failed"
