"""The pure retry core: every rule of docs/design.md, Client retries and budget, without a
network, a clock or a sleep."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.retry import (
    TIMEOUT_PHASES,
    Outcome,
    RetryBudget,
    RetryPolicy,
    StreamingConfig,
    decide,
    nothing_started,
    parse_retry_after,
)

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.0

statuses = st.sampled_from([400, 401, 404, 408, 409, 422, 429, 500, 501, 502, 503, 504])
retry_after_values = st.one_of(
    st.none(),
    st.floats(min_value=0, max_value=200, allow_nan=False).map(lambda v: {"retry-after": f"{v}"}),
    st.integers(min_value=0, max_value=200_000).map(lambda v: {"retry-after-ms": str(v)}),
    st.sampled_from(
        [{"retry-after": "soon"}, {"x-should-retry": "true"}, {"x-should-retry": "false"}]
    ),
)
pre_commit = st.one_of(
    st.booleans().map(lambda r: Outcome.connect_failed(refused=r)),
    st.sampled_from(["connect", "write", "pool", "first_byte"]).map(Outcome.timed_out),
    st.just(Outcome.disconnected()),
    st.builds(Outcome.status, statuses, retry_after_values),
)
committed = st.one_of(
    st.builds(
        Outcome.broken,
        events=st.integers(min_value=0, max_value=1000),
        resumable=st.booleans(),
    ),
    st.builds(
        lambda n, r: Outcome.timed_out("idle", events=n, resumable=r),
        st.integers(min_value=0, max_value=1000),
        st.booleans(),
    ),
)
outcomes = st.one_of(pre_commit, committed, st.just(Outcome.timed_out("total")))
policies = st.builds(
    RetryPolicy,
    max_retries=st.integers(min_value=0, max_value=6),
    initial_delay=st.floats(min_value=0, max_value=5),
    max_delay=st.floats(min_value=0, max_value=30),
    multiplier=st.floats(min_value=1, max_value=10),
    max_retry_after=st.floats(min_value=0, max_value=120),
    deadline=st.one_of(st.none(), st.floats(min_value=0, max_value=100)),
)
streamings = st.one_of(
    st.none(),
    st.builds(
        StreamingConfig,
        max_retries=st.integers(min_value=0, max_value=4),
        retry_on_timeout=st.booleans(),
        retry_on_server_error=st.booleans(),
        retry_if_nothing_started=st.booleans(),
        resume=st.booleans(),
        max_resumes=st.integers(min_value=0, max_value=6),
    ),
)
rands = st.floats(min_value=0, max_value=1, exclude_max=True)


def _decide(policy, streaming, outcome, *, attempt=0, resumes=0, budget=None, now=NOW, rand=0.5):
    return decide(
        policy,
        streaming,
        outcome,
        attempt=attempt,
        resumes=resumes,
        budget=budget,
        now=now,
        started_at=NOW,
        rand=rand,
    )


# --- hypothesis properties ------------------------------------------------------------------


@given(
    policies,
    streamings,
    outcomes,
    st.integers(0, 50),
    st.integers(0, 50),
    rands,
    st.floats(min_value=0, max_value=200),
)
def test_delay_is_always_within_zero_and_the_cap(
    policy, streaming, outcome, attempt, resumes, rand, elapsed
):
    d = _decide(
        policy, streaming, outcome, attempt=attempt, resumes=resumes, rand=rand, now=NOW + elapsed
    )
    cap = max(policy.max_delay, policy.max_retry_after) if d.retry else policy.max_delay
    assert 0.0 <= d.delay <= cap
    if d.give_up:
        assert d.delay == 0.0
    if d.retry and outcome.kind != "status":
        assert d.delay <= policy.backoff_cap(attempt)


@given(policies, streamings, committed, st.integers(0, 50), st.integers(0, 50), rands)
def test_a_committed_outcome_is_never_retried(policy, streaming, outcome, attempt, resumes, rand):
    d = _decide(policy, streaming, outcome, attempt=attempt, resumes=resumes, rand=rand)
    assert not d.retry
    if d.resume:
        assert streaming is not None and streaming.resume and outcome.resumable
        assert resumes < streaming.max_resumes


@given(
    policies, streamings, st.lists(st.one_of(pre_commit, committed), min_size=1, max_size=40), rands
)
def test_attempts_and_resumes_never_exceed_their_limits(policy, streaming, history, rand):
    attempt = resumes = 0
    for outcome in history:
        d = _decide(policy, streaming, outcome, attempt=attempt, resumes=resumes, rand=rand)
        if d.retry:
            attempt += 1
        elif d.resume:
            resumes += 1
        else:
            break
    limit = (
        policy.max_retries if streaming is None else max(policy.max_retries, streaming.max_retries)
    )
    assert attempt <= limit
    assert resumes <= (0 if streaming is None else streaming.max_resumes)


@given(
    policies,
    streamings,
    outcomes,
    st.integers(0, 10),
    st.integers(0, 10),
    rands,
    st.floats(min_value=0, max_value=10),
    st.floats(min_value=0, max_value=200),
)
def test_same_inputs_give_the_same_decision(
    policy, streaming, outcome, attempt, resumes, rand, tokens_spent, elapsed
):
    budget = RetryBudget(clock=lambda: NOW)
    for _ in range(int(tokens_spent)):
        budget.record_retry()
    kw = dict(attempt=attempt, resumes=resumes, budget=budget, rand=rand, now=NOW + elapsed)
    assert _decide(policy, streaming, outcome, **kw) == _decide(policy, streaming, outcome, **kw)


# --- examples that pin each rule -----------------------------------------------------------


def test_plain_call_retries_the_transient_statuses_and_not_501_or_4xx():
    policy = RetryPolicy()
    for code in (408, 409, 429, 500, 502, 503, 504):
        assert _decide(policy, None, Outcome.status(code)).retry, code
    for code in (400, 401, 403, 404, 422, 501):
        assert _decide(policy, None, Outcome.status(code)).give_up, code


def test_plain_call_retries_network_failures_and_every_pre_commit_timeout():
    policy = RetryPolicy()
    assert _decide(policy, None, Outcome.connect_failed(refused=True)).retry
    assert _decide(policy, None, Outcome.connect_failed()).retry
    assert _decide(policy, None, Outcome.disconnected()).retry
    for phase in ("connect", "write", "pool", "first_byte"):
        assert _decide(policy, None, Outcome.timed_out(phase)).retry
    assert _decide(policy, None, Outcome.timed_out("total")).give_up


def test_default_policy_makes_two_retries_then_gives_up():
    policy = RetryPolicy()
    out = Outcome.status(503)
    assert _decide(policy, None, out, attempt=0).retry
    assert _decide(policy, None, out, attempt=1).retry
    d = _decide(policy, None, out, attempt=2)
    assert d.give_up and "3 attempts" in d.reason


def test_full_jitter_backoff_grows_and_is_capped():
    policy = RetryPolicy()
    caps = [policy.backoff_cap(n) for n in range(7)]
    assert caps == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert policy.backoff(3, 0.5) == 2.0
    assert policy.backoff(10_000, 0.999) <= 8.0  # no overflow
    d = _decide(policy, None, Outcome.timed_out("first_byte"), attempt=1, rand=0.25)
    assert d.delay == pytest.approx(0.25)
    assert d.reason == "attempt 3/3: first_byte timeout"


def test_x_should_retry_decides_where_present():
    policy = RetryPolicy()
    assert _decide(policy, None, Outcome.status(400, {"X-Should-Retry": "true"})).retry
    assert _decide(policy, None, Outcome.status(503, {"x-should-retry": "false"})).give_up


def test_retry_after_is_honoured_in_seconds_ms_and_dates_up_to_the_cap():
    policy = RetryPolicy()
    assert _decide(policy, None, Outcome.status(429, {"Retry-After": "3"})).delay == 3.0
    assert _decide(policy, None, Outcome.status(429, {"retry-after-ms": "1500"})).delay == 1.5
    date = email.utils.formatdate(NOW + 7, usegmt=True)
    assert _decide(policy, None, Outcome.status(503, {"Retry-After": date})).delay == 7.0
    d = _decide(policy, None, Outcome.status(503, {"Retry-After": "61"}))
    assert d.give_up and "max_retry_after" in d.reason
    # An unreadable header falls back to backoff.
    assert _decide(policy, None, Outcome.status(503, {"Retry-After": "x"}), rand=0).delay == 0


def test_parse_retry_after_rejects_garbage_and_clamps_past_dates():
    assert parse_retry_after(None, NOW) is None
    assert parse_retry_after({}, NOW) is None
    assert parse_retry_after({"retry-after": "-3"}, NOW) is None
    assert parse_retry_after({"retry-after": "nan"}, NOW) is None
    assert parse_retry_after({"retry-after": "2.5"}, NOW) == 2.5
    assert parse_retry_after([("Retry-After-Ms", "bad"), ("Retry-After", "4")], NOW) == 4.0
    past = email.utils.formatdate(NOW - 100, usegmt=True)
    assert parse_retry_after({"retry-after": past}, NOW) == 0.0
    assert parse_retry_after({"retry-after": "1e400"}, NOW) == float("inf")


def test_deadline_bounds_every_attempt():
    policy = RetryPolicy(deadline=10.0)
    assert _decide(policy, None, Outcome.status(503), now=NOW + 9, rand=0.5).retry
    d = _decide(policy, None, Outcome.status(503, {"retry-after": "2"}), now=NOW + 9)
    assert d.give_up and "deadline" in d.reason
    assert _decide(policy, None, Outcome.status(503), now=NOW + 10).give_up


def test_stream_is_not_retried_by_default_where_work_may_have_started():
    s = StreamingConfig()
    policy = RetryPolicy()
    for out in (
        Outcome.timed_out("first_byte"),
        Outcome.timed_out("write"),
        Outcome.status(500),
        Outcome.status(502),
        Outcome.disconnected(),
    ):
        d = _decide(policy, s, out)
        assert d.give_up and "StreamingConfig" in d.reason, out


def test_stream_retries_what_cannot_have_started_within_the_policy():
    s = StreamingConfig()
    policy = RetryPolicy(max_retries=2)
    for out in (
        Outcome.connect_failed(refused=True),
        Outcome.status(429),
        Outcome.status(503),
        Outcome.timed_out("connect"),
        Outcome.timed_out("pool"),
    ):
        assert nothing_started(out)
        assert _decide(policy, s, out, attempt=1).retry, out
        assert _decide(policy, s, out, attempt=2).give_up, out
    off = StreamingConfig(retry_if_nothing_started=False)
    assert _decide(policy, off, Outcome.status(503)).give_up


def test_stream_opt_ins_retry_within_streaming_max_retries():
    policy = RetryPolicy(max_retries=5)
    s = StreamingConfig(max_retries=1, retry_on_server_error=True)
    assert _decide(policy, s, Outcome.status(500)).retry
    assert _decide(policy, s, Outcome.status(500), attempt=1).give_up
    assert _decide(policy, s, Outcome.timed_out("first_byte")).give_up
    t = StreamingConfig(max_retries=2, retry_on_timeout=True)
    assert _decide(policy, t, Outcome.timed_out("first_byte"), attempt=1).retry
    assert _decide(policy, t, Outcome.status(500)).give_up


def test_committed_stream_resumes_where_resumable_and_the_first_resume_is_immediate():
    policy = RetryPolicy()
    s = StreamingConfig(max_resumes=2)
    broke = Outcome.broken(events=7, resumable=True, detail="connection reset")
    d = _decide(policy, s, broke, resumes=0, rand=0.9)
    assert d.resume and d.delay == 0.0
    assert d.reason == "resume 1/2: connection reset after 7 events"
    assert _decide(policy, s, broke, resumes=1, rand=0.9).delay == pytest.approx(0.45)
    assert _decide(policy, s, broke, resumes=2).give_up
    assert _decide(policy, StreamingConfig(resume=False), broke).give_up
    assert _decide(policy, s, Outcome.broken(events=7, resumable=False)).give_up
    assert _decide(policy, None, broke).give_up
    assert _decide(policy, s, Outcome.timed_out("idle", events=3, resumable=True)).resume


def test_success_and_total_timeout_end_the_call():
    assert _decide(RetryPolicy(), None, Outcome.success()).give_up
    assert not Outcome.success().spends_budget
    assert not Outcome.status(404).spends_budget
    assert Outcome.status(503).spends_budget


def test_outcome_rejects_an_unknown_phase_and_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        Outcome.timed_out("lunch")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError):
        RetryPolicy(multiplier=0.5)
    with pytest.raises(ValueError):
        StreamingConfig(max_resumes=-1)
    assert TIMEOUT_PHASES[-1] == "total"
    assert isinstance(RetryPolicy().replace(max_retries=0), RetryPolicy)
