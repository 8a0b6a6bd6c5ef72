"""Injected faults happen as specified, deterministically for a seed."""

from __future__ import annotations

import time

import httpx2
import openai
import pytest
from openai import OpenAI

from streamsafe.engine_sim import Fault, expected_text
from streamsafe.sse import SSEDecoder


def _url(server) -> str:
    return server.url + "/v1/chat/completions"


def _client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def _read_until_cut(server, req, headers=None):
    """(events received, whether the connection was cut before the stream ended)."""
    decoder = SSEDecoder()
    events = []
    with httpx2.Client() as http, http.stream("POST", _url(server), json=req, headers=headers) as r:
        try:
            for chunk in r.iter_bytes():
                events += decoder.feed(chunk)
        except httpx2.RemoteProtocolError:
            return events, True
    return events, False


def test_fault_specs_parse_and_print_back():
    for spec in ("status:503:0.1", "status:429:1:0", "cut:20:0.05", "cut:3-9:0.5", "stall:0.5:1"):
        assert Fault.parse(str(Fault.parse(spec))) == Fault.parse(spec)
    assert Fault.parse("status:503:0.1").retry_after == 1.0
    assert Fault.parse("status:500:1").retry_after is None
    assert Fault.parse("cut:3-9:0.5").cut_low == 3
    for bad in ("status:503", "cut:x:1", "stall:1:2", "cut:9-3:1", "nope:1:1", "status:200:1"):
        with pytest.raises(ValueError, match="fault"):
            Fault.parse(bad)


def test_status_fault_answers_before_any_work_with_retry_after(serve, body):
    sim, server = serve(faults=(Fault.parse("status:503:1"),))
    with pytest.raises(openai.APIStatusError) as info:
        _client(server).chat.completions.create(**body(max_tokens=3))
    assert info.value.status_code == 503
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.response.json()["error"]["code"] == 503
    stats = sim.stats()
    assert stats["generations_started"] == 0 and stats["faults_injected"]["status"] == 1


def test_status_fault_retry_after_is_configurable(serve, body):
    _sim, server = serve(faults=(Fault.parse("status:429:1:0"),))
    resp = httpx2.post(_url(server), json=body())
    assert resp.status_code == 429 and resp.headers["retry-after"] == "0"
    assert resp.json()["error"]["type"] == "RateLimitError"


def test_cut_closes_the_connection_after_n_events_and_aborts(serve, body, wait_until):
    sim, server = serve(faults=(Fault.parse("cut:3:1"),))
    req = body(max_tokens=50, stream=True)
    events, cut = _read_until_cut(server, req)
    assert cut
    assert len(events) == 3 and not any(e.is_done for e in events)
    assert b'"role":"assistant"' in events[0].raw
    wait_until(lambda: sim.stats()["generations_aborted"] == 1, what="abort after cut")
    stats = sim.stats()
    assert stats["faults_injected"]["cut"] == 1 and stats["memory_used_tokens"] == 0


def test_openai_client_sees_a_cut_stream_as_a_transport_error(serve, body):
    _sim, server = serve(faults=(Fault.parse("cut:4:1"),))
    received = []
    with pytest.raises((httpx2.TransportError, openai.APIConnectionError)):
        for chunk in _client(server).chat.completions.create(**body(max_tokens=50), stream=True):
            received.append(chunk.choices[0].delta.content)
    assert "".join(received) == expected_text(body(), 3)


def test_random_cut_points_come_from_the_seed(serve, body):
    runs = []
    for _ in range(2):
        _sim, server = serve(seed=3, faults=(Fault.parse("cut:1-8:1"),))
        counts = []
        for i in range(5):
            events, cut = _read_until_cut(server, body(f"p{i}", max_tokens=20, stream=True))
            assert cut
            counts.append(len(events))
        runs.append(counts)
    assert runs[0] == runs[1]
    assert all(1 <= n <= 8 for n in runs[0])


def test_probabilistic_faults_repeat_for_a_seed(serve, body):
    outcomes = []
    for _ in range(2):
        _sim, server = serve(seed=11, faults=(Fault.parse("status:500:0.5"),))
        outcomes.append(
            [httpx2.post(_url(server), json=body(max_tokens=1)).status_code for _ in range(12)]
        )
    assert outcomes[0] == outcomes[1]
    assert set(outcomes[0]) == {200, 500}


def test_zero_probability_never_fires(serve, body):
    _sim, server = serve(faults=(Fault.parse("status:503:0"), Fault.parse("cut:0:0")))
    for _ in range(5):
        assert httpx2.post(_url(server), json=body(max_tokens=1)).status_code == 200


