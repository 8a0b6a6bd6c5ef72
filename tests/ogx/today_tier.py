"""The session's server of one of today's flavors, as a test sees it (tests/ogx/conftest.py
starts it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe_bench.llamastack_deployment import Deployment, SeenRequest
from streamsafe_bench.ogx_server import Flavor, OGXServer

MODEL = "sim-llama-8b"
FAST: dict[str, Any] = {
    "model": MODEL,
    "itl_ms": 2.0,
    "itl_ms_per_seq": 0.0,
    "prefill_ms_per_token": 0.0,
    "default_max_tokens": 16,
}


class TodayTier:
    """One of today's servers in front of the session's engine slot, with helpers for a test."""

    def __init__(self, flavor: Flavor, deployment: Deployment) -> None:
        self.flavor = flavor
        self.deployment = deployment
        self.server: OGXServer = deployment.ls  # type: ignore[assignment]

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self.deployment.url

    @property
    def model(self) -> str:
        """The engine's model as the server names it."""
        return f"vllm/{MODEL}"

    @property
    def client_python(self) -> Path:
        """The Python of the flavor's venv, which holds its client."""
        return self.server.client_python

    @property
    def seen(self) -> list[SeenRequest]:
        """The requests that reached the engine since the last :meth:`engine`."""
        return list(self.deployment.slot.seen)

    def engine(self, config: SimConfig | None = None, **overrides: Any) -> Simulator:
        """Install a fresh simulator behind the server: ``config``, or ``FAST`` plus
        ``overrides``."""
        sim = Simulator(config or SimConfig(**{**FAST, **overrides}))
        self.deployment.install(sim)
        return sim
