"""Every vLLM route through the gateway answers as the real vLLM (0.32) answers straight: the
same status and the same JSON keys (issue 31, item 1), the tiny generative model's 404 for the
pooling and audio routes it does not serve included; an operator route is refused without the
gateway's admin key and passes with it. One vLLM, the session's."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest
from vllm_helpers import gateway

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(180, func_only=True)


#: vLLM's pooling routes: not served for a generative model.
POOLING = ("/v1/embeddings", "/pooling", "/classify", "/score", "/v1/rerank", "/v2/rerank")


def _shape(response: httpx2.Response) -> tuple[int, Any]:
    """The status and the body's shape: its JSON keys, or its length where it is no object."""
    try:
        doc = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.status_code, len(response.content)
    return response.status_code, sorted(doc) if isinstance(doc, dict) else type(doc).__name__


def _calls(model: str) -> list[tuple[str, str, Any]]:
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return [
        ("POST", "/tokenize", {"model": model, "prompt": "hello there"}),
        ("POST", "/tokenize", chat),
        ("POST", "/detokenize", {"model": model, "tokens": [1, 2, 3]}),
        ("POST", "/tokenize", {"model": "no-such-model", "prompt": "x"}),
        ("POST", "/v1/chat/completions/render", chat),
        ("POST", "/v1/responses", {"model": model, "input": "hi", "max_output_tokens": 4}),
        ("GET", "/v1/responses/resp_nosuch", None),
        ("POST", "/v1/embeddings", {"model": model, "input": "hi"}),
        ("POST", "/pooling", {"model": model, "input": "hi"}),
        ("POST", "/classify", {"model": model, "input": "hi"}),
        ("POST", "/score", {"model": model, "text_1": "a", "text_2": "b"}),
        ("POST", "/v1/rerank", {"model": model, "query": "q", "documents": ["d"]}),
        ("POST", "/v2/rerank", {"model": model, "query": "q", "documents": ["d"]}),
        ("POST", "/v1/audio/transcriptions", None),
        ("GET", "/version", None),
        ("GET", "/load", None),
        ("GET", "/ping", None),
    ]


def test_every_route_answers_through_the_gateway_as_vllm_answers_straight(
    vllm_engine: VLLMEngine,
) -> None:
    statuses: dict[str, list[int]] = {}
    with gateway(vllm_engine) as gw, httpx2.Client(timeout=60) as client:
        for method, path, body in _calls(vllm_engine.model):
            straight = client.request(method, vllm_engine.url + path, json=body)
            through = client.request(method, gw.url + path, json=body)
            assert _shape(through) == _shape(straight), (method, path, through.text[:300])
            statuses.setdefault(path, []).append(straight.status_code)
    # What vLLM 0.32 answers straight for the tiny generative model: a route it serves is
    # served through the gateway (never the gateway's own 404), one it lacks is its own 404.
    assert statuses == {
        "/tokenize": [200, 200, 404],
        "/detokenize": [200],
        "/v1/chat/completions/render": [403],  # vLLM's scale-out routes are off by default
        "/v1/responses": [200],
        "/v1/responses/resp_nosuch": [404],
        **{path: [404] for path in POOLING},
        "/v1/audio/transcriptions": [404],
        "/version": [200],
        "/load": [200],
        "/ping": [200],
    }


def test_an_operator_route_needs_the_admin_key(vllm_engine: VLLMEngine) -> None:
    # vLLM serves /is_scaling_elastic_ep for a generative model without dev mode; harmless.
    route = "/is_scaling_elastic_ep"
    straight = httpx2.post(vllm_engine.url + route, timeout=30)
    assert straight.status_code == 200
    with (
        gateway(vllm_engine, api_keys=("tenant",), admin_key="admin") as gw,
        httpx2.Client(timeout=30) as client,
    ):
        for key in (None, "tenant"):
            headers = {"authorization": f"Bearer {key}"} if key else {}
            r = client.post(gw.url + route, headers=headers)
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        r = client.post(gw.url + route, headers={"authorization": "Bearer admin"})
        assert r.status_code == 200 and r.json() == straight.json()
