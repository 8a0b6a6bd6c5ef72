"""An upstream that authenticates its own users: OGX 1.5.0 with API keys (``local_api_key``),
and the gateway in front of it. By default the caller's ``Authorization`` never leaves the
gateway, so OGX refuses every call; with ``--forward-authorization`` it goes upstream on every
route, served and passed through, and each credential is a tenant of its own: one user's retry
never attaches to another's generation."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx2
import orjson
import pytest

from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from streamsafe_bench.ogx_server import OGX, OGXServer, ServerUnavailable, find_venv

pytestmark = pytest.mark.timeout(120)

MODEL = "sim-llama-8b"
USERS = ("user-a", "user-b")


@pytest.fixture(scope="module")
def engine_and_ogx() -> Iterator[tuple[Simulator, OGXServer]]:
    try:
        venv = find_venv(OGX)
    except ServerUnavailable as exc:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"{exc}; CI runs the real server and never skips it", pytrace=False)
        pytest.skip(str(exc))
    sim = Simulator(SimConfig(model=MODEL, itl_ms=2.0, default_max_tokens=8))
    with ServerThread(sim) as engine:
        server = OGXServer(engine.url, flavor=OGX, venv=venv, api_keys=USERS).start()
        try:
            yield sim, server
        finally:
            server.stop()


def chat(url: str, token: str | None, content: str, **headers: str) -> httpx2.Response:
    body = {
        "model": f"vllm/{MODEL}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 5,
        "stream": True,
    }
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx2.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def text(r: httpx2.Response) -> str:
    parts = []
    for ev in SSEDecoder().feed(r.content):
        for choice in orjson.loads(ev.data).get("choices", ()):
            parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


def expected(content: str) -> str:
    return expected_text({"model": MODEL, "messages": [{"role": "user", "content": content}]}, 5)


def test_by_default_the_caller_s_credential_stays_in_the_gateway(
    engine_and_ogx: tuple[Simulator, OGXServer],
) -> None:
    _sim, ogx = engine_and_ogx
    with ServerThread(Gateway(GatewayConfig(upstream=ogx.url))) as server:
        assert chat(server.url, "user-a", "kept").status_code == 401  # OGX's refusal


def test_forwarded_every_user_is_served_and_apart(
    engine_and_ogx: tuple[Simulator, OGXServer],
) -> None:
    sim, ogx = engine_and_ogx
    gateway = Gateway(GatewayConfig(upstream=ogx.url, forward_authorization=True))
    with ServerThread(gateway) as server:
        url = server.url
        before = sim.stats()["generations_started"]
        a = chat(url, "user-a", "whose answer")
        assert a.status_code == 200 and text(a) == expected("whose answer")
        # The same body, marked as a retry: user-a's attaches; user-b's is other work.
        retry = {"x-stainless-retry-count": "1"}
        assert text(chat(url, "user-a", "whose answer", **retry)) == expected("whose answer")
        assert sim.stats()["generations_started"] == before + 1
        b = chat(url, "user-b", "whose answer", **retry)
        assert b.status_code == 200 and sim.stats()["generations_started"] == before + 2
        assert chat(url, "stranger", "whose answer").status_code == 401
        assert chat(url, None, "whose answer").status_code == 401
        # Passed through with it too (OGX's model list asks for a key).
        auth = {"authorization": "Bearer user-b"}
        assert httpx2.get(url + "/v1/models", headers=auth, timeout=10).status_code == 200
        assert httpx2.get(url + "/v1/models", timeout=10).status_code == 401
        stats = gateway.stats()
    assert stats["upstream_kind"] == "ogx"  # /v1/chat/completions answered 401: it is served


def test_forwarding_and_the_gateway_s_own_upstream_key_are_exclusive() -> None:
    with pytest.raises(ValueError, match="forward_authorization"):
        GatewayConfig(forward_authorization=True, upstream_api_key="k")
