"""Unmodified SDKs made retry-safe by ``streamsafe.http_client()``: one engine request per
logical call in a retry storm, one key across an SDK's retries, no retry of what may have
started, and a broken stream of the gateway resumed before the SDK sees it."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from client_fakes import (
    FakeServer,
    RawConn,
    RawServer,
    Req,
    cutting_proxy,
    resumable_stream,
    serve,
    words,
)
from gateway_helpers import MODEL, fast_sim, make_stack

import streamsafe
from streamsafe.engine_sim import Simulator
from streamsafe.server import ServerThread
from waiting import wait_until

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(60)

CALLS = 8
#: The storm: a 1 s client timeout, the SDK's 2 retries, an engine that needs about 1.5 s for
#: each of the 8 concurrent calls (60 tokens at 25 ms).
TIMEOUT, TOKENS = 1.0, 60


def _busy_sim() -> Simulator:
    return Simulator(fast_sim(itl_ms=25.0, default_max_tokens=TOKENS))


def _storm(make: Callable[[int], Any]) -> list[str]:
    """CALLS concurrent plain calls, each from a client ``make(i)`` builds: what each gave."""
    out = [""] * CALLS

    def one(i: int) -> None:
        client = make(i)
        messages = [{"role": "user", "content": f"question {i}"}]
        try:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS)
            out[i] = "ok"
        except Exception as exc:
            out[i] = type(exc).__name__

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def _openai(url: str, **kw: Any) -> Any:
    return openai.OpenAI(base_url=url, api_key="k", timeout=TIMEOUT, max_retries=2, **kw)


def test_storm_straight_to_the_engine_sends_one_request_per_call_with_http_client() -> None:
    sim = _busy_sim()
    with ServerThread(sim) as server:
        url = server.url + "/v1"
        # The control: the plain SDK times out three times per call, each a new generation.
        plain = _storm(lambda i: _openai(url))
        assert plain == ["APITimeoutError"] * CALLS
        wait_until(lambda: sim.stats()["active"] == 0, what="the engine to drop the copies")
        assert sim.stats()["requests_received"] == 3 * CALLS
        # The same SDK with streamsafe's HTTP client: one generation per call, all answered.
        safe = _storm(lambda i: _openai(url, http_client=streamsafe.http_client()))
        assert safe == ["ok"] * CALLS
        stats = sim.stats()
    assert stats["requests_received"] == 4 * CALLS
    assert stats["generations_completed"] == CALLS


def test_async_sdk_storm_sends_one_request_per_call() -> None:
    sim = _busy_sim()

    async def storm() -> list[Any]:
        client = openai.AsyncOpenAI(
            base_url=url,
            api_key="k",
            timeout=TIMEOUT,
            max_retries=2,
            http_client=streamsafe.async_http_client(),
        )
        calls = [
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"async {i}"}],
                max_tokens=TOKENS,
            )
            for i in range(CALLS)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    with ServerThread(sim) as server:
        url = server.url + "/v1"
        answers = asyncio.run(storm())
        stats = sim.stats()
    assert [type(a).__name__ for a in answers] == ["ChatCompletion"] * CALLS
    assert stats["requests_received"] == CALLS and stats["generations_aborted"] == 0


def test_a_stream_held_before_its_headers_is_waited_on_not_sent_again() -> None:
    # A middle layer that answers a stream only with its first token (1.5 s of prefill here):
    # the SDK retries a stream until the headers come, each retry a new generation.
    sim = Simulator(
        fast_sim(headers_after_first_token=True, prefill_ms_per_token=100.0, default_max_tokens=8)
    )
    messages = [{"role": "user", "content": "a question of some length here"}]

    def read(**kw: Any) -> str:
        client = openai.OpenAI(base_url=url, api_key="k", timeout=TIMEOUT, max_retries=2, **kw)
        stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ServerThread(sim) as server:
        url = server.url + "/v1"
        with pytest.raises(openai.APITimeoutError):
            read()
        assert sim.stats()["requests_received"] == 3
        assert len(read(http_client=streamsafe.http_client()).split()) == 8
        assert sim.stats()["requests_received"] == 4


def test_llama_stack_client_takes_an_httpx_client_and_sends_one_request() -> None:
    lsc = pytest.importorskip("llama_stack_client")
    sim = _busy_sim()
    with ServerThread(sim) as server:
        client = lsc.LlamaStackClient(
            base_url=server.url,
            timeout=TIMEOUT,
            max_retries=2,
            http_client=streamsafe.http_client(package="httpx"),
        )
        messages = [{"role": "user", "content": "one"}]
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS)
        assert answer.choices[0].message.content  # type: ignore[union-attr]
        assert sim.stats()["requests_received"] == 1


def _keyed(statuses: list[int]) -> FakeServer:
    """Answers the i-th request with ``statuses[i]`` (a 200 past the list)."""

    async def handler(req: Req) -> None:
        code = statuses[req.index] if req.index < len(statuses) else 200
        if code == 200:
            choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}}
            await req.status(200, {"id": "c", "object": "chat.completion", "choices": [choice]})
        else:
            await req.status(code, headers={"retry-after": "0"})

    return FakeServer(handler)


def _one_call(url: str, **kw: Any) -> Any:
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=2, **kw)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1
    )


def test_every_request_of_a_logical_call_carries_its_one_key() -> None:
    app = _keyed([503, 429])
    with serve(app) as server:
        http = streamsafe.http_client()
        _one_call(server.url + "/v1", http_client=http)
        _one_call(server.url + "/v1", http_client=http)
    # Nothing started on a 503 or a 429: the SDK's retries go out, with the call's key.
    counts = [r.headers["x-stainless-retry-count"] for r in app.requests]
    keys = app.keys()
    assert counts == ["0", "1", "2", "0"]
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert all(k and k.startswith("streamsafe-") for k in keys)


@pytest.mark.parametrize("status", [500, 502, 504])
def test_an_answer_that_may_have_started_work_is_not_retried(status: int) -> None:
    app = _keyed([status] * 4)
    with serve(app) as server:
        with pytest.raises(openai.InternalServerError):
            _one_call(server.url + "/v1", http_client=streamsafe.http_client())
        assert len(app.requests) == 1
        # The control: the plain SDK sends it three times.
        with pytest.raises(openai.InternalServerError):
            _one_call(server.url + "/v1")
        assert len(app.requests) == 4


ANSWER = b'{"id": "c", "object": "chat.completion", "choices": []}'


def test_a_request_lost_after_it_was_sent_is_not_sent_again() -> None:
    def read_then_hang_up(conn: RawConn) -> None:
        conn.read_request()  # the server has it, and closes without a word

    with RawServer(read_then_hang_up) as server:
        with pytest.raises(openai.APIConnectionError):
            _one_call(server.url, http_client=streamsafe.http_client())
        assert len(server.conns) == 1
        # The control: the plain SDK sends it three times.
        with pytest.raises(openai.APIConnectionError):
            _one_call(server.url)
        assert len(server.conns) == 4


def test_a_lost_request_to_a_server_that_keys_its_work_is_sent_again() -> None:
    # The first answer names its generation, as the gateway's do; the next call's first
    # request is lost: its retry goes out (the gateway would attach it by its key).
    def handler(conn: RawConn) -> None:
        conn.read_request()
        if conn.index != 1:
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"x-streamsafe-generation: g%d\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % (conn.index, len(ANSWER))
            )
            conn.sock.sendall(head + ANSWER)

    with RawServer(handler) as server:
        http = streamsafe.http_client()
        _one_call(server.url, http_client=http)
        _one_call(server.url, http_client=http)
        assert len(server.conns) == 3
        keys = [c.headers["idempotency-key"] for c in server.conns]
        assert keys[0] != keys[1] == keys[2]


def test_an_attempt_no_retry_claims_is_closed_after_the_grace() -> None:
    async def hold(req: Req) -> None:
        await req.wait_disconnect()

    app = FakeServer(hold)

    async def call() -> None:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1",
            api_key="k",
            timeout=0.3,
            max_retries=0,
            http_client=streamsafe.async_http_client(grace=0.2),
        )
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}]
            )
        # The SDK gave up; the attempt ran on until the grace passed, then its connection closed.
        assert not app.requests[0].disconnected.is_set()
        await asyncio.to_thread(app.requests[0].disconnected.wait, 5)

    with serve(app) as server:
        asyncio.run(call())
        assert app.requests[0].disconnected.is_set() and len(app.requests) == 1


def _read_stream(url: str, **kw: Any) -> str:
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=2, **kw)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "tell me"}], stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_a_broken_resumable_stream_is_resumed_before_the_sdk_sees_it() -> None:
    app = FakeServer(resumable_stream(12, cut_every=5))
    with serve(app) as server:
        text = _read_stream(server.url + "/v1", http_client=streamsafe.http_client())
    assert text == "".join(words(12))
    # 13 events (12 words and the finishing chunk), cut after every 5: two resumes.
    assert [r.headers.get("last-event-id") for r in app.requests] == [None, "4", "9"]
    assert len(set(app.keys())) == 1


def test_the_async_sdk_gets_a_broken_resumable_stream_whole() -> None:
    app = FakeServer(resumable_stream(12, cut_every=4))

    async def read() -> str:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="k", http_client=streamsafe.async_http_client()
        )
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "tell me"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    with serve(app) as server:
        assert asyncio.run(read()) == "".join(words(12))
    assert [r.headers.get("last-event-id") for r in app.requests] == [None, "3", "7", "11"]


def test_through_a_flaky_network_to_the_gateway_every_chunk_arrives_once() -> None:
    rng = random.Random(7)
    with make_stack(fast_sim(default_max_tokens=40)) as s:
        proxy = cutting_proxy(s.url, rng, share=0.7, events=(3, 12))
        with serve(proxy) as server:
            texts = [
                _read_stream(server.url + "/v1", http_client=streamsafe.http_client())
                for _ in range(3)
            ]
            # The control: the plain SDK meets the break as an error.
            with pytest.raises(openai.APIConnectionError):
                for _ in range(5):
                    _read_stream(server.url + "/v1")
        stats = s.sim.stats()
    assert len({len(t.split()) for t in texts}) == 1 and len(texts[0].split()) == 40
    # Each logical call was one generation, however many times its stream broke.
    assert stats["generations_started"] <= 3 + 5
