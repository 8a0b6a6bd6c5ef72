"""The faults of a public crash-test suite for LLM gateways, rebuilt as our own (issue 22): a
silent engine, a frozen one, a stall past the idle timeout, a context-length fallback, a
continuation whose only other engine refuses a prefill, a flapping engine, and what an operator
sees when an engine is killed.

Every scenario runs real processes (``streamsafe simulate``, and ``streamsafe serve`` with its
default flags: only the upstreams and what the topology needs) and an openai client that never
retries. The scenarios are slow by nature (a 45 s stall is 45 s), so one module fixture runs
them all at once and records how each ended; each test checks one scenario's record. The module
costs about its longest scenario, not the sum; a test selected alone (``-k``) runs its own
scenario only.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from crash_helpers import (
    Call,
    Lab,
    Rig,
    chat,
    client,
    engine_samples,
    eventually,
    get,
    post,
    ready_status,
    stats,
    stream_chat,
)
from gateway_helpers import MODEL

from streamsafe.engine_sim import expected_text

# The fixture runs the scenarios (about a minute) inside the first test; the rest read records.
pytestmark = pytest.mark.timeout(300)

#: The longest any call is waited for: past the 60 s the suite allows a silent engine.
LIMIT = 65.0
#: What the suite allows a silent or frozen engine to hold a caller.
SILENT_BOUND = 60.0
#: What the suite allows a stalled stream to take.
STALL_BOUND = 45.0
#: What a continuation that cannot go anywhere may take to end in an error.
PROMPT_BOUND = 30.0
#: The most engine requests one call may cost on a flapping engine, on its own (what the suite
#: allows any refused call: 6, the refusal gate's bound per call; a call refused through a
#: 3 s down period, let go as it ends and refused again by the next one, takes them all), or in
#: a pool (the failover attempts).
MOST_REQUESTS_PER_CALL = {"single": 6, "pool": 3}
#: A stall of 45 s on the first request only (``@fresh``: a continuation is not stalled).
STALL_45 = "pause:3:45:1@fresh#1"
#: A stall of 30 s on every request, continuations included.
STALL_30 = "pause:3:30:1"
#: The engine dies after 6 events of the first fresh request: its stream is cut mid-way and
#: it answers nothing but 500 (and /health 503) after.
CRASH = "crash:6:1@fresh#1"
#: Up 2 s, down 3 s, from the simulator's start.
FLAP = "2:3"
#: How long the flapping scenarios call: two down periods.
FLAP_WINDOW = 11.0

Record = dict[str, Any]
Scenario = Callable[[Rig], Awaitable[Record]]


def _whole(call: Call, body: dict[str, Any]) -> bool:
    expected = expected_text(body, body["max_tokens"])
    return call.done and call.error is None and call.text == expected


async def _is(value: Awaitable[Any], expected: Any) -> bool:
    return bool(await value == expected)


def _pool(*pairs: tuple[str, str]) -> list[str]:
    """``--upstream`` values naming each engine's models: ``(url, models)``."""
    return [f"{url} models={models}" for url, models in pairs]


# -- silent engine -------------------------------------------------------------------------


async def silent_single(rig: Rig) -> Record:
    """One engine that accepts connections and answers nothing, /health included."""
    engine = await rig.engine("--black-hole")
    gateway = await rig.gateway(engine.url)
    readiness: list[int | None] = []
    health = asyncio.create_task(get(engine.url + "/health"))  # the engine is silent indeed
    task = asyncio.create_task(stream_chat(client(gateway), chat(MODEL, "silent single", 8), LIMIT))
    while not task.done():  # /ready while the call waits on the silent engine
        readiness.append(await ready_status(gateway))
        await asyncio.wait([task], timeout=1.0)
    return {"call": task.result(), "ready": readiness, "engine_health": await health}


