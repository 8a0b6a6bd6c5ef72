"""Over real HTTP: memory through completion, disconnects (with and without abort), death under
overload, and restart."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest
from openai import OpenAI

from streamsafe.engine_sim import expected_text
from streamsafe.sse import SSEDecoder
from streamsafe.tokens import estimate_prompt_tokens

LONG = 1_000_000  # max_tokens that cannot finish during a test


def _client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def _url(server) -> str:
    return server.url + "/v1/chat/completions"


def test_memory_peaks_at_prompt_plus_max_tokens_and_returns_to_zero(serve, body):
    sim, server = serve()
    req = body("count my memory", max_tokens=9)
    _client(server).chat.completions.create(**req)
    stats = sim.stats()
    assert stats["memory_peak_tokens"] == estimate_prompt_tokens(req) + 9
    assert stats["memory_used_tokens"] == 0
    assert stats["peak_active"] == 1 and stats["active"] == 0
    assert stats["memory_capacity_tokens"] == 32768


def test_disconnect_mid_stream_aborts_and_frees_memory(serve, body, wait_until):
    sim, server = serve()
    with httpx2.Client() as http:
        with http.stream("POST", _url(server), json=body(max_tokens=LONG, stream=True)) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")  # the role chunk came with the first token
            assert sim.stats()["memory_used_tokens"] > 0
        wait_until(lambda: sim.stats()["generations_aborted"] == 1, what="abort")
    stats = sim.stats()
    assert stats["memory_used_tokens"] == 0 and stats["active"] == 0
    assert stats["generations_completed"] == 0
    assert 0 <= stats["tokens_unread"] <= stats["tokens_generated"]


def test_disconnect_while_queued_aborts_the_waiting_request(serve, body, wait_until):
    sim, server = serve(max_num_seqs=1)
    first = body("first", max_tokens=LONG, stream=True)
    second = body("second", max_tokens=LONG, stream=True)
    with httpx2.Client() as a, httpx2.Client() as b:
        with a.stream("POST", _url(server), json=first) as ra:
            lines = ra.iter_lines()  # kept: dropping the iterator would close the response
            next(lines)
            with b.stream("POST", _url(server), json=second) as rb:
                assert rb.status_code == 200  # headers go out before the first token
                wait_until(lambda: sim.stats()["waiting"] == 1, what="queued")
                held = sim.stats()["memory_used_tokens"]
                assert held >= estimate_prompt_tokens(first) + estimate_prompt_tokens(second)
            wait_until(lambda: sim.stats()["generations_aborted"] == 1, what="queued abort")
            stats = sim.stats()
            assert stats["waiting"] == 0 and stats["active"] == 1
            assert any(next(lines).startswith("data: ") for _ in range(2))
        wait_until(lambda: sim.stats()["generations_aborted"] == 2, what="second abort")
    assert sim.stats()["memory_used_tokens"] == 0


def test_without_abort_on_disconnect_generation_runs_on_for_nobody(serve, body, wait_until):
    sim, server = serve(abort_on_disconnect=False)
    with httpx2.Client() as http:
        with http.stream("POST", _url(server), json=body(max_tokens=600, stream=True)) as resp:
            lines = resp.iter_lines()
            next(lines)
        # The memory stays held while the orphan generates...
        wait_until(lambda: sim.stats()["tokens_unread"] > 0, what="unread tokens")
        wait_until(lambda: sim.stats()["generations_completed"] == 1, what="completion")
    stats = sim.stats()
    assert stats["generations_aborted"] == 0
    assert stats["tokens_generated"] == 600
    assert 0 < stats["tokens_unread"] <= 600
    assert stats["memory_used_tokens"] == 0


def _stream_until_error(server, req):
    text = []
    try:
        for chunk in _client(server).chat.completions.create(**req, stream=True):
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
    except openai.APIError as exc:
        return "".join(text), exc
    return "".join(text), None


def test_overload_kills_every_live_stream_and_restart_revives(serve, body, wait_until):
    sim, server = serve(memory_tokens=300)
    reqs = [body(f"stream {i}", max_tokens=LONG) for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda r: _stream_until_error(server, r), reqs))
    midstream = 0
    for req, (text, exc) in zip(reqs, results, strict=True):
        assert exc is not None and "EngineDeadError" in str(exc)
        if not isinstance(exc, openai.APIStatusError):  # died under the stream, not refused
            midstream += 1
            assert "'shared memory'" in str(exc)
            assert text == expected_text(req, len(text.split()))  # all before death is true text
    stats = sim.stats()
    assert stats["engine_dead"] and stats["crashes"] == 1
    assert midstream >= 1
    assert stats["generations_failed"] == stats["generations_started"] == midstream
    assert stats["memory_used_tokens"] == 0 and stats["memory_peak_tokens"] <= 300

    with pytest.raises(openai.InternalServerError, match="EngineDeadError"):
        _client(server).chat.completions.create(**body(max_tokens=2))
    assert httpx2.get(server.url + "/health").status_code == 503
    assert sim.stats()["generations_started"] == midstream  # a refused request starts nothing

    resp = httpx2.post(server.url + "/admin/restart")
    assert resp.status_code == 200 and resp.json()["crashes"] == 1
    assert httpx2.get(server.url + "/health").status_code == 200
    out = _client(server).chat.completions.create(**body(max_tokens=2))
    assert out.choices[0].finish_reason == "length"


def test_dead_engine_ends_a_raw_stream_with_error_event_then_done(serve, body):
    _sim, server = serve(memory_tokens=100)
    with (
        httpx2.Client() as http,
        http.stream("POST", _url(server), json=body(max_tokens=LONG, stream=True)) as r,
    ):
        events = SSEDecoder().feed(b"".join(r.iter_bytes()))
    assert events[-1].is_done
    error = events[-2].raw
    assert error.startswith(b'{"error": {"message": "EngineDeadError: Engine loop is not running.')
    assert b"OutOfResources(101, 100, 'shared memory')" in error
    assert b'"type": "InternalServerError", "code": 500}}' in error


def test_restart_from_another_thread(serve, body):
    sim, server = serve(memory_tokens=60)
    _text, exc = _stream_until_error(server, body(max_tokens=LONG))
    assert exc is not None and sim.stats()["engine_dead"]
    done = threading.Event()
    threading.Thread(target=lambda: (sim.restart(), done.set())).start()
    assert done.wait(10)
    assert not sim.stats()["engine_dead"] and sim.stats()["restarts"] == 1
    assert _client(server).chat.completions.create(**body(max_tokens=1)).choices


def test_memory_series_records_the_crash(serve, body):
    sim, server = serve(memory_tokens=80, series_interval_s=0.0)
    _stream_until_error(server, body(max_tokens=LONG))
    series = sim.memory_series()
    values = [v for _, v in series]
    assert max(values) <= 80 and values[-1] == 0
    times = [t for t, _ in series]
    assert times == sorted(times)
