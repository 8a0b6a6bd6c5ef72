"""One generation's asks decided in one value (gateway/engines/attempt_plan.py): whatever the
engines answer, the requests a generation sends upstream never exceed the plan's stated most,
and its history counts every one of them.

The driver below is the shells' loop as they run it: a round is
:class:`~streamsafe.gateway.engines.attempts.Attempts`' failover (a connect that failed is retried
on the same engine, a failure before the first token fails over), and between rounds the relay
asks the plan whether a broken or shed answer goes on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.engines.attempt_plan import (
    Again,
    AskKind,
    AttemptPlan,
    Outcome,
    PlanBounds,
    Stop,
    Where,
)
from streamsafe.gateway.engines.refusal_backoff import RefusalRules

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class _Answer:
    """What the engine did with one ask."""

    kind: str  # "not-connected", "status", "in-band-refusal", "cut", "done"
    status: int | None = None
    retry_after: float | None = None
    retryable: bool = True
    budget: bool = True
    dt: float = 0.0
    #: A 400 that says the context is too long, where a larger model is configured.
    too_long: bool = False


#: Mostly yes: the engine's worst is a budget that allows and a failure worth retrying.
_MOSTLY = st.sampled_from([True, True, True, False])
_ANSWERS = st.one_of(
    st.builds(
        _Answer,
        kind=st.just("not-connected"),
        retryable=_MOSTLY,
        budget=_MOSTLY,
        dt=st.sampled_from([0.0, 0.0, 1.0, 5.0]),
    ),
    st.builds(
        _Answer,
        kind=st.just("status"),
        status=st.sampled_from([400, 404, 429, 500, 502, 503, 504]),
        retry_after=st.one_of(st.none(), st.floats(0, 5)),
        budget=_MOSTLY,
        dt=st.sampled_from([0.0, 0.0, 1.0, 5.0]),
        too_long=st.booleans(),
    ),
    st.builds(
        _Answer, kind=st.sampled_from(["in-band-refusal", "cut", "done"]), dt=st.floats(0, 5)
    ),
)

_BOUNDS = st.builds(
    PlanBounds,
    connect_retries=st.integers(0, 3),
    failover_attempts=st.integers(1, 4),
    failover_window=st.floats(0, 60),
    same_engine_retries=st.integers(0, 2),
    continuations=st.integers(0, 3),
    refusals=st.builds(RefusalRules, most_asks=st.integers(1, 4)),
)


def _drive(plan: AttemptPlan, answers: Iterator[_Answer]) -> tuple[AttemptPlan, int, str]:
    """Run the shells' loops against ``answers`` (the engine's side) until the plan stops or
    the answer is whole: the last plan, the requests sent, and why it ended."""
    sent, now = 0, plan.started
    while True:
        ended, shed = _round(plan, answers, now)
        plan, now, asked, result = ended
        sent += asked
        if result is not None:
            return plan, sent, result
        verdict = plan.after_break(shed=shed)
        if isinstance(verdict, Stop):
            return plan, sent, verdict.reason
        assert verdict.where is (Where.GATE if shed else Where.ANY)
        plan = verdict.plan


def _round(
    plan: AttemptPlan, answers: Iterator[_Answer], now: float
) -> tuple[tuple[AttemptPlan, float, int, str | None], bool]:
    """One round (Attempts' failover): ((plan, clock, requests sent, the end where the answer
    is final), whether it ended shed)."""
    sent = 0
    while True:
        plan = plan.asked("e", now)
        sent += 1
        answer = next(answers, _Answer("done"))
        now += answer.dt
        status = answer.status
        if answer.kind == "done":
            return (plan.ended(Outcome.SERVED), now, sent, "done"), False
        if answer.kind in ("cut", "in-band-refusal"):
            outcome = Outcome.FAILED if answer.kind == "cut" else Outcome.REFUSED
            return (plan.ended(outcome), now, sent, None), answer.kind != "cut"
        if answer.kind == "not-connected":
            plan = plan.ended(Outcome.NOT_CONNECTED)
            verdict = plan.after_not_connected(
                retryable=answer.retryable, budget_allows=answer.budget
            )
            if isinstance(verdict, Again):
                assert verdict.where is Where.SAME_ENGINE and verdict.delay > 0
                plan = verdict.plan
                continue
        else:
            refused = status in (429, 503)
            plan = plan.ended(Outcome.REFUSED if refused else Outcome.FAILED)
        verdict = plan.after_failure(
            status,
            b"prompt too long for the maximum context length" if answer.too_long else b"",
            retry_after=answer.retry_after,
            now=now,
            budget_allows=answer.budget,
            larger_model=answer.too_long,
        )
        if isinstance(verdict, Again):
            plan = verdict.plan
            continue
        if status is not None and 400 <= status < 500 and status != 429:
            return (plan, now, sent, verdict.reason), False  # the caller's answer
        return (plan, now, sent, None), status in (429, 503)


@settings(max_examples=400, deadline=None)
@given(bounds=_BOUNDS, answers=st.lists(_ANSWERS, max_size=300))
def test_no_sequence_of_answers_sends_more_than_the_stated_most(
    bounds: PlanBounds, answers: list[_Answer]
) -> None:
    plan, sent, _ = _drive(AttemptPlan(bounds, 0.0), iter(answers))
    assert sent <= bounds.most_asks
    assert plan.asks == sent == len(plan.history)
    assert plan.history[0].kind is AskKind.FIRST
    assert plan.count(AskKind.CONTINUATION) <= bounds.continuations
    assert plan.count(AskKind.WAIT_FOR_ROOM) <= bounds.refusals.most_asks - 1
    rounds = _split(plan, _ROUND_KINDS)
    assert len(rounds) <= bounds.most_rounds
    for round_ in rounds:
        attempts = _split_kinds(round_, lambda k: k is not AskKind.CONNECT_RETRY)
        assert len(attempts) <= bounds.failover_attempts
        assert all(len(attempt) <= 1 + bounds.connect_retries for attempt in attempts)


_ROUND_KINDS = frozenset((AskKind.FIRST, AskKind.CONTINUATION, AskKind.WAIT_FOR_ROOM))


def _split(plan: AttemptPlan, starts: frozenset[AskKind]) -> list[list[AskKind]]:
    return _split_kinds([a.kind for a in plan.history], lambda k: k in starts)


def _split_kinds(kinds: list[AskKind], starts: Callable[[AskKind], bool]) -> list[list[AskKind]]:
    """``kinds`` cut before each kind ``starts`` says begins a part."""
    parts: list[list[AskKind]] = []
    for kind in kinds:
        if starts(kind) or not parts:
            parts.append([])
        parts[-1].append(kind)
    return parts


@settings(max_examples=200, deadline=None)
@given(bounds=_BOUNDS, answers=st.lists(_ANSWERS, max_size=300))
def test_the_history_counts_every_ask_with_its_outcome(
    bounds: PlanBounds, answers: list[_Answer]
) -> None:
    plan, sent, _ = _drive(AttemptPlan(bounds, 0.0), iter(answers))
    kinds = [a.kind for a in plan.history]
    assert len(kinds) == sent
    assert all(a.outcome is not None for a in plan.history)
    # A connect retry follows an ask that made no connection, and only such.
    for before, after in zip(plan.history, plan.history[1:], strict=False):
        assert (after.kind is AskKind.CONNECT_RETRY) <= (before.outcome is Outcome.NOT_CONNECTED)


def test_the_worst_case_reaches_the_stated_most_and_no_further() -> None:
    # Every attempt's connects fail twice, then it fails; the sixth round's last refuses and
    # five waits for room are refused too: the bound is reached, not only not passed.
    bounds = PlanBounds()
    assert bounds.most_asks == 99  # 11 rounds x 3 attempts x 3 connects

    def engine() -> Iterator[_Answer]:
        for round_ in range(11):
            for attempt in range(3):
                yield _Answer("not-connected")
                yield _Answer("not-connected")
                last = round_ >= 5 and attempt == 2
                yield _Answer("status", status=503 if last else 502)

    plan, sent, why = _drive(AttemptPlan(bounds, 0.0), engine())
    assert sent == 99 == plan.asks
    assert why == "refused 6 times (at most 6 asks)"
    assert plan.summary().startswith("connect-retry x2, failover, connect-retry x2")


def test_a_connect_retry_stays_on_the_engine_and_backs_off() -> None:
    plan = AttemptPlan(PlanBounds(connect_retries=2, connect_backoff=0.05), 0.0).asked("e", 0.0)
    delays = []
    for _ in range(2):
        verdict = plan.ended(Outcome.NOT_CONNECTED).after_not_connected(
            retryable=True, budget_allows=True
        )
        assert isinstance(verdict, Again) and verdict.where is Where.SAME_ENGINE
        delays.append(verdict.delay)
        plan = verdict.plan.asked("e", 0.0)
    assert delays == [0.05, 0.1]
    spent = plan.after_not_connected(retryable=True, budget_allows=True)
    assert spent == Stop("connect retries spent (2)")
    assert plan.attempts == 1  # connect retries repeat the attempt
    tls = AttemptPlan(PlanBounds(), 0.0).asked("e", 0.0)
    assert isinstance(tls.after_not_connected(retryable=False, budget_allows=True), Stop)


def test_a_500_is_asked_once_more_on_the_same_engine_then_elsewhere() -> None:
    plan = AttemptPlan(PlanBounds(), 0.0).asked("a", 0.0).ended(Outcome.FAILED)
    first = plan.after_failure(
        500, b"", retry_after=None, now=1.0, budget_allows=True, larger_model=False
    )
    assert isinstance(first, Again) and first.where is Where.SAME_ENGINE
    plan = first.plan.asked("a", 1.0).ended(Outcome.FAILED)
    second = plan.after_failure(
        500, b"", retry_after=None, now=1.0, budget_allows=True, larger_model=False
    )
    assert isinstance(second, Again) and second.where is Where.OTHER_ENGINE
    plan = second.plan.asked("b", 1.0).ended(Outcome.FAILED)
    third = plan.after_failure(
        500, b"", retry_after=None, now=1.0, budget_allows=True, larger_model=False
    )
    assert third == Stop("failover attempts spent (3)")
    assert [a.kind for a in plan.history] == [AskKind.FIRST, AskKind.SAME_ENGINE, AskKind.FAILOVER]
    assert plan.summary() == "same-engine, failover"


def test_continuations_are_counted_across_rounds_and_bounded() -> None:
    plan = AttemptPlan(PlanBounds(continuations=1), 0.0).asked("a", 0.0).ended(Outcome.FAILED)
    again = plan.after_break(shed=False)
    assert isinstance(again, Again) and again.plan.attempts == 0
    plan = again.plan.asked("a", 1.0)
    assert plan.history[-1].kind is AskKind.CONTINUATION
    assert plan.after_break(shed=False) == Stop("continuations spent (1)")
