"""What the facts told of one attempt mean, decided in one pure table
(gateway/engines/attempt_end.py): whatever order the relay, the ask, the reader and the sink tell
them in, and however often, each end counts once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.engines.attempt_end import Actions, Fact, Told, tell
from streamsafe.gateway.engines.attempt_plan import Outcome

pytestmark = pytest.mark.unit


def _run(facts: list[Fact]) -> tuple[list[Actions], Outcome | None]:
    """The actions of ``facts`` told in order of one attempt, and how its ask ends."""
    told, last, out = Told(), None, []
    for fact in facts:
        acts = tell(told, fact, last)
        out.append(acts)
        told = acts.told
        if acts.outcome is not None:
            last = acts.outcome
    return out, last


FACTS = st.lists(st.sampled_from(list(Fact)), max_size=12)


@settings(max_examples=500)
@given(FACTS)
def test_each_end_counts_once_whatever_the_order(facts: list[Fact]) -> None:
    acts, last = _run(facts)
    # The breaker hears a failure once, and a death whenever one is said (it holds the engine
    # down); never a failure after the engine shed the attempt, unless it died.
    failures = [a for a in acts if a.failure and not a.dead]
    assert len(failures) <= 1
    assert sum(a.dead for a in acts) == facts.count(Fact.DIED)
    if Fact.SHED in facts:
        after_shed = acts[facts.index(Fact.SHED) + 1 :]
        assert not any(a.failure and not a.dead for a in after_shed)
    # A shed is told to the engine once, and the gate hears the attempt admitted once.
    assert sum(a.shed for a in acts) == (Fact.SHED in facts)
    admitting = {Fact.SERVED, Fact.ADMITTED}
    assert sum(a.admit for a in acts) == any(f in admitting for f in facts)
    # The breaker closes at every first token or whole answer.
    assert sum(a.succeeded for a in acts) == facts.count(Fact.SERVED)
    # How the ask ends: the last fact that says how; a cut keeps an end already told.
    said = [f for f in facts if f not in (Fact.ADMITTED, Fact.GAVE_UP)]
    if not said:
        assert last is None
    elif said[-1] is Fact.CUT:
        before = [f for f in said if f is not Fact.CUT]
        if not before or before[-1] is Fact.SERVED:
            assert last is Outcome.FAILED
        else:
            assert last is not Outcome.SERVED
    else:
        assert last is _OUTCOME[said[-1]] or (said[-1] is Fact.SHED and said.count(Fact.SHED) > 1)


_OUTCOME = {
    Fact.SERVED: Outcome.SERVED,
    Fact.FAILED: Outcome.FAILED,
    Fact.DIED: Outcome.FAILED,
    Fact.SHED: Outcome.REFUSED,
    Fact.ANSWERED: Outcome.ANSWERED,
    Fact.NOT_CONNECTED: Outcome.NOT_CONNECTED,
}


def test_the_ends_seen_twice_in_the_gateway_count_once() -> None:
    # A 503 is the ask's status and the relay's answer: one shed, no failure.
    acts, last = _run([Fact.SHED, Fact.SHED, Fact.CUT])
    assert [a.shed for a in acts] == [True, False, False]
    assert not any(a.failure for a in acts) and last is Outcome.REFUSED
    # A stream that failed (a reset) is cut next: one failure, the ask failed.
    acts, last = _run([Fact.SERVED, Fact.FAILED, Fact.CUT])
    assert [a.failure for a in acts] == [False, True, False] and last is Outcome.FAILED
    # A stream cut with nothing else said counts against its engine once.
    acts, last = _run([Fact.SERVED, Fact.CUT])
    assert [a.failure for a in acts] == [False, True] and last is Outcome.FAILED
    # A 4xx is the caller's: no verdict on the engine either way.
    (acts,), last = _run([Fact.ANSWERED])
    assert acts.neutral and not acts.failure and last is Outcome.ANSWERED
    # Connects not made say nothing to the breaker until the last is given up.
    acts, last = _run([Fact.NOT_CONNECTED, Fact.NOT_CONNECTED, Fact.GAVE_UP])
    assert [a.failure for a in acts] == [False, False, True] and last is Outcome.NOT_CONNECTED
