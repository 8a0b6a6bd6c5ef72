"""Anthropic's Messages API of the real vLLM through the gateway: the unmodified ``anthropic``
SDK's storm is one vLLM request per call (counted in vLLM's own request log), and greedy
streams cut at random points come back exact, as one stream whose usage counts the whole
answer. The session's one vLLM server serves every test here."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import orjson
import pytest
from vllm_helpers import gateway, wait_until

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from streamsafe_bench.cutting_proxy import CuttingProxy, serve_proxy
from streamsafe_bench.vllm_engine import VLLMEngine

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.timeout(240, func_only=True)

CALLS = 8
TIMEOUT = 2.0
TOKENS = 60


def _body(model: str, content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def _sdk(model: str, content: str, max_tokens: int) -> dict[str, Any]:
    """The SDK's arguments for :func:`_body` (it takes no ``temperature`` of its own)."""
    body = _body(model, content, max_tokens)
    temperature = body.pop("temperature")
    return {**body, "extra_body": {"temperature": temperature}}


def _read(base: str, body: dict[str, Any]) -> tuple[str, int, int, int]:
    """(text, events, usage.output_tokens, message_starts) of one Messages stream."""
    decoder = SSEDecoder()
    text: list[str] = []
    usage = starts = events = 0
    with httpx2.stream(
        "POST", base + "/v1/messages", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        for raw in r.iter_raw():
            for event in decoder.feed(raw):
                if event.event == "ping":
                    continue
                data = orjson.loads(event.raw)
                assert data["type"] != "error", data
                events += 1
                if data["type"] == "message_start":
                    starts += 1
                elif data["type"] == "content_block_delta":
                    text.append(data["delta"].get("text", ""))
                elif data["type"] == "message_delta":
                    usage = data["usage"]["output_tokens"]
    return "".join(text), events, usage, starts


def test_the_anthropic_sdk_storm_through_the_gateway_is_one_vllm_request_per_call(
    vllm_engine: VLLMEngine,
) -> None:
    model = vllm_engine.model
    prompts = [f"anthropic storm caller {i}" for i in range(CALLS)]
    straight = anthropic.Anthropic(base_url=vllm_engine.url, api_key="x", max_retries=0)
    wanted = [straight.messages.create(**_sdk(model, p, 16)).content[0].text for p in prompts]
    out: list[Any] = [None] * CALLS
    with gateway(vllm_engine) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="x", timeout=TIMEOUT, max_retries=2)

        def call(i: int) -> None:
            try:
                out[i] = client.messages.create(**_sdk(model, prompts[i], 16)).content[0].text
            except Exception as exc:  # reported below
                out[i] = exc

        before = len(vllm_engine.requests_received())
        vllm_engine.pause()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(CALLS)]
        for t in threads:
            t.start()
        # Stalled past all three attempts' timeouts after the last request reached vLLM.
        wait_until(
            lambda: len(vllm_engine.requests_received()) - before == CALLS, what="all received"
        )
        stalled_until = time.monotonic() + 3 * TIMEOUT + 1.0
        wait_until(lambda: time.monotonic() > stalled_until, what="the stall")
        vllm_engine.resume()
        for t in threads:
            t.join(60)
        received = len(vllm_engine.requests_received()) - before
    assert out == wanted
    assert received == CALLS


@pytest.fixture
def cut_gateway(vllm_engine: VLLMEngine) -> Iterator[tuple[CuttingProxy, str]]:
    """The gateway with its default flags, in front of a network that cuts planned streams."""
    proxy = CuttingProxy(vllm_engine.url)
    with (
        serve_proxy(proxy) as net,
        ServerThread(Gateway(GatewayConfig(upstream=net.url))) as server,
    ):
        yield proxy, server.url


def test_twenty_random_cuts_of_greedy_messages_streams_come_back_exact(
    vllm_engine: VLLMEngine, cut_gateway: tuple[CuttingProxy, str]
) -> None:
    proxy, url = cut_gateway
    rng = random.Random(31)
    model = vllm_engine.model
    markers = [f"Tell me the story of messages cut {i}." for i in range(20)]
    with ThreadPoolExecutor(4) as pool:
        wanted = list(pool.map(lambda m: _read(vllm_engine.url, _body(model, m, TOKENS)), markers))
        for marker, (_, events, _, _) in zip(markers, wanted, strict=True):
            # From just after message_start to just before message_stop.
            proxy.plan[marker] = rng.randint(2, max(2, events - 1))
        got = list(pool.map(lambda m: _read(url, _body(model, m, TOKENS)), markers))
    assert proxy.cuts == 20
    exact = sum(
        have[0] == want[0] and have[2] == want[2] == TOKENS and have[3] == 1
        for want, have in zip(wanted, got, strict=True)
    )
    assert exact >= 19, (exact, got)
