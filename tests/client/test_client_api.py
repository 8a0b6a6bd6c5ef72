"""The client's surface: typed results, options, hooks, logging, the chat command."""

from __future__ import annotations

import logging

import pytest
from client_fakes import FakeClock, FakeServer, Req, plain_stream, run, serve

from streamsafe.client import (
    AsyncClient,
    ChatCompletionChunk,
    Client,
    RetryEvent,
    ServiceUnavailableError,
    Timeouts,
)
from streamsafe.client.cli import main as chat_main
from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from streamsafe.retry import RetryBudget, RetryPolicy, StreamingConfig


def test_typed_results_give_attribute_access_and_their_plain_dict():
    data = {
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}],
        "usage": None,
    }
    chunk = ChatCompletionChunk(data)
    assert chunk.choices[0].delta.content == "hi"
    assert chunk.choices[0].delta.role is None  # absent field reads as None
    assert chunk["choices"][0]["index"] == 0 and "usage" in chunk
    assert chunk.to_dict() is data
    assert chunk == data and len(chunk.choices) == 1
    assert [c.index for c in chunk.choices] == [0]
    with pytest.raises(KeyError):
        chunk["missing"]
    assert "hi" in repr(chunk)


def test_timeouts_from_a_number_or_none():
    t = Timeouts.of(3)
    assert (t.connect, t.first_byte, t.idle, t.total) == (3.0, 3.0, 3.0, None)
    assert Timeouts.of(None).idle is None
    assert Timeouts.of(t) is t and t.replace(total=9).total == 9


def _always_503() -> FakeServer:
    async def handler(req: Req) -> None:
        await req.status(503, None, {"Retry-After": "1"})

    return FakeServer(handler)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_decision_is_one_log_line_and_calls_the_hook(mode, caplog):
    app = _always_503()
    events: list[RetryEvent] = []
    with serve(app) as server, caplog.at_level(logging.INFO, logger="streamsafe.client"):
        [res] = run(mode, {"base_url": server.url + "/v1", "on_retry": events.append})
    assert isinstance(res.error, ServiceUnavailableError)
    lines = [r.getMessage() for r in caplog.records if r.name == "streamsafe.client"]
    assert lines == [
        "retrying in 1.00 s, attempt 2/3: status 503",
        "retrying in 1.00 s, attempt 3/3: status 503",
        "giving up on POST /chat/completions: status 503: 3 attempts made, retries exhausted",
    ]
    assert [e.attempts for e in events] == [1, 2]
    assert events[0].action == "retry" and events[0].outcome.status_code == 503
    assert events[0].idempotency_key == events[1].idempotency_key


def test_with_options_changes_settings_and_shares_pool_and_budget():
    app = _always_503()
    clock = FakeClock()
    # One whole retry per call, no floor: what is left shows every call drew on this budget.
    budget = RetryBudget(1.0, min_per_second=0, clock=clock.time)
    with serve(app) as server:
        client = Client(base_url=server.url + "/v1", budget=budget, sleep=clock.sleep)
        quick = client.with_options(retry=RetryPolicy(max_retries=0), timeout=5)
        assert quick.budget is budget and quick._http is client._http
        assert quick.settings.timeouts.first_byte == 5.0
        with pytest.raises(ServiceUnavailableError):
            quick.chat.completions.create(model="m", messages=[])
        assert len(app.requests) == 1
        with pytest.raises(ServiceUnavailableError):
            client.chat.completions.create(model="m", messages=[], retry=RetryPolicy(max_retries=1))
        assert len(app.requests) == 3
        quick.close()  # does not close the shared pool
        client.close()
    assert budget.balance == 1.0  # two calls deposited a retry each, one retry was spent


async def test_async_with_options_and_per_call_streaming_config():
    app = FakeServer(plain_stream(3))
    async with AsyncClient(base_url="http://127.0.0.1:9/v1") as client:
        with serve(app) as server:
            other = client.with_options(base_url=server.url + "/v1/")
            stream = await other.chat.completions.create(
                model="m",
                messages=[],
                stream=True,
                streaming=StreamingConfig(resume=False),
                idempotency_key="fixed-key",
                temperature=0.5,
            )
            async with stream:
                got = [c async for c in stream]
    assert len(got) == 4 and stream.text == "w0 w1 w2 "
    sent = app.requests[0]
    assert sent.headers["idempotency-key"] == "fixed-key"
    assert sent.json()["temperature"] == 0.5 and sent.json()["stream"] is True


def test_chat_command_prints_the_reply_as_it_streams(capsys):
    sim = Simulator(SimConfig(model="sim-llama-8b", itl_ms=1.0))
    with serve(sim) as server:
        base = ["--base-url", server.url + "/v1", "--model", "sim-llama-8b", "--max-tokens", "8"]
        assert chat_main([*base, "hello there"]) == 0
        streamed = capsys.readouterr().out
        assert chat_main([*base, "--no-stream", "hello there"]) == 0
        plain = capsys.readouterr().out
        assert chat_main([*base, "--model", "nope", "hello"]) == 1
        err = capsys.readouterr().err
    want = expected_text(
        {
            "model": "sim-llama-8b",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 8,
        },
        8,
    )
    assert streamed == want + "\n" and plain == want + "\n"
    assert "404" in err


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_with_options_none_keeps_settings_and_an_unknown_name_is_refused(mode):
    import asyncio

    import httpx2

    app = FakeServer(plain_stream(2))
    with serve(app) as server:
        base = server.url + "/v1"
        if mode == "sync":
            client = Client(base_url=base, api_key="sk-1")
            other_http = httpx2.Client()
            copy = client.with_options(
                base_url=None, api_key=None, retry=None, streaming=None, http_client=other_http
            )
            assert copy._http is other_http
            with copy.chat.completions.create(model="m", messages=[], stream=True) as stream:
                assert stream.text == "" and len(list(stream)) == 3
            with pytest.raises(TypeError, match="bogus"):
                client.with_options(bogus=1)
            client.close()
            assert not other_http.is_closed  # not ours to close
            other_http.close()
        else:

            async def go() -> AsyncClient:
                client = AsyncClient(base_url=base, api_key="sk-1")
                other_http = httpx2.AsyncClient()
                copy = client.with_options(
                    base_url=None, api_key=None, retry=None, streaming=None, http_client=other_http
                )
                assert copy._http is other_http
                stream = await copy.chat.completions.create(model="m", messages=[], stream=True)
                async with stream:
                    assert len([c async for c in stream]) == 3
                with pytest.raises(TypeError, match="bogus"):
                    client.with_options(bogus=1)
                await client.aclose()
                await other_http.aclose()
                return copy

            copy = asyncio.run(go())
    assert copy.base_url == base and copy.settings.api_key == "sk-1"
    assert app.requests[0].headers["authorization"] == "Bearer sk-1"
