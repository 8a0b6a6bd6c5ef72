"""Deterministic text: a function of (prompt, seed, position) only, reproducible with
expected_text, and continued exactly by a resumed request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI

from streamsafe.engine_sim import VOCABULARY, expected_text

pytestmark = pytest.mark.unit

MODEL = "sim-llama-8b"


@pytest.mark.integration
def test_same_prompt_and_seed_give_the_same_text_across_servers(serve, body):
    req = body("tell me a story", max_tokens=12)
    texts = []
    for _ in range(2):
        _sim, server = serve(seed=7)
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(**req, stream=True)
            if c.choices
        )
        texts.append(streamed)
        texts.append(client.chat.completions.create(**req).choices[0].message.content)
    assert len(set(texts)) == 1
    assert texts[0] == expected_text(req, 12, seed=7)


def test_a_different_seed_or_prompt_gives_different_text(body):
    req = body("a", max_tokens=20)
    assert expected_text(req, 20, seed=0) != expected_text(req, 20, seed=1)
    assert expected_text(req, 20) != expected_text(body("b"), 20)


@pytest.mark.integration
def test_resumed_request_continues_the_same_text(serve, body):
    _sim, server = serve()
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    req = body("resume me", max_tokens=10)
    full = client.chat.completions.create(**req).choices[0].message.content
    assert full is not None
    partial = " ".join(full.split()[:4])
    resumed = dict(req)
    resumed["messages"] = [*req["messages"], {"role": "assistant", "content": partial}]
    resumed["max_tokens"] = 6
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    rest = client.chat.completions.create(**resumed, extra_body=extra).choices[0].message.content
    assert partial + rest == full


@settings(max_examples=50, deadline=None)
@given(
    prompt=st.text(max_size=40), seed=st.integers(0, 2**32), n=st.integers(1, 30), data=st.data()
)
def test_text_has_one_vocabulary_word_per_token_and_resumes_exactly(prompt, seed, n, data):
    req = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    full = expected_text(req, n, seed)
    words = full.split(" ")
    assert len(words) == n and all(w in VOCABULARY for w in words)
    k = data.draw(st.integers(0, n))
    partial = " ".join(words[:k])
    resumed = {
        **req,
        "messages": [*req["messages"], {"role": "assistant", "content": partial}],
        "continue_final_message": True,
    }
    assert partial + expected_text(resumed, n - k, seed) == full
