"""Anthropic's Messages API through the gateway, called by the unmodified ``anthropic`` SDK
(Stainless: 2 retries, ``x-stainless-retry-count``, no idempotency key) against the simulator:
the storm costs one generation per call, streams resume and replay with their event names,
a cut stream is continued into one exact stream, quiet streams get Anthropic's ping, and
refusals come in Anthropic's shape."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest
from gateway_helpers import MODEL, Stack, fast_sim, make_stack, wait_for

from server_stops import stop_later
from streamsafe.engine_sim import Fault, SimConfig, Simulator, expected_text
from streamsafe.engine_sim.messages import to_chat
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.generations.event_log import MemoryEventLog
from streamsafe.gateway.relay.messages_continuation import SkipDelivered, read_messages_partial
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from streamsafe_bench.cutting_proxy import CuttingProxy, serve_proxy

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.timeout(60)


def _body(content: str, max_tokens: int, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }
    if stream:
        body["stream"] = True
    return body


def _expected(content: str, max_tokens: int) -> str:
    """The simulator's answer: the text of the chat the request stands for."""
    return expected_text(to_chat(_body(content, max_tokens)), max_tokens)


def _events(text: str) -> list[tuple[str | None, int | None, dict[str, Any]]]:
    """(event name, id, data) of each event of a Messages stream."""
    return [
        (e.event, None if e.id is None else int(e.id), orjson.loads(e.raw))
        for e in SSEDecoder().feed(text.encode())
    ]


def _text_of(events: list[tuple[str | None, int | None, dict[str, Any]]]) -> str:
    return "".join(
        d["delta"].get("text", "") for _, _, d in events if d["type"] == "content_block_delta"
    )


