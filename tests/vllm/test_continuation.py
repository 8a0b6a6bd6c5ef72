"""A stream cut between the gateway and the real vLLM is continued by token ids: the caller gets
exactly the tokens an unbroken stream gives (greedy), never more than it asked for, and a usage
that counts them. Cut points are drawn at random (a fixed seed), special tokens allowed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import orjson
import pytest

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.cutting_proxy import CuttingProxy, serve_proxy
from streamsafe_bench.tiny_model import TRIM_TEMPLATE

pytestmark = pytest.mark.timeout(240)

TOKENS = 120


def _body(model: str, marker: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me the story of {marker}."}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def _read(base: str, body: dict[str, Any]) -> tuple[str, int, int, list[int]]:
    """(content, content chunks, usage.completion_tokens, token ids if sent) of one stream."""
    text: list[str] = []
    ids: list[int] = []
    usage = -1
    chunks = 0
    with httpx2.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", ()):
                content = (choice.get("delta") or {}).get("content")
                if content:
                    text.append(content)
                    chunks += 1
                ids.extend(choice.get("token_ids") or ())
    return "".join(text), chunks, usage, ids


@pytest.fixture
def cut_gateway(vllm_engine: Any) -> Iterator[tuple[CuttingProxy, str]]:
    """The gateway with its default flags, in front of a network that cuts planned streams."""
    proxy = CuttingProxy(vllm_engine.url)
    with serve_proxy(proxy) as net:
        gateway = Gateway(GatewayConfig(upstream=net.url))
        with ServerThread(gateway) as server:
            yield proxy, server.url


def _cut_streams(
    vllm_engine: Any, proxy: CuttingProxy, url: str, seed: int, n: int, **extra: Any
) -> list[tuple[bool, int, int, int]]:
    """For ``n`` prompts: (exact, usage tokens, content chunks, cut point) through the gateway,
    each stream cut once at a random event, against the same prompt straight to vLLM."""
    rng = random.Random(seed)
    markers = [f"cut {seed}-{i}" for i in range(n)]
    model = vllm_engine.model
    with ThreadPoolExecutor(4) as pool:
        direct = {**extra, "return_token_ids": True}
        wanted = list(
            pool.map(lambda m: _read(vllm_engine.url, _body(model, m, **direct)), markers)
        )
        for marker, (_, chunks, _, _) in zip(markers, wanted, strict=True):
            # Anywhere from just after the role chunk to just before the last token.
            proxy.plan[marker] = rng.randint(2, max(2, chunks))
        cuts = dict(proxy.plan)
        got = list(pool.map(lambda m: _read(url, _body(model, m, **extra)), markers))
    results = []
    for marker, want, have in zip(markers, wanted, got, strict=True):
        assert want[2] == TOKENS  # the unbroken stream ran to max_tokens
        results.append((have[0] == want[0] and have[3] == want[3], have[2], have[1], cuts[marker]))
    return results


def test_twenty_random_cuts_of_greedy_streams_come_back_exact(
    vllm_engine: Any, cut_gateway: tuple[CuttingProxy, str]
) -> None:
    proxy, url = cut_gateway
    results = _cut_streams(vllm_engine, proxy, url, seed=20, n=20)
    exact = sum(r[0] for r in results)
    assert proxy.cuts == 20
    # Continued on the completion route, by ids (a cut that fell after the last token needs
    # only the end of the stream).
    assert proxy.paths.count("/v1/completions") >= 18
    assert exact >= 19, results
    assert all(r[1] == TOKENS for r in results), results  # usage exact, never more than asked


def test_a_template_that_trims_content_loses_nothing_at_the_cut(
    vllm_engine: Any, cut_gateway: tuple[CuttingProxy, str]
) -> None:
    # Llama 3's template trims each message: a continuation by text lost the whitespace at the
    # cut (0 of 8 exact); by ids no template is applied to the partial answer.
    proxy, url = cut_gateway
    results = _cut_streams(vllm_engine, proxy, url, seed=8, n=8, chat_template=TRIM_TEMPLATE)
    assert sum(r[0] for r in results) >= 7, results
    assert all(r[1] == TOKENS for r in results), results
