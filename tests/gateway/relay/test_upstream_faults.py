"""What the engine does wrong, the gateway bounds and repairs: refused continuations are retried,
stalls and silences are cut and continued, broken streams never pass as complete, a dead or
frozen engine is seen by ``/health`` and the breaker, and usage counts the whole answer."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx2
import orjson
import pytest
from engine_process import engine_process
from gateway_helpers import (
    MODEL,
    chat_body,
    content_of,
    fast_sim,
    make_stack,
    sse_payloads,
    wait_for,
)

from streamsafe.engine_sim import Fault, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from streamsafe.tokens import estimate_prompt_tokens


def _faults(*specs: str) -> tuple[Fault, ...]:
    return tuple(Fault.parse(s) for s in specs)


def _stream(url: str, body: dict[str, Any], read: float = 10.0) -> tuple[int, list[str]]:
    """(status, SSE data of each event); the read timeout bounds every silence (the gateway's
    heartbeats stop once events flow)."""
    decoder = SSEDecoder()
    data: list[str] = []
    timeout = httpx2.Timeout(10.0, read=read)
    with (
        httpx2.Client(timeout=timeout) as client,
        client.stream("POST", url + "/v1/chat/completions", json=body) as resp,
    ):
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, [resp.text]
        for chunk in resp.iter_bytes():
            data += [ev.data for ev in decoder.feed(chunk)]
    return 200, data


def _assert_clean(data: list[str]) -> None:
    """Every event is JSON except the final [DONE]; no error event."""
    assert data[-1] == "[DONE]"
    for d in data[:-1]:
        assert "error" not in orjson.loads(d), d


def _text(data: list[str]) -> str:
    return content_of([(None, d) for d in data])


# -- row 4: a continuation refused before any work -----------------------------------------


def test_a_continuation_refused_before_work_is_retried_after_retry_after() -> None:
    sim = fast_sim(faults=_faults("cut:5:1@fresh#1", "status:503:1:1@continuation#1"))
    body = chat_body("refused continuation", max_tokens=20)
    with make_stack(sim, max_continuations=5) as s:
        started = time.monotonic()
        status, data = _stream(s.url, body)
        waited = time.monotonic() - started
        assert status == 200
        _assert_clean(data)
        assert _text(data) == expected_text(body, 20)
        stats = s.sim.stats()
        assert stats["faults_injected"]["status"] == 1
        assert stats["continuations"] == 1  # the refused one started nothing
        assert waited >= 1.0  # Retry-After: 1 was honoured


# -- row 6: a continuation of a request without max_tokens ---------------------------------


def test_a_continued_answer_without_max_tokens_is_as_long_as_an_unbroken_one() -> None:
    sim = fast_sim(default_max_tokens=40, faults=_faults("cut:5:1@fresh#1"))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "no limit"}], "stream": True}
    with make_stack(sim) as s:
        status, data = _stream(s.url, body)
        assert status == 200
        _assert_clean(data)
        assert _text(data) == expected_text(body, 40)
        assert s.sim.stats()["continuations"] == 1


# -- usage after a continuation ------------------------------------------------------------


def test_usage_after_a_continuation_counts_the_whole_answer() -> None:
    sim = fast_sim(faults=_faults("cut:5:1@fresh#1"))
    body = {**chat_body("usage", max_tokens=12), "stream_options": {"include_usage": True}}
    with make_stack(sim) as s:
        status, data = _stream(s.url, body)
        assert status == 200
        _assert_clean(data)
        usage = orjson.loads(data[-2])["usage"]
        prompt = estimate_prompt_tokens(body)
        assert usage == {
            "prompt_tokens": prompt,
            "completion_tokens": 12,
            "total_tokens": prompt + 12,
        }
        assert s.sim.stats()["continuations"] == 1


@pytest.mark.parametrize("kind", ["auto", "openai"])
def test_a_stream_dropped_after_its_last_token_still_gets_its_usage(kind: str) -> None:
    """vLLM counts the prompt (its /tokenize); a generic OpenAI server cannot, so no usage."""
    # 1 role chunk + 7 token chunks: the cut falls after the finish_reason chunk, before usage.
    sim = fast_sim(faults=_faults("cut:8:1@fresh#1"))
    body = {**chat_body("usage lost", max_tokens=7), "stream_options": {"include_usage": True}}
    with make_stack(sim, upstream_kind=kind) as s:
        status, data = _stream(s.url, body)
        assert status == 200
        _assert_clean(data)
        assert _text(data) == expected_text(body, 7)
        stats = s.sim.stats()
        assert stats["faults_injected"]["cut"] == 1
        assert stats["generations_started"] == 1 and stats["continuations"] == 0
        chunks = [orjson.loads(d) for d in data[:-1]]
        if kind == "openai":
            # A generic OpenAI server has no tokenizer route: the answer ends without usage
            # rather than with a guess.
            assert all("usage" not in c for c in chunks)
            assert s.gw.stats()["usage_recovered"] == 0
            return
        usage_chunk = chunks[-1]
        prompt = estimate_prompt_tokens(body)
        assert usage_chunk["usage"] == {
            "prompt_tokens": prompt,
            "completion_tokens": 7,
            "total_tokens": prompt + 7,
        }
        assert usage_chunk["choices"] == []
        first = chunks[0]
        for field in ("id", "object", "created", "model"):
            assert usage_chunk[field] == first[field]
        assert s.gw.stats()["usage_recovered"] == 1


# -- upstream timeouts: a stall is a cut, continued at once -----------------------------------


def test_a_first_token_that_does_not_come_ends_with_a_504_and_the_engine_is_not_asked_again() -> (
    None
):
    # The engine held the request silent past the first-token timeout: asking it again would
    # wait as long once more (before, each timeout was a cut asked again of the same engine, up
    # to max_continuations). With one engine the caller gets a clear 504 at once.
    sim = fast_sim(faults=_faults("stall:8:1@fresh#1"))
    body = chat_body("stalled first token", max_tokens=10)
    # 2 s: well past a loaded machine's way to the engine (0.5 s ran out before the request
    # reached the simulator under two busy loops, 2026-12-07), well within the 8 s stall.
    with make_stack(sim, first_token_timeout=2.0, commit="first-token") as s:
        with httpx2.Client(timeout=20) as client:
            resp = client.post(s.url + "/v1/chat/completions", json=body)
        assert resp.status_code == 504, resp.text
        error = resp.json()["error"]
        assert "first token timeout" in error["message"] and error["code"] == 504
        stats = s.sim.stats()
        assert stats["faults_injected"]["stall"] == 1
        assert stats["requests_received"] == 1
        assert s.gw.stats()["upstream_timeouts"] == 1
        # The next call is the engine's to answer again (it was shunned by one generation).
        other = chat_body("the next call", max_tokens=10)
        status, data = _stream(s.url, other)
        assert status == 200 and _text(data) == expected_text(other, 10)


def test_a_non_streamed_answer_longer_than_the_first_token_timeout_is_waited_for() -> None:
    # Its headers come only with the whole answer: a first-token bound cut it and asked the
    # engine to start over, every time (three generations, a 504 and an open breaker before).
    sim = fast_sim(itl_ms=20.0)
    body = chat_body("a long plain answer", max_tokens=40, stream=False)
    with make_stack(sim, first_token_timeout=0.3, max_continuations=2) as s:
        with httpx2.Client(timeout=20) as client:
            resp = client.post(s.url + "/v1/chat/completions", json=body)
        assert resp.status_code == 200
        assert resp.json()["choices"][0]["message"]["content"] == expected_text(body, 40)
        assert s.sim.stats()["generations_started"] == 1
        gw = s.gw.stats()
        assert gw["upstream_timeouts"] == 0 and not gw["breaker_open"]


def test_a_stream_that_goes_silent_is_cut_and_continued() -> None:
    sim = fast_sim(faults=_faults("hang:4:1@fresh#1"))
    body = chat_body("silence", max_tokens=12)
    with make_stack(sim, idle_timeout=0.5) as s:
        status, data = _stream(s.url, body, read=5.0)
        assert status == 200
        _assert_clean(data)
        assert _text(data) == expected_text(body, 12)
        assert s.sim.stats()["continuations"] == 1
        assert s.gw.stats()["upstream_timeouts"] == 1


def test_a_stream_that_keeps_flowing_outlives_the_idle_timeout() -> None:
    # Every read moves the idle deadline: 40 tokens at 20 ms take 0.8 s, past a 0.3 s bound.
    sim = fast_sim(itl_ms=20.0)
    body = chat_body("flowing", max_tokens=40)
    with make_stack(sim, idle_timeout=0.3) as s:
        status, data = _stream(s.url, body, read=5.0)
        assert status == 200
        _assert_clean(data)
        assert _text(data) == expected_text(body, 40)
        assert s.gw.stats()["upstream_timeouts"] == 0
        assert s.sim.stats()["continuations"] == 0


def test_the_total_timeout_ends_a_stream_with_an_error_event_and_frees_the_engine() -> None:
    sim = fast_sim(itl_ms=20.0)
    with make_stack(sim, total_timeout=0.5) as s:
        status, data = _stream(s.url, chat_body("too long", max_tokens=2000), read=5.0)
        assert status == 200
        assert data[-1] == "[DONE]"
        error = orjson.loads(data[-2])["error"]
        assert "timeout" in error["message"]
        wait_for(lambda: s.sim.stats()["active"] == 0, what="engine request aborted")


# -- upstream stream hygiene -----------------------------------------------------------------


def test_a_malformed_chunk_is_never_relayed_and_the_answer_stays_exact() -> None:
    sim = fast_sim(faults=_faults("malformed:3:1@fresh#1"))
    body = chat_body("malformed", max_tokens=10)
    with make_stack(sim) as s:
        status, data = _stream(s.url, body)
        assert status == 200
        _assert_clean(data)  # every relayed event parses
        assert _text(data) == expected_text(body, 10)


@pytest.mark.parametrize("continuations", [5, 0])
def test_a_finished_stream_without_done_ends_cleanly(continuations: int) -> None:
    sim = fast_sim(faults=_faults("nodone:1"))
    body = chat_body("no done", max_tokens=6)
    with make_stack(sim, max_continuations=continuations) as s:
        status, data = _stream(s.url, body)
        assert status == 200
        _assert_clean(data)
        assert _text(data) == expected_text(body, 6)
        assert s.sim.stats()["generations_started"] == 1


def test_a_reset_before_headers_is_asked_again() -> None:
    sim = fast_sim(faults=_faults("reset:1#1"))
    body = chat_body("reset once", max_tokens=6)
    with make_stack(sim) as s:
        status, data = _stream(s.url, body)
        assert status == 200
        _assert_clean(data)
        assert _text(data) == expected_text(body, 6)
        assert s.sim.stats()["faults_injected"]["reset"] == 1


def test_a_reset_before_headers_is_not_reported_as_unreachable() -> None:
    sim = fast_sim(faults=_faults("reset:1"))
    with make_stack(sim, commit="first-token") as s:
        status, data = _stream(s.url, chat_body("always reset", max_tokens=6))
        assert status == 502
        message = orjson.loads(data[0])["error"]["message"]
        assert "unreachable" not in message
        assert "reset" in message or "closed" in message


# -- /ready and the breaker see a dead or frozen engine ---------------------------------------


def test_a_killed_engine_opens_the_breaker_and_readiness_tells_the_truth() -> None:
    with engine_process() as engine:
        gw = Gateway(GatewayConfig(upstream=engine.url, probe_interval=0.1, heartbeat=0.05))
        with ServerThread(gw) as server:
            assert httpx2.get(server.url + "/ready").status_code == 200
            engine.kill()
            # True within a probe interval: a response from just before the kill may still
            # count as a sign of life that long.
            ready = wait_for(
                lambda: (
                    (r := httpx2.get(server.url + "/ready", timeout=10)).status_code == 503 and r
                ),
                what="ready 503",
            )
            assert ready.json()["error"]["message"]
            assert int(ready.headers["retry-after"]) >= 1
            # Liveness is the gateway's own: a supervisor must not restart it for the engine.
            assert httpx2.get(server.url + "/health").status_code == 200
            status, _ = _stream(server.url, chat_body("after the kill", max_tokens=3))
            assert status == 503
            assert gw.stats()["breaker_open"]
            engine.start()  # the same port again
            wait_for(lambda: not gw.stats()["breaker_open"], what="breaker closed")
            assert httpx2.get(server.url + "/ready").status_code == 200
            assert httpx2.get(server.url + "/health").status_code == 200
            body = chat_body("back", max_tokens=3)
            status, data = _stream(server.url, body)
            assert status == 200 and _text(data) == expected_text(body, 3)


def test_streams_reset_by_a_killed_engine_open_the_breaker() -> None:
    with engine_process("--itl-ms", "20") as engine:
        gw = Gateway(GatewayConfig(upstream=engine.url, probe_interval=0.1, heartbeat=0.05))
        with ServerThread(gw) as server:
            with (
                httpx2.Client(timeout=10) as client,
                client.stream(
                    "POST", server.url + "/v1/chat/completions", json=chat_body(max_tokens=500)
                ) as resp,
            ):
                decoder = SSEDecoder()
                events = []
                for chunk in resp.iter_bytes():
                    events += decoder.feed(chunk)
                    if len(events) >= 3 and engine.proc is not None and engine.proc.poll() is None:
                        engine.kill()
                assert events[-1].data == "[DONE]"
                assert "error" in orjson.loads(events[-2].data)
            wait_for(lambda: gw.stats()["breaker_open"], what="breaker open")
            assert httpx2.get(server.url + "/ready").status_code == 503


def test_refused_connections_open_the_breaker() -> None:
    from streamsafe.server import bind_socket

    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    gw = Gateway(GatewayConfig(upstream=f"http://127.0.0.1:{port}", connect_backoff=0.001))
    with ServerThread(gw) as server:
        status, _ = _stream(server.url, chat_body())
        assert status == 503
        assert gw.stats()["breaker_open"]
        assert httpx2.get(server.url + "/ready").status_code == 503


def test_a_frozen_engine_bounds_every_call_and_readiness_says_so() -> None:
    with engine_process("--itl-ms", "20") as engine:
        config = GatewayConfig(
            upstream=engine.url,
            probe_interval=0.2,
            heartbeat=0.05,
            first_token_timeout=1.0,
            idle_timeout=0.5,
            max_continuations=1,
        )
        gw = Gateway(config)
        with ServerThread(gw) as server:
            decoder = SSEDecoder()
            events = []
            frozen = False
            with (
                httpx2.Client(timeout=10) as client,
                client.stream(
                    "POST", server.url + "/v1/chat/completions", json=chat_body(max_tokens=500)
                ) as resp,
            ):
                for chunk in resp.iter_bytes():
                    events += decoder.feed(chunk)
                    if len(events) >= 3 and not frozen:
                        engine.freeze()
                        frozen = True
            try:
                assert events[-1].data == "[DONE]"
                assert "error" in orjson.loads(events[-2].data)
                status, data = _stream(server.url, chat_body("while frozen", max_tokens=3))
                assert status in (503, 504) or "error" in data[-2]
                assert httpx2.get(server.url + "/ready", timeout=10).status_code == 503
            finally:
                engine.thaw()


# -- AttemptWatch: the deadlines of one attempt ---------------------------------------------------


async def test_attempt_watch_raises_a_stall_past_the_first_token_deadline() -> None:
    from streamsafe.gateway.relay.attempt_watch import (
        AttemptWatch,
        UpstreamStalled,
        UpstreamTimeouts,
    )

    timeouts = UpstreamTimeouts(first_token=0.05, idle=None, total=None)
    with pytest.raises(UpstreamStalled) as info:
        async with AttemptWatch(timeouts, None):
            await asyncio.Event().wait()  # an upstream that never answers
    assert info.value.phase == "first_token"


async def test_an_ask_again_within_a_round_keeps_the_round_s_first_token_bound() -> None:
    # The asks of one round (a failover, a same-engine retry) share one first-token bound from
    # the round's start: an ask made when it has passed ends at once, not a whole bound later.
    from streamsafe.gateway.relay.attempt_watch import (
        AttemptWatch,
        UpstreamStalled,
        UpstreamTimeouts,
    )

    loop = asyncio.get_running_loop()
    timeouts = UpstreamTimeouts(first_token=30.0, idle=None, total=None)
    with pytest.raises(UpstreamStalled) as info:
        async with AttemptWatch(timeouts, None, since=loop.time() - 30.0):
            await asyncio.Event().wait()  # the engine asked again never answers either
    assert info.value.phase == "first_token"


async def test_attempt_watch_idle_deadline_moves_with_every_chunk_and_then_fires() -> None:
    from streamsafe.gateway.relay.attempt_watch import (
        AttemptWatch,
        UpstreamStalled,
        UpstreamTimeouts,
    )

    timeouts = UpstreamTimeouts(first_token=10.0, idle=0.2, total=None)
    chunks = 0
    with pytest.raises(UpstreamStalled) as info:
        async with AttemptWatch(timeouts, None) as watch:
            watch.first_event()  # the idle bound applies from here, not the first-token one
            for _ in range(5):  # chunks closer together than the idle bound keep it alive
                await asyncio.sleep(0.05)
                watch.chunk()
                chunks += 1
            await asyncio.Event().wait()  # then silence
    assert info.value.phase == "idle"
    assert chunks == 5


async def test_attempt_watch_total_deadline_wins_and_a_real_cancel_still_propagates() -> None:
    from streamsafe.gateway.relay.attempt_watch import (
        AttemptWatch,
        UpstreamStalled,
        UpstreamTimeouts,
    )

    loop = asyncio.get_running_loop()
    timeouts = UpstreamTimeouts(first_token=10.0, idle=10.0, total=0.1)
    with pytest.raises(UpstreamStalled) as info:
        async with AttemptWatch(timeouts, loop.time() + 0.1):
            await asyncio.Event().wait()
    assert info.value.phase == "total"

    watching = asyncio.Event()

    async def attempt() -> None:
        async with AttemptWatch(UpstreamTimeouts(first_token=10.0), None):
            watching.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(attempt())
    await asyncio.wait_for(watching.wait(), 5)
    task.cancel()  # an abort (the last subscriber left): not a stall
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_reset_before_headers_is_asked_again_even_for_a_never_retry_upstream_request() -> None:
    # X-LlamaStack-Streaming asks for no upstream retry that could duplicate work; the first
    # attempt is gone before the second is sent, so asking again is not one (the streamsafe
    # client marks every stream so).
    sim = fast_sim(faults=_faults("reset:1#1"))
    body = chat_body("marked", max_tokens=3)
    with make_stack(sim) as s:
        r = httpx2.post(
            s.url + "/v1/chat/completions",
            json=body,
            headers={"X-LlamaStack-Streaming": "true"},
            timeout=10,
        )
        assert r.status_code == 200
        assert _text([d for _, d in sse_payloads(r.text)]) == expected_text(body, 3)
        assert s.sim.stats()["requests_received"] == 2


def test_a_plain_call_on_an_engine_that_freezes_ends_with_a_503_not_at_the_total_timeout() -> None:
    # A non-streamed answer comes whole at its end, so no first-token or idle bound can tell a
    # frozen engine from a long answer: its engine's health is asked while it is quiet, and an
    # engine that answers nothing ends it (before, it waited for the 600 s total timeout).
    with engine_process("--itl-ms", "50") as engine:
        gw = Gateway(GatewayConfig(upstream=engine.url))  # default flags
        with ServerThread(gw) as server, httpx2.Client(timeout=60) as client:
            body = chat_body("a long plain answer", max_tokens=2000, stream=False)
            started = time.monotonic()

            def freeze_once_running() -> None:
                wait_for(lambda: engine.stats()["active"] == 1, what="the answer under way")
                engine.freeze()

            freezer = threading.Thread(target=freeze_once_running)
            freezer.start()
            try:
                resp = client.post(server.url + "/v1/chat/completions", json=body)
            finally:
                freezer.join(30)
                engine.thaw()
            took = time.monotonic() - started
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert "down" in error["message"] and engine.url in error["message"]
            assert took < 30, took  # 5 s quiet, then at most 10 s for /health: not 600 s
