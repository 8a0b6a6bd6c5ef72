"""The client against small servers with exact fault shapes, sync and async alike.

Retries wait on a fake clock (no real sleeps); what the server saw is counted on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

import orjson
import pytest
from client_fakes import (
    Cut,
    FakeClock,
    FakeServer,
    RawConn,
    RawServer,
    RefusingPort,
    Req,
    ServerThread,
    chunk,
    completion,
    events,
    plain_stream,
    resumable_stream,
    run,
    serve,
    words,
)

from server_stops import wait_stopped
from streamsafe.client import (
    APIConnectionError,
    APIResponseError,
    APITimeoutError,
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    Client,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    RetryBudgetExhausted,
    ServiceUnavailableError,
    StreamError,
    StreamInterrupted,
    Timeouts,
)
from streamsafe.retry import RetryBudget, RetryPolicy, StreamingConfig
from streamsafe.sse import DONE_EVENT, encode_comment, encode_event

MODES = ["sync", "async"]
FULL = "".join(words(8))


def url(server: ServerThread) -> str:
    return server.url + "/v1"


def scripted(*steps):
    """A handler answering request i with steps[i] (the last step repeats)."""

    async def handler(req: Req) -> None:
        step = steps[min(req.index, len(steps) - 1)]
        await step(req)

    return handler


def status(code, headers=None, body=None):
    async def step(req: Req) -> None:
        await req.status(code, body, headers)

    return step


async def hold(req: Req) -> None:
    """Never send headers; wait for the client to give up."""
    await req.wait_disconnect()


async def ok(req: Req) -> None:
    if req.seen.method == "GET":
        await req.status(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
    elif req.seen.json().get("stream"):
        await plain_stream(8)(req)
    else:
        await req.status(200, completion(FULL))


def wait_disconnect(seen, timeout: float = 10.0) -> bool:
    return seen.disconnected.wait(timeout)


# -- first-byte timeout -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_stream_with_headers_held_past_first_byte_timeout_is_sent_once(mode):
    app = FakeServer(scripted(hold, ok))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server), "timeout": Timeouts(first_byte=0.2)})
        assert isinstance(res.error, APITimeoutError)
        assert res.error.phase == "first_byte" and res.error.attempts == 1
        assert len(app.requests) == 1
        assert wait_disconnect(app.requests[0])  # the abandoned attempt was closed


@pytest.mark.parametrize("mode", MODES)
def test_plain_call_with_headers_held_past_first_byte_timeout_is_retried(mode):
    app = FakeServer(scripted(hold, ok))
    clock = FakeClock()
    with serve(app) as server:
        [res] = run(
            mode,
            {"base_url": url(server), "timeout": Timeouts(first_byte=0.2)},
            stream=False,
            clock=clock,
        )
        assert res.error is None
        assert res.value.choices[0].message.content == FULL
        assert len(app.requests) == 2
        assert wait_disconnect(app.requests[0])
        assert [r.headers["x-retry-count"] for r in app.requests] == ["0", "1"]
        assert clock.sleeps == [0.25]  # rand 0.5 * 0.5 s


@pytest.mark.parametrize("mode", MODES)
def test_stream_timeout_retry_is_an_explicit_opt_in(mode):
    app = FakeServer(scripted(hold, ok))
    with serve(app) as server:
        streaming = StreamingConfig(max_retries=1, retry_on_timeout=True)
        kw = {"base_url": url(server), "timeout": Timeouts(first_byte=0.2), "streaming": streaming}
        [res] = run(mode, kw)
        assert res.error is None and res.text == FULL
        assert len(app.requests) == 2


# -- nothing started: 429 / 503 / refused ---------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [True, False])
def test_429_and_503_before_any_work_are_retried_after_the_asked_delay(mode, stream):
    app = FakeServer(
        scripted(status(429, {"Retry-After": "3"}), status(503, {"retry-after-ms": "1500"}), ok)
    )
    clock = FakeClock()
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)}, stream=stream, clock=clock)
        assert res.error is None
        assert clock.sleeps == [3.0, 1.5]
        assert len(app.requests) == 3
        assert len(set(app.keys())) == 1


@pytest.mark.parametrize("mode", MODES)
def test_retry_after_beyond_the_cap_is_not_waited_for(mode):
    app = FakeServer(scripted(status(503, {"Retry-After": "3600"}), ok))
    clock = FakeClock()
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)}, clock=clock)
        assert isinstance(res.error, ServiceUnavailableError)
        assert res.error.retry_after == "3600"
        assert clock.sleeps == [] and len(app.requests) == 1


def sse_over_raw(conn: RawConn) -> None:
    """Answer a raw connection with the 8-word stream (vLLM's shape) and close."""
    conn.read_request()
    body = b"".join(encode_event(e) for e in events(8)) + DONE_EVENT
    conn.respond(200, "text/event-stream", body)


@pytest.mark.parametrize("mode", MODES)
def test_connection_refused_is_retried_until_the_server_is_up(mode):
    with RefusingPort() as port:
        seen = []

        def start_listening(event):
            # The port stayed bound (never free for anyone else) and refused; now it listens.
            seen.append(event.outcome)
            if port.server is None:
                port.listen(sse_over_raw)

        [res] = run(mode, {"base_url": port.url, "on_retry": start_listening})
        assert res.error is None and res.text == FULL
        assert len(seen) == 1 and seen[0].refused
        assert len(port.server.conns) == 1
        assert port.server.conns[0].headers["x-retry-count"] == "1"


@pytest.mark.parametrize("mode", MODES)
def test_connection_refused_everywhere_fails_after_the_policy_retries(mode):
    clock = FakeClock()
    with RefusingPort() as port:
        [res] = run(mode, {"base_url": port.url}, clock=clock)
    assert isinstance(res.error, APIConnectionError) and res.error.refused
    assert res.error.attempts == 3 and len(clock.sleeps) == 2


# -- connection lost after the request was sent, before the headers ---------------------------


def lose_first(n: int):
    """A raw server that reads each of the first ``n`` requests in full and then closes the
    socket without a word (the engine may have the request); later ones are answered."""

    def handler(conn: RawConn) -> None:
        conn.read_request()
        if conn.index < n:
            return  # closed by RawServer without answering
        if orjson.loads(conn.body).get("stream"):
            body = b"".join(encode_event(e) for e in events(8)) + DONE_EVENT
            conn.respond(200, "text/event-stream", body)
        else:
            conn.respond(200, "application/json", orjson.dumps(completion(FULL)))

    return handler


@pytest.mark.parametrize("mode", MODES)
def test_stream_whose_connection_is_lost_before_the_headers_is_not_retried(mode):
    with RawServer(lose_first(1)) as server:
        [res] = run(mode, {"base_url": server.url})
    assert type(res.error) is APIConnectionError and not res.error.refused
    assert "before the response" in str(res.error) and res.error.attempts == 1
    assert len(server.conns) == 1 and server.conns[0].body  # the request did arrive


@pytest.mark.parametrize("mode", MODES)
def test_plain_call_whose_connection_is_lost_before_the_headers_is_retried_by_policy(mode):
    clock = FakeClock()
    with RawServer(lose_first(2)) as server:
        [res] = run(mode, {"base_url": server.url}, stream=False, clock=clock)
    assert res.error is None and res.value.choices[0].message.content == FULL
    assert [c.headers["x-retry-count"] for c in server.conns] == ["0", "1", "2"]
    assert len({c.headers["idempotency-key"] for c in server.conns}) == 1
    assert clock.sleeps == [0.25, 0.5]


@pytest.mark.parametrize("mode", MODES)
def test_stream_whose_connection_is_lost_before_the_headers_is_retried_when_opted_in(mode):
    streaming = StreamingConfig(max_retries=1, retry_on_server_error=True)
    with RawServer(lose_first(1)) as server:
        [res] = run(mode, {"base_url": server.url, "streaming": streaming})
    assert res.error is None and res.text == FULL
    assert len(server.conns) == 2


# -- server errors on a stream -----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_500_on_a_stream_is_not_retried_by_default(mode):
    app = FakeServer(scripted(status(500), ok))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
        assert isinstance(res.error, InternalServerError)
        assert res.error.status_code == 500 and res.error.code == 500
        assert len(app.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_500_on_a_stream_is_retried_when_the_caller_opts_in(mode):
    app = FakeServer(scripted(status(500), ok))
    with serve(app) as server:
        streaming = StreamingConfig(max_retries=1, retry_on_server_error=True)
        [res] = run(mode, {"base_url": url(server), "streaming": streaming})
        assert res.error is None and res.text == FULL
        assert len(app.requests) == 2


@pytest.mark.parametrize("mode", MODES)
def test_plain_call_retries_500_by_default_but_not_x_should_retry_false(mode):
    app = FakeServer(scripted(status(500), ok))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)}, stream=False)
        assert res.error is None and len(app.requests) == 2
    app = FakeServer(scripted(status(500, {"x-should-retry": "false"}), ok))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)}, stream=False)
        assert isinstance(res.error, InternalServerError) and len(app.requests) == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("code", "cls"),
    [(400, BadRequestError), (401, AuthenticationError), (404, NotFoundError)],
)
def test_client_errors_are_typed_and_never_retried(mode, code, cls):
    app = FakeServer(scripted(status(code), ok))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)}, stream=False)
        assert isinstance(res.error, cls) and res.error.status_code == code
        assert f"fake {code}" in str(res.error)
        assert len(app.requests) == 1


