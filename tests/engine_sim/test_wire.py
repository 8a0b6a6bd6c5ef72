"""The wire format: the real openai client parses everything, and the bytes have vLLM's shape."""

from __future__ import annotations

import httpx2
import orjson
from openai import OpenAI

from streamsafe.engine_sim import expected_text
from streamsafe.sse import SSEDecoder
from streamsafe.tokens import estimate_prompt_tokens

MODEL = "sim-llama-8b"


def _client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def test_openai_client_parses_a_chat_completion(serve, body):
    _sim, server = serve()
    req = body("what is up", max_tokens=7)
    out = _client(server).chat.completions.create(**req)
    assert out.object == "chat.completion"
    assert out.model == MODEL
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected_text(req, 7)
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens == estimate_prompt_tokens(req)
    assert out.usage.total_tokens == 7 + estimate_prompt_tokens(req)


def test_openai_client_parses_a_chat_stream_with_usage(serve, body):
    _sim, server = serve()
    req = body("stream me", max_tokens=6)
    chunks = list(
        _client(server).chat.completions.create(
            **req, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    content = [c for c in chunks if c.choices]
    assert len(content) == 1 + 6
    assert [c.choices[0].finish_reason for c in content] == [None] * 6 + ["length"]
    assert "".join(c.choices[0].delta.content or "" for c in content) == expected_text(req, 6)
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_openai_client_parses_completions_streaming_and_not(serve):
    _sim, server = serve()
    client = _client(server)
    req = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5}
    out = client.completions.create(**req)
    assert out.object == "text_completion"
    assert out.choices[0].text == expected_text(req, 5)
    assert out.usage is not None and out.usage.completion_tokens == 5
    chunks = list(client.completions.create(**req, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected_text(req, 5)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stream_bytes_have_vllm_shape(serve, body):
    _sim, server = serve()
    with (
        httpx2.Client() as http,
        http.stream(
            "POST", server.url + "/v1/chat/completions", json=body(max_tokens=3, stream=True)
        ) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(resp.iter_bytes())
    assert b"\nid:" not in raw and not raw.startswith(b"id:")
    events = SSEDecoder().feed(raw)
    assert events[-1].is_done
    first = orjson.loads(events[0].raw)
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert set(first) == {"id", "object", "created", "model", "choices"}
    last = orjson.loads(events[-2].raw)
    assert last["choices"][0]["finish_reason"] == "length"


def test_models_lists_the_served_model(serve):
    _sim, server = serve()
    models = _client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_health_is_ok_while_the_engine_lives(serve):
    _sim, server = serve()
    assert httpx2.get(server.url + "/health").status_code == 200


def test_metrics_use_vllm_names(serve, body):
    _sim, server = serve()
    _client(server).chat.completions.create(**body(max_tokens=2))
    text = httpx2.get(server.url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert f'{name}{{model_name="{MODEL}"}} ' in text
    assert 'vllm:generation_tokens_total{model_name="sim-llama-8b"} 2.0' in text


def test_stats_endpoint_reports_every_issue_key(serve, body):
    sim, server = serve()
    _client(server).chat.completions.create(**body(max_tokens=3))
    stats = httpx2.get(server.url + "/stats").json()
    for key in (
        "requests_received",
        "generations_started",
        "generations_completed",
        "generations_aborted",
        "generations_failed",
        "active",
        "waiting",
        "peak_active",
        "memory_used_tokens",
        "memory_peak_tokens",
        "memory_capacity_tokens",
        "engine_dead",
        "crashes",
        "tokens_generated",
        "tokens_unread",
    ):
        assert key in stats
    assert stats["requests_received"] == stats["generations_completed"] == 1
    assert stats["tokens_generated"] == 3 and stats["tokens_unread"] == 0
    assert sim.memory_series()[-1][1] >= 0


def test_llama_stack_paths_serve_llama_stack_client_without_done(serve, body):
    import httpx
    from llama_stack_client import LlamaStackClient

    _sim, server = serve()
    client = LlamaStackClient(base_url=server.url, timeout=httpx.Timeout(10), max_retries=0)
    stream = client.chat.completions.create(**body("hi", max_tokens=3), stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(text.split()) == 3
    raw = httpx.post(
        server.url + "/v1/openai/v1/chat/completions",
        json={**body("hi", max_tokens=2), "stream": True},
        timeout=10,
    ).text
    assert "[DONE]" not in raw
    assert raw.count("data: ") == 3  # the role event and two tokens, no [DONE]


def test_tokenize_counts_the_prompt_as_a_completion_does(serve, body):
    _sim, server = serve()
    req = body("count my words please", max_tokens=3)
    with httpx2.Client(base_url=server.url) as http:
        done = http.post("/v1/chat/completions", json=req).json()
        chat = http.post("/tokenize", json={"model": MODEL, "messages": req["messages"]})
        assert chat.status_code == 200
        assert chat.json()["count"] == done["usage"]["prompt_tokens"]
        assert len(chat.json()["tokens"]) == chat.json()["count"]
        prompt = {"model": MODEL, "prompt": "one two three", "max_tokens": 2}
        text = http.post("/v1/completions", json=prompt).json()
        counted = http.post("/tokenize", json={"model": MODEL, "prompt": "one two three"})
        assert counted.json()["count"] == text["usage"]["prompt_tokens"]
        for bad in (b"{", b"[]", b'{"messages": "x"}', b'{"prompt": 3}'):
            refused = http.post("/tokenize", content=bad)
            assert refused.status_code == 400
            assert "message" in refused.json()["error"]
