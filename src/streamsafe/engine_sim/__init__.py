"""The engine simulator: an OpenAI-compatible server that behaves like vLLM under load.

>>> sim = Simulator(SimConfig(itl_ms=2))          # an ASGI app
>>> with ServerThread(sim) as server: ...          # serve it on loopback
>>> sim.stats()["tokens_generated"]

Finite memory in tokens, a running limit with an unbounded waiting queue, prefill and batch-
dependent inter-token delays, death past capacity (until restart), abort on disconnect (or not),
injected faults, outages of the whole engine (silent, flapping), and deterministic text
(:func:`expected_text`). See docs/simulator.md.
"""

from __future__ import annotations

from streamsafe.engine_sim.app import Simulator
from streamsafe.engine_sim.config import Fault, FaultKind, FaultTarget, Flap, SimConfig
from streamsafe.engine_sim.engine import EngineDeadError
from streamsafe.engine_sim.text import VOCABULARY, expected_text

__all__ = [
    "VOCABULARY",
    "EngineDeadError",
    "Fault",
    "FaultKind",
    "FaultTarget",
    "Flap",
    "SimConfig",
    "Simulator",
    "expected_text",
]