def test_stall_holds_the_request_but_not_the_headers(serve, body, wait_until):
    sim, server = serve(faults=(Fault.parse("stall:30:1"),))
    with (
        httpx2.Client() as http,
        http.stream("POST", _url(server), json=body(max_tokens=2, stream=True)) as r,
    ):
        # Headers are out while the request is still held before the engine.
        assert r.status_code == 200
        wait_until(lambda: sim.stats()["faults_injected"]["stall"] == 1, what="stall")
        assert sim.stats()["generations_started"] == 0
    # The client left during the stall: nothing reaches the engine, the server stops at once.


def test_stall_delays_the_first_token(serve, body):
    _sim, server = serve(faults=(Fault.parse("stall:0.2:1"),))
    req = body(max_tokens=2)
    start = time.monotonic()
    out = _client(server).chat.completions.create(**req)
    assert time.monotonic() - start >= 0.2  # a lower bound only: the stall is a minimum
    assert out.choices[0].message.content == expected_text(req, 2)


def test_headers_after_first_token_holds_the_response_start(serve, body):
    sim, server = serve(headers_after_first_token=True, faults=(Fault.parse("stall:0.1:1"),))
    with (
        httpx2.Client() as http,
        http.stream("POST", _url(server), json=body(max_tokens=2, stream=True)) as r,
    ):
        assert r.status_code == 200 and sim.stats()["tokens_generated"] >= 1
        b"".join(r.iter_bytes())


def test_fault_header_aims_a_fault_at_one_request(serve, body):
    _sim, server = serve()
    resp = httpx2.post(_url(server), json=body(), headers={"x-sim-fault": "status:502:1"})
    assert resp.status_code == 502
    assert httpx2.post(_url(server), json=body(max_tokens=1)).status_code == 200
    events, cut = _read_until_cut(
        server, body(max_tokens=9, stream=True), headers={"x-sim-fault": "cut:2:1"}
    )
    assert cut and len(events) == 2
    bad = httpx2.post(_url(server), json=body(), headers={"x-sim-fault": "bogus"})
    assert bad.status_code == 400


def test_new_fault_specs_parse_with_target_and_times_and_print_back():
    for spec in (
        "reset:0.5",
        "hang:3:1",
        "malformed:4:1",
        "nodone:1",
        "status:503:1:1@continuation#1",
        "cut:5:1@fresh",
        "reset:1#2",
    ):
        assert Fault.parse(str(Fault.parse(spec))) == Fault.parse(spec)
    fault = Fault.parse("status:503:1@continuation#1")
    assert (fault.target, fault.times) == ("continuation", 1)
    assert fault.hits(continuation=True) and not fault.hits(continuation=False)
    for bad in ("reset:1@later", "hang:1", "nodone:1#0", "malformed:-1:1"):
        with pytest.raises(ValueError, match="fault"):
            Fault.parse(bad)


def _stream_raw(server, req, headers=None):
    """(SSE data of every event, error raised while reading or None)."""
    decoder = SSEDecoder()
    data = []
    with httpx2.Client(timeout=10) as http:
        try:
            with http.stream("POST", _url(server), json=req, headers=headers) as r:
                for chunk in r.iter_bytes():
                    data += [ev.data for ev in decoder.feed(chunk)]
        except httpx2.HTTPError as exc:
            return data, exc
    return data, None


def test_reset_fault_resets_the_connection_before_any_response(serve, body):
    sim, server = serve()
    data, error = _stream_raw(server, body(max_tokens=3, stream=True), {"x-sim-fault": "reset:1"})
    assert data == []
    assert isinstance(error, httpx2.RemoteProtocolError | httpx2.ReadError)
    stats = sim.stats()
    assert stats["faults_injected"]["reset"] == 1 and stats["generations_started"] == 0


def test_hang_fault_goes_silent_with_the_connection_open(serve, body):
    sim, server = serve()
    decoder = SSEDecoder()
    req = body(max_tokens=10, stream=True)
    with (
        httpx2.Client(timeout=httpx2.Timeout(10, read=0.5)) as http,
        http.stream("POST", _url(server), json=req, headers={"x-sim-fault": "hang:3:1"}) as r,
    ):
        events = []
        with pytest.raises(httpx2.ReadTimeout):
            for chunk in r.iter_bytes():
                events += decoder.feed(chunk)
    assert len(events) == 3  # the role chunk and two tokens, then silence
    assert sim.stats()["faults_injected"]["hang"] == 1


def test_malformed_fault_sends_one_chunk_that_is_not_json(serve, body):
    import orjson

    sim, server = serve()
    data, error = _stream_raw(
        server, body(max_tokens=5, stream=True), {"x-sim-fault": "malformed:2:1"}
    )
    assert error is None and data[-1] == "[DONE]"
    broken = []
    for i, d in enumerate(data[:-1]):
        try:
            orjson.loads(d)
        except orjson.JSONDecodeError:
            broken.append(i)
    assert broken == [2]
    assert len(data) == 1 + 5 + 1 + 1  # role, 5 tokens, the malformed one, [DONE]
    assert sim.stats()["faults_injected"]["malformed"] == 1