# -- resume -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_resumable_server_cutting_at_random_points_gives_exactly_the_uncut_text(mode, seed):
    n = 25
    app = FakeServer(resumable_stream(n, rng=random.Random(seed)))
    resumes = []
    with serve(app) as server:
        kw = {
            "base_url": url(server),
            "streaming": StreamingConfig(max_resumes=1000),
            "on_resume": resumes.append,
        }
        [res] = run(mode, kw)
        assert res.error is None
        assert res.text == "".join(words(n))
        assert [c.to_dict() for c in res.chunks] == [
            __import__("orjson").loads(e) for e in events(n)
        ]
        assert len(app.requests) == len(resumes) + 1 > 1
        assert len(set(app.keys())) == 1
        last_ids = [r.headers.get("last-event-id") for r in app.requests[1:]]
        numeric = [int(x) for x in last_ids if x is not None]
        assert numeric == sorted(numeric)
        assert all(r.headers["x-llamastack-streaming"] == "true" for r in app.requests)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clean", [False, True])
def test_non_resumable_server_cut_raises_stream_interrupted_with_the_exact_partial(mode, clean):
    app = FakeServer(plain_stream(8, cut_after=4, clean=clean))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
        err = res.error
        assert isinstance(err, StreamInterrupted)
        assert err.text == "w0 w1 w2 w3 " and len(err.chunks) == 4
        assert ("truncated" in err.reason) == clean
        assert len(app.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_resumable_stream_without_event_ids_is_not_resumed_once_chunks_arrived(mode):
    # Without an id there is no Last-Event-ID: a resume would replay from the start and the
    # caller would see the first chunks twice.
    evs = events(6)

    async def handler(req: Req) -> None:
        await req.start_stream(resumable=True)
        for i, ev in enumerate(evs):
            if req.index == 0 and i == 2:
                raise Cut
            await req.write(encode_event(ev))
        await req.write(DONE_EVENT, more=False)

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
    assert isinstance(res.error, StreamInterrupted), res.text
    assert res.error.text == "w0 w1 " and len(app.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_resumable_stream_broken_before_any_event_is_resumed_from_the_start(mode):
    async def handler(req: Req) -> None:
        await req.start_stream(resumable=True)
        if req.index == 0:
            await req.write(encode_comment("keep-alive"))
            raise Cut
        for ev in events(8):
            await req.write(encode_event(ev))
        await req.write(DONE_EVENT, more=False)

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
    assert res.error is None and res.text == FULL
    assert [r.headers.get("last-event-id") for r in app.requests] == [None, None]


@pytest.mark.parametrize("mode", MODES)
def test_first_byte_timeout_does_not_apply_between_chunks(mode):
    async def handler(req: Req) -> None:
        await req.start_stream()
        await req.write(encode_event(chunk(0, "slow ")))
        await asyncio.sleep(0.4)  # past first_byte, well within idle
        await req.write(encode_event(chunk(1, "but fine", "stop")))
        await req.write(DONE_EVENT, more=False)

    app = FakeServer(handler)
    with serve(app) as server:
        kw = {"base_url": url(server), "timeout": Timeouts(first_byte=0.2, idle=30.0)}
        [res] = run(mode, kw)
    assert res.error is None and res.text == "slow but fine"


@pytest.mark.parametrize("mode", MODES)
def test_idle_timeout_on_a_resumable_stream_resumes(mode):
    evs = events(6)

    async def handler(req: Req) -> None:
        last = req.headers.get("last-event-id")
        start = 0 if last is None else int(last) + 1
        await req.start_stream(resumable=True)
        for i in range(start, len(evs)):
            if req.index == 0 and i == 3:
                await req.wait_disconnect()  # stall
                return
            await req.write(encode_event(evs[i], id=i))
        await req.write(DONE_EVENT, more=False)

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server), "timeout": Timeouts(idle=0.3)})
        assert res.error is None and res.text == "".join(words(6))
        assert [r.headers.get("last-event-id") for r in app.requests] == [None, "2"]
        assert wait_disconnect(app.requests[0])


