"""Heartbeats once a stream flows: a stall of the engine in the middle of an answer, shorter than
the gateway's idle timeout, never reaches a client's read timeout."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor

import httpx2
import orjson
import pytest
from gateway_helpers import MODEL, chat_body, content_of, fast_sim, make_stack, raw_post
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.engine_sim import Fault, expected_text
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.generations.fanout import Fanout
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.keepalive import KEEPALIVE_LINE, TICK, QuietWait, quiet_beat
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.sse import SSEDecoder

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")


@given(
    beat=st.floats(0.01, 10.0),
    writes=st.lists(st.floats(0.0, 100.0), max_size=40).map(sorted),
)
def test_a_stream_is_never_silent_longer_than_the_beat_nor_beaten_sooner(
    beat: float, writes: list[float]
) -> None:
    """The timer looks when :func:`quiet_beat` says; writes fall anywhere in between. Every
    silence is at most ``beat``, and no heartbeat follows a byte sooner than ``beat - TICK``."""
    end = 100.0 + beat
    last, look = 0.0, beat  # the timer is first armed one beat after the start
    sent = [0.0]  # every byte that went out: writes and heartbeats
    pending = list(writes)
    while look <= end:
        while pending and pending[0] <= look:
            last = pending.pop(0)
            sent.append(last)
        due, at = quiet_beat(last, look, beat)
        assert at > look
        if due:
            assert look - last >= beat - TICK
            last = look
            sent.append(look)
        look = at
    sent += pending
    assert all(b - a <= beat + 1e-9 for a, b in itertools.pairwise(sorted(sent)))


def _generation() -> Generation:
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
    return gen


@pytest.mark.timeout(10)
async def test_a_fanout_member_gets_a_heartbeat_when_the_generation_goes_quiet() -> None:
    fanout = Fanout()
    written: list[bytes] = []
    beaten = asyncio.Event()

    def writer(body: bytes) -> bool:
        written.append(body)
        if body == KEEPALIVE_LINE:
            beaten.set()
        return True

    member = asyncio.create_task(fanout.serve(writer, 0, 0.05))
    await asyncio.sleep(0)
    fanout.publish_one(b'{"a":1}', 0)
    await asyncio.wait_for(beaten.wait(), 5)
    assert written[0] == b'id: 0\ndata: {"a":1}\n\n' and written[1] == KEEPALIVE_LINE
    fanout.release_all()
    assert await member == 1
    assert fanout._keepalive is None  # the timer went with the last member


@pytest.mark.timeout(10)
async def test_a_fanout_without_heartbeats_sets_no_timer() -> None:
    fanout = Fanout()
    member = asyncio.create_task(fanout.serve(lambda body: True, 0, 0.0))
    await asyncio.sleep(0)
    assert fanout._keepalive is None
    fanout.release_all()
    await member


@pytest.mark.timeout(10)
async def test_a_loop_served_subscriber_is_woken_for_a_heartbeat_and_leaves_no_waiter() -> None:
    gen = _generation()
    quiet = QuietWait(0.05)
    try:
        assert await quiet.wait(gen) is True  # nothing changed: a heartbeat is due
        assert not gen._waiters  # the timer's wake-up took its waiter off the list
        quiet.wrote()
        waiting = asyncio.create_task(quiet.wait(gen))
        await asyncio.sleep(0)
        gen.publish([b'{"a":1}'], 0)
        assert await waiting is False  # woken by the event, not the timer
    finally:
        quiet.close()


# -- end to end -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_openai_streams_with_a_2s_read_timeout_survive_a_6s_stall_mid_stream() -> None:
    """Issue 20, item 4: 8 unmodified openai streams (2 s read timeout, 2 retries) through a
    gateway with its default settings, the engine silent 6 s in the middle of every answer: all
    whole and exact, each one engine generation (no client retried)."""
    import openai

    sim = fast_sim(faults=(Fault.parse("pause:4:6:1"),))
    defaults = GatewayConfig(upstream="http://unused")
    with make_stack(sim, heartbeat=defaults.heartbeat) as s:
        assert defaults.idle_timeout is not None and defaults.idle_timeout > 6
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", timeout=2.0, max_retries=2)

        def one(i: int) -> tuple[str, str]:
            messages = [{"role": "user", "content": f"stall {i}"}]
            stream = client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=12,
                stream=True,  # type: ignore[arg-type]
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            body = {"model": MODEL, "messages": messages, "max_tokens": 12, "stream": True}
            return text, expected_text(body, 12)

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
        assert all(text == expected for text, expected in results)
        stats = s.sim.stats()
        assert stats["faults_injected"]["pause"] == 8
        assert stats["requests_received"] == 8 and stats["generations_started"] == 8
        assert s.gw.registry.counters.continued == 0  # not even the gateway asked again


def _read_with_timeout(url: str, body: dict[str, object], read: float) -> tuple[str, int]:
    """(the answer's text, keep-alive lines after the first event) of one stream read with a
    ``read`` s timeout that the client states, as Stainless clients do."""
    decoder = SSEDecoder()
    data: list[str] = []
    beats = 0
    headers = {"x-stainless-read-timeout": str(read)}
    with (
        httpx2.Client(timeout=httpx2.Timeout(10.0, read=read)) as http,
        http.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            if data:
                beats += chunk.count(b": keep-alive\n")
            data += [ev.data for ev in decoder.feed(chunk)]
    assert data[-1] == "[DONE]"
    return content_of([(None, d) for d in data]), beats


@pytest.mark.timeout(60)
def test_a_subscriber_its_own_loop_serves_gets_heartbeats_mid_stream_too() -> None:
    """Two identical calls collapse into one generation; the one that joined gets a completion
    id of its own, so its own loop serves it instead of the fan-out. Both read through a 3 s
    pause with a 1 s read timeout."""
    sim = fast_sim(faults=(Fault.parse("pause:3:3:1"),))
    with make_stack(sim, heartbeat=5.0, collapse_identical="all") as s:
        body = chat_body("collapsed", max_tokens=8)
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: _read_with_timeout(s.url, body, 1.0), range(2)))
        assert [text for text, _ in results] == [expected_text(body, 8)] * 2
        assert all(beats >= 2 for _, beats in results)  # every 0.5 s through 3 s of silence
        assert s.sim.stats()["requests_received"] == 1


# -- plain calls: 102 Processing for clients that state their read timeout ------------------------


@pytest.mark.timeout(60)
def test_a_plain_call_that_outlasts_the_openai_read_timeout_is_answered_once() -> None:
    """Issue 28, row 5: a non-streamed answer of about 3 s, an unmodified openai client with a
    1 s read timeout and its 2 retries, default flags: kept alive by interim 102 responses, it
    gets the answer from one engine request."""
    import openai

    with make_stack(fast_sim(itl_ms=250.0), heartbeat=GatewayConfig("x").heartbeat) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", timeout=1.0, max_retries=2)
        messages = [{"role": "user", "content": "slow plain"}]
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)  # type: ignore[arg-type]
        body = {"model": MODEL, "messages": messages, "max_tokens": 12}
        assert answer.choices[0].message.content == expected_text(body, 12)
        assert s.sim.stats()["requests_received"] == 1


@pytest.mark.timeout(60)
def test_a_plain_call_that_outlasts_the_llama_stack_client_read_timeout_is_answered_once() -> None:
    from llama_stack_client import LlamaStackClient

    with make_stack(fast_sim(itl_ms=250.0)) as s:
        client = LlamaStackClient(base_url=s.url, timeout=1.0, max_retries=2)
        messages = [{"role": "user", "content": "slow plain too"}]
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)  # type: ignore[arg-type]
        body = {"model": MODEL, "messages": messages, "max_tokens": 12}
        assert answer.choices[0].message.content == expected_text(body, 12)  # type: ignore[union-attr]
        assert s.sim.stats()["requests_received"] == 1


def test_a_failure_after_interim_responses_keeps_its_own_status() -> None:
    # The engine runs out of memory 7 tokens in, past two 102s: the call is answered with an
    # error status (a client may retry it as it would any), never a 200.
    sim = fast_sim(itl_ms=200.0, memory_tokens=14, publish_kv_cache=False)
    with make_stack(sim, heartbeat=0.2) as s:
        got = raw_post(s.url, chat_body("dies", max_tokens=12, stream=False), read_timeout=0.5)
        assert got.startswith(b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n")
        head, body = got.rsplit(b"\r\n\r\n", 1)
        status = int(head.rsplit(b"HTTP/1.1 ", 1)[1][:3])
        assert status >= 500, got
        assert b"content-type: application/json" in head.lower()
        assert "error" in orjson.loads(body)


def test_interim_responses_go_only_to_a_client_that_states_its_read_timeout() -> None:
    with make_stack(fast_sim(itl_ms=150.0), heartbeat=0.2) as s:
        body = chat_body("raw", max_tokens=8, stream=False)
        stated = raw_post(s.url, body, read_timeout=0.5)
        assert stated.startswith(b"HTTP/1.1 102 Processing\r\n\r\n")
        assert b"HTTP/1.1 200 OK" in stated
        silent = raw_post(s.url, body, read_timeout=None)
        assert silent.startswith(b"HTTP/1.1 200 OK")
