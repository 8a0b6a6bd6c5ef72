"""Unmodified Stainless clients (llama-stack-client 0.2.12, openai) behind the gateway: the
original report's retry storm becomes one generation per logical request."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from gateway_helpers import MODEL, chat_body, fast_sim, make_stack

from streamsafe.engine_sim import Fault, expected_text

_SLOW_FIRST_TOKEN = 0.6
_CLIENT_TIMEOUT = 0.25


def _llama_stream(base_url: str, content: str, max_tokens: int, out: dict[str, Any]) -> None:
    from llama_stack_client import LlamaStackClient

    client = LlamaStackClient(base_url=base_url, timeout=_CLIENT_TIMEOUT, max_retries=2)
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            stream=True,
        )
        parts = []
        for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
        out[content] = "".join(parts)
    except Exception as exc:  # reported by the test
        out[content] = exc


def _run_clients(url: str, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    threads = [
        threading.Thread(target=_llama_stream, args=(url, p, max_tokens, out)) for p in prompts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


def test_llama_stack_client_retries_attach_with_first_token_commit() -> None:
    sim = fast_sim(faults=(Fault.parse(f"stall:{_SLOW_FIRST_TOKEN}:1.0"),))
    with make_stack(sim, commit="first-token") as s:
        prompts = ["first user", "second user", "third user"]
        out = _run_clients(s.url, prompts, max_tokens=6)
        for p in prompts:
            assert out[p] == expected_text(chat_body(p, 6), 6, 0), out[p]
        stats = s.gw.stats()
        # The clients timed out waiting for headers and retried: the retries reached us...
        assert stats["retries_seen"] >= len(prompts)
        assert stats["requests_received"] > len(prompts)
        # ...and the engine saw exactly one generation per logical request.
        assert s.sim.stats()["requests_received"] == len(prompts)
        assert s.sim.stats()["generations_started"] == len(prompts)


def test_llama_stack_client_never_times_out_with_early_commit_and_heartbeats() -> None:
    sim = fast_sim(
        faults=(Fault.parse(f"stall:{_SLOW_FIRST_TOKEN}:1.0"),), headers_after_first_token=True
    )
    with make_stack(sim, commit="early", heartbeat=0.05) as s:
        prompts = ["patient one", "patient two"]
        out = _run_clients(s.url, prompts, max_tokens=6)
        for p in prompts:
            assert out[p] == expected_text(chat_body(p, 6), 6, 0), out[p]
        stats = s.gw.stats()
        assert stats["retries_seen"] == 0
        assert stats["requests_received"] == len(prompts)
        assert s.sim.stats()["requests_received"] == len(prompts)


def test_openai_client_streams_through_gateway_with_api_key() -> None:
    import openai

    with make_stack(api_keys=("sk-test",)) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-test", max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == expected_text(chat_body("hi", 5), 5, 0)
        models = client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )


@pytest.mark.parametrize("kept_alive", [True, False])
def test_openai_non_streaming_call_slower_than_its_timeout_gets_one_completion(
    kept_alive: bool,
) -> None:
    # By default the gateway keeps the call alive (102 Processing: openai states its read
    # timeout), so it is never retried; without heartbeats the client times out and retries,
    # and the retry gets the same completion. Either way one engine request. (A read timeout
    # of 0.6 s: interim responses come every 0.3 s, well inside it.)
    import openai

    sim = fast_sim(faults=(Fault.parse("stall:1.5:1.0"),))
    with make_stack(sim, heartbeat=5.0 if kept_alive else 0.0) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", timeout=0.6, max_retries=3)
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "once"}], max_tokens=5
        )
        assert reply.choices[0].message.content == expected_text(chat_body("once", 5), 5, 0)
        assert (s.gw.stats()["retries_seen"] == 0) is kept_alive
        assert s.sim.stats()["requests_received"] == 1