@pytest.mark.parametrize("mode", MODES)
def test_idle_timeout_on_a_plain_stream_interrupts_it(mode):
    async def handler(req: Req) -> None:
        await req.start_stream()
        await req.write(encode_event(chunk(0, "a")))
        await req.wait_disconnect()

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server), "timeout": Timeouts(idle=0.2)})
        assert isinstance(res.error, StreamInterrupted)
        assert res.error.text == "a" and "idle timeout" in res.error.reason
        assert wait_disconnect(app.requests[0])


@pytest.mark.parametrize("mode", MODES)
def test_keep_alive_comments_keep_a_slow_stream_from_idling_out(mode):
    async def handler(req: Req) -> None:
        await req.start_stream()
        for _ in range(10):
            await req.write(encode_comment("keep-alive"))
            await asyncio.sleep(0.05)  # the slow stream's pace: the behaviour under test
        await req.write(encode_event(chunk(0, "late", "stop")))
        await req.write(DONE_EVENT, more=False)

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server), "timeout": Timeouts(idle=2.0)})
        assert res.error is None and res.text == "late"


@pytest.mark.parametrize("mode", MODES)
def test_resume_that_the_server_refuses_ends_in_stream_interrupted(mode):
    async def handler(req: Req) -> None:
        if req.index == 0:
            await req.start_stream(resumable=True)
            await req.write(encode_event(chunk(0, "a"), id=0))
            raise Cut
        await req.status(404)

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
        assert isinstance(res.error, StreamInterrupted) and res.error.text == "a"
        assert isinstance(res.error.__cause__, NotFoundError)
        assert len(app.requests) == 2


