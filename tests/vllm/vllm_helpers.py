"""Helpers for the tests against the real vLLM: the gateway in front of it, requests straight
to it, and waiting on what its log says."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

import waiting
from server_stops import stop_later
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.vllm_engine import VLLMEngine


@dataclass
class GatewayRun:
    gw: Gateway
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url


@contextlib.contextmanager
def gateway(vllm: VLLMEngine, **config: Any) -> Iterator[GatewayRun]:
    """The gateway in front of ``vllm`` (default flags unless given), on its own loopback server;
    stopped in the background when the block ends."""
    gw = Gateway(GatewayConfig(**{"upstream": vllm.url, **config}))
    server = ServerThread(gw).start()
    try:
        yield GatewayRun(gw, server)
    finally:
        stop_later(server)


def start_together(
    vllm: VLLMEngine, read: Callable[[int], None], streams: int, seed: int
) -> list[threading.Thread]:
    """``read(i)`` for each of ``streams`` on its own thread, vLLM's engine held until every
    request (tagged with ``seed``) is in: they run in one batch, so none ends before the others
    have begun. Returns the threads, started."""
    vllm.pause()
    threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    wait_until(lambda: len(vllm.requests_received(seed=seed)) == streams, what="all received")
    vllm.resume()
    return threads


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """:func:`waiting.wait_until` with the longer default a loaded vLLM needs."""
    return waiting.wait_until(predicate, timeout, what)


def chat_body(vllm: VLLMEngine, content: str, max_tokens: int, seed: int, **extra: Any) -> dict:
    """A greedy chat request, tagged with ``seed`` (greedy ignores it; vLLM logs it, so a test
    counts its own requests with ``vllm.requests_received(seed=...)``)."""
    return {
        "model": vllm.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        **extra,
    }


def greedy_text(vllm: VLLMEngine, content: str, max_tokens: int, seed: int) -> str:
    """The answer vLLM gives straight, unary: what every other path must give."""
    r = httpx2.post(
        vllm.url + "/v1/chat/completions",
        json=chat_body(vllm, content, max_tokens, seed),
        timeout=60.0,
        trust_env=False,
    )
    r.raise_for_status()
    text: str = r.json()["choices"][0]["message"]["content"]
    return text


def stream_text(events: list[tuple[int | None, str]]) -> str:
    """The content of the chat chunks among SSE ``events`` (id, data)."""
    parts = []
    for _, data in events:
        if data == "[DONE]":
            continue
        for choice in orjson.loads(data).get("choices", ()):
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def sse_events(text: str) -> list[tuple[int | None, str]]:
    """(id, data) of each event in an SSE body."""
    from streamsafe.sse import SSEDecoder

    return [
        (None if ev.id is None else int(ev.id), ev.data) for ev in SSEDecoder().feed(text.encode())
    ]
