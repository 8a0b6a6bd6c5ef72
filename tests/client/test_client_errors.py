"""Every error a caller can meet from the client is a StreamsafeError, drawn in one tree."""

from __future__ import annotations

import re

import pytest
from client_fakes import FakeServer, Req, chunk, run, serve

import streamsafe.client.errors as errors_module
from streamsafe.client import (
    APIConnectionError,
    APIResponseError,
    SSEError,
    StreamInterrupted,
    StreamsafeError,
)
from streamsafe.sse import SSEDecoder, encode_event

MODES = ["sync", "async"]


def test_every_error_class_is_in_the_tree_and_drawn_in_it():
    classes = {
        name: getattr(errors_module, name)
        for name in errors_module.__all__
        if isinstance(getattr(errors_module, name), type)
    }
    assert "SSEError" in classes
    drawn = set(re.findall(r"[├└]── (\w+)", errors_module.__doc__ or ""))
    for name, cls in classes.items():
        assert issubclass(cls, StreamsafeError), name
        if cls is not StreamsafeError:
            assert name in drawn, f"{name} is missing from the tree in client/errors.py"
    assert drawn <= set(classes)


def test_sse_decoder_errors_are_streamsafe_errors_and_value_errors():
    with pytest.raises(StreamsafeError) as info:
        SSEDecoder().feed(b"id: \xff\n\n")
    assert isinstance(info.value, SSEError) and isinstance(info.value, ValueError)
    with pytest.raises(SSEError):
        SSEDecoder(max_line_bytes=8).feed(b"data: far too long a line")


def _stream_of(*parts: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> FakeServer:
    async def handler(req: Req) -> None:
        hdrs = headers or [(b"content-type", b"text/event-stream")]
        await req._send({"type": "http.response.start", "status": 200, "headers": hdrs})
        for part in parts:
            await req.write(part)
        await req.write(b"", more=False)

    return FakeServer(handler)


def _call(mode: str, server, **kw):
    [res] = run(mode, {"base_url": server.url + "/v1"}, **kw)
    return res


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_the_sse_decoder_cannot_read_is_an_api_response_error(mode):
    app = _stream_of(encode_event(chunk(0, "a")), b"id: \xff\n\n")
    with serve(app) as server:
        res = _call(mode, server)
    assert isinstance(res.error, APIResponseError), res.error
    assert isinstance(res.error.__cause__, SSEError)
    assert res.error.attempts == 1 and res.error.idempotency_key is not None
    assert len(app.requests) == 1  # the server would send the same bytes again


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("payload", [b"[1, 2]", b"5", b'"text"', b"null"])
def test_a_stream_event_that_is_not_a_json_object_is_an_api_response_error(mode, payload):
    with serve(_stream_of(b"data: " + payload + b"\n\n")) as server:
        res = _call(mode, server)
    assert isinstance(res.error, APIResponseError), res.error
    assert "not a JSON object" in str(res.error)


@pytest.mark.parametrize("mode", MODES)
def test_odd_choices_read_as_no_text_instead_of_crashing(mode):
    odd = [
        b'data: {"choices": 5}\n\n',
        b'data: {"choices": [7, {"index": 0, "delta": {"content": 3}}]}\n\n',
        encode_event(chunk(0, "ok", finish="stop")),
        b"data: [DONE]\n\n",
    ]
    with serve(_stream_of(*odd)) as server:
        res = _call(mode, server)
    assert res.error is None, res.error
    assert res.text == "ok"


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_whose_content_encoding_does_not_decode_is_an_api_response_error(mode):
    headers = [(b"content-type", b"text/event-stream"), (b"content-encoding", b"gzip")]
    with serve(_stream_of(b"this is not gzip at all", headers=headers)) as server:
        res = _call(mode, server)
    assert isinstance(res.error, APIResponseError), res.error


@pytest.mark.parametrize("mode", MODES)
def test_a_plain_body_whose_content_encoding_does_not_decode_is_an_api_response_error(mode):
    async def handler(req: Req) -> None:
        hdrs = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]
        await req._send({"type": "http.response.start", "status": 200, "headers": hdrs})
        await req.write(b"not gzip either", more=False)

    with serve(FakeServer(handler)) as server:
        res = _call(mode, server, stream=False)
    assert isinstance(res.error, APIResponseError), res.error


@pytest.mark.parametrize("mode", MODES)
def test_a_redirect_loop_is_an_api_response_error(mode):
    async def handler(req: Req) -> None:
        await req.status(307, {}, {"location": req.seen.path})

    with serve(FakeServer(handler)) as server:
        res = _call(mode, server, stream=False)
    assert isinstance(res.error, APIResponseError), res.error
    assert "redirect" in str(res.error).lower()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("base_url", ["ftp://127.0.0.1:9/v1", "http://[::1/v1"])
def test_a_url_no_connection_can_be_made_to_is_an_api_connection_error(mode, base_url):
    [res] = run(mode, {"base_url": base_url})
    assert isinstance(res.error, APIConnectionError), res.error
    assert not isinstance(res.error, StreamInterrupted)


@pytest.mark.parametrize("mode", MODES)
def test_errors_from_every_path_are_caught_by_the_root(mode):
    # One except clause covers them all: what the docs promise a caller.
    servers = [
        _stream_of(b"id: \xff\n\n"),
        _stream_of(b"data: [1]\n\n"),
        _stream_of(encode_event(chunk(0, "cut before done"))),
    ]
    for app in servers:
        with serve(app) as server:
            res = _call(mode, server)
        assert isinstance(res.error, StreamsafeError), res.error
