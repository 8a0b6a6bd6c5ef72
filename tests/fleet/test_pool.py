"""The engine pool's decisions (routing, load, breaker, fallback, failover), with no I/O: the
clock is an argument, so hypothesis drives them through arbitrary histories."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.engines.failover import Failover, failover_step
from streamsafe.gateway.engines.pool import (
    Counts,
    EngineSpec,
    Full,
    Pick,
    Pool,
    Unavailable,
    parse_engine,
    parse_fallback,
)
from streamsafe.gateway.upstream.breaker import BreakerState, EngineBreaker


def _pool(specs: Sequence[EngineSpec], fallbacks: Mapping[str, str] | None = None) -> Pool:
    """A pool of ``specs``, each engine with plain load counts and a breaker of its own."""
    return Pool(
        specs, [Counts() for _ in specs], [EngineBreaker() for _ in specs], fallbacks=fallbacks
    )


pytestmark = pytest.mark.unit

MODELS = ["llama-8b", "llama-70b", "qwen-7b"]
models_st = st.frozensets(st.sampled_from(MODELS), max_size=3)
weights_st = st.sampled_from([0.5, 1.0, 2.0, 3.0])
specs_st = st.lists(
    st.builds(
        EngineSpec,
        url=st.integers(8000, 8999).map(lambda p: f"http://127.0.0.1:{p}"),
        models=models_st,
        weight=weights_st,
        memory=st.one_of(st.none(), st.integers(1, 500)),
    ),
    min_size=1,
    max_size=5,
)


# -- configuration ------------------------------------------------------------------------------


@given(specs_st)
def test_engine_spec_reads_back_what_it_writes(specs: list[EngineSpec]) -> None:
    for spec in specs:
        assert parse_engine(str(spec)) == spec


def test_engine_spec_examples() -> None:
    spec = parse_engine("http://a:8000/ models=llama-8b,qwen-7b weight=2 memory=300")
    assert spec == EngineSpec("http://a:8000", frozenset({"llama-8b", "qwen-7b"}), 2.0, 300)
    assert spec.serves("qwen-7b") and not spec.serves("llama-70b")
    assert parse_engine("http://b:8000").serves("anything")


@pytest.mark.parametrize(
    "text",
    [
        "a:8000",
        "http://a weight=0",
        "http://a weight=x",
        "http://a color=red",
        "http://a models",
        "http://a memory=0",
        "http://a memory=lots",
    ],
)
def test_bad_engine_spec_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_engine(text)


def test_fallback_option() -> None:
    assert parse_fallback("llama-8b=llama-70b") == ("llama-8b", "llama-70b")
    for bad in ("llama-8b", "=x", "x=", "x=x"):
        with pytest.raises(ValueError):
            parse_fallback(bad)


# -- routing and load ---------------------------------------------------------------------------


@given(specs_st, st.sampled_from(MODELS), st.sets(st.integers(0, 4)), st.floats(0, 100))
def test_pick_routes_only_to_engines_of_the_model(
    specs: list[EngineSpec], model: str, exclude: set[int], now: float
) -> None:
    pool = _pool(specs)
    result = pool.pick(model, now, exclude)
    usable = [e for e in pool.serving(model) if e.index not in exclude]
    if usable:
        assert isinstance(result, Pick)
        assert result.engine in usable and result.model == model and not result.fallback
    else:
        assert isinstance(result, Unavailable)
        assert result.known == bool(pool.serving(model))


@given(
    specs_st,
    st.sampled_from(MODELS),
    st.lists(st.integers(0, 400), max_size=5),
    st.integers(1, 300),
)
def test_pick_never_overfills_an_engine(
    specs: list[EngineSpec], model: str, held: list[int], cost: int
) -> None:
    pool = _pool(specs)
    for engine, memory in zip(pool.engines, held, strict=False):
        engine.load.memory = memory
    result = pool.pick(model, 0.0, cost=cost)
    serving = pool.serving(model)
    if isinstance(result, Pick):
        cap = result.engine.spec.memory
        assert cap is None or result.engine.load.memory + cost <= cap
    elif isinstance(result, Full):
        assert serving and not any(e.has_room(cost) for e in serving)
    else:
        assert not serving


@settings(max_examples=60)
@given(st.lists(weights_st, min_size=2, max_size=4), st.integers(1, 50))
def test_load_follows_the_weights(weights: list[float], cost: int) -> None:
    specs = [EngineSpec(f"http://e{i}:8000", weight=w) for i, w in enumerate(weights)]
    pool = _pool(specs)
    for _ in range(200):
        pick = pool.pick("m", 0.0)
        assert isinstance(pick, Pick)
        pick.engine.load.memory += cost
    # Every engine holds its weighted share to within one request.
    shares = [e.load.memory / e.spec.weight for e in pool.engines]
    assert max(shares) - min(shares) <= cost / min(weights) + 1e-9


def test_least_memory_wins_then_shortest_queue_then_turns() -> None:
    pool = _pool([EngineSpec(f"http://e{i}:8000") for i in range(3)])
    a, b, c = pool.engines
    a.load.memory, b.load.memory, c.load.memory = 100, 10, 10
    b.load.queued = 2
    assert pool.pick("m", 0.0) == Pick(c, "m", "m")
    b.load.queued = 0
    first, second = pool.pick("m", 0.0), pool.pick("m", 0.0)
    assert {first.engine.index, second.engine.index} == {1, 2}


def test_fallback_model_answers_when_every_engine_of_the_model_is_down() -> None:
    pool = _pool(
        [
            EngineSpec("http://small:8000", frozenset({"llama-8b"})),
            EngineSpec("http://big:8000", frozenset({"llama-70b"})),
        ],
        fallbacks={"llama-8b": "llama-70b", "llama-70b": "llama-8b"},  # a cycle is harmless
    )
    small = pool.engines[0]
    small.breaker.on_failure(0.0, dead=True)
    pick = pool.pick("llama-8b", 0.5)
    assert isinstance(pick, Pick) and pick.model == "llama-70b" and pick.fallback
    pool.engines[1].breaker.on_failure(0.0, dead=True)
    gone = pool.pick("llama-8b", 0.5)
    assert gone == Unavailable(0.5)
    # Held down until its health answers, whatever the time.
    assert isinstance(pool.pick("llama-8b", 100.0), Unavailable)
    small.breaker.let_go(close=False)  # /health answers again: a probe goes to the primary
    back = pool.pick("llama-8b", 100.0)
    assert isinstance(back, Pick) and back.model == "llama-8b"


def test_engines_only_cooling_down_still_take_traffic_where_no_other_can() -> None:
    # "Panic", as Envoy calls it: failures opened every breaker of the model, but nobody knows
    # the engines are gone, so turning every caller away would help no one.
    pool = _pool([EngineSpec("http://a:8000"), EngineSpec("http://b:8000")])
    for engine in pool.engines:
        for _ in range(3):
            engine.breaker.on_failure(0.0)
    assert all(not e.breaker.takes_traffic(0.5) for e in pool.engines)
    pick = pool.pick("m", 0.5)
    assert isinstance(pick, Pick)
    pool.engines[pick.engine.index].breaker.hold(0.5, 1.0)
    other = pool.pick("m", 0.6)
    assert isinstance(other, Pick) and other.engine is not pick.engine
    pool.engines[other.engine.index].breaker.hold(0.6, 1.0)
    assert isinstance(pool.pick("m", 0.7), Unavailable)


def test_unknown_model_is_not_known() -> None:
    pool = _pool([EngineSpec("http://a:8000", frozenset({"llama-8b"}))])
    result = pool.pick("gpt-9", 0.0)
    assert isinstance(result, Unavailable) and not result.known


# -- the breaker --------------------------------------------------------------------------------

events_st = st.lists(
    st.tuples(
        st.sampled_from(["attempt", "success", "failure", "dead", "abandon", "hold", "let_go"]),
        st.floats(0, 5),
    ),
    max_size=40,
)


@given(events_st)
def test_breaker_invariants(events: list[tuple[str, float]]) -> None:
    breaker = EngineBreaker(failure_threshold=3, cooldown=1.0, max_cooldown=8.0)
    now = 0.0
    for kind, step in events:
        now += step
        if kind == "attempt":
            if breaker.allows(now):
                breaker.on_attempt(now)
        elif kind == "success":
            breaker.on_success()
            assert breaker.state is BreakerState.CLOSED and breaker.failures == 0
        elif kind == "abandon":
            breaker.on_abandon()
        elif kind == "hold":
            breaker.hold(now, 1.0)
            assert breaker.held and breaker.state is BreakerState.OPEN
        elif kind == "let_go":
            breaker.let_go(close=step > 2.5)
            assert not breaker.held
        else:
            was = breaker.state
            breaker.on_failure(now, dead=kind == "dead")
            if was is not BreakerState.CLOSED or kind == "dead":
                assert breaker.state is BreakerState.OPEN or was is BreakerState.OPEN
        if breaker.state is BreakerState.OPEN:
            # As the breaker computes it (now + cooldown): open_until - now may round a hair
            # over 8.0 (8.000000000000004), the bound itself does not.
            assert breaker.open_until <= now + 8.0
            if now < breaker.open_until:
                assert not breaker.allows(now)
                assert breaker.retry_after(now) > 0
        if breaker.state is BreakerState.HALF_OPEN and breaker.probing:
            assert not breaker.allows(now)  # one probe at a time
        if breaker.held:  # held down by the health probe: nothing goes there, whatever the time
            assert breaker.state is BreakerState.OPEN
            assert not breaker.allows(now + 1000) and not breaker.takes_traffic(now + 1000)
        # A question is not an attempt: takes_traffic agrees with allows and moves nothing.
        before = (breaker.state, breaker.probing)
        answer = breaker.takes_traffic(now)
        assert (breaker.state, breaker.probing) == before
        assert answer == breaker.allows(now)


# -- where a generation can go (docs/design.md, Failover) -------------------------------------


@given(
    st.lists(st.sampled_from(["up", "held", "cooling"]), min_size=1, max_size=5),
    st.sets(st.integers(0, 4)),
)
def test_a_generation_is_stranded_only_where_every_engine_is_held_down_or_shunned(
    states: list[str], shunned: set[int]
) -> None:
    pool = _pool([EngineSpec(f"http://e{i}:8000") for i in range(len(states))])
    for engine, state in zip(pool.engines, states, strict=True):
        if state == "held":
            engine.breaker.hold(0.0, 1.0)
        elif state == "cooling":
            for _ in range(3):
                engine.breaker.on_failure(0.0)
    why = pool.stranded(["m"], shunned)
    gone = [s == "held" or i in shunned for i, s in enumerate(states)]
    assert (why is not None) == all(gone)
    if why is not None:
        assert all(e.spec.url in why for e in pool.engines)
    # Where it is not stranded, a pick (without the shunned) finds an engine: a cooling breaker
    # is waited for or, where nothing else is, taken anyway; a held one never.
    pick = pool.pick("m", 0.5, exclude=shunned)
    assert isinstance(pick, Pick) == (why is None)
    if isinstance(pick, Pick):
        assert not pick.engine.breaker.held and pick.engine.index not in shunned


@given(st.floats(0, 100), st.one_of(st.none(), st.floats(0.5, 1e6)))
def test_an_engine_that_sheds_is_passed_over_while_it_said_and_never_longer_than_ten_s(
    now: float, retry_after: float | None
) -> None:
    pool = _pool([EngineSpec("http://full:8000"), EngineSpec("http://other:8000")])
    full, other = pool.engines
    full.said_full(now, retry_after)
    assert now < full.full_until <= now + 10.0
    assert full.breaker.state is BreakerState.CLOSED  # full is not failing
    for _ in range(3):
        pick = pool.pick("m", now)
        assert isinstance(pick, Pick) and pick.engine is other
    later = pool.pick("m", full.full_until)
    assert isinstance(later, Pick)  # both take turns again


def test_half_open_probe_closes_on_success_and_reopens_longer_on_failure() -> None:
    breaker = EngineBreaker(failure_threshold=2, cooldown=1.0, max_cooldown=30.0)
    breaker.on_failure(0.0)
    assert breaker.state is BreakerState.CLOSED
    breaker.on_failure(0.0)
    assert breaker.state is BreakerState.OPEN and not breaker.allows(0.9)
    assert breaker.allows(1.0)
    breaker.on_attempt(1.0)
    assert breaker.state is BreakerState.HALF_OPEN and not breaker.allows(1.0)
    breaker.on_failure(1.1)
    assert breaker.state is BreakerState.OPEN and breaker.open_until == pytest.approx(3.1)
    breaker.on_attempt(3.1)
    breaker.on_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allows(3.1)
    assert breaker.trips == 2


# -- failover -----------------------------------------------------------------------------------

statuses_st = st.one_of(
    st.none(),
    st.sampled_from([400, 401, 403, 404, 408, 413, 422, 429]),
    st.sampled_from([500, 501, 502, 503, 504]),
)


@given(
    status=statuses_st,
    context=st.booleans(),
    retry_after=st.one_of(st.none(), st.floats(0, 100)),
    same=st.integers(0, 2),
    attempts=st.integers(1, 5),
    max_attempts=st.integers(1, 5),
    deadline_in=st.one_of(st.none(), st.floats(-1, 100)),
    budget=st.booleans(),
    larger=st.booleans(),
    answered=st.booleans(),
)
def test_failover_rules(
    status: int | None,
    context: bool,
    retry_after: float | None,
    same: int,
    attempts: int,
    max_attempts: int,
    deadline_in: float | None,
    budget: bool,
    larger: bool,
    answered: bool,
) -> None:
    body = b'{"error": {"message": "maximum context length is 4096"}}' if context else b"{}"
    now = 10.0
    step = failover_step(
        status,
        body,
        retry_after=retry_after,
        same_engine_tries=same,
        attempts=attempts,
        max_attempts=max_attempts,
        now=now,
        deadline=None if deadline_in is None else now + deadline_in,
        budget_allows=budget,
        larger_model=larger,
        sheds_answered=answered,
    )
    if step.action is not Failover.PASS_THROUGH:
        assert attempts < max_attempts  # never past the attempt bound
    if step.action in (Failover.SAME_ENGINE, Failover.OTHER_ENGINE):
        assert budget and status in (None, 429, 500, 502, 503, 504)
        assert deadline_in is None or deadline_in > 0
    if step.action is Failover.SAME_ENGINE:
        assert same == 0 and status in (429, 500, 503)
        # A shed is asked of the same engine only where it said when, and its refusals are not
        # its caller's answer (a full engine that says nothing is passed over).
        if status in (429, 503):
            assert retry_after is not None and not answered
        # The time left as the rule sees it: (now + deadline_in) - now, not deadline_in itself,
        # which floating point can make a hair smaller (0.05 against 0.0500000000000007).
        left = None if deadline_in is None else (now + deadline_in) - now
        assert step.delay <= 2.0 and (left is None or step.delay < left)
    if step.action is Failover.LARGER_MODEL:
        assert status == 400 and context and larger
    if status is not None and 400 <= status < 500 and status != 429:
        assert step.action in (Failover.PASS_THROUGH, Failover.LARGER_MODEL)
    if status == 501:
        assert step.action is Failover.PASS_THROUGH


def test_failover_examples() -> None:
    common = {
        "same_engine_tries": 0,
        "attempts": 1,
        "max_attempts": 3,
        "now": 0.0,
        "deadline": None,
        "budget_allows": True,
        "larger_model": False,
    }
    assert failover_step(429, b"", retry_after=1.0, **common).action is Failover.SAME_ENGINE
    assert failover_step(429, b"", retry_after=30.0, **common).action is Failover.OTHER_ENGINE
    assert failover_step(None, b"", retry_after=None, **common).action is Failover.OTHER_ENGINE
    assert failover_step(502, b"", retry_after=None, **common).action is Failover.OTHER_ENGINE
    assert failover_step(400, b"", retry_after=None, **common).action is Failover.PASS_THROUGH