async def silent_pool(rig: Rig) -> Record:
    """A silent engine and a steady one: four calls at once, some routed to the silent one."""
    silent = await rig.engine("--black-hole")
    steady = await rig.engine()
    gateway = await rig.gateway(silent.url, steady.url)
    api = client(gateway)
    bodies = [chat(MODEL, f"silent pool {i}", 8) for i in range(4)]
    calls = await asyncio.gather(*(stream_chat(api, body, LIMIT) for body in bodies))
    return {"calls": list(zip(calls, bodies, strict=True)), "steady": await stats(steady)}


# -- frozen engine -------------------------------------------------------------------------


async def frozen_single(rig: Rig) -> Record:
    """Three streams flowing from one engine when it is frozen (SIGSTOP); then it is thawed
    (SIGCONT) and called again."""
    engine = await rig.engine("--itl-ms", "40")
    gateway = await rig.gateway(engine.url)
    api = client(gateway)
    flowing = [asyncio.Event() for _ in range(3)]

    def flows(event: asyncio.Event) -> Callable[[int], None]:
        return lambda n: event.set() if n >= 3 else None

    tasks = [
        asyncio.create_task(stream_chat(api, chat(MODEL, f"frozen {i}", 200), LIMIT, flows(e)))
        for i, e in enumerate(flowing)
    ]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in flowing)), 30)
    engine.freeze()
    frozen_at = time.monotonic()
    record: Record = {"ready_frozen": await eventually(lambda: _is(ready_status(gateway), 503), 30)}
    calls = await asyncio.gather(*tasks)
    record["calls"] = calls
    record["after_freeze"] = [c.ended_at - frozen_at for c in calls]
    engine.thaw()
    record["ready_thawed"] = await eventually(lambda: _is(ready_status(gateway), 200), 30)
    body = chat(MODEL, "after the thaw", 8)
    record["after"] = (await stream_chat(api, body, LIMIT), body)
    return record


# -- stalls --------------------------------------------------------------------------------


async def stall_45_single(rig: Rig) -> Record:
    """One engine whose first answer goes silent for 45 s after 3 events; it stays alive."""
    engine = await rig.engine("--fault", STALL_45)
    gateway = await rig.gateway(engine.url)
    body = chat(MODEL, "stall 45 single", 12)
    call = await stream_chat(client(gateway), body, LIMIT)
    return {"call": call, "body": body, "engine": await stats(engine)}


async def stall_45_pool(rig: Rig) -> Record:
    """Both engines stall their first fresh request: whichever gets the call stalls."""
    engines = [await rig.engine("--fault", STALL_45) for _ in range(2)]
    gateway = await rig.gateway(*(e.url for e in engines))
    body = chat(MODEL, "stall 45 pool", 12)
    call = await stream_chat(client(gateway), body, LIMIT)
    return {"call": call, "body": body, "engines": [await stats(e) for e in engines]}


async def stall_30_single(rig: Rig) -> Record:
    """One engine whose every answer goes silent for 30 s after 3 events."""
    engine = await rig.engine("--fault", STALL_30)
    gateway = await rig.gateway(engine.url)
    body = chat(MODEL, "stall 30 single", 12)
    call = await stream_chat(client(gateway), body, LIMIT)
    return {"call": call, "body": body, "engine": await stats(engine)}


# -- context length ------------------------------------------------------------------------


async def context_fallback(rig: Rig) -> Record:
    """Model ``small`` (64 tokens of context) falls back to ``large``."""
    small = await rig.engine("--model", "small", "--max-model-len", "64")
    large = await rig.engine("--model", "large")
    upstreams = _pool((small.url, "small"), (large.url, "large"))
    gateway = await rig.gateway(*upstreams, extra=("--fallback-model", "small=large"))
    body = chat("small", "a long question " * 20, 8)  # about 86 prompt tokens
    direct = await post(small.url + "/v1/chat/completions", {**body, "stream": False})
    call = await stream_chat(client(gateway), body, LIMIT)
    return {
        "call": call,
        "body": body,
        "direct": direct,
        "small": await stats(small),
        "large": await stats(large),
    }


