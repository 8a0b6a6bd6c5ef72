"""End to end: client -> a proxy that cuts streams -> the streamsafe gateway -> the simulator.

The proxy stands for a flaky network between the client and the gateway: it drops each stream
connection after a few events. The client must resume through the gateway's replay and the
caller must get exactly the simulator's text, with one generation upstream.
"""

from __future__ import annotations

import random

import pytest
from client_fakes import cutting_proxy, run, serve

from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.retry import StreamingConfig

MODEL = "sim-llama-8b"
MESSAGES = [{"role": "user", "content": "resume me"}]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_stream_cut_between_client_and_gateway_is_resumed_to_the_exact_text(mode):
    sim = Simulator(SimConfig(model=MODEL, itl_ms=1.0))
    with serve(sim) as engine:
        gateway = Gateway(GatewayConfig(upstream=engine.url, grace=10.0))
        with serve(gateway) as gw:
            proxy = cutting_proxy(gw.url, random.Random(7))
            with serve(proxy) as px:
                [res] = run(
                    mode,
                    {"base_url": px.url + "/v1", "streaming": StreamingConfig(max_resumes=100)},
                    model=MODEL,
                    messages=MESSAGES,
                    max_tokens=20,
                )
    assert res.error is None, res.error
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20}
    assert res.text == expected_text(body, 20)
    assert len(proxy.requests) > 1
    assert len(set(proxy.keys())) == 1
    assert sim.stats()["requests_received"] == 1
