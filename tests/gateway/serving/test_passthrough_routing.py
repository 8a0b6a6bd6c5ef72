"""Pass-through over a pool of engines: no engine is the gateway's only one. A call whose JSON
body names a model goes to an engine of that model; one that names none to a live engine (the
first in pool order that takes traffic, so an upstream's stored state stays in one place while
it is up)."""

from __future__ import annotations

import httpx2
from path_helpers import PROBE, Recorder

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread


def test_pass_through_goes_to_the_engine_of_the_model_its_body_names_else_a_live_one() -> None:
    first, second = Recorder(), Recorder()
    probe = {PROBE.decode(): "1"}
    with ServerThread(first) as a, ServerThread(second) as b:
        config = GatewayConfig(
            upstream=a.url,
            engines=(f"{a.url} models=model-a", f"{b.url} models=model-b"),
            upstream_kind="openai",
        )
        with ServerThread(Gateway(config)) as gateway, httpx2.Client(timeout=10) as client:
            for model in ("model-b", "model-a", "model-b"):
                body = {"model": model, "input": "x"}
                r = client.post(gateway.url + "/v1/embeddings", json=body, headers=probe)
                assert r.status_code == 200, r.text
            assert client.get(gateway.url + "/v1/files", headers=probe).status_code == 200
            r = client.post(gateway.url + "/v1/files", content=b"not json", headers=probe)
            assert r.status_code == 200
    assert first.probes() == [b"/v1/embeddings", b"/v1/files", b"/v1/files"]
    assert second.probes() == [b"/v1/embeddings", b"/v1/embeddings"]
