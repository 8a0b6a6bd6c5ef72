"""Bad input gets vLLM's answer (400 with an OpenAI-style error body, 404 for an unknown model)
and costs the engine nothing."""

from __future__ import annotations

import httpx2
import openai
import pytest
from openai import OpenAI

MODEL = "sim-llama-8b"


def _post(server, path, content, **kw):
    return httpx2.post(server.url + path, content=content, **kw)


def _error(resp, code):
    assert resp.status_code == code
    err = resp.json()["error"]
    assert err["code"] == code and isinstance(err["message"], str) and err["type"]
    return err


def test_malformed_json_is_a_400(serve):
    sim, server = serve()
    err = _error(_post(server, "/v1/chat/completions", b'{"model": "sim'), 400)
    assert err["type"] == "BadRequestError"
    assert sim.stats()["generations_started"] == 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL}),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}),
        ("/v1/chat/completions", {"model": MODEL, "messages": ["hi"]}),
        ("/v1/chat/completions", [1, 2]),
        ("/v1/completions", {"model": MODEL}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}], "max_tokens": 0}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}], "stream": "y"}),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "9.5"}),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "5e3"}),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}),
        *(
            (
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": [part]}]},
            )
            for part in (
                {"type": "text", "text": 5},
                {"type": "text", "text": None},
                {"type": "text", "text": ["a"]},
                {"text": "no type"},
                "not an object",
            )
        ),
    ],
)
def test_missing_or_wrong_fields_are_a_400(serve, path, body):
    sim, server = serve()
    err = _error(httpx2.post(server.url + path, json=body), 400)
    assert sim.stats()["generations_started"] == 0
    messages = body.get("messages") if isinstance(body, dict) else None
    if messages and isinstance(messages[0], dict) and isinstance(messages[0].get("content"), list):
        assert "messages[0].content[0]" in err["message"]  # names the field


def test_unknown_model_is_a_404_the_client_understands(serve):
    _sim, server = serve()
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert "gpt-9" in str(info.value)


def test_openai_client_sees_a_bad_request_error(serve):
    _sim, server = serve()
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])


def test_oversized_body_is_a_413(serve):
    _sim, server = serve(max_body_bytes=1000)
    body = b'{"model": "sim-llama-8b", "prompt": "' + b"x" * 5000 + b'"}'
    _error(_post(server, "/v1/completions", body), 413)


def test_unknown_path_is_a_404_and_wrong_method_a_405(serve):
    _sim, server = serve()
    _error(httpx2.get(server.url + "/v1/nothing"), 404)
    _error(httpx2.get(server.url + "/v1/chat/completions"), 405)


def test_the_model_field_defaults_to_the_served_model(serve):
    # vLLM accepts a request without "model" and serves its one model.
    _sim, server = serve()
    resp = httpx2.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert resp.status_code == 200 and resp.json()["model"] == MODEL


@pytest.mark.parametrize("written", ["3", " +3 ", 3.0, "3.00", "0_3"])
def test_numbers_are_read_as_vllm_reads_them(serve, written):
    # vLLM's pydantic models read integers leniently: "3" and 3.0 ask for three tokens.
    _sim, server = serve()
    body = {"model": MODEL, "prompt": "x", "max_tokens": written}
    resp = httpx2.post(server.url + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 3


def test_a_completion_without_max_tokens_gets_vllms_default_of_16(serve):
    _sim, server = serve()
    resp = httpx2.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert resp.json()["usage"]["completion_tokens"] == 16
