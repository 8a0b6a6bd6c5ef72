"""The client speaks openai-python's language: its error names and attributes, embeddings and
the Responses API."""

from __future__ import annotations

import asyncio

import httpx2
import orjson
import pytest
from client_fakes import FakeServer, RefusingPort, Req, serve

import streamsafe
from streamsafe.client import AsyncClient, Client
from streamsafe.client import errors as errors_module
from streamsafe.sse import encode_event

pytestmark = pytest.mark.timeout(60)

MODES = ["sync", "async"]

#: openai-python's mapping of a status to its error class (503 is ours, under 5xx).
BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "InternalServerError",
    503: "ServiceUnavailableError",
    418: "APIStatusError",
}


async def _answer_asked_status(req: Req) -> None:
    code = int(req.headers["x-want-status"])
    error = {"message": f"no {code}", "type": "fake_type", "param": "messages", "code": code}
    await req.status(code, {"error": error}, headers={"x-request-id": f"req-{code}"})


def _call_each_status(mode: str, url: str) -> dict[int, BaseException]:
    kw = {"base_url": url, "max_retries": 0, "budget": None}
    args = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    out: dict[int, BaseException] = {}
    if mode == "sync":
        with Client(**kw) as client:
            for code in BY_STATUS:
                try:
                    client.chat.completions.create(
                        **args, extra_headers={"x-want-status": str(code)}
                    )
                except Exception as exc:
                    out[code] = exc
        return out

    async def go() -> None:
        async with AsyncClient(**kw) as client:
            for code in BY_STATUS:
                try:
                    await client.chat.completions.create(
                        **args, extra_headers={"x-want-status": str(code)}
                    )
                except Exception as exc:
                    out[code] = exc

    asyncio.run(go())
    return out


@pytest.mark.parametrize("mode", MODES)
def test_each_status_raises_openais_class_with_openais_attributes(mode):
    with serve(FakeServer(_answer_asked_status)) as server:
        raised = _call_each_status(mode, server.url + "/v1")
    assert set(raised) == set(BY_STATUS)
    for code, err in raised.items():
        assert type(err).__name__ == BY_STATUS[code], (code, err)
        assert isinstance(err, streamsafe.APIStatusError)
        assert isinstance(err, streamsafe.APIError)
        assert isinstance(err, streamsafe.StreamsafeError)
        assert err.status_code == code and err.response.status_code == code
        assert err.request_id == f"req-{code}"
        assert err.message == str(err) and f"no {code}" in err.message
        # As openai-python has it: body is the error object, code/param/type read from it.
        assert err.body == {
            "message": f"no {code}",
            "type": "fake_type",
            "param": "messages",
            "code": code,
        }
        assert (err.code, err.param, err.type) == (code, "messages", "fake_type")
        assert isinstance(err.request, httpx2.Request)
        assert err.request.url.path == "/v1/chat/completions"
        assert err.idempotency_key is not None and err.attempts == 1


def test_503_is_still_a_service_unavailable_error_under_internal_server_error():
    err = errors_module.status_error(503, {"error": {"message": "busy"}}, {"retry-after": "2"})
    assert isinstance(err, streamsafe.ServiceUnavailableError)
    assert isinstance(err, streamsafe.InternalServerError)
    assert err.retry_after == "2" and err.response is None and err.request is None


def test_top_level_exports_every_openai_error_name_with_its_attributes():
    openai = pytest.importorskip("openai")
    names = [
        "APIError",
        "APIStatusError",
        "APIConnectionError",
        "APITimeoutError",
        "BadRequestError",
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        "ConflictError",
        "UnprocessableEntityError",
        "RateLimitError",
        "InternalServerError",
    ]
    for name in names:
        ours, theirs = getattr(streamsafe, name), getattr(openai, name)
        assert name in streamsafe.__all__
        assert ours is getattr(streamsafe.client, name) is getattr(errors_module, name)
        # The same family tree, name for name.
        for parent in theirs.__mro__[1:]:
            if parent.__module__.startswith("openai") and parent.__name__ in names:
                assert issubclass(ours, getattr(streamsafe, parent.__name__)), (name, parent)
    status = errors_module.status_error(
        404, {"error": {"message": "gone", "code": "x"}}, {"x-request-id": "r1"}
    )
    for attr in ("status_code", "response", "body", "message", "request_id", "request", "code"):
        assert hasattr(status, attr), attr
    assert (status.request_id, status.code, status.message) == ("r1", "x", "status 404: gone")


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_connection_is_an_api_error_carrying_its_request(mode):
    with RefusingPort() as port:
        kw = {"base_url": port.url, "max_retries": 0}
        args = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        if mode == "sync":
            with Client(**kw) as client, pytest.raises(streamsafe.APIConnectionError) as info:
                client.chat.completions.create(**args)
        else:

            async def go() -> None:
                async with AsyncClient(**kw) as client:
                    await client.chat.completions.create(**args)

            with pytest.raises(streamsafe.APIConnectionError) as info:
                asyncio.run(go())
    err = info.value
    assert isinstance(err, streamsafe.APIError) and err.body is None
    assert isinstance(err.request, httpx2.Request) and err.request.method == "POST"


