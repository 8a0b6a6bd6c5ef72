"""An engine that refuses a request before any token, by status or in-band (vLLM's load shedding
answers a stream either 503 or 200 with a first event that is an error carrying 503): the
refusal is treated as its status, never relayed as a failure where nothing started."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import orjson
import pytest
from gateway_helpers import MODEL, fast_sim, make_stack, sse_payloads, wait_for
from hypothesis import given
from hypothesis import strategies as st

from server_stops import stop_later
from streamsafe.engine_sim import Fault, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.admission.fair_queue import AdmissionCore
from streamsafe.gateway.engines.attempts import Attempts
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.failover import refusal_status
from streamsafe.gateway.engines.pool import EngineSpec
from streamsafe.gateway.errors import Failure
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.relay.endings import REFUSAL_WAIT, BrokenAttempt, GenerationFailer
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.retry import MAX_RETRY_AFTER, retry_after_seconds
from streamsafe.server import ServerThread

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

pytestmark = pytest.mark.timeout(60)

#: The gateway's own heartbeat setting (make_stack's is shorter, for speed).
_DEFAULT_HEARTBEAT = GatewayConfig(upstream="http://unused").heartbeat

#: vLLM 0.32's in-band refusal, as its serving layer writes it (json.dumps of its ErrorResponse).
VLLM_SHED = (
    b'{"error": {"message": "The engine is currently busy and cannot accept new requests. '
    b'Please try again later or on a different instance.", "type": "Service Unavailable", '
    b'"param": null, "code": 503}}'
)


# -- the decision ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "status", "refusal"),
    [
        (VLLM_SHED, 503, 503),
        (b'{"error": {"message": "slow down", "type": "x", "code": 429}}', 429, 429),
        (b'{"error": {"message": "m", "type": "rate_limit_exceeded"}}', 500, 429),
        (b'{"error": {"message": "m", "type": "overloaded_error"}}', 500, 503),
        (b'{"error": {"message": "m", "code": "rate_limit_exceeded"}}', 500, 429),
        (b'{"error": {"message": "boom", "type": "InternalServerError", "code": 500}}', 500, None),
        (b'{"error": {"message": "bad", "type": "BadRequestError", "code": 400}}', 400, None),
        (b'{"error": "not an object"}', 500, None),
    ],
)
def test_an_error_event_is_a_refusal_only_where_it_says_overloaded_or_rate_limited(
    payload: bytes, status: int, refusal: int | None
) -> None:
    assert refusal_status(payload, status) == refusal


def _generation(committed: bool) -> Generation:
    req = GenerationRequest(
        tenant="t",
        path="/v1/chat/completions",
        body=b"{}",
        fingerprint=b"f",
        cost=1,
        stream=True,
        route=CHAT,
    )
    gen = Generation("gen-1", req, MemoryEventLog(), None, 0.0)
    gen.admitted()
    gen.waiter, _ = AdmissionCore(1, None, 10).request("t", 1, None, 0.0)
    gen.waiter.committed = committed
    return gen


class _Owner:
    """An owner that notes each end and moves the generation there (as the registry's does)."""

    def __init__(self) -> None:
        self.finished: list[State] = []

    def end(self, gen: Generation, state: State, failure: Failure | None = None) -> None:
        self.finished.append(state)
        gen.end(state, failure)

    def refused(self, gen: Generation) -> None:
        pass


def _attempts(gen: Generation) -> Attempts:
    """``gen``'s attempts on one engine that is never reached (the endings only tell it)."""
    engines = Engines([EngineSpec("http://127.0.0.1:9")])
    return Attempts(engines, gen.request.body, gen.cost, gen, Counters())


@pytest.mark.parametrize("in_band", [False, True])
async def test_a_shed_is_asked_again_whoever_was_answered(in_band: bool) -> None:
    # An engine that sheds load is full, not failing: the generation waits for room (the relay
    # bounds the wait by the queue timeout), committed or not.
    owner = _Owner()
    endings = GenerationFailer(Counters(), owner, lambda: 1)
    for committed in (False, True):
        gen = _generation(committed=committed)
        attempts = _attempts(gen)
        out = await endings.refused(gen, 503, VLLM_SHED, None, False, attempts, in_band=in_band)
        assert isinstance(out, BrokenAttempt) and out.retry_after == REFUSAL_WAIT
        assert out.failure is not None and out.failure.status == 503
        assert gen.failure is None
    assert owner.finished == []


async def test_another_refusal_is_the_callers_status_until_it_committed() -> None:
    owner = _Owner()
    endings = GenerationFailer(Counters(), owner, lambda: 1)
    failing = b'{"error": {"message": "boom", "type": "InternalServerError", "code": 500}}'
    fresh = _generation(committed=False)
    assert await endings.refused(fresh, 500, failing, None, False, _attempts(fresh)) is None
    assert owner.finished == [State.FAILED]
    assert fresh.failure is not None and fresh.failure.status == 500
    committed = _generation(committed=True)
    out = await endings.refused(committed, 500, failing, None, False, _attempts(committed))
    assert isinstance(out, BrokenAttempt) and committed.failure is None


# -- through the gateway --------------------------------------------------------------------


def _openai_streams(url: str, n: int) -> list[tuple[str, str]]:
    """(text, expected text) of ``n`` concurrent unmodified openai streams (2 retries)."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=10.0, max_retries=2)

    def one(i: int) -> tuple[str, str]:
        messages = [{"role": "user", "content": f"refused {i}"}]
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=6,
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        body = {"model": MODEL, "messages": messages, "max_tokens": 6, "stream": True}
        return text, expected_text(body, 6)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.parametrize("form", ["status:503:1", "errorevent:503:1"])
def test_both_forms_of_vllms_503_are_asked_again_and_no_caller_sees_them(form: str) -> None:
    """4 openai streams through a gateway with its defaults, each refused once before any token
    (the engine's first 4 requests): the gateway asks again, every caller gets its whole answer
    at its first attempt; the engine saw 8 requests and ran 4 generations."""
    sim = fast_sim(faults=(Fault.parse(f"{form}#4"),))
    with make_stack(sim, heartbeat=_DEFAULT_HEARTBEAT) as s:
        results = _openai_streams(s.url, 4)
        assert all(text == expected for text, expected in results)
        stats = s.sim.stats()
        kind = form.split(":")[0]
        assert stats["faults_injected"][kind] == 4
        assert stats["requests_received"] == 8 and stats["generations_started"] == 4
        gw = s.gw.stats()
        assert gw["engine_sheds"] == 4 and gw["retries_seen"] == 0


def test_a_shed_past_the_queue_timeout_is_answered_with_its_status_and_retry_after() -> None:
    # Never an error event for a caller not yet answered: its status, and when to come back.
    sim = fast_sim(faults=(Fault.parse("errorevent:503:1"),))
    with make_stack(sim, heartbeat=_DEFAULT_HEARTBEAT, queue_timeout=0.5) as s:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
        r = httpx2.post(s.url + "/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 503, r.text
        # When the engine is asked again, and that the gateway already asked for its caller.
        assert int(r.headers["retry-after"]) >= REFUSAL_WAIT
        assert r.headers["x-should-retry"] == "false"
        assert r.json()["error"]["code"] == 503
        assert s.sim.stats()["generations_started"] == 0


def test_a_committed_caller_never_sees_a_refusal_the_gateway_asks_again() -> None:
    """A stream whose response committed while it waited in the gateway's queue (early commit,
    0.05 s after it arrived) is refused in-band once it reaches the engine: it can no longer be
    told a status, so the gateway asks again after the refusal's wait, and the caller reads a
    whole answer. (The refused request is shaped as a continuation only so that the fault,
    ``@continuation``, hits it and not the stream holding the gateway's one place.)"""
    sim = fast_sim(itl_ms=20.0, faults=(Fault.parse("errorevent:503:1@continuation#1"),))
    with make_stack(sim, heartbeat=0.05, max_inflight=1) as s:
        holder = {**_chat("holder"), "max_tokens": 60}
        refused = {
            **_chat("refused"),
            "messages": [
                {"role": "user", "content": "refused"},
                {"role": "assistant", "content": "the"},
            ],
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        with ThreadPoolExecutor(2) as pool, httpx2.Client(timeout=20) as http:
            first = pool.submit(http.post, s.url + "/v1/chat/completions", json=holder)
            wait_for(lambda: s.sim.stats()["generations_started"] == 1, what="the holder runs")
            second = http.post(s.url + "/v1/chat/completions", json=refused)
            assert first.result().status_code == 200
        assert second.status_code == 200
        events = [d for _, d in sse_payloads(second.text)]
        assert events[-1] == "[DONE]" and len(events) > 2
        assert all("error" not in orjson.loads(d) for d in events[:-1])
        stats = s.sim.stats()
        assert stats["faults_injected"]["errorevent"] == 1
        assert stats["requests_received"] == 3 and stats["generations_started"] == 2
        assert s.gw.registry.counters.engine_sheds == 1  # asked again, no continuation spent


def _chat(content: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 5,
        "stream": True,
    }


@contextlib.contextmanager
def _pool(*sims: Simulator) -> Iterator[str]:
    servers = [ServerThread(sim).start() for sim in sims]
    gw = ServerThread(
        Gateway(GatewayConfig(upstream=servers[0].url, engines=tuple(s.url for s in servers)))
    ).start()
    try:
        yield gw.url
    finally:
        stop_later(gw, *servers)


def test_a_pool_takes_an_in_band_refusal_to_another_engine() -> None:
    shedding = Simulator(fast_sim(faults=(Fault.parse("errorevent:503:1"),)))
    healthy = Simulator(fast_sim())
    with _pool(shedding, healthy) as url:
        bodies: list[dict[str, Any]] = [
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"pool {i}"}],
                "max_tokens": 5,
                "stream": True,
            }
            for i in range(4)
        ]
        with httpx2.Client(timeout=20) as http:
            for body in bodies:
                r = http.post(url + "/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                events = sse_payloads(r.text)
                assert all("error" not in orjson.loads(d) for _, d in events if d != "[DONE]")
                text = "".join(
                    (orjson.loads(d)["choices"][0]["delta"].get("content") or "")
                    for _, d in events
                    if d != "[DONE]" and orjson.loads(d).get("choices")
                )
                assert text == expected_text(body, 5)
    assert healthy.stats()["generations_started"] == 4
    shed = shedding.stats()
    assert shed["faults_injected"]["errorevent"] >= 1 and shed["generations_started"] == 0


# -- whatever Retry-After an engine sends ------------------------------------------------------

#: Every kind of value an engine may send: seconds whole and fractional, infinite, not a number,
#: negative, past 64 bits, dates past and far ahead, garbage.
ENGINE_RETRY_AFTERS = [
    b"2.5",
    b"0",
    b"inf",
    b"-inf",
    b"nan",
    b"-1",
    b"1e308",
    b"99999999999999999999999",
    b"Wed, 21 Oct 2015 07:28:00 GMT",
    b"Fri, 01 Jan 2100 00:00:00 GMT",
    b"soon",
]


def _refusing(status: int, retry_after: bytes) -> Any:
    """An engine that refuses every completion with ``status`` and ``retry_after``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        headers = [(b"content-type", b"application/json"), (b"retry-after", retry_after)]
        body = b'{"error": {"message": "full", "type": "x", "code": %d}}' % status
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


@pytest.mark.parametrize("retry_after", ENGINE_RETRY_AFTERS)
@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("engines", [1, 2])
def test_every_retry_after_an_engine_sends_gives_the_caller_a_json_refusal(
    retry_after: bytes, status: int, engines: int
) -> None:
    # `Retry-After: inf` was a 502 "gateway error: OverflowError" (an error event on a stream)
    # with a traceback; 1e308 went to the caller as a 309-digit Retry-After; dates were ignored.
    ups = [ServerThread(_refusing(status, retry_after)).start() for _ in range(engines)]
    pool = tuple(u.url for u in ups) if engines > 1 else ()
    config = GatewayConfig(
        upstream=ups[0].url, engines=pool, upstream_kind="vllm", queue_timeout=0.3
    )
    gw = ServerThread(Gateway(config)).start()
    try:
        for stream in (True, False):
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
            r = httpx2.post(gw.url + "/v1/chat/completions", json={**body, "stream": stream})
            # Every engine refused: the caller gets the last engine's own refusal.
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] == r.status_code
            seconds = int(r.headers["retry-after"])
            assert 1 <= seconds <= MAX_RETRY_AFTER
    finally:
        stop_later(gw, *ups)


def test_the_gateway_reads_an_engine_s_retry_after_with_the_retry_core_s_parser() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds("2.5", now) == 2.5
    assert retry_after_seconds("inf", now) == retry_after_seconds("1e308", now) == MAX_RETRY_AFTER
    assert retry_after_seconds("nan", now) is retry_after_seconds("-1", now) is None
    assert retry_after_seconds("x", now) is retry_after_seconds("", now) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now) == 0.0
    assert retry_after_seconds("Fri, 01 Jan 2100 00:00:00 GMT", now) == MAX_RETRY_AFTER


@given(st.text(max_size=40), st.floats(min_value=0, max_value=4e9))
def test_every_retry_after_value_has_a_defined_meaning(value: str, now: float) -> None:
    seconds = retry_after_seconds(value, now)
    assert seconds is None or 0.0 <= seconds <= MAX_RETRY_AFTER
