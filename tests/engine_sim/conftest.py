"""Fixtures for the engine simulator's tests: a fast simulator on a loopback server, and a
bounded poll (tests synchronize on conditions, never on sleeps)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import waiting
from server_stops import stop_later
from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.server import ServerThread

MODEL = "sim-llama-8b"
FAST: dict[str, Any] = {
    "itl_ms": 1.0,
    "itl_ms_per_seq": 0.0,
    "prefill_ms_per_token": 0.0,
    "default_max_tokens": 16,
}


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[Simulator, ServerThread]]]:
    """serve(**config) -> (simulator, running server); stopped in the background at the end of
    the test (see server_stops)."""
    servers: list[ServerThread] = []

    def _serve(**overrides: Any) -> tuple[Simulator, ServerThread]:
        sim = Simulator(SimConfig(**{**FAST, **overrides}))
        server = ServerThread(sim).start()
        servers.append(server)
        return sim, server

    yield _serve
    stop_later(*servers)


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """wait_until(predicate, timeout=10, what="") -> the first truthy value of predicate()."""
    return lambda predicate, timeout=10.0, what="": waiting.wait_until(predicate, timeout, what)


def chat_body(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture
def body() -> Callable[..., dict[str, Any]]:
    """body(content="hello", **fields) -> a chat completion request body."""
    return chat_body