@pytest.mark.parametrize("mode", MODES)
def test_finish_reason_then_a_clean_end_without_done_is_complete(mode):
    async def handler(req: Req) -> None:
        await req.start_stream()
        await req.write(encode_event(chunk(0, "x")))
        await req.write(encode_event(chunk(1, None, "stop")), more=False)

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
        assert res.error is None and res.text == "x"


# -- errors inside a stream, malformed input -------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_error_event_inside_a_stream_raises_a_typed_error(mode):
    async def handler(req: Req) -> None:
        await req.start_stream()
        await req.write(encode_event(chunk(0, "partial ")))
        err = b'{"error": {"message": "engine died", "type": "EngineDeadError", "code": 500}}'
        await req.write(encode_event(err))
        await req.write(DONE_EVENT, more=False)

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
        err = res.error
        assert isinstance(err, StreamError)
        assert "engine died" in str(err) and err.code == 500 and err.type == "EngineDeadError"
        assert err.text == "partial " and len(err.chunks) == 1
        assert len(app.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_malformed_stream_event_and_body_raise_a_clear_error(mode):
    async def bad_stream(req: Req) -> None:
        await req.start_stream()
        await req.write(encode_event(b"{not json"))
        await req.write(DONE_EVENT, more=False)

    async def bad_body(req: Req) -> None:
        await req._send({"type": "http.response.start", "status": 200, "headers": []})
        await req._send({"type": "http.response.body", "body": b"<html>oops</html>"})

    with serve(FakeServer(bad_stream)) as server:
        [res] = run(mode, {"base_url": url(server)})
        assert isinstance(res.error, APIResponseError) and "not JSON" in str(res.error)
    with serve(FakeServer(bad_body)) as server:
        [res] = run(mode, {"base_url": url(server)}, stream=False)
        assert isinstance(res.error, APIResponseError) and "oops" in str(res.error)
        assert res.error.body == "<html>oops</html>" and res.error.attempts == 1
        assert res.error.idempotency_key is not None


@pytest.mark.parametrize("mode", MODES)
def test_stream_answered_with_a_json_error_body_raises_that_error(mode):
    body = {"error": {"message": "model overloaded", "type": "EngineError", "code": 507}}
    app = FakeServer(status(200, body=body))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
    err = res.error
    assert isinstance(err, StreamError), err
    assert "model overloaded" in str(err) and "application/json" in str(err)
    assert err.code == 507 and err.type == "EngineError" and err.chunks == []
    assert len(app.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_stream_answered_with_a_whole_json_completion_raises_api_response_error_with_it(mode):
    app = FakeServer(status(200, body=completion(FULL)))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
    err = res.error
    assert type(err) is APIResponseError, err
    assert "not an event stream" in str(err) and "application/json" in str(err)
    assert err.body == completion(FULL) and err.idempotency_key == app.keys()[0]
    assert len(app.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_resume_answered_with_json_ends_in_stream_interrupted(mode):
    async def handler(req: Req) -> None:
        if req.index == 0:
            await req.start_stream(resumable=True)
            await req.write(encode_event(chunk(0, "a"), id=0))
            raise Cut
        await req.status(200, {"error": {"message": "generation expired", "code": "gone"}})

    app = FakeServer(handler)
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)})
    assert isinstance(res.error, StreamInterrupted) and res.error.text == "a"
    assert isinstance(res.error.__cause__, StreamError)
    assert "generation expired" in str(res.error.__cause__)
    assert len(app.requests) == 2