# -- a continuation and a fallback that refuses a prefill ----------------------------------


def _continuation(model: str) -> dict[str, Any]:
    """A chat continuation (vLLM's ``continue_final_message``), as the gateway sends one."""
    return {
        "model": model,
        "messages": [
            {"role": "user", "content": "go on"},
            {"role": "assistant", "content": "partial"},
        ],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 4,
    }


async def prefill_refused(rig: Rig) -> Record:
    """Model ``m`` on one engine, which crashes mid-stream; its fallback ``m2`` refuses to
    continue a partial answer."""
    first = await rig.engine("--model", "m", "--fault", CRASH)
    fallback = await rig.engine("--model", "m2", "--refuse-prefill")
    upstreams = _pool((first.url, "m"), (fallback.url, "m2"))
    gateway = await rig.gateway(*upstreams, extra=("--fallback-model", "m=m2"))
    direct = await post(fallback.url + "/v1/chat/completions", _continuation("m2"))
    before = await stats(fallback)
    body = chat("m", "prefill refused", 24)
    call = await stream_chat(client(gateway), body, LIMIT)
    return {
        "call": call,
        "body": body,
        "direct": direct,
        "first": await stats(first),
        "fallback_before": before,
        "fallback": await stats(fallback),
    }


async def prefill_sibling(rig: Rig) -> Record:
    """The same, with a second engine of ``m``: both crash on their first fresh request, so
    whichever gets the call crashes and the other can continue it."""
    siblings = [await rig.engine("--model", "m", "--fault", CRASH) for _ in range(2)]
    fallback = await rig.engine("--model", "m2", "--refuse-prefill")
    upstreams = _pool(*((e.url, "m") for e in siblings), (fallback.url, "m2"))
    gateway = await rig.gateway(*upstreams, extra=("--fallback-model", "m=m2"))
    body = chat("m", "prefill sibling", 24)
    call = await stream_chat(client(gateway), body, LIMIT)
    return {
        "call": call,
        "body": body,
        "siblings": [await stats(e) for e in siblings],
        "fallback": await stats(fallback),
    }


# -- flapping engine -----------------------------------------------------------------------


async def _calls_for(
    gateway_api: Any, engines: list[Any], name: str
) -> list[tuple[Call, dict[str, Any], int]]:
    """Calls one after another for :data:`FLAP_WINDOW` seconds: (call, body, the engine
    requests it cost)."""
    out: list[tuple[Call, dict[str, Any], int]] = []
    end = time.monotonic() + FLAP_WINDOW
    while time.monotonic() < end:
        before = await _requests(engines)
        body = chat(MODEL, f"{name} {len(out)}", 8)
        call = await stream_chat(gateway_api, body, LIMIT)
        out.append((call, body, await _requests(engines) - before))
        await asyncio.sleep(0.25)  # a caller's pace, not a synchronisation
    return out


async def _requests(engines: list[Any]) -> int:
    """Completion requests the ``engines`` received in all."""
    return sum([(await stats(e))["requests_received"] for e in engines])


async def flap_single(rig: Rig) -> Record:
    """One engine, up 2 s then answering 503 (Retry-After: 1) for 3 s, over and over."""
    engine = await rig.engine("--flap", f"{FLAP}:503")
    gateway = await rig.gateway(engine.url)
    calls = await _calls_for(client(gateway), [engine], "flap single")
    return {"calls": calls, "engine": await stats(engine)}


async def flap_pool(rig: Rig) -> Record:
    """An engine that resets every connection for 3 s of every 5, and a steady one."""
    flapping = await rig.engine("--flap", f"{FLAP}:reset")
    steady = await rig.engine()
    gateway = await rig.gateway(flapping.url, steady.url)
    calls = await _calls_for(client(gateway), [flapping, steady], "flap pool")
    return {"calls": calls, "flapping": await stats(flapping)}


# -- an engine that refuses everything ------------------------------------------------------