# -- embeddings and the Responses API ---------------------------------------------------------

RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "error": None,
    "output": [
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Hello "},
                {"type": "output_text", "text": "there"},
            ],
        }
    ],
}


def _response_events() -> list[bytes]:
    evs = [{"type": "response.created", "response": {**RESPONSE, "status": "in_progress"}}]
    evs += [{"type": "response.output_text.delta", "delta": d} for d in ("Hel", "lo ", "there")]
    evs.append({"type": "response.completed", "response": RESPONSE})
    return [
        encode_event(orjson.dumps({**e, "sequence_number": i}), event=e["type"])
        for i, e in enumerate(evs)
    ]


async def _openai_routes(req: Req) -> None:
    body = req.seen.json()
    if req.seen.path == "/v1/embeddings":
        data = [{"object": "embedding", "index": 0, "embedding": [0.5, -1.0]}]
        await req.status(200, {"object": "list", "data": data, "model": body["model"]})
    elif req.seen.path == "/v1/responses" and body.get("stream"):
        await req.start_stream()
        for ev in _response_events():
            await req.write(ev)
        await req.write(b"", more=False)  # the Responses API ends without [DONE]
    elif req.seen.path == "/v1/responses":
        await req.status(200, RESPONSE)
    else:
        await req.status(404)


def _use_openai_routes(mode: str, url: str) -> tuple[object, object, object, list[object]]:
    if mode == "sync":
        with Client(base_url=url) as client:
            emb = client.embeddings.create(model="e", input=["a"], encoding_format="float")
            resp = client.responses.create(model="m", input="hi", max_output_tokens=5)
            with client.responses.create(model="m", input="hi", stream=True) as stream:
                evs = list(stream)
            return emb, resp, stream, evs

    async def go() -> tuple[object, object, object, list[object]]:
        async with AsyncClient(base_url=url) as client:
            emb = await client.embeddings.create(model="e", input=["a"], encoding_format="float")
            resp = await client.responses.create(model="m", input="hi", max_output_tokens=5)
            async with await client.responses.create(model="m", input="hi", stream=True) as s:
                evs = [ev async for ev in s]
            return emb, resp, s, evs

    return asyncio.run(go())


@pytest.mark.parametrize("mode", MODES)
def test_embeddings_and_responses_as_openai_python_calls_them(mode):
    app = FakeServer(_openai_routes)
    with serve(app) as server:
        emb, resp, stream, evs = _use_openai_routes(mode, server.url + "/v1")
    assert emb.data[0].embedding == [0.5, -1.0] and emb.model == "e"  # type: ignore[attr-defined]
    assert resp.output_text == "Hello there" and resp.id == "resp_1"  # type: ignore[attr-defined]
    assert [e.type for e in evs][-1] == "response.completed"  # type: ignore[attr-defined]
    assert stream.text == "Hello there"  # type: ignore[attr-defined]
    sent = [(r.path, r.json()) for r in app.requests]
    assert sent[0] == ("/v1/embeddings", {"model": "e", "input": ["a"], "encoding_format": "float"})
    assert sent[1] == ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 5})
    assert sent[2] == ("/v1/responses", {"model": "m", "input": "hi", "stream": True})
    # Each is one logical call with a key of its own, sent once.
    keys = app.keys()
    assert len(keys) == 3 and None not in keys and len(set(keys)) == 3