# -- budget ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_budget_allows_retries_as_a_share_of_the_calls_made(mode):
    s503 = status(503)
    app = FakeServer(scripted(s503, s503, s503, ok, ok, s503, ok))
    clock = FakeClock()
    # Half a retry per call, no floor: a retry needs two calls' worth.
    budget = RetryBudget(0.5, min_per_second=0, clock=clock.time)
    with serve(app) as server:
        results = run(
            mode, {"base_url": url(server), "budget": budget}, stream=False, calls=5, clock=clock
        )
    errors = [type(r.error).__name__ if r.error else None for r in results]
    assert errors == ["RetryBudgetExhausted", "RetryBudgetExhausted", None, None, None]
    assert isinstance(results[0].error.last_error, ServiceUnavailableError)
    assert results[0].error.attempts == 1 and results[1].error.attempts == 2
    assert len(app.requests) == 7  # call 5 was retried: calls 3 and 4 paid for it
    assert budget.balance == 0.5


# -- connection hygiene and headers -------------------------------------------------------


async def endless(req: Req) -> None:
    await req.start_stream()
    gone = asyncio.ensure_future(req.wait_disconnect())
    i = 0
    while not gone.done():  # uvicorn drops writes after a disconnect; receive() tells
        await req.write(encode_event(chunk(i, "x")))
        i += 1
        await asyncio.sleep(0.01)  # the endless stream's pace


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["break", "raise"])
def test_leaving_a_for_loop_early_without_with_or_close_drops_the_connection(mode, how):
    # The stream object stays referenced: only leaving the loop may close the connection.
    app = FakeServer(endless)

    def body(i: int) -> bool:
        if i == 2 and how == "raise":
            raise LookupError("caller's own error")
        return i == 2

    with serve(app) as server:
        if mode == "sync":
            with Client(base_url=url(server)) as client:
                stream = client.chat.completions.create(model="m", messages=[], stream=True)
                with contextlib.suppress(LookupError):
                    for i, _ in enumerate(stream):
                        if body(i):
                            break
                assert wait_disconnect(app.requests[0], 5.0)
                assert stream.response.is_closed and len(stream.chunks) == 3
        else:

            async def go() -> None:
                async with AsyncClient(base_url=url(server)) as client:
                    stream = await client.chat.completions.create(
                        model="m", messages=[], stream=True
                    )
                    i = 0
                    with contextlib.suppress(LookupError):
                        async for _ in stream:
                            if body(i):
                                break
                            i += 1
                    # Wait off the loop: the close runs on this loop.
                    assert await asyncio.to_thread(wait_disconnect, app.requests[0], 5.0)
                    assert stream.response.is_closed and len(stream.chunks) == 3

            asyncio.run(go())


@pytest.mark.parametrize("mode", MODES)
def test_stream_closed_early_by_the_caller_is_seen_as_a_disconnect(mode, caplog):
    app = FakeServer(endless)
    with serve(app) as server:
        if mode == "sync":
            from streamsafe.client import Client

            with Client(base_url=url(server)) as client:
                stream = client.chat.completions.create(model="m", messages=[], stream=True)
                with stream:
                    for i, _ in enumerate(stream):
                        if i == 2:
                            break
        else:
            from streamsafe.client import AsyncClient

            async def go():
                async with AsyncClient(base_url=url(server)) as client:
                    stream = await client.chat.completions.create(
                        model="m", messages=[], stream=True
                    )
                    async with stream:
                        i = 0
                        async for _ in stream:
                            i += 1
                            if i == 3:
                                break

            # Earlier tests' servers may still be stopping on other threads (server_stops):
            # let them finish, so only this test's records are counted.
            wait_stopped()
            with caplog.at_level(logging.ERROR, logger="asyncio"):
                asyncio.run(go())
            # break then aclose (async with) close once: no failed closing task is logged
            assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
        assert wait_disconnect(app.requests[0])


