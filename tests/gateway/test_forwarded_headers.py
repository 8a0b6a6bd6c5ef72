"""Llama Stack's per-request provider data (a provider's keys), ``X-OGX-Provider-Data`` (OGX,
ogx-client) and ``X-LlamaStack-Provider-Data`` (llama-stack 0.7 and before), reaches the
upstream on the routes the gateway serves, streamed or not, as it does on the routes it passes
through; and requests that carry other provider data are never the same work."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gateway_helpers import chat_body, content_of, fast_sim, post_stream, sse_payloads

from streamsafe.engine_sim import Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread

_DATA = '{"together_api_key": "k-1"}'
_NAMES = ("x-ogx-provider-data", "x-llamastack-provider-data")


class _Recording:
    """The simulator, noting the provider data of every completion request it gets (the
    value of whichever of the two headers came, and which)."""

    def __init__(self) -> None:
        self.sim = Simulator(fast_sim(itl_ms=10.0))
        self.seen: list[str | None] = []
        self.names: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            found = [n for n in _NAMES if n.encode() in headers]
            self.names.extend(found)
            value = headers.get(found[0].encode()) if found else None
            self.seen.append(None if value is None else value.decode())
        await self.sim(scope, receive, send)


@pytest.fixture
def stack() -> Iterator[tuple[_Recording, str]]:
    upstream = _Recording()
    with ServerThread(upstream) as engine:
        gateway = Gateway(GatewayConfig(upstream=engine.url, upstream_kind="vllm"))
        with ServerThread(gateway) as server:
            yield upstream, server.url


@pytest.mark.parametrize("name", _NAMES)
def test_provider_data_reaches_the_upstream_streamed_and_not(
    stack: tuple[_Recording, str], name: str
) -> None:
    upstream, url = stack
    body = chat_body("keys", max_tokens=3)
    streamed = post_stream(url, body, {name: _DATA})
    assert content_of(sse_payloads(streamed.text)) == expected_text(body, 3)
    plain = post_stream(url, {**body, "stream": False}, {name: _DATA})
    assert plain.status_code == 200
    post_stream(url, chat_body("none", max_tokens=2))
    assert upstream.seen == [_DATA, _DATA, None]  # dropped on these routes before
    assert upstream.names == [name, name]


@pytest.mark.parametrize("name", _NAMES)
def test_a_retry_with_other_provider_data_is_other_work(
    stack: tuple[_Recording, str], name: str
) -> None:
    upstream, url = stack
    body = chat_body("whose keys", max_tokens=3)
    post_stream(url, body, {name: _DATA})
    retry = {"x-stainless-retry-count": "1"}
    # Marked as a retry of the same body, but with another caller's keys: not replayed.
    post_stream(url, body, {**retry, name: '{"k": "other"}'})
    assert upstream.sim.stats()["generations_started"] == 2
    # The same keys: the retry replays the finished generation.
    post_stream(url, body, {**retry, name: _DATA})
    assert upstream.sim.stats()["generations_started"] == 2


def test_the_same_keys_under_the_other_name_are_other_work(
    stack: tuple[_Recording, str],
) -> None:
    # OGX reads only its own header, llama-stack 0.7 only the old one: which header carries the
    # keys decides which the server uses, so the two are not one request.
    upstream, url = stack
    body = chat_body("which header", max_tokens=3)
    post_stream(url, body, {_NAMES[0]: _DATA})
    post_stream(url, body, {"x-stainless-retry-count": "1", _NAMES[1]: _DATA})
    assert upstream.sim.stats()["generations_started"] == 2
