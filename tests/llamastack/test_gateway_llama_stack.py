"""The gateway with the real Llama Stack: in front of it (its routes in its own wire formats,
every other route passed through, masked failures counted, the breaker), and behind it (engine
death opens the breaker; Llama Stack's own retries attach)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest

from conftest import MODEL, LlamaStackTier
from streamsafe.engine_sim import Fault, SimConfig, Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder

pytestmark = pytest.mark.timeout(90)


@contextlib.contextmanager
def _gateway(upstream: str, **config: Any) -> Iterator[tuple[Gateway, str]]:
    config.setdefault("heartbeat", 0.2)
    gateway = Gateway(GatewayConfig(upstream=upstream, **config))
    with ServerThread(gateway) as server:
        yield gateway, server.url


def _native(content: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model_id": MODEL,
        "messages": [{"role": "user", "content": content}],
        "sampling_params": {"max_tokens": max_tokens},
        "stream": stream,
    }


def _events(raw: bytes) -> list[tuple[str | None, bytes]]:
    return [(e.id, e.raw) for e in SSEDecoder().feed(raw)]


def test_the_probe_finds_llama_stack_and_other_routes_pass_through(tier: LlamaStackTier) -> None:
    from llama_stack_client import LlamaStackClient

    with _gateway(tier.url) as (gateway, url):
        assert gateway.stats()["upstream_kind"] == "llama-stack"
        client = LlamaStackClient(base_url=url, timeout=10)
        assert [m.identifier for m in client.models.list()] == [MODEL]
        with httpx2.Client(base_url=url, timeout=10) as http:
            assert http.get("/v1/health").json() == {"status": "OK"}
            listed = http.get("/v1/openai/v1/chat/completions")  # a GET on a completion path
            assert listed.status_code == 200 and "data" in listed.json()
            missing = http.get("/v1/no/such/route?x=1")
            assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
        assert gateway.stats()["passed_through"] == 4
        assert gateway.stats()["generations_started"] == 0


def test_native_stream_carries_ids_and_resumes_exactly_once(tier: LlamaStackTier) -> None:
    sim = tier.engine(itl_ms=5.0)
    body = _native("resume me", 30)
    headers = {"Idempotency-Key": "ls-resume-1"}
    with _gateway(tier.url, upstream_kind="llama-stack") as (gateway, url):
        with httpx2.Client(timeout=30) as client:
            with client.stream(
                "POST", url + "/v1/inference/chat-completion", json=body, headers=headers
            ) as r:
                assert r.headers["x-stream-resumable"] == "true"
                first: list[tuple[str | None, bytes]] = []
                decoder = SSEDecoder()
                for chunk in r.iter_bytes():
                    first.extend((e.id, e.raw) for e in decoder.feed(chunk))
                    if len(first) >= 4:
                        break
            last_id = first[-1][0]
            assert last_id is not None
            again = client.post(
                url + "/v1/inference/chat-completion",
                json=body,
                headers={**headers, "Last-Event-ID": last_id},
            )
        rest = _events(again.content)
        ids = [int(i) for i, _ in first + rest if i is not None]
        assert ids == list(range(len(ids)))  # every event exactly once
        payloads = [p for _, p in first + rest]
        assert orjson.loads(payloads[-1])["event"]["event_type"] == "complete"
        assert b"[DONE]" not in again.content  # llama-stack-client decodes every event
        text = "".join(orjson.loads(p)["event"]["delta"]["text"] for p in payloads)
        assert len(text.split()) == 29  # Llama Stack's own answer: the last token dropped
        assert sim.stats()["generations_started"] == 1
        assert gateway.stats()["resumed"] == 1


def test_a_native_stream_whose_first_token_does_not_come_ends_with_a_clear_504(
    tier: LlamaStackTier,
) -> None:
    # Llama Stack sends its start event at once; the engine then holds the first token past the
    # gateway's first-token bound. The start event is no token: the upstream held the request
    # silent, so it is not asked again (it would wait as long once more, docs/design.md,
    # Failover), and with nowhere else to go the stream ends with a 504 error event, once.
    sim = tier.engine(itl_ms=2.0, faults=(Fault.parse("stall:5:1@fresh#1"),))
    with (
        _gateway(tier.url, upstream_kind="llama-stack", first_token_timeout=1.0) as (gw, url),
        httpx2.Client(timeout=30) as client,
    ):
        r = client.post(url + "/v1/inference/chat-completion", json=_native("held", 10))
        payloads = [orjson.loads(p) for _, p in _events(r.content)]
        types = [p.get("event", {}).get("event_type") for p in payloads]
        assert types[0] == "start" and types.count("start") == 1
        error = payloads[-1]["error"]
        assert error["code"] == 504 and "first token timeout" in error["message"]
        assert gw.stats()["upstream_timeouts"] == 1 and gw.stats()["continued"] == 0
    assert sim.stats()["faults_injected"]["stall"] == 1


def test_bad_native_requests_are_refused_before_llama_stack(tier: LlamaStackTier) -> None:
    with _gateway(tier.url, upstream_kind="llama-stack") as (_, url), httpx2.Client() as client:
        r = client.post(url + "/v1/inference/chat-completion", json={"messages": []})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "model_id"
        r = client.post(url + "/v1/inference/completion", json={"model_id": MODEL})
        assert r.status_code == 400 and r.json()["error"]["param"] == "content"
        r = client.post(url + "/v1/inference/chat-completion", content=b"{not json")
        assert r.status_code == 400 and "error" in r.json()
    assert list(tier.slot.seen) == []


def test_masked_engine_failures_count_and_open_the_breaker(tier: LlamaStackTier) -> None:
    # The engine dies on the first call; Llama Stack masks every later failure as a 500 event.
    tier.engine(memory_tokens=60, default_max_tokens=200)
    with (
        _gateway(tier.url, upstream_kind="llama-stack", probe_interval=30.0) as (gateway, url),
        httpx2.Client(timeout=30) as client,
    ):
        for i in range(3):
            r = client.post(url + "/v1/inference/chat-completion", json=_native(f"x{i}", 200))
            assert r.status_code == 200
            error = orjson.loads(_events(r.content)[-1][1])["error"]
            assert error["message"].startswith("500: ")
        stats = gateway.stats()
        assert stats["upstream_failures"] == 3 and stats["breaker_open"], str(stats["engines"])
        refused = client.post(url + "/v1/inference/chat-completion", json=_native("y", 5))
        assert refused.status_code == 503 and "retry-after" in refused.headers
        assert client.get(url + "/ready").status_code == 503


def test_engine_death_behind_llama_stack_opens_the_breaker(tier: LlamaStackTier) -> None:
    # An engine that does not say its memory: the gateway lets the request that kills it pass.
    sim = Simulator(
        SimConfig(model=MODEL, memory_tokens=60, default_max_tokens=200, publish_kv_cache=False)
    )
    with ServerThread(sim) as engine:
        gateway = Gateway(GatewayConfig(upstream=engine.url, probe_interval=1.0))
        tier.deployment.install(gateway)
        try:
            path = tier.url + "/v1/inference/chat-completion"
            with httpx2.Client(timeout=30) as client:
                first = client.post(path, json=_native("a", 200, False))
                assert first.status_code == 500  # Llama Stack's masked answer
                assert sim.stats()["engine_dead"] and gateway.stats()["breaker_open"]
                seen = sim.stats()["requests_received"]
                rejected = gateway.stats()["breaker_rejections"]
                second = client.post(path, json=_native("b", 5, False))
                assert second.status_code == 500
            # The second call and Llama Stack's two retries of it were refused at the gateway
            # (503 with Retry-After); none reached the dead engine.
            assert sim.stats()["requests_received"] == seen
            assert gateway.stats()["breaker_rejections"] == rejected + 3
            retries = [s.headers.get("x-stainless-retry-count") for s in tier.slot.seen]
            assert retries[-3:] == ["0", "1", "2"]
        finally:
            tier.engine()


class _DropFirstAfterCommit:
    """Between Llama Stack and the gateway: the first response is cut after its headers and
    first bytes (a proxy restarting), as a connection reset would; later ones pass."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.dropped = False

    async def startup(self) -> None:
        await self.app.startup()

    async def shutdown(self) -> None:
        await self.app.shutdown()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.dropped or not scope["path"].endswith("completions"):
            await self.app(scope, receive, send)
            return
        self.dropped = True
        started = asyncio.Event()

        async def cut_send(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body":
                started.set()

        task = asyncio.get_running_loop().create_task(self.app(scope, receive, cut_send))
        await started.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ConnectionResetError("dropped between Llama Stack and the gateway")


def test_llama_stack_retries_attach_to_the_running_generation(tier: LlamaStackTier) -> None:
    sim = Simulator(SimConfig(model=MODEL, itl_ms=20.0, itl_ms_per_seq=0.0))
    with ServerThread(sim) as engine:
        gateway = Gateway(
            GatewayConfig(upstream=engine.url, json_keepalive=True, heartbeat=0.1, grace=10.0)
        )
        tier.deployment.install(_DropFirstAfterCommit(gateway))
        try:
            with httpx2.Client(timeout=30) as client:
                r = client.post(
                    tier.url + "/v1/inference/chat-completion", json=_native("once", 40, False)
                )
            assert r.status_code == 200, r.text
            stats = gateway.stats()
            assert stats["retries_seen"] == 1 and stats["attached"] + stats["replayed"] == 1
            assert sim.stats()["generations_started"] == 1
            counts = [s.headers.get("x-stainless-retry-count") for s in tier.slot.seen]
            assert counts == ["0", "1"]
            assert len(r.json()["completion_message"]["content"].split()) == 40
        finally:
            tier.engine()
