"""The retry budget: retries as a share of recent requests plus a small floor per second.

Pure: every test drives the budget with a clock it controls (a list of readings), so the same
sequence always gives the same answers and no test waits.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.retry import Outcome, RetryBudget, RetryPolicy, decide

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.0


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _retry_503(budget: RetryBudget, now: float) -> bool:
    """What the retry core says to a 503 with this budget (plenty of retries otherwise)."""
    decision = decide(
        RetryPolicy(max_retries=100, deadline=None),
        None,
        Outcome.status(503),
        attempt=0,
        resumes=0,
        budget=budget,
        now=now,
        started_at=now,
        rand=0.5,
    )
    return decision.retry


# --- hypothesis: invariants -----------------------------------------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["request", "retry", "forced_retry", "success", "failure"]),
        st.floats(min_value=-5.0, max_value=30.0, allow_nan=False),  # clock step, may go back
    ),
    max_size=300,
)
ratios = st.integers(0, 2000).map(lambda n: n / 1000)  # the budget keeps milli-retries
floors = st.floats(min_value=0.0, max_value=5.0)
windows = st.floats(min_value=0.1, max_value=60.0)


def _play(ratio: float, floor: float, window: float, steps: list[tuple[str, float]]) -> list:
    clock = Clock()
    budget = RetryBudget(ratio, min_per_second=floor, window=window, clock=clock)
    trace = []
    for op, step in steps:
        clock.now += step
        if op == "request":
            budget.record_request()
        elif op == "retry":
            if budget.allow_retry():
                budget.record_retry()
        elif op == "forced_retry":  # a caller that retries without asking
            budget.record_retry()
        elif op == "success":
            budget.record_success()
        else:
            budget.record_failure()
        trace.append((budget.allow_retry(), budget.balance))
    return trace


@given(ratios, floors, windows, ops)
def test_budget_balance_is_never_negative_and_a_retry_needs_a_whole_one(
    ratio, floor, window, steps
):
    for allowed, balance in _play(ratio, floor, window, steps):
        assert balance >= 0.0
        assert allowed == (balance >= 1.0 - 1e-9)


@given(ratios, floors, windows, ops)
def test_budget_gives_the_same_answers_for_the_same_clock_readings(ratio, floor, window, steps):
    assert _play(ratio, floor, window, steps) == _play(ratio, floor, window, steps)


@given(ratios, floors, windows, ops)
def test_budget_never_holds_more_than_its_floor_and_the_window_s_deposits(
    ratio, floor, window, steps
):
    clock = Clock()
    budget = RetryBudget(ratio, min_per_second=floor, window=window, clock=clock)
    requests: list[float] = []
    for op, step in steps:
        clock.now += abs(step)  # a clock that moves forward, so "the last window" is defined
        if op in ("request", "success"):
            budget.record_request()
            requests.append(clock.now)
        elif budget.allow_retry():
            budget.record_retry()
        recent = sum(1 for t in requests if t > clock.now - window)
        assert budget.balance <= floor * window + ratio * recent + 1e-6


# --- hypothesis: the two claims -------------------------------------------------------------


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=30.0),  # seconds since the previous request
            st.integers(min_value=0, max_value=2),  # retries this request needs
        ),
        min_size=1,
        max_size=1000,
    ),
)
def test_ten_percent_of_requests_refused_before_any_work_never_exhaust_the_budget(requests):
    # At most one request in any ten in a row is refused (and may be refused again on its
    # retry): a 10 % error rate, however the requests are spread in time.
    refused_at = -10
    clock = Clock()
    budget = RetryBudget(clock=clock)
    for i, (gap, retries) in enumerate(requests):
        clock.now += gap
        budget.record_request()
        if retries == 0 or i - refused_at < 10:
            continue
        refused_at = i
        for _ in range(retries):
            assert _retry_503(budget, clock.now), budget
            budget.record_retry()


@settings(deadline=None, max_examples=30)
@given(
    st.floats(min_value=20.0, max_value=200.0),  # requests per second
    st.floats(min_value=10.0, max_value=60.0),  # seconds the storm lasts
)
def test_a_backend_that_fails_everything_sees_about_a_fifth_more_requests(rate, duration):
    clock = Clock()
    budget = RetryBudget(clock=clock)
    requests = retries = 0
    while clock.now - NOW < duration:
        budget.record_request()
        requests += 1
        for _ in range(2):  # each call would retry twice (the default policy)
            if not budget.allow_retry():
                break
            budget.record_retry()
            retries += 1
        clock.now += 1.0 / rate
    floor = budget.min_per_second * (duration + budget.window)
    assert retries <= 0.2 * requests + floor + 1
    assert retries >= 0.2 * requests - 1  # throttled to the share, not below it
    if requests >= 20 * floor:
        assert 0.19 <= retries / requests <= 0.26


@settings(deadline=None, max_examples=300)
@given(st.data())
def test_a_hundred_calls_to_a_backend_that_fails_everything_cost_it_at_most_130_requests(data):
    # 100 calls within one window, spread however in time, each failing and retried up to
    # twice (at once or after other calls began) while the budget allows. The reserve used to
    # be added to the share: 134-140 requests.
    clock = Clock()
    budget = RetryBudget(clock=clock)
    calls = requests = 0
    pending: list[int] = []  # retries each failed call may still make
    while calls < 100 or pending:
        clock.now += data.draw(st.floats(min_value=0.0, max_value=0.1))
        if calls < 100 and (not pending or data.draw(st.booleans())):
            budget.record_request()
            calls += 1
            requests += 1
            pending.append(2)
            continue
        i = data.draw(st.integers(0, len(pending) - 1))
        if budget.allow_retry():
            budget.record_retry()
            requests += 1
            pending[i] -= 1
            if pending[i]:
                continue
        pending.pop(i)  # refused by the budget, or out of retries: the call failed
    assert requests <= 130


# --- examples -------------------------------------------------------------------------------


def test_a_storm_at_a_hundred_requests_a_second_gets_twenty_percent_retries():
    clock = Clock()
    budget = RetryBudget(clock=clock)
    retries = 0
    for _ in range(6000):  # one minute
        budget.record_request()
        if budget.allow_retry():
            budget.record_retry()
            retries += 1
        clock.now += 0.01
    # 20 %, and the reserve's 5 at the start: the floor is not added to the share.
    assert 1200 <= retries <= 1200 + 5


def test_an_idle_client_still_gets_the_floor_and_it_refills_at_its_rate():
    clock = Clock()
    budget = RetryBudget(clock=clock)
    spent = 0
    while budget.allow_retry():
        budget.record_retry()
        spent += 1
    assert spent == 5  # min_per_second * window
    clock.now += 2.0
    assert budget.allow_retry()
    budget.record_retry()
    assert not budget.allow_retry()


def test_deposits_leave_with_their_window():
    clock = Clock()
    budget = RetryBudget(0.5, min_per_second=0, window=10.0, clock=clock)
    for _ in range(10):
        budget.record_request()
    assert budget.balance == 5.0
    clock.now += 9.0
    assert budget.balance == 5.0
    clock.now += 1.5  # past the window: what those requests paid for is gone
    assert budget.balance == 0.0
    assert not budget.allow_retry()


def test_a_retry_spends_the_oldest_deposits_first():
    clock = Clock()
    budget = RetryBudget(0.5, min_per_second=0, window=10.0, clock=clock)
    budget.record_request()
    clock.now += 5.0
    budget.record_request()
    budget.record_request()
    budget.record_retry()  # takes the old 0.5 and half of the newer 1.0
    clock.now += 5.5  # the first deposit's slice has left the window; nothing was lost
    assert budget.balance == 0.5


def test_outcome_accounting_pays_for_failures_with_successes():
    # Callers that only see outcomes (gRPC style): a success is a request, a failure a retry.
    clock = Clock()
    budget = RetryBudget(clock=clock)
    for _ in range(10):
        budget.record_failure()
    assert not budget.allow_retry()  # the floor is spent
    for _ in range(5):
        budget.record_success()
    assert budget.allow_retry()


def test_retry_core_refuses_a_retry_the_budget_cannot_pay_for():
    clock = Clock()
    budget = RetryBudget(0.2, min_per_second=0, clock=clock)
    for _ in range(4):
        budget.record_request()
    assert not _retry_503(budget, clock.now)
    budget.record_request()
    assert _retry_503(budget, clock.now)


def test_budget_settings_are_checked():
    with pytest.raises(ValueError):
        RetryBudget(-0.1)
    with pytest.raises(ValueError):
        RetryBudget(min_per_second=-1)
    with pytest.raises(ValueError):
        RetryBudget(window=0)
    assert "ratio=0.2" in repr(RetryBudget())


def test_budget_is_safe_under_threads():
    budget = RetryBudget(1.0, min_per_second=0, clock=Clock())

    def run(op):
        threads = [threading.Thread(target=lambda: [op() for _ in range(2000)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run(budget.record_request)
    assert budget.balance == 8000
    run(budget.record_retry)
    assert budget.balance == 0
