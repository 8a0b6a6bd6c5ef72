"""Closing is the caller's word: a stream closed from another thread or task ends its reader's
loop and is never resumed; a stream read after a close raises instead of ending as if whole; a
closed client fails with the client's own errors. And two answers that only look like errors
(``"error": null`` in a chunk) or only look like successes (a 200 carrying an error) are read for
what they are; and code written for openai-python's client runs unchanged."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest
from client_fakes import FakeServer, Req, chunk, completion, events, serve

from streamsafe.client import (
    APIConnectionError,
    AsyncClient,
    Client,
    ServiceUnavailableError,
    StreamClosed,
    StreamInterrupted,
)
from streamsafe.sse import DONE_EVENT, encode_event

ARGS: dict[str, Any] = {
    "model": "fake",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
}


def _three_then_hold() -> FakeServer:
    """A resumable stream (the gateway's contract) that sends three events, then holds until
    the client goes away. A resume would be seen as a second request."""

    async def handler(req: Req) -> None:
        await req.start_stream(resumable=True)
        for i, ev in enumerate(events(10)[:3]):
            await req.write(encode_event(ev, id=i))
        await req.wait_disconnect()

    return FakeServer(handler)


def _whole(n: int) -> FakeServer:
    async def handler(req: Req) -> None:
        await req.start_stream(resumable=True)
        for i, ev in enumerate(events(n)):
            await req.write(encode_event(ev, id=i))
        await req.write(DONE_EVENT, more=False)

    return FakeServer(handler)


def test_a_stream_closed_from_another_thread_ends_its_reader_and_is_not_resumed() -> None:
    app = _three_then_hold()
    with serve(app) as srv, Client(base_url=srv.url + "/v1") as client:
        stream = client.chat.completions.create(**ARGS)
        three = threading.Event()
        got: list[Any] = []
        errors: list[BaseException] = []

        def read() -> None:
            try:
                for c in stream:
                    got.append(c)
                    if len(got) == 3:
                        three.set()
            except BaseException as exc:  # handed to the test thread
                errors.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        assert three.wait(10)
        stream.close()  # raised ValueError (generator already executing) before
        reader.join(10)
        assert not reader.is_alive()
        assert errors == [] and len(got) == 3
        assert app.requests[0].disconnected.wait(10)
        assert len(app.requests) == 1 and stream.resumes == 0  # no resume after the close
        with pytest.raises(StreamClosed) as info:
            list(stream)
        assert len(info.value.chunks) == 3


async def test_a_stream_closed_from_another_task_ends_its_reader_and_is_not_resumed() -> None:
    app = _three_then_hold()
    with serve(app) as srv:
        async with AsyncClient(base_url=srv.url + "/v1") as client:
            stream = await client.chat.completions.create(**ARGS)
            three = asyncio.Event()
            got: list[Any] = []

            async def read() -> None:
                async for c in stream:
                    got.append(c)
                    if len(got) == 3:
                        three.set()

            reader = asyncio.create_task(read())
            await asyncio.wait_for(three.wait(), 10)
            await stream.aclose()  # raised RuntimeError (aclose(): already running) before
            await asyncio.wait_for(reader, 10)  # ends without an error
            assert len(got) == 3
            assert await asyncio.to_thread(app.requests[0].disconnected.wait, 10)
            assert len(app.requests) == 1 and stream.resumes == 0
            with pytest.raises(StreamClosed):
                await anext(stream)


def test_a_stream_left_by_a_loop_raises_when_read_again_and_a_whole_one_just_ends() -> None:
    with serve(_whole(6)) as srv, Client(base_url=srv.url + "/v1") as client:
        with client.chat.completions.create(**ARGS) as stream:
            for _ in stream:
                break
            with pytest.raises(StreamClosed):  # it silently yielded nothing before
                for _ in stream:
                    pass
        whole = client.chat.completions.create(**ARGS)
        assert len(list(whole)) == 7
        assert list(whole) == []  # read to its end: iterating again is empty, as openai's
        whole.close()
        assert list(whole) == []


async def test_an_async_stream_left_by_a_loop_raises_when_read_again() -> None:
    with serve(_whole(6)) as srv:
        async with AsyncClient(base_url=srv.url + "/v1") as client:
            stream = await client.chat.completions.create(**ARGS)
            async for _ in stream:
                break
            with pytest.raises(StreamClosed):
                async for _ in stream:
                    pass
            whole = await client.chat.completions.create(**ARGS)
            assert len([c async for c in whole]) == 7
            assert [c async for c in whole] == []


def test_closing_the_client_mid_stream_interrupts_it_and_later_calls_fail_cleanly() -> None:
    app = _three_then_hold()
    with serve(app) as srv:
        client = Client(base_url=srv.url + "/v1")
        stream = client.chat.completions.create(**ARGS)
        chunks = [next(stream) for _ in range(3)]
        client.close()
        with pytest.raises(StreamInterrupted) as info:  # a bare RuntimeError before
            next(stream)
        assert info.value.chunks == chunks
        assert len(app.requests) == 1  # never resumed on the closed client
        with pytest.raises(APIConnectionError, match="client is closed"):
            client.chat.completions.create(**ARGS)


async def test_closing_an_async_client_mid_stream_interrupts_it() -> None:
    app = _three_then_hold()
    with serve(app) as srv:
        client = AsyncClient(base_url=srv.url + "/v1")
        stream = await client.chat.completions.create(**ARGS)
        for _ in range(3):
            await anext(stream)
        await client.aclose()
        with pytest.raises(StreamInterrupted):
            await anext(stream)
        assert len(app.requests) == 1
        with pytest.raises(APIConnectionError, match="client is closed"):
            await client.chat.completions.create(**ARGS)


def test_a_chunk_whose_error_is_null_is_an_ordinary_chunk() -> None:
    async def handler(req: Req) -> None:
        await req.start_stream()
        for i, w in enumerate(["a", "b"]):
            body = chunk(i, w)[:-1] + b',"error":null}'
            await req.write(encode_event(body))
        await req.write(encode_event(chunk(2, None, "stop")) + DONE_EVENT, more=False)

    with serve(FakeServer(handler)) as srv, Client(base_url=srv.url + "/v1") as client:
        stream = client.chat.completions.create(**ARGS)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == "ab"


def test_a_plain_answer_that_carries_an_error_raises_it() -> None:
    # The gateway's JSON keep-alive sends 200 before the work ends; a failure then comes as
    # a 200 whose body is the error.
    failed = {"error": {"message": "engine is down", "type": "service_unavailable", "code": 503}}

    async def handler(req: Req) -> None:
        await req.status(200, failed if req.index == 0 else completion("fine"))

    with serve(FakeServer(handler)) as srv, Client(base_url=srv.url + "/v1") as client:
        plain = {**ARGS, "stream": False}
        with pytest.raises(ServiceUnavailableError, match="engine is down") as info:
            client.chat.completions.create(**plain)
        assert info.value.status_code == 503
        assert client.chat.completions.create(**plain).choices[0].message.content == "fine"


def test_code_written_for_openai_python_runs_unchanged() -> None:
    import httpx
    import httpx2

    async def handler(req: Req) -> None:
        await req.status(200, completion("fine"))

    app = FakeServer(handler)
    with serve(app) as srv:
        # max_retries and an httpx Timeout, as openai.OpenAI takes them (TypeErrors before).
        timeout = httpx.Timeout(7.0, connect=2.0)
        with Client(base_url=srv.url + "/v1", max_retries=5, timeout=timeout) as client:
            assert client.settings.retry.max_retries == 5
            phases = client.settings.timeouts
            assert (phases.connect, phases.first_byte, phases.idle) == (2.0, 7.0, 7.0)
            other = client.with_options(max_retries=0, timeout=httpx2.Timeout(3.0))
            assert other.settings.retry.max_retries == 0
            assert other.settings.timeouts.first_byte == 3.0
            assert client.with_options(max_retries=None).settings.retry.max_retries == 5
            reply = client.chat.completions.create(
                model="fake", messages=ARGS["messages"], extra_query={"api-version": "1"}
            )
            # Results dump as pydantic models do (model_dump was None, so calling it failed).
            assert reply.model_dump() == completion("fine")
            assert reply.model_dump() is not reply.to_dict()
            assert orjson.loads(reply.model_dump_json()) == completion("fine")
            assert orjson.loads(reply.to_json()) == completion("fine")
            with pytest.raises(TypeError):
                Client(base_url=srv.url + "/v1", max_retries=-1)
    seen = app.requests[0]
    assert seen.query == "api-version=1"  # it went into the JSON body before
    assert "api-version" not in orjson.loads(seen.body)
