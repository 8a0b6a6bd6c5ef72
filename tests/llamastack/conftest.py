"""One real Llama Stack server for the whole session, in front of an engine slot; each test
installs a fresh simulator in the slot (see streamsafe_bench.llamastack_deployment)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe_bench.llamastack_deployment import Deployment, llama_stack_deployment

sys.path.insert(0, os.path.dirname(__file__))

MODEL = "sim-llama-8b"
FAST: dict[str, Any] = {
    "model": MODEL,
    "itl_ms": 2.0,
    "itl_ms_per_seq": 0.0,
    "prefill_ms_per_token": 0.0,
    "default_max_tokens": 16,
}


class LlamaStackTier:
    """The session's Llama Stack deployment, with helpers for one test."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.slot = deployment.slot

    @property
    def url(self) -> str:
        return self.deployment.url

    @property
    def slot_url(self) -> str:
        """Where Llama Stack sends engine requests (the slot)."""
        return self.deployment.slot_server.url

    def engine(self, **overrides: Any) -> Simulator:
        """Install a fresh simulator (``FAST`` plus ``overrides``) behind Llama Stack."""
        sim = Simulator(SimConfig(**{**FAST, **overrides}))
        self.deployment.install(sim)
        return sim


@pytest.fixture(scope="session")
def llama_stack_tier() -> Iterator[LlamaStackTier]:
    with llama_stack_deployment(Simulator(SimConfig(**FAST)), MODEL) as deployment:
        yield LlamaStackTier(deployment)


@pytest.fixture
def tier(llama_stack_tier: LlamaStackTier) -> LlamaStackTier:
    """The session's Llama Stack, with a fresh default engine for this test."""
    llama_stack_tier.engine()
    return llama_stack_tier