def test_nodone_fault_ends_the_stream_cleanly_without_done(serve, body):
    sim, server = serve()
    req = body(max_tokens=4, stream=True)
    data, error = _stream_raw(server, req, {"x-sim-fault": "nodone:1"})
    assert error is None
    assert data and data[-1] != "[DONE]" and '"finish_reason":"length"' in data[-1]
    assert sim.stats()["faults_injected"]["nodone"] == 1


def test_times_bounds_how_often_a_fault_hits_and_target_picks_continuations(serve, body):
    sim, server = serve(faults=(Fault.parse("status:503:1@continuation#1"),))
    plain = body(max_tokens=2)
    assert httpx2.post(_url(server), json=plain).status_code == 200  # not a continuation
    cont = {
        **plain,
        "messages": [*plain["messages"], {"role": "assistant", "content": "the"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    assert httpx2.post(_url(server), json=cont).status_code == 503
    assert httpx2.post(_url(server), json=cont).status_code == 200  # hit once only
    assert sim.stats()["faults_injected"]["status"] == 1


def test_a_continuation_without_max_tokens_gets_only_the_default_tokens_still_owed(serve, body):
    _sim, server = serve(default_max_tokens=12)
    plain = body()
    whole = httpx2.post(_url(server), json=plain).json()["choices"][0]["message"]["content"]
    assert whole == expected_text(plain, 12)
    partial = expected_text(plain, 5)
    cont = {
        **plain,
        "messages": [*plain["messages"], {"role": "assistant", "content": partial}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    answer = httpx2.post(_url(server), json=cont).json()
    assert partial + answer["choices"][0]["message"]["content"] == whole
    # Its prompt is the original prompt plus the 5 tokens of the partial answer.
    from streamsafe.tokens import estimate_prompt_tokens

    assert answer["usage"]["prompt_tokens"] == estimate_prompt_tokens(plain) + 5
    assert answer["usage"]["completion_tokens"] == 7


def test_errorevent_and_pause_specs_parse_and_print_back():
    for spec in ("errorevent:503:1", "errorevent:429:0.5#2", "pause:5:6:1", "pause:0:0.5:1@fresh"):
        assert Fault.parse(str(Fault.parse(spec))) == Fault.parse(spec)
    pause = Fault.parse("pause:5:6:1")
    assert (pause.after, pause.stall_s) == (5, 6.0)
    for bad in ("errorevent:200:1", "errorevent:503", "pause:1:1", "pause:-1:1:1", "pause:1:-2:1"):
        with pytest.raises(ValueError, match="fault"):
            Fault.parse(bad)


def test_errorevent_fault_refuses_a_stream_in_vllms_second_form(serve, body):
    """A 200, then a first event that is vLLM 0.32's error object carrying 503, then [DONE]:
    no generation starts. A plain call gets the status."""
    import orjson

    sim, server = serve()
    headers = {"x-sim-fault": "errorevent:503:1"}
    with httpx2.Client(timeout=10) as http:
        with http.stream(
            "POST", _url(server), json=body(max_tokens=3, stream=True), headers=headers
        ) as r:
            assert r.status_code == 200
            decoder = SSEDecoder()
            data = [ev.data for chunk in r.iter_bytes() for ev in decoder.feed(chunk)]
        plain = http.post(_url(server), json=body(max_tokens=3), headers=headers)
    assert data[-1] == "[DONE]" and len(data) == 2
    error = orjson.loads(data[0])["error"]
    assert error["code"] == 503 and error["type"] == "Service Unavailable"
    assert list(error) == ["message", "type", "param", "code"] and error["param"] is None
    assert plain.status_code == 503 and plain.json()["error"]["code"] == 503
    stats = sim.stats()
    assert stats["faults_injected"]["errorevent"] == 2 and stats["generations_started"] == 0


def test_pause_fault_goes_silent_mid_stream_then_finishes_the_answer(serve, body):
    import orjson

    sim, server = serve()
    req = body(max_tokens=6, stream=True)
    started = time.monotonic()
    data, error = _stream_raw(server, req, {"x-sim-fault": "pause:3:0.3:1"})
    assert error is None and data[-1] == "[DONE]"
    assert time.monotonic() - started >= 0.3
    chunks = [orjson.loads(d)["choices"][0]["delta"] for d in data[:-1]]
    text = "".join(delta.get("content") or "" for delta in chunks)
    assert text == expected_text(req, 6)
    assert sim.stats()["faults_injected"]["pause"] == 1
