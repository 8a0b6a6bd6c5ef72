"""Admission's pure core: bounds, fair order across tenants, dormant places, predicted waits and
the plan of a queued subscriber (hypothesis), plus its event-loop shell."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.admission.admission import MAX_REQUEST_COST, Admission, Shed, request_cost
from streamsafe.gateway.admission.fair_queue import ADMITTED, QUEUED, SHED, AdmissionCore, Waiter
from streamsafe.gateway.serving.wait_plan import ANSWER_FRACTION, plan_wait

pytestmark = pytest.mark.unit

TENANTS = ("a", "b", "c")

ops = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.sampled_from(TENANTS), st.integers(1, 60)),
        st.tuples(st.just("release"), st.sampled_from(TENANTS), st.integers(0, 50)),
        st.tuples(st.just("withdraw"), st.sampled_from(TENANTS), st.integers(0, 50)),
        st.tuples(st.just("leave"), st.sampled_from(TENANTS), st.integers(0, 50)),
        st.tuples(st.just("step-back"), st.sampled_from(TENANTS), st.integers(0, 50)),
        st.tuples(st.just("return"), st.sampled_from(TENANTS), st.integers(0, 50)),
        st.tuples(st.just("commit"), st.sampled_from(TENANTS), st.integers(0, 50)),
    ),
    max_size=120,
)
limits = st.tuples(
    st.one_of(st.none(), st.integers(1, 5)),  # max_inflight
    st.one_of(st.none(), st.integers(60, 200)),  # max_memory_tokens
    st.integers(0, 8),  # queue_size
)
weights = st.fixed_dictionaries({t: st.sampled_from([0.5, 1.0, 2.0, 3.0]) for t in TENANTS})


class Model:
    """Drives a core and checks its invariants after every step."""

    def __init__(self, core: AdmissionCore) -> None:
        self.core = core
        self.now = 0.0
        self.waiters: list[Waiter] = []
        self.admissions: list[Waiter] = []

    def absorb(self, changed: list[Waiter]) -> None:
        for w in changed:
            assert w.state in (ADMITTED, SHED)
            if w.state == ADMITTED:
                self.admissions.append(w)

    def pick(self, state: str, i: int, tenant: str | None = None) -> Waiter | None:
        found = [w for w in self.waiters if w.state == state and tenant in (None, w.tenant)]
        return found[i % len(found)] if found else None

    def step(self, op: str, tenant: str, arg: int) -> None:
        core = self.core
        self.now += 0.1
        if op == "request":
            if not core.can_ever_fit(arg):
                return
            w, changed = core.request(tenant, arg, None, self.now)
            self.waiters.append(w)
            if w.state == ADMITTED:
                self.admissions.append(w)
            self.absorb(changed)
        elif op == "release" and (w := self.pick(ADMITTED, arg)):
            self.absorb(core.release(w, self.now))
        elif op == "withdraw" and (w := self.pick(QUEUED, arg)):
            if not w.committed:
                self.absorb(core.withdraw(w, self.now))
        elif op in ("leave", "return", "step-back") and (w := self.pick(QUEUED, arg)):
            back = op == "return"
            self.absorb(core.set_active(w, back, self.now, expected=op == "step-back"))
        elif op == "commit" and (w := self.pick(QUEUED, arg)):
            core.commit(w)
        self.check()

    def check(self) -> None:
        core = self.core
        running = [w for w in self.waiters if w.state == ADMITTED]
        queued = [w for w in self.waiters if w.state == QUEUED]
        assert core.inflight == len(running)
        assert core.memory == sum(w.cost for w in running)
        assert core.queued == len(queued)
        if core.max_inflight is not None:
            assert core.inflight <= core.max_inflight
        if core.max_memory_tokens is not None:
            assert core.memory <= core.max_memory_tokens
        assert core.queued <= core.queue_size
        for t in TENANTS:
            assert core.tenant_counts(t) == (
                sum(w.tenant == t for w in running),
                sum(w.tenant == t for w in queued),
            )
        # Work-conserving: whoever is next in order does not fit (so the engine is never idle
        # while an active or expected waiter waits); only the other dormant ones are passed
        # over, and an expected one only while an active one waits.
        head = core.next_waiter()
        assert (head is None) == (not any(w.active or w.expected for w in queued))
        if head is not None and not head.active:
            assert not any(w.active for w in queued)
        if head is not None:
            assert not core.fits(head.cost)
            assert core.inflight > 0


@given(ops, limits, weights)
@settings(max_examples=300, deadline=None)
def test_bounds_hold_and_the_engine_never_idles_while_an_active_waiter_waits(
    script: list[tuple[str, str, int]],
    lim: tuple[int | None, int | None, int],
    w: dict[str, float],
) -> None:
    model = Model(AdmissionCore(*lim, weights=w))
    for op in script:
        model.step(*op)


@given(ops, limits, weights, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_no_tenant_is_starved_while_another_floods(
    script: list[tuple[str, str, int]],
    lim: tuple[int | None, int | None, int],
    w: dict[str, float],
    rnd: object,
) -> None:
    model = Model(AdmissionCore(*lim, weights=w))
    for op in script:
        model.step(*op)
    for waiter in model.waiters:  # everybody comes back
        if waiter.state == QUEUED:
            model.absorb(model.core.set_active(waiter, True, model.now))
    waiting = [x for x in model.waiters if x.state == QUEUED and x.tenant != "a"]
    # Tenant "a" floods: it asks again after every step, while the engine finishes one
    # generation at a time, oldest first. Everybody else must get a place (or a clear 429).
    steps = 0
    while any(x.state == QUEUED for x in waiting):
        steps += 1
        assert steps < 500, "a waiter was starved"
        model.step("request", "a", 20)
        oldest = next((x for x in model.admissions if x.state == ADMITTED), None)
        if oldest is not None:
            model.absorb(model.core.release(oldest, model.now))
            model.check()


@given(
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    st.integers(1, 4),
    st.integers(1, 30),
)
@settings(max_examples=100, deadline=None)
def test_backlogged_tenants_are_admitted_in_proportion_to_their_weights(
    wa: float, wb: float, max_inflight: int, cost: int
) -> None:
    core = AdmissionCore(max_inflight, None, 400, weights={"a": wa, "b": wb})
    model = Model(core)
    for i in range(150):  # "a" arrived first with all of its backlog
        model.step("request", "a", cost + i % 2)
    for i in range(150):
        model.step("request", "b", cost + i % 2)
    start = len(model.admissions)
    for _ in range(120):
        oldest = next(x for x in model.admissions if x.state == ADMITTED)
        model.absorb(core.release(oldest, model.now))
    done = model.admissions[start:]
    na = sum(x.tenant == "a" for x in done)
    nb = sum(x.tenant == "b" for x in done)
    # Shares of the admissions follow the weights, within what in-flight rounding allows.
    assert abs(na / wa - nb / wb) <= (max_inflight + 2) / min(wa, wb)


def test_a_tenant_that_filled_the_queue_does_not_keep_another_out() -> None:
    core = AdmissionCore(1, None, 4)
    core.request("a", 1, None, 0.0)  # running
    a = [core.request("a", 1, None, 0.0)[0] for _ in range(4)]
    assert [w.state for w in a] == [QUEUED] * 4
    b1, changed = core.request("b", 1, None, 0.0)
    assert b1.state == QUEUED and changed == [a[-1]] and a[-1].state == SHED  # a's newest
    b2, changed = core.request("b", 1, None, 0.0)
    assert b2.state == QUEUED and changed == [a[-2]]
    b3, changed = core.request("b", 1, None, 0.0)  # "b" holds its half: no more
    assert b3.state == SHED and changed == []
    # And "b" goes first when a place frees, though "a" asked earlier.
    running = core.next_waiter()
    assert running is b1


def test_committed_waiters_are_never_shed_to_make_room() -> None:
    core = AdmissionCore(1, None, 2)
    core.request("a", 1, None, 0.0)
    for _ in range(2):
        core.commit(core.request("a", 1, None, 0.0)[0])
    b, changed = core.request("b", 1, None, 0.0)
    assert b.state == SHED and changed == []


def test_dormant_waiter_keeps_its_place_and_goes_first_on_return() -> None:
    core = AdmissionCore(1, None, 10)
    running, _ = core.request("t", 1, None, 0.0)
    w1, w2, w3 = (core.request("t", 1, None, 0.0)[0] for _ in range(3))
    assert core.set_active(w1, False, 0.1) == []
    assert core.release(running, 1.0) == [w2]  # w1 is skipped: nobody waits for it
    assert w1.state == QUEUED
    assert core.set_active(w1, True, 1.1) == []  # back, but the place is still taken
    assert core.release(w2, 2.0) == [w1]  # ahead of w3: it kept its place
    assert w3.state == QUEUED


def test_a_waiter_told_to_come_back_runs_ahead_only_of_an_idle_engine() -> None:
    core = AdmissionCore(1, None, 10)
    running, _ = core.request("t", 1, None, 0.0)
    expected, _ = core.request("t", 1, None, 0.0)
    active, _ = core.request("t", 1, None, 0.0)
    core.set_active(expected, False, 0.0, expected=True)
    assert core.release(running, 1.0) == [active]  # somebody waits: it goes first
    assert core.release(active, 2.0) == [expected]  # nobody waits: the engine does not idle


def test_a_waiter_alone_is_admitted_as_soon_as_it_returns() -> None:
    core = AdmissionCore(1, None, 10)
    running, _ = core.request("t", 1, None, 0.0)
    w, _ = core.request("t", 1, None, 0.0)
    core.set_active(w, False, 0.0)
    assert core.release(running, 1.0) == []
    assert core.set_active(w, True, 2.0) == [w] and w.state == ADMITTED


def test_predicted_wait_follows_the_drain_rate() -> None:
    core = AdmissionCore(2, None, 10)
    assert core.predicted_wait(tenant="t") == 0.0  # room now
    a, _ = core.request("t", 1, None, 0.0)
    b, _ = core.request("t", 1, None, 0.0)
    q1, _ = core.request("t", 1, None, 0.0)
    assert core.predicted_wait(q1) is None  # no generation finished yet: unknown
    core.release(a, 2.0)  # q1 admitted; every generation takes 2 s so far
    q2, _ = core.request("t", 1, None, 2.0)
    q3, _ = core.request("t", 1, None, 2.0)
    # Two in flight, 2 s each: a place frees every second.
    assert core.predicted_wait(q2) == pytest.approx(1.0)
    assert core.predicted_wait(q3) == pytest.approx(2.0)
    assert core.predicted_wait(tenant="t") == pytest.approx(3.0)  # behind its own backlog
    assert core.predicted_wait(tenant="u") == pytest.approx(1.0)  # another tenant goes first
    core.set_active(q2, False, 2.0)  # a dormant waiter is not ahead of anyone
    assert core.predicted_wait(q3) == pytest.approx(1.0)
    core.set_active(q2, True, 2.0)
    core.set_active(q2, False, 2.0, expected=True)  # unless its client is on its way back
    assert core.predicted_wait(q3) == pytest.approx(2.0)
    assert core.predicted_wait(b) == 0.0


def test_request_cost_counts_prompt_and_completion_limit() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "abcd" * 10}]}
    assert request_cost(body, 100) == 2 + 4 + 10 + 100
    assert request_cost({**body, "max_tokens": 5}, 100) == 21
    assert request_cost({**body, "max_completion_tokens": 7, "max_tokens": 5}, 100) == 23
    assert request_cost({**body, "max_tokens": 5, "n": 2}, 100) == 42


def test_request_cost_is_bounded_whatever_a_request_asks_for() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for asked in ({"max_tokens": 2**63 - 1}, {"max_tokens": 10**30, "n": 10**12}):
        assert request_cost({**body, **asked}, 100) == MAX_REQUEST_COST
    assert MAX_REQUEST_COST * 10**6 < 2**63  # a million in flight still sum within 64 bits


# -- the plan of a queued subscriber ----------------------------------------------------------

seconds = st.floats(0, 100, allow_nan=False)
plans = st.fixed_dictionaries(
    {
        "predicted": st.one_of(st.none(), seconds),
        "waited": seconds,
        "hold_left": st.floats(-10, 100, allow_nan=False),
        "patience": st.one_of(st.none(), st.floats(0.1, 120, allow_nan=False)),
        "early": st.booleans(),
        "commit_after": st.floats(0, 5, allow_nan=False),
        "committed": st.booleans(),
    }
)


@given(plans)
@settings(max_examples=500, deadline=None)
def test_plan_never_commits_what_will_not_fit_and_always_answers_before_the_read_timeout(
    kw: dict[str, object],
) -> None:
    plan = plan_wait(**kw)  # type: ignore[arg-type]
    predicted, waited, hold_left = kw["predicted"], kw["waited"], kw["hold_left"]
    patience, early, committed = kw["patience"], kw["early"], kw["committed"]
    assert isinstance(waited, float) and isinstance(hold_left, float)
    if plan.action == "commit":
        assert early  # first-token commit never commits before the first token
        assert committed or (hold_left > 0 and (predicted is None or predicted <= hold_left))
    if plan.action == "shed":
        assert not committed  # never a 429 after a 200
        assert plan.retry_after >= 0
    if plan.action == "step-back":
        assert not early and plan.retry_after > 0
    if plan.action == "wait":
        assert plan.until > 0
        if isinstance(patience, float):
            # The next decision comes before the client's read timeout fires.
            assert waited + plan.until <= patience * ANSWER_FRACTION + 1e-9
        if not committed:  # nor later than the gateway holds the generation
            assert plan.until <= hold_left + 1e-9
    if isinstance(patience, float) and waited >= patience * ANSWER_FRACTION:
        assert plan.action != "wait"


def test_plan_commits_early_only_when_the_wait_may_reach_the_read_timeout() -> None:
    base = {"hold_left": 30.0, "early": True, "commit_after": 1.0, "committed": False}
    assert plan_wait(predicted=0.2, waited=0.0, patience=60.0, **base).action == "wait"
    assert plan_wait(predicted=40.0, waited=0.0, patience=60.0, **base).action == "shed"
    assert plan_wait(predicted=29.0, waited=2.0, patience=60.0, **base).action == "commit"
    # The client did not say: commit after commit_after, as before.
    assert plan_wait(predicted=5.0, waited=0.5, patience=None, **base).action == "wait"
    assert plan_wait(predicted=5.0, waited=1.0, patience=None, **base).action == "commit"
    assert plan_wait(predicted=None, waited=1.0, patience=None, **base).action == "commit"


def test_first_token_commit_steps_back_a_subscriber_that_would_time_out() -> None:
    base = {"hold_left": 30.0, "early": False, "commit_after": 1.0, "committed": False}
    plan = plan_wait(predicted=6.0, waited=0.0, patience=2.0, **base)
    assert plan.action == "step-back"
    assert plan.retry_after == pytest.approx(6.0 + 2.0 * ANSWER_FRACTION / 2)  # just after
    assert plan_wait(predicted=0.3, waited=0.0, patience=2.0, **base).action == "wait"
    # Its place is near: stepping back would cost an attempt for nothing, so it waits.
    assert plan_wait(predicted=0.4, waited=0.7, patience=2.0, **base).action == "wait"
    assert plan_wait(predicted=0.4, waited=1.0, patience=2.0, **base).action == "step-back"
    assert plan_wait(predicted=None, waited=0.0, patience=None, **base).until == 30.0
    assert plan_wait(predicted=31.0, waited=0.0, patience=2.0, **base).action == "shed"
    assert plan_wait(predicted=None, waited=0.0, patience=2.0, **base).until == 1.0


# -- the event-loop shell -----------------------------------------------------------------------


def _admission(**kw: object) -> Admission:
    args: dict[str, object] = {
        "max_inflight": 1,
        "max_memory_tokens": None,
        "queue_size": 5,
        "queue_timeout": 5.0,
    }
    args.update(kw)
    return Admission(**args)  # type: ignore[arg-type]


async def test_queue_timeout_sheds_an_uncommitted_waiter_and_frees_its_place() -> None:
    adm = _admission(queue_size=1, queue_timeout=0.01)
    first = adm.request("t", 1)
    await adm.wait(first)
    queued = adm.request("t", 1)
    with pytest.raises(Shed) as exc:
        adm.request("t", 1)  # the queue (size 1) is full: shed at once
    assert "full" in exc.value.reason
    with pytest.raises(Shed) as exc:
        await adm.wait(queued)
    assert exc.value.retry_after >= 1
    assert adm.queued == 0 and adm.inflight == 1
    adm.release(first)
    adm.release(first)  # no effect the second time
    assert adm.inflight == 0 and adm.memory == 0


async def test_a_committed_waiter_outlives_the_queue_timeout() -> None:
    adm = _admission(queue_timeout=0.01)
    first = adm.request("t", 1)
    queued = adm.request("t", 1)
    adm.commit(queued)
    waiting = asyncio.create_task(adm.wait(queued))
    await asyncio.sleep(0.05)  # well past the queue timeout
    assert not waiting.done()
    adm.release(first)
    await asyncio.wait_for(waiting, 5)
    assert adm.inflight == 1


async def test_a_cancelled_waiter_hands_its_place_on() -> None:
    adm = _admission()
    first = adm.request("t", 1)
    a, b = adm.request("t", 1), adm.request("t", 1)
    task_a = asyncio.create_task(adm.wait(a))
    task_b = asyncio.create_task(adm.wait(b))
    await asyncio.sleep(0)
    task_a.cancel()
    adm.release(first)  # a was cancelled in the same instant: b must get the place
    await asyncio.wait_for(task_b, 1)
    assert adm.inflight == 1 and adm.queued == 0
    with pytest.raises(asyncio.CancelledError):
        await task_a
    adm.release(b)
    assert adm.inflight == 0


async def test_request_that_can_never_fit_is_refused() -> None:
    adm = _admission(max_memory_tokens=10)
    with pytest.raises(ValueError, match="max_tokens"):
        adm.request("t", 11)
    assert math.isclose(adm.memory, 0)


@given(
    predicted=st.one_of(st.none(), st.floats(0, 100)),
    waited=st.floats(0, 100),
    hold_left=st.floats(-1, 100),
    patience=st.one_of(st.none(), st.floats(0.1, 100)),
    committed=st.booleans(),
)
def test_a_client_on_its_last_attempt_is_never_told_to_come_back(
    predicted: float | None,
    waited: float,
    hold_left: float,
    patience: float | None,
    committed: bool,
) -> None:
    # Told to come back on its last attempt, a Stainless client gives up: commit it instead.
    kw = dict(
        predicted=predicted,
        waited=waited,
        hold_left=hold_left,
        patience=patience,
        early=False,
        commit_after=1.0,
        committed=committed,
    )
    last = plan_wait(**kw, last_attempt=True)  # type: ignore[arg-type]
    assert last.action != "step-back"
    if plan_wait(**kw).action == "step-back":  # type: ignore[arg-type]
        assert last.action == "commit"