#: vLLM's own 503 past ``--max-num-queued-reqs``: no ``Retry-After``, every request.
REFUSE_ALL = "status:503:1:none"
#: What the suite allows one call that is never admitted: engine requests, and within 3 s.
MOST_ASKS, WINDOW_ASKS, WINDOW = 6, 4, 3.0


async def refusing_single(rig: Rig) -> Record:
    """One engine that refuses every request (503, no Retry-After); one call, its engine
    requests timed by polling the engine's /stats while it waits."""
    engine = await rig.engine("--fault", REFUSE_ALL)
    gateway = await rig.gateway(engine.url)
    task = asyncio.create_task(stream_chat(client(gateway), chat(MODEL, "refused", 8), LIMIT))
    times: list[float] = []
    seen = 0
    while not task.done():
        now = time.monotonic()
        received = (await stats(engine))["requests_received"]
        times += [now] * (received - seen)
        seen = received
        await asyncio.wait([task], timeout=0.05)
    received = (await stats(engine))["requests_received"]
    times += [time.monotonic()] * (received - seen)
    return {"call": task.result(), "times": times}


# -- what an operator sees -----------------------------------------------------------------


def _open_in(samples: dict[str, float]) -> bool:
    """The per-engine breaker series say open (``breaker_open`` 1, or ``breaker_state`` 2)."""
    for name, value in samples.items():
        if name.endswith("breaker_open") and value == 1:
            return True
        if name.endswith("breaker_state") and value == 2:
            return True
    return False


async def operators(rig: Rig) -> Record:
    """Two engines; the one serving a stream is killed (SIGKILL) mid-way; four more calls
    follow."""
    engines = [await rig.engine("--itl-ms", "30") for _ in range(2)]
    gateway = await rig.gateway(*(e.url for e in engines))
    flowing = asyncio.Event()
    body = chat(MODEL, "operators", 60)
    task = asyncio.create_task(
        stream_chat(client(gateway), body, LIMIT, lambda n: flowing.set() if n >= 5 else None)
    )
    await asyncio.wait_for(flowing.wait(), 30)
    first_active = (await stats(engines[0]))["active"]
    victim, survivor = engines if first_active else engines[::-1]
    await asyncio.to_thread(victim.kill)
    call = await task
    # Traffic goes on: whatever finds the engine dead (its probe, its failures) has seen it.
    api = client(gateway)
    bodies = [chat(MODEL, f"operators after {i}", 8) for i in range(4)]
    after = [(await stream_chat(api, b, LIMIT), b) for b in bodies]

    async def victim_samples() -> dict[str, float] | None:
        response = await get(gateway.url + "/metrics")
        samples = engine_samples(response.text, victim.url) if response is not None else {}
        return samples if _open_in(samples) else None

    samples = await eventually(victim_samples, 15)
    response = await get(gateway.url + "/stats")
    engine_stats = response.json().get("engines", []) if response is not None else []
    return {
        "call": call,
        "body": body,
        "after": after,
        "victim": victim.url,
        "survivor": survivor.url,
        "samples": samples,
        "stats": {e.get("url"): e for e in engine_stats},
        "log": list(gateway.output),
    }


#: Every scenario, the longest first (their processes start first).
SCENARIOS: dict[str, Scenario] = {
    "silent_single": silent_single,
    "silent_pool": silent_pool,
    "stall_45_single": stall_45_single,
    "stall_45_pool": stall_45_pool,
    "stall_30_single": stall_30_single,
    "frozen_single": frozen_single,
    "flap_single": flap_single,
    "flap_pool": flap_pool,
    "refusing_single": refusing_single,
    "context_fallback": context_fallback,
    "prefill_refused": prefill_refused,
    "prefill_sibling": prefill_sibling,
    "operators": operators,
}