@pytest.mark.parametrize("mode", MODES)
def test_idempotency_key_is_the_same_across_attempts_and_resumes_and_differs_between_calls(mode):
    async def handler(req: Req) -> None:
        if req.index % 3 == 0:
            await req.status(503, None, {"Retry-After": "0"})
        else:
            await resumable_stream(4, cut_every=2)(
                req
            ) if req.index % 3 == 1 else await resumable_stream(4)(req)

    app = FakeServer(handler)
    with serve(app) as server:
        results = run(mode, {"base_url": url(server)}, calls=2)
    assert [r.error for r in results] == [None, None]
    keys = app.keys()
    assert len(keys) == 6
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert keys[3] == keys[4] == keys[5]
    assert results[0].key == keys[0] and results[1].key == keys[3]
    assert [r.headers["x-retry-count"] for r in app.requests] == ["0", "1", "2"] * 2
    assert app.requests[2].headers["last-event-id"] == "1"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["Idempotency-Key", "idempotency-key"])
def test_a_callers_own_idempotency_key_header_is_the_calls_key_on_every_attempt(mode, name):
    app = FakeServer(scripted(status(503, {"Retry-After": "0"}), ok))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server)}, extra_headers={name: "mine", "ACCEPT": "*/*"})
    assert res.error is None and res.key == "mine"
    assert app.keys() == ["mine", "mine"]
    for seen in app.requests:
        assert seen.names.count("idempotency-key") == 1 and seen.names.count("accept") == 1
        assert seen.headers["accept"] == "*/*"


@pytest.mark.parametrize("mode", MODES)
def test_headers_and_environment_fallbacks(mode, monkeypatch):
    app = FakeServer(ok)
    with serve(app) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", url(server))
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        [a] = run(mode, {}, stream=True)
        [b] = run(mode, {"api_key": "sk-arg"}, stream=False, extra_headers={"X-Extra": "1"})
        [c] = run(mode, {}, kind="models")
    assert (a.error, b.error, c.error) == (None, None, None)
    assert [m.id for m in c.value] == ["fake"] and c.value.data[0].object == "model"
    stream_h, plain_h, get_h = (r.headers for r in app.requests)
    assert stream_h["authorization"] == "Bearer sk-env"
    assert stream_h["x-llamastack-streaming"] == "true"
    assert stream_h["accept"] == "text/event-stream"
    assert plain_h["authorization"] == "Bearer sk-arg" and plain_h["x-extra"] == "1"
    assert "x-llamastack-streaming" not in plain_h
    assert "idempotency-key" in plain_h and "idempotency-key" not in get_h
    assert app.requests[2].method == "GET" and app.requests[2].path == "/v1/models"


@pytest.mark.parametrize("mode", MODES)
def test_total_timeout_bounds_every_attempt_and_wait(mode):
    app = FakeServer(status(503, {"Retry-After": "5"}))
    clock = FakeClock()
    with serve(app) as server:
        kw = {
            "base_url": url(server),
            "timeout": Timeouts(total=8.0),
            "retry": RetryPolicy(max_retries=5),
        }
        [res] = run(mode, kw, stream=False, clock=clock)
    assert isinstance(res.error, ServiceUnavailableError)
    assert clock.sleeps == [5.0] and len(app.requests) == 2


@pytest.mark.parametrize("mode", MODES)
def test_rate_limit_error_carries_status_body_and_attempts(mode):
    app = FakeServer(status(429, {"Retry-After": "1"}))
    with serve(app) as server:
        [res] = run(mode, {"base_url": url(server), "budget": None}, stream=False)
    err = res.error
    assert isinstance(err, RateLimitError) and not isinstance(err, RetryBudgetExhausted)
    assert (
        err.attempts == 3 and err.body["message"] == "fake 429"
    )  # the error object, as openai-python has it
    assert err.idempotency_key == app.keys()[0]
