"""The pure rules of refused calls waiting together (gateway/engines/refusal_backoff.py): an
engine that refuses every ask is asked again by one probe at a time, with exponential backoff
and full jitter, its ``Retry-After`` honoured up to a cap; a call never asks more than 6 times,
never more than 4 times within 3 s, and gives up at once where waiting cannot help."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.engines.refusal_backoff import (
    REFUSAL_BACKOFF,
    RefusalRules,
    Refusing,
    next_turn,
)

pytestmark = pytest.mark.unit

RULES = RefusalRules()
QUEUE_TIMEOUT = 20.0


@dataclass
class _Call:
    arrives: float
    deadline: float
    asks: tuple[float, ...] = ()
    gave_up: float | None = None
    retry_after: float | None = None
    turns: list[float] = field(default_factory=list)


def _run(
    arrivals: list[float], draws: list[float], retry_after: float | None, burst: int = 1
) -> tuple[list[_Call], list[float]]:
    """An engine refusing every ask; calls arriving at ``arrivals``: the first ``burst`` ask
    at once (they asked before any refusal came back), then each asks when :func:`next_turn`
    lets it, one at a time (the earliest turn first). Returns the calls and every ask the
    engine saw."""
    calls = [_Call(t, t + QUEUE_TIMEOUT) for t in sorted(arrivals)]
    engine: Refusing | None = None
    seen: list[float] = []
    draw = iter(draws)

    def ask(call: _Call, now: float) -> None:
        nonlocal engine
        seen.append(now)
        call.asks = (*call.asks, now)
        engine = (engine or Refusing()).refused(now, retry_after, next(draw, 0.5), RULES)

    for call in calls[:burst]:
        ask(call, calls[0].arrives)
    now = calls[0].arrives
    while True:
        waiting = [c for c in calls if c.gave_up is None]
        if not waiting:
            return calls, seen
        turns = []
        for c in waiting:
            at_least = max(now, c.arrives)
            turn = next_turn(engine, c.asks, at_least, c.deadline, RULES)
            if not turn.go:
                turns.append((at_least, 0, c, turn))
            else:
                turns.append((turn.at, 1, c, turn))
        at, _, call, turn = min(turns, key=lambda t: (t[0], t[1], t[2].arrives))
        now = at
        if not turn.go:
            call.gave_up, call.retry_after = at, turn.retry_after
        else:
            ask(call, at)


def _most_within(times: list[float], window: float) -> int:
    times = sorted(times)
    return max((sum(1 for u in times if t <= u < t + window) for t in times), default=0)


@settings(max_examples=300)
@given(
    st.lists(st.floats(0, 30), min_size=1, max_size=8),
    st.lists(st.floats(0, 0.999), min_size=60, max_size=60),
    st.one_of(st.none(), st.floats(0, 30)),
)
def test_no_call_asks_more_than_6_times_nor_4_within_3_s(
    arrivals: list[float], draws: list[float], retry_after: float | None
) -> None:
    calls, seen = _run(arrivals, draws, retry_after)
    for call in calls:
        assert len(call.asks) <= RULES.most_asks
        assert _most_within(list(call.asks), RULES.window) <= RULES.window_asks
        assert call.gave_up is not None and call.retry_after is not None
        assert call.retry_after >= 1.0
        assert call.gave_up <= call.deadline  # never held past its bound
    # The engine itself is asked by one probe at a time, never 5 times within 3 s.
    assert _most_within(seen, RULES.window) <= RULES.window_asks


@settings(max_examples=300)
@given(
    st.lists(st.floats(0, 0.999), min_size=1, max_size=12),
    st.one_of(st.none(), st.floats(0, 30)),
)
def test_the_wait_is_full_jitter_exponential_and_honours_retry_after_up_to_a_cap(
    draws: list[float], retry_after: float | None
) -> None:
    state = Refusing()
    now = 100.0
    for n, rand in enumerate(draws):
        after = state.refused(now, retry_after, rand, RULES)
        wait = after.next_at - now
        jitter = rand * REFUSAL_BACKOFF.backoff_cap(n)
        asked = 0.0 if retry_after is None else min(retry_after, REFUSAL_BACKOFF.max_retry_after)
        window = after.asks[0] + RULES.window - now if len(after.asks) >= 4 else 0.0
        assert math.isclose(wait, max(jitter, asked, window), abs_tol=1e-9)
        assert after.refusals == n + 1
        state, now = after, after.next_at


def test_one_call_against_an_engine_that_refuses_everything_without_retry_after() -> None:
    # The draws the full jitter may make: all at once (0), or each at its cap (near 1).
    for rand in (0.0, 0.999):
        [call], seen = _run([0.0], [rand] * 10, None)
        assert len(seen) == len(call.asks) <= 6
        assert _most_within(seen, 3.0) <= 4
        assert call.gave_up is not None and call.gave_up <= QUEUE_TIMEOUT


def test_a_call_gives_up_at_once_where_the_next_probe_is_past_its_deadline() -> None:
    engine = Refusing().refused(0.0, 30.0, 0.5, RULES)  # asks for 30 s: capped at 10
    assert engine.next_at == 10.0
    late = next_turn(engine, (0.0,), 1.0, deadline=5.0, rules=RULES)
    assert not late.go and late.retry_after == 9.0
    soon = next_turn(engine, (0.0,), 1.0, deadline=20.0, rules=RULES)
    assert soon.go and soon.at == 10.0
    spent = next_turn(None, (0.0,) * 6, 1.0, deadline=20.0, rules=RULES)
    assert not spent.go


@settings(max_examples=200)
@given(
    st.integers(2, 8),
    st.lists(st.floats(0, 0.999), min_size=60, max_size=60),
    st.one_of(st.none(), st.floats(0, 30)),
)
def test_a_burst_that_asked_before_any_refusal_keeps_every_call_within_its_bounds(
    burst: int, draws: list[float], retry_after: float | None
) -> None:
    calls, seen = _run([0.0] * burst, draws, retry_after, burst=burst)
    for call in calls:
        assert 1 <= len(call.asks) <= RULES.most_asks
        assert _most_within(list(call.asks), RULES.window) <= RULES.window_asks
    # Past the burst's own asks, one probe at a time: never 4 more within 3 s.
    probes = seen[burst:]
    assert _most_within(probes, RULES.window) <= RULES.window_asks
    if burst >= RULES.window_asks:  # the burst filled the window already
        assert all(t >= RULES.window for t in probes)


def test_a_call_waits_to_its_deadline_where_a_generation_ending_may_make_room() -> None:
    engine = Refusing().refused(0.0, 30.0, 0.5, RULES)  # the next probe at 10 s
    waits = next_turn(engine, (0.0,), 1.0, deadline=5.0, rules=RULES, room_expected=True)
    assert waits.go and waits.at == 10.0  # the shell waits until 5 s at most, then plans again
    ends = next_turn(engine, (0.0,), 5.0, deadline=5.0, rules=RULES, room_expected=True)
    assert not ends.go and ends.retry_after == 5.0
    roomy = engine.room(3.0)  # a generation ended at 3 s: the next probe goes now
    assert next_turn(roomy, (0.0,), 3.0, deadline=5.0, rules=RULES).at == 3.0
