"""Helpers for the gateway tests: the engine simulator and a gateway in front of it, each on
its own loopback server thread."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from server_stops import stop_later
from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from waiting import wait_until

MODEL = "sim-llama-8b"


@dataclass
class Stack:
    sim: Simulator
    sim_server: ServerThread
    gw: Gateway
    gw_server: ServerThread

    @property
    def url(self) -> str:
        return self.gw_server.url

    @property
    def sim_url(self) -> str:
        return self.sim_server.url


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """The first truthy value of ``cond()``: :func:`waiting.wait_until`, ten seconds."""
    return wait_until(cond, timeout, what)


def fast_sim(**changes: Any) -> SimConfig:
    base: dict[str, Any] = {
        "model": MODEL,
        "itl_ms": 1.0,
        "itl_ms_per_seq": 0.0,
        "prefill_ms_per_token": 0.0,
        "default_max_tokens": 16,
    }
    base.update(changes)
    return SimConfig(**base)


@contextlib.contextmanager
def make_stack(sim_config: SimConfig | None = None, **gw_kwargs: Any) -> Iterator[Stack]:
    """A simulator and a gateway in front of it, each on its own server; on exit both stop in
    the background, the gateway first (see server_stops)."""
    sim = Simulator(sim_config or fast_sim())
    sim_server = ServerThread(sim).start()
    try:
        gw_kwargs.setdefault("heartbeat", 0.05)
        gw = Gateway(GatewayConfig(upstream=sim_server.url, **gw_kwargs))
        gw_server = ServerThread(gw).start()
    except BaseException:
        sim_server.stop()
        raise
    try:
        yield Stack(sim, sim_server, gw, gw_server)
    finally:
        stop_later(gw_server, sim_server)


def chat_body(
    content: str = "hello there", max_tokens: int = 8, stream: bool = True
) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def sse_payloads(text: str) -> list[tuple[int | None, str]]:
    """(id, data) of each event in an SSE body."""
    from streamsafe.sse import SSEDecoder

    dec = SSEDecoder()
    out = []
    for ev in dec.feed(text.encode()):
        out.append((None if ev.id is None else int(ev.id), ev.data))
    return out


def content_of(payloads: list[tuple[int | None, str]]) -> str:
    import orjson

    text = []
    for _, data in payloads:
        if data == "[DONE]":
            continue
        obj = orjson.loads(data)
        for choice in obj.get("choices", ()):
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or choice.get("text") or "")
    return "".join(text)


def post_stream(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx2.Response:
    with httpx2.Client(timeout=10) as client:
        return client.post(url + "/v1/chat/completions", json=body, headers=headers or {})


def raw_chat_request(body: dict[str, Any], read_timeout: float | None = None) -> bytes:
    """One POST of ``body`` to the chat route on a connection of its own (``Connection:
    close``), the read timeout stated as Stainless clients state it where given."""
    raw = orjson.dumps(body)
    stated = b"" if read_timeout is None else b"x-stainless-read-timeout: %g\r\n" % read_timeout
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
        b"\r\nconnection: close\r\n%bcontent-length: %d\r\n\r\n%b" % (stated, len(raw), raw)
    )


def raw_connection(url: str) -> socket.socket:
    """A socket connected to the server at ``url`` (20 s timeout)."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=20)


def raw_post(url: str, body: dict[str, Any], read_timeout: float | None = None) -> bytes:
    """Everything the server writes for :func:`raw_chat_request`, up to its close."""
    with raw_connection(url) as sock:
        sock.sendall(raw_chat_request(body, read_timeout))
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got
