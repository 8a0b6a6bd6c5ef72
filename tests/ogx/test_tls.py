"""An ``https://`` upstream: OGX as it starts by default, with TLS (here a self-signed certificate
for 127.0.0.1), and the gateway in front of it given that certificate as its CA bundle
(``--upstream-ca-bundle``): the probe, the served routes (the hot stream and plain calls) and
the routes passed through all go over TLS. Without the bundle nothing is trusted, and the probe's
log line says why."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import httpx2
import openai
import pytest

from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.ogx_server import OGX, OGXServer, ServerUnavailable, find_venv

pytestmark = pytest.mark.timeout(120)

MODEL = "sim-llama-8b"


@pytest.fixture(scope="module")
def ogx_tls() -> Iterator[OGXServer]:
    try:
        venv = find_venv(OGX)
    except ServerUnavailable as exc:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"{exc}; CI runs the real server and never skips it", pytrace=False)
        pytest.skip(str(exc))
    sim = Simulator(SimConfig(model=MODEL, itl_ms=2.0, default_max_tokens=8))
    with ServerThread(sim) as engine:
        server = OGXServer(engine.url, flavor=OGX, venv=venv, tls=True).start()
        try:
            yield server
        finally:
            server.stop()


def test_the_gateway_serves_an_ogx_that_speaks_tls(ogx_tls: OGXServer) -> None:
    assert ogx_tls.url.startswith("https://")
    config = GatewayConfig(upstream=ogx_tls.url, upstream_ca_bundle=str(ogx_tls.ca_bundle))
    gateway = Gateway(config)
    with ServerThread(gateway) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "over tls"}]
        stream = client.chat.completions.create(
            model=f"vllm/{MODEL}", messages=messages, max_tokens=6, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        plain = client.chat.completions.create(
            model=f"vllm/{MODEL}", messages=messages, max_tokens=6
        )
        models = httpx2.get(server.url + "/v1/models", timeout=10).json()
        stats = gateway.stats()
    expected = expected_text({"model": MODEL, "messages": messages}, 6)
    assert text == expected and plain.choices[0].message.content == expected
    assert stats["upstream_kind"] == "ogx" and stats["generations_started"] == 2
    assert [m["id"] for m in models["data"]] == [f"vllm/{MODEL}"]  # passed through


def test_without_the_bundle_the_probe_says_the_certificate_is_not_trusted(
    ogx_tls: OGXServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="streamsafe.gateway")
    gateway = Gateway(GatewayConfig(upstream=ogx_tls.url))
    with ServerThread(gateway):
        assert gateway.stats()["upstream_kind"] is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "TLS: the upstream's certificate is not trusted (self-signed certificate)" in said, said
