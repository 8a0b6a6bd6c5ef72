"""The Responses API (``POST /v1/responses``) as a route the gateway serves with its promises, in
front of the real OGX 1.5.0: an ``Idempotency-Key`` sent again attaches to the one generation, a
retry marked by its client attaches too, ``Last-Event-ID`` resumes with exactly the rest, and
openai-python's ``responses.create`` gets OGX's own text, streamed or not. Counted at the
engine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import pytest
from today_tier import TodayTier

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from waiting import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def through(ogx_server: TodayTier) -> Iterator[tuple[str, Gateway]]:
    gateway = Gateway(GatewayConfig(upstream=ogx_server.url))
    with ServerThread(gateway) as server:
        yield server.url, gateway


def body(tier: TodayTier, text: str, stream: bool = True) -> dict[str, Any]:
    return {"model": tier.model, "input": text, "max_output_tokens": 16, "stream": stream}


def events(url: str, payload: dict[str, Any], **headers: str) -> list[tuple[str | None, Any]]:
    """(id, parsed data) of every event of one streamed call."""
    r = httpx2.post(url + "/v1/responses", json=payload, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return [(ev.id, orjson.loads(ev.data)) for ev in SSEDecoder().feed(r.content)]


def text_of(evs: list[tuple[str | None, Any]]) -> str:
    return "".join(d.get("delta", "") for _, d in evs if d["type"] == "response.output_text.delta")


def test_a_key_sent_again_attaches_and_last_event_id_resumes_exactly(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, gateway = through
    sim = ogx_server.engine(itl_ms=5.0)
    key = {"idempotency-key": "resp-1"}
    first = events(url, body(ogx_server, "a key"), **key)
    assert first[-1][1]["type"] in ("response.completed", "response.incomplete")
    again = events(url, body(ogx_server, "a key"), **key)
    assert again == first  # replayed: the same events, the same response id
    cut = len(first) // 2
    rest = events(url, body(ogx_server, "a key"), **key, **{"last-event-id": str(first[cut][0])})
    assert rest == first[cut + 1 :]
    assert sim.stats()["generations_started"] == 1
    assert gateway.stats()["generations_started"] == 1


def test_a_marked_retry_of_a_live_response_attaches(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, _gateway = through
    sim = ogx_server.engine(itl_ms=60.0)  # about a second of answer
    got: list[list[tuple[str | None, Any]]] = []
    first = threading.Thread(target=lambda: got.append(events(url, body(ogx_server, "live"))))
    first.start()
    wait_until(lambda: sim.stats()["generations_started"] >= 1, 30, "the first call generating")
    retry = events(url, body(ogx_server, "live"), **{"x-stainless-retry-count": "1"})
    first.join(30)
    assert text_of(retry) == text_of(got[0]) and retry[-1] == got[0][-1]
    assert sim.stats()["generations_started"] == 1


def test_openai_python_gets_ogx_s_own_answer_through_the_gateway(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, gateway = through
    ogx_server.engine()
    straight = openai.OpenAI(base_url=ogx_server.url + "/v1", api_key="none")
    expected = straight.responses.create(
        model=ogx_server.model, input="same text", max_output_tokens=16
    ).output_text
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    plain = client.responses.create(model=ogx_server.model, input="same text", max_output_tokens=16)
    streamed = client.responses.create(
        model=ogx_server.model, input="same text", max_output_tokens=16, stream=True
    )
    deltas = "".join(ev.delta for ev in streamed if ev.type == "response.output_text.delta")
    assert plain.output_text == expected and deltas == expected
    assert gateway.stats()["generations_started"] == 2


def test_a_response_without_input_is_refused_by_the_gateway(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, _gateway = through
    r = httpx2.post(url + "/v1/responses", json={"model": ogx_server.model}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def resumed(url: str, response_id: str, after: int | None) -> list[tuple[str | None, Any]]:
    query = "stream=true" + ("" if after is None else f"&starting_after={after}")
    r = httpx2.get(f"{url}/v1/responses/{response_id}?{query}", timeout=60)
    assert r.status_code == 200, r.text
    return [(ev.id, orjson.loads(ev.data)) for ev in SSEDecoder().feed(r.content)]


def test_starting_after_resumes_a_finished_stream_from_the_gateway_s_log(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, gateway = through
    sim = ogx_server.engine()
    first = events(url, body(ogx_server, "starting after"))
    response_id = first[0][1]["response"]["id"]
    seq = [d["sequence_number"] for _, d in first]
    assert seq == list(range(len(first)))
    for after in (0, 5, seq[-2]):
        assert resumed(url, response_id, after) == first[after + 1 :]
    assert resumed(url, response_id, None) == first
    assert sim.stats()["generations_started"] == 1
    assert gateway.stats()["resumed"] == 4


def test_starting_after_follows_a_live_stream_to_its_end(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, _gateway = through
    sim = ogx_server.engine(itl_ms=80.0)  # over a second of answer
    got: list[list[tuple[str | None, Any]]] = []
    first = threading.Thread(target=lambda: got.append(events(url, body(ogx_server, "live"))))
    first.start()
    # The caller lost its stream after the first delta: it comes back for the rest.
    response_id, after = wait_until(
        lambda: ogx_server_events(through[1]), 30, "the response held here", every=0.02
    )
    rest = resumed(url, response_id, after)
    first.join(30)
    assert rest == got[0][after + 1 :]
    assert sim.stats()["generations_started"] == 1


def ogx_server_events(gateway: Gateway) -> tuple[str, int] | None:
    """The response id of the one live Responses stream the gateway holds, and the sequence
    number of its first delta, once it has one."""
    for gen in gateway.registry.generations:
        payloads = gen.log.read_nowait(0)
        deltas = [
            orjson.loads(p)
            for p in payloads
            if b'"type":"response.output_text.delta"' in p and not gen.finished
        ]
        if deltas:
            return orjson.loads(payloads[0])["response"]["id"], deltas[0]["sequence_number"]
    return None


def test_a_response_the_gateway_does_not_hold_is_the_server_s_to_answer(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, gateway = through
    r = httpx2.get(f"{url}/v1/responses/resp_unknown?stream=true&starting_after=3", timeout=10)
    assert r.status_code == 404  # OGX's own answer
    assert gateway.stats()["passed_through"] == 1


def test_cancel_ends_a_live_response_for_every_subscriber_and_at_the_engine(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, gateway = through
    sim = ogx_server.engine(itl_ms=100.0)  # about 1.6 s of answer
    readers: list[list[tuple[str | None, Any]]] = []
    key = {"idempotency-key": "to-cancel"}

    def read() -> None:
        readers.append(events(url, body(ogx_server, "cancel me"), **key))

    threads = [threading.Thread(target=read) for _ in range(2)]  # the second attaches
    for t in threads:
        t.start()
    response_id, _ = wait_until(
        lambda: ogx_server_events(gateway), 30, "the response held here", every=0.02
    )
    r = httpx2.post(f"{url}/v1/responses/{response_id}/cancel", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    for t in threads:
        t.join(30)
    for got in readers:
        last = got[-1][1]
        assert last["error"]["type"] == "cancelled", last
        assert not any(d.get("type") == "response.completed" for _, d in got)
    stats = sim.stats()
    assert stats["generations_started"] == 1
    # OGX lets its engine request go.
    wait_until(lambda: sim.stats()["generations_aborted"] >= 1, 10, "the engine request let go")
    assert sim.stats()["generations_aborted"] == 1


def test_a_cancel_of_a_response_not_held_here_is_the_server_s(
    ogx_server: TodayTier, through: tuple[str, Gateway]
) -> None:
    url, gateway = through
    r = httpx2.post(f"{url}/v1/responses/resp_unknown/cancel", timeout=10)
    assert r.status_code != 200  # OGX's own answer
    assert gateway.stats()["passed_through"] == 1