def scenario(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark a test as reading scenario ``name`` (so a test run alone runs only its own)."""
    assert name in SCENARIOS

    def mark(test: Callable[..., None]) -> Callable[..., None]:
        test.scenario = name  # type: ignore[attr-defined]
        return test

    return mark


async def _run(names: list[str]) -> dict[str, Record]:
    lab = Lab()

    async def one(name: str) -> Record:
        started = time.monotonic()
        try:
            async with lab.rig() as rig:
                found = await SCENARIOS[name](rig)
        except Exception:
            found = {"crashed": traceback.format_exc()}
        found["seconds"] = time.monotonic() - started
        return found

    return dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))


@pytest.fixture(scope="module")
def records(request: pytest.FixtureRequest) -> dict[str, Record]:
    """The record of every scenario a selected test of this module reads."""
    wanted = {
        getattr(item.function, "scenario", None)
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module
    }
    names = [name for name in SCENARIOS if name in wanted]
    started = time.monotonic()
    done = asyncio.run(_run(names))
    each = ", ".join(f"{name} {found['seconds']:.1f}" for name, found in done.items())
    print(f"\ncrash-test scenarios: {time.monotonic() - started:.1f} s ({each})")
    return done


@pytest.fixture
def record(request: pytest.FixtureRequest, records: dict[str, Record]) -> Record:
    """The record of the scenario this test reads."""
    name = request.function.scenario
    found = records[name]
    if "crashed" in found:
        pytest.fail(f"scenario {name} could not run:\n{found['crashed']}")
    return found


# -- the tests -----------------------------------------------------------------------------


@scenario("silent_single")
def test_a_silent_engine_gives_the_caller_a_clear_error_within_60_s(record: Record) -> None:
    assert record["engine_health"] is None  # its /health answered nothing in 5 s
    call: Call = record["call"]
    assert call.clear and not call.done, call
    assert call.seconds < SILENT_BOUND, call
    # Every reading, the first included: None is a /ready that did not answer within 5 s.
    assert record["ready"] and set(record["ready"]) == {503}, record["ready"]


@scenario("silent_pool")
def test_calls_routed_to_a_silent_engine_complete_on_the_other(record: Record) -> None:
    for call, body in record["calls"]:
        assert _whole(call, body), call
        assert call.seconds < SILENT_BOUND, call
    assert record["steady"]["generations_completed"] == len(record["calls"])


@scenario("frozen_single")
def test_a_frozen_engine_ends_open_streams_with_an_error_and_recovers(record: Record) -> None:
    for call, after in zip(record["calls"], record["after_freeze"], strict=True):
        assert call.clear and not call.done, call
        assert after < SILENT_BOUND, (after, call)
    assert record["ready_frozen"], "/ready never said 503 while the engine was frozen"
    assert record["ready_thawed"], "/ready never said 200 after the engine was thawed"
    call, body = record["after"]
    assert _whole(call, body), call


@scenario("stall_45_single")
def test_a_stall_past_the_idle_timeout_is_continued_on_the_same_live_engine(
    record: Record,
) -> None:
    call: Call = record["call"]
    assert _whole(call, record["body"]), call
    assert call.seconds < STALL_BOUND, call
    engine = record["engine"]
    assert engine["faults_injected"]["pause"] == 1
    assert engine["continuations"] == 1


@scenario("stall_45_pool")
def test_a_stall_past_the_idle_timeout_in_a_pool_is_continued_on_the_other_engine(
    record: Record,
) -> None:
    call: Call = record["call"]
    assert _whole(call, record["body"]), call
    assert call.seconds < STALL_BOUND, call
    stalled = [e for e in record["engines"] if e["faults_injected"]["pause"]]
    other = [e for e in record["engines"] if not e["faults_injected"]["pause"]]
    assert len(stalled) == 1 and len(other) == 1
    assert stalled[0]["continuations"] == 0
    assert other[0]["continuations"] == 1


@scenario("stall_30_single")
def test_a_stall_under_the_idle_timeout_is_waited_out(record: Record) -> None:
    call: Call = record["call"]
    assert _whole(call, record["body"]), call
    assert call.seconds < STALL_BOUND, call
    assert record["engine"]["continuations"] == 0  # not cut: 30 s is under the idle timeout


@scenario("context_fallback")
def test_a_prompt_too_long_for_its_model_is_answered_by_the_fallback_model(
    record: Record,
) -> None:
    status, answer = record["direct"]  # the engine refuses it as vLLM does
    assert status == 400 and "maximum context length" in answer["error"]["message"]
    call: Call = record["call"]
    assert _whole(call, record["body"]), call
    assert call.models == {"large"}  # the answer says which model wrote it
    assert record["large"]["requests_by_model"] == {"large": 1}
    assert record["small"]["refused_context_length"] == 2  # the direct ask and the gateway's


@scenario("prefill_refused")
def test_a_continuation_never_goes_to_a_fallback_that_refuses_a_prefill(record: Record) -> None:
    status, answer = record["direct"]  # the fallback does refuse a continuation
    assert status == 400 and answer["error"]["code"] == "invalid_prefill"
    assert record["first"]["faults_injected"]["crash"] == 1
    call: Call = record["call"]
    assert "invalid_prefill" not in (call.error or ""), call
    # A clear error, or (the issue allows it) the answer restarted whole on the fallback.
    assert (call.clear and not call.done) or _whole(call, record["body"]), call
    assert call.seconds < PROMPT_BOUND, call
    before, after = record["fallback_before"], record["fallback"]
    assert after["refused_prefill"] == before["refused_prefill"]
    assert after["continuations"] == before["continuations"] == 0


@scenario("prefill_sibling")
def test_a_continuation_goes_to_another_engine_of_the_same_model(record: Record) -> None:
    call: Call = record["call"]
    assert _whole(call, record["body"]), call
    crashed = [e for e in record["siblings"] if e["faults_injected"]["crash"]]
    other = [e for e in record["siblings"] if not e["faults_injected"]["crash"]]
    assert len(crashed) == 1 and len(other) == 1
    assert other[0]["continuations"] == 1
    assert record["fallback"]["requests_received"] == 0


@scenario("flap_single")
def test_a_flapping_engine_alone_answers_every_call_without_a_storm(record: Record) -> None:
    assert record["engine"]["faults_injected"]["flap"] > 0  # calls did meet its down periods
    for call, body, requests in record["calls"]:
        assert _whole(call, body), call
        assert requests <= MOST_REQUESTS_PER_CALL["single"], (requests, call)


@scenario("flap_pool")
def test_a_flapping_engine_in_a_pool_costs_no_call_its_answer(record: Record) -> None:
    assert record["flapping"]["faults_injected"]["flap"] > 0
    for call, body, requests in record["calls"]:
        assert _whole(call, body), call
        assert requests <= MOST_REQUESTS_PER_CALL["pool"], (requests, call)


@scenario("operators")
def test_an_operator_sees_which_engine_died_and_where_its_stream_went(record: Record) -> None:
    call: Call = record["call"]
    assert _whole(call, record["body"]), call
    for later, body in record["after"]:
        assert _whole(later, body), later
    victim, survivor = record["victim"], record["survivor"]
    assert record["samples"], f"/metrics never showed {victim}'s breaker open"
    assert record["stats"][victim]["breaker"] != "closed", record["stats"]
    moved = [line for line in record["log"] if victim in line and survivor in line]
    assert moved, "no log line names both engines of the moved stream"


@scenario("refusing_single")
def test_an_engine_that_refuses_everything_is_not_hammered(record: Record) -> None:
    call: Call = record["call"]
    assert call.clear and not call.done and call.status == 503, call
    assert call.retry_after is not None and int(call.retry_after) >= 1, call
    times: list[float] = record["times"]
    assert 1 <= len(times) <= MOST_ASKS, times
    # Polled every 0.05 s: a margin of a few polls on the window.
    within = WINDOW - 0.2
    most = max(sum(1 for u in times if t <= u < t + within) for t in times)
    assert most <= WINDOW_ASKS, times
