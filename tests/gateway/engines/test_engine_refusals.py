"""``engine_refusals="answer"``: an engine's refusal before any work goes to the caller at once,
and while the engine refuses, a retry of the same request (marked, or under the same key) is
answered from it without asking the engine again; a fresh call still asks, and the first answer
the engine completes ends it. The default (``wait``) is pinned in test_upstream_faults and
tests/vllm/test_refusals."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from gateway_helpers import chat_body

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.engine_sim.config import Fault
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.errors import Failure
from streamsafe.gateway.generations.refusals import EngineRefusals
from streamsafe.server import ServerThread

MODEL = "sim-llama-8b"


def test_a_refusal_answers_retries_until_served_or_too_old() -> None:
    refusals = EngineRefusals(memory=10.0)
    failure = Failure(503, b'{"error":{"message":"full"}}', 1)
    refusals.note("t", b"body", failure, now=100.0)
    assert refusals.answer("t", b"body", now=105.0) is failure
    assert refusals.answer("other tenant", b"body", now=105.0) is None
    assert refusals.answer("t", b"other body", now=105.0) is None
    assert refusals.answer("t", b"body", now=110.5) is None  # too old: the retry asks
    refusals.note("t", b"body", failure, now=200.0)
    refusals.served()
    assert refusals.answer("t", b"body", now=200.1) is None  # the engine has room again
    assert refusals.answered == 1


@pytest.fixture
def refusing() -> Iterator[tuple[Simulator, str, Gateway]]:
    # Refuses its first three requests (503, Retry-After 1), then serves.
    sim = Simulator(SimConfig(model=MODEL, itl_ms=2.0, faults=(Fault.parse("status:503:1#3"),)))
    with ServerThread(sim) as engine:
        gateway = Gateway(GatewayConfig(upstream=engine.url, engine_refusals="answer"))
        with ServerThread(gateway) as server:
            yield sim, server.url, gateway


def post(url: str, body: dict[str, object], **headers: str) -> httpx2.Response:
    return httpx2.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_retries_of_a_refused_request_never_reach_the_engine_while_it_refuses(
    refusing: tuple[Simulator, str, Gateway], stream: bool
) -> None:
    sim, url, gateway = refusing
    body = {**chat_body("full engine", max_tokens=3), "stream": stream}
    first = post(url, body)
    assert first.status_code == 503 and first.headers["retry-after"] == "1"
    for count in ("1", "2"):  # the openai SDK's retries, marked
        again = post(url, body, **{"x-stainless-retry-count": count})
        assert again.status_code == 503 and again.content == first.content
    assert sim.stats()["requests_received"] == 1
    assert gateway.stats()["refusals_answered"] == 2


def test_a_fresh_call_asks_and_the_first_answer_served_ends_the_refusals(
    refusing: tuple[Simulator, str, Gateway],
) -> None:
    sim, url, _gateway = refusing
    body = chat_body("full engine", max_tokens=3)
    keyed = {"idempotency-key": "k-1"}
    assert post(url, body, **keyed).status_code == 503
    assert post(url, body, **keyed).status_code == 503  # the same key: answered here
    assert sim.stats()["requests_received"] == 1
    assert post(url, chat_body("another", max_tokens=3)).status_code == 503  # fresh: asks
    assert post(url, chat_body("a third", max_tokens=3)).status_code == 503
    assert post(url, chat_body("served", max_tokens=3)).status_code == 200  # room again
    assert sim.stats()["requests_received"] == 4
    # The engine served one since: the refused key asks it again, and is served.
    assert post(url, body, **keyed).status_code == 200
    assert sim.stats()["requests_received"] == 5