@pytest.mark.parametrize("kept_alive", [True, False])
def test_the_storm_of_anthropic_sdk_calls_costs_one_generation_per_call(kept_alive: bool) -> None:
    # The report's storm in Anthropic's API: 8 calls whose engine answers past the client's
    # 2 s timeout, the SDK's 2 retries each. Kept alive (102 Processing: the SDK states its
    # read timeout) nobody retries; without heartbeats every call times out and retries, and
    # each retry (x-stainless-retry-count, no key) joins its call's generation. 8, not 24.
    sim = fast_sim(faults=(Fault.parse("stall:2.6:1.0"),))
    heartbeat = {} if kept_alive else {"heartbeat": 0.0}
    with make_stack(sim, **heartbeat) as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="x", timeout=2.0, max_retries=2)
        prompts = [f"storm call {i}" for i in range(8)]
        out: dict[str, Any] = {}

        def call(p: str) -> None:
            try:
                out[p] = client.messages.create(**_body(p, 6))
            except Exception as exc:  # reported below
                out[p] = exc

        threads = [threading.Thread(target=call, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for p in prompts:
            message = out[p]
            assert not isinstance(message, Exception), message
            assert message.content[0].text == _expected(p, 6)
            assert message.usage.output_tokens == 6
        assert s.sim.stats()["generations_started"] == 8
        assert s.sim.stats()["requests_received"] == 8
        retries = s.gw.stats()["retries_seen"]
        assert retries == 0 if kept_alive else retries >= 8


def test_the_sdk_streams_through_the_gateway_with_named_events_and_ids() -> None:
    with make_stack() as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        with client.messages.stream(**_body("stream me", 7)) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
        assert final.content[0].text == _expected("stream me", 7)
        assert final.usage.output_tokens == 7 and final.stop_reason == "max_tokens"
        assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop"
        raw = httpx2.post(s.url + "/v1/messages", json=_body("stream me", 7, stream=True))
        assert raw.headers["x-stream-resumable"] == "true"
        events = _events(raw.text)
        assert [i for _, i, _ in events] == list(range(len(events)))
        assert all(name == data["type"] for name, _, data in events)
        assert "[DONE]" not in raw.text


def test_a_messages_stream_is_replayed_and_resumed_from_last_event_id() -> None:
    with make_stack() as s, httpx2.Client(base_url=s.url, timeout=10) as http:
        key = {"idempotency-key": "messages-resume-1"}
        body = _body("resume me", 9, stream=True)
        first = _events(http.post("/v1/messages", json=body, headers=key).text)
        assert _text_of(first) == _expected("resume me", 9)
        replay = _events(http.post("/v1/messages", json=body, headers=key).text)
        assert replay == first
        resumed = http.post("/v1/messages", json=body, headers={**key, "last-event-id": "3"})
        assert _events(resumed.text) == first[4:]
        assert s.sim.stats()["generations_started"] == 1


@contextlib.contextmanager
def _cut_stack(sim: SimConfig) -> Iterator[tuple[CuttingProxy, Stack]]:
    """The simulator behind a network that cuts planned streams, and the gateway in front."""
    simulator = Simulator(sim)
    sim_server = ServerThread(simulator).start()
    proxy = CuttingProxy(sim_server.url)
    net = serve_proxy(proxy).start()
    gw = Gateway(GatewayConfig(upstream=net.url, heartbeat=0.05))
    gw_server = ServerThread(gw).start()
    try:
        yield proxy, Stack(simulator, sim_server, gw, gw_server)
    finally:
        stop_later(gw_server, net, sim_server)


@pytest.mark.parametrize("cut_at", [2, 3, 7, 12])
def test_a_cut_greedy_stream_is_continued_into_one_exact_stream(cut_at: int) -> None:
    with _cut_stack(fast_sim(itl_ms=2.0)) as (proxy, s):
        proxy.plan["cut marker"] = cut_at
        client = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        body = _body("cut marker", 14, extra_body={"temperature": 0})
        with client.messages.stream(**body) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
        assert proxy.cuts == 1
        assert final.content[0].text == _expected("cut marker", 14)
        assert final.usage.output_tokens == 14  # the whole answer's, not the second run's part
        assert kinds.count("message_start") == 1
        assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
        assert s.gw.stats()["continued"] == 1


def test_a_cut_sampled_stream_ends_with_an_error_event_the_sdk_raises() -> None:
    with _cut_stack(fast_sim(itl_ms=2.0)) as (proxy, s):
        proxy.plan["sampled marker"] = 4
        client = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        with (
            pytest.raises(anthropic.APIStatusError, match="upstream"),
            client.messages.stream(**_body("sampled marker", 14)) as stream,
        ):
            for _ in stream:
                pass
        assert s.sim.stats()["generations_started"] == 1


def test_a_quiet_stream_gets_anthropic_pings_and_the_sdk_reads_through_them() -> None:
    sim = fast_sim(faults=(Fault.parse("stall:0.5:1.0"),), headers_after_first_token=True)
    with make_stack(sim, commit="early", heartbeat=0.05) as s:
        raw = httpx2.post(s.url + "/v1/messages", json=_body("quiet", 4, stream=True), timeout=10)
        assert 'event: ping\ndata: {"type": "ping"}\n\n' in raw.text
        assert ": keep-alive" not in raw.text
        assert _text_of([e for e in _events(raw.text) if e[0] != "ping"]) == _expected("quiet", 4)
        client = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0, timeout=0.4)
        with client.messages.stream(**_body("quiet sdk", 4)) as stream:
            assert stream.get_final_message().content[0].text == _expected("quiet sdk", 4)


def test_refusals_come_in_anthropic_shape_and_the_sdk_raises_its_own_errors() -> None:
    # The gateway full: its 429 with Retry-After, Anthropic's rate_limit_error.
    with make_stack(
        fast_sim(faults=(Fault.parse("stall:5:1.0"),)), max_inflight=1, queue_size=0
    ) as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        busy = threading.Thread(target=lambda: client.messages.create(**_body("hold", 2)))
        busy.start()
        wait_for(lambda: s.sim.stats()["requests_received"] == 1, what="the first call")
        with pytest.raises(anthropic.RateLimitError) as refused:
            client.messages.create(**_body("refused", 2))
        assert refused.value.response.headers["retry-after"]
        assert refused.value.body["error"]["type"] == "rate_limit_error"
        s.sim.restart()  # ends the held call
        busy.join(20)
    # Every engine down: the gateway's 503, Anthropic's 529 overloaded_error.
    with make_stack() as s:
        s.sim_server.stop()
        client = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as down:
            client.messages.create(**_body("nobody home", 2))
        assert down.value.status_code == 529
        assert down.value.body["error"]["type"] == "overloaded_error"
        assert down.value.response.headers["retry-after"]
        bad = httpx2.post(s.url + "/v1/messages", json={"model": MODEL, "messages": []})
        assert bad.status_code == 400
        assert bad.json()["type"] == "error"
        assert bad.json()["error"]["type"] == "invalid_request_error"


async def test_skip_delivered_trims_the_straddling_delta_and_refuses_a_different_answer() -> None:
    log = MemoryEventLog()
    start = b'{"type":"message_start","message":{"id":"m1"}}'
    block = b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'

    def delta(text: str) -> bytes:
        return orjson.dumps(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            }
        )

    await log.append((start, block, delta("Hel"), delta("lo")))
    partial = await read_messages_partial(log)
    assert partial is not None and partial.texts == {0: "Hello"} and not partial.finished
    skip = SkipDelivered(partial)
    assert skip([start, block]) == []
    assert skip([delta("He")]) == []
    (straddling,) = skip([delta("llo w")])
    assert orjson.loads(straddling)["delta"]["text"] == " w"
    assert skip([delta("orld")]) == [delta("orld")]
    assert skip.diverged is None
    other = SkipDelivered(partial)
    assert other([delta("Bye"), delta("orld")]) == []
    assert other.diverged is not None and "differs" in other.diverged
