"""One real Llama Stack server for the whole session, in front of an engine slot; each test
installs a fresh simulator in the slot (see streamsafe.bench.llamastack)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from streamsafe.bench.llamastack import (
    EngineSlot,
    LlamaStackServer,
    replace_engine,
    serve_engine_slot,
)
from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.serving import ServerThread

sys.path.insert(0, os.path.dirname(__file__))

MODEL = "sim-llama-8b"
FAST: dict[str, Any] = {
    "model": MODEL,
    "itl_ms": 2.0,
    "itl_ms_per_seq": 0.0,
    "prefill_ms_per_token": 0.0,
    "default_max_tokens": 16,
}


@dataclass
class LlamaStackTier:
    """The session's Llama Stack server and the slot its engine sits in."""

    ls: LlamaStackServer
    slot: EngineSlot
    engine_server: ServerThread

    @property
    def url(self) -> str:
        return self.ls.url

    def engine(self, **overrides: Any) -> Simulator:
        """Install a fresh simulator (``FAST`` plus ``overrides``) behind Llama Stack."""
        sim = Simulator(SimConfig(**{**FAST, **overrides}))
        replace_engine(self.engine_server, self.slot, sim)
        return sim


@pytest.fixture(scope="session")
def llama_stack_tier() -> Iterator[LlamaStackTier]:
    with serve_engine_slot(Simulator(SimConfig(**FAST))) as (slot, engine_server):
        ls = LlamaStackServer(engine_server.url, MODEL)
        ls.start()
        try:
            yield LlamaStackTier(ls, slot, engine_server)
        finally:
            ls.stop()


@pytest.fixture
def tier(llama_stack_tier: LlamaStackTier) -> LlamaStackTier:
    """The session's Llama Stack, with a fresh default engine for this test."""
    llama_stack_tier.engine()
    return llama_stack_tier


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """The first truthy value of ``predicate()``, polled; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout} s: {what or predicate}")
        time.sleep(0.005)
