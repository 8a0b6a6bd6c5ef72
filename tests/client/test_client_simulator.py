"""The client against the engine simulator over loopback, sync and async alike."""

from __future__ import annotations

import pytest
from client_fakes import FakeClock, run, serve

from streamsafe.client import APITimeoutError, ServiceUnavailableError, StreamInterrupted, Timeouts
from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from waiting import wait_until

MODES = ["sync", "async"]
MODEL = "sim-llama-8b"
MESSAGES = [{"role": "user", "content": "tell me about retries"}]


def sim_run(mode, server, client_kw=None, **kw):
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("max_tokens", 12)
    return run(mode, {"base_url": server.url + "/v1", **(client_kw or {})}, model=MODEL, **kw)


def body(max_tokens: int = 12):
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens}


@pytest.mark.parametrize("mode", MODES)
def test_stream_and_plain_call_give_the_simulators_exact_text(mode):
    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0))
    with serve(sim) as server:
        [streamed] = sim_run(mode, server)
        [plain] = sim_run(mode, server, stream=False)
        [models] = run(mode, {"base_url": server.url + "/v1"}, kind="models")
    want = expected_text(body(), 12)
    assert streamed.error is None and streamed.text == want
    assert plain.error is None and plain.value.choices[0].message.content == want
    assert plain.value.to_dict()["model"] == MODEL
    assert [m.id for m in models.value] == [MODEL]
    assert sim.stats()["requests_received"] == 2


@pytest.mark.parametrize("mode", MODES)
def test_completions_endpoint_streams_and_returns_text(mode):
    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0))
    with serve(sim) as server:
        [streamed] = run(
            mode, {"base_url": server.url + "/v1"}, kind="completion", model=MODEL, max_tokens=6
        )
        [plain] = run(
            mode,
            {"base_url": server.url + "/v1"},
            kind="completion",
            stream=False,
            model=MODEL,
            max_tokens=6,
        )
    assert streamed.error is None and plain.error is None
    assert streamed.text and streamed.text == plain.value.choices[0].text


@pytest.mark.parametrize("mode", MODES)
def test_held_headers_past_first_byte_timeout_send_a_stream_once(mode):
    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0, headers_after_first_token=True))
    with serve(sim) as server:
        [res] = sim_run(
            mode,
            server,
            {"timeout": Timeouts(first_byte=0.2)},
            extra_headers={"x-sim-fault": "stall:30:1"},
        )
        assert isinstance(res.error, APITimeoutError) and res.error.phase == "first_byte"
        assert sim.stats()["requests_received"] == 1
        wait_until(lambda: sim.stats()["generations_started"] == 0, 10, "no generation left")


@pytest.mark.parametrize("mode", MODES)
def test_held_headers_past_first_byte_timeout_retry_a_plain_call(mode):
    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0, headers_after_first_token=True))
    with serve(sim) as server:
        [res] = sim_run(
            mode,
            server,
            {"timeout": Timeouts(first_byte=0.2)},
            stream=False,
            extra_headers={"x-sim-fault": "stall:30:1"},
        )
        assert isinstance(res.error, APITimeoutError) and res.error.attempts == 3
        assert sim.stats()["requests_received"] == 3


@pytest.mark.parametrize("mode", MODES)
def test_503_from_the_simulator_is_retried_after_its_retry_after(mode):
    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0))
    clock = FakeClock()
    with serve(sim) as server:
        [res] = sim_run(mode, server, clock=clock, extra_headers={"x-sim-fault": "status:503:1:2"})
    assert isinstance(res.error, ServiceUnavailableError)
    assert clock.sleeps == [2.0, 2.0]
    assert sim.stats()["requests_received"] == 3


@pytest.mark.parametrize("mode", MODES)
def test_a_cut_stream_from_a_non_resumable_engine_is_interrupted_with_its_partial_text(mode):
    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0))
    with serve(sim) as server:
        [res] = sim_run(mode, server, extra_headers={"x-sim-fault": "cut:4:1"})
    err = res.error
    assert isinstance(err, StreamInterrupted)
    assert err.text and expected_text(body(), 12).startswith(err.text)
    assert err.text != expected_text(body(), 12)
    assert sim.stats()["requests_received"] == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("code", [503, 429])
def test_a_stream_refused_by_its_first_event_is_retried_not_a_stream_error(mode, code):
    """vLLM's load shedding in its second form: 200, then a first event that is an error
    carrying 503 (or 429). Nothing started: the client retries it as it would that status."""
    from streamsafe.engine_sim import Fault

    sim = Simulator(
        SimConfig(model=MODEL, itl_ms=1.0, faults=(Fault.parse(f"errorevent:{code}:1#2"),))
    )
    clock = FakeClock()
    with serve(sim) as server:
        [res] = sim_run(mode, server, clock=clock)
    assert res.error is None and res.text == expected_text(body(), 12)
    assert len(clock.sleeps) == 2  # two retries, each after its backoff
    stats = sim.stats()
    assert stats["faults_injected"]["errorevent"] == 2
    assert stats["requests_received"] == 3 and stats["generations_started"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_refused_by_its_first_event_every_time_raises_the_status_error(mode):
    from streamsafe.client import StreamError

    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0))
    with serve(sim) as server:
        [res] = sim_run(mode, server, extra_headers={"x-sim-fault": "errorevent:503:1"})
    assert isinstance(res.error, ServiceUnavailableError)
    assert not isinstance(res.error, StreamError) and res.error.attempts == 3
    assert sim.stats()["requests_received"] == 3 and sim.stats()["generations_started"] == 0
