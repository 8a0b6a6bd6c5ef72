"""vLLM's own Responses API (``POST /v1/responses``) served by the gateway with the promises it
gives OGX's: an ``Idempotency-Key`` sent again replays the one generation, ``Last-Event-ID`` and
``starting_after`` resume with exactly the rest, and the answer is vLLM's own. Counted in
vLLM's request log."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest
from vllm_helpers import gateway

from streamsafe.sse import SSEDecoder
from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(180)


def _body(vllm: VLLMEngine, text: str, stream: bool = True) -> dict[str, Any]:
    return {
        "model": vllm.model,
        "input": text,
        "max_output_tokens": 24,
        "temperature": 0,
        "stream": stream,
    }


def _events(url: str, body: dict[str, Any], **headers: str) -> list[tuple[str | None, Any]]:
    r = httpx2.post(url + "/v1/responses", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return [(ev.id, orjson.loads(ev.data)) for ev in SSEDecoder().feed(r.content)]


def _text(events: list[tuple[str | None, Any]]) -> str:
    return "".join(
        d.get("delta", "") for _, d in events if d["type"] == "response.output_text.delta"
    )


def test_a_keyed_response_is_one_vllm_request_replayed_and_resumed_exactly(
    vllm_engine: VLLMEngine,
) -> None:
    straight = _events(vllm_engine.url, _body(vllm_engine, "responses through the gateway"))
    with gateway(vllm_engine) as gw:
        before = len(vllm_engine.requests_received())
        key = {"idempotency-key": "vllm-responses-1"}
        first = _events(gw.url, _body(vllm_engine, "responses through the gateway"), **key)
        assert first[-1][1]["type"] in ("response.completed", "response.incomplete")
        assert _text(first) == _text(straight) and _text(first)
        again = _events(gw.url, _body(vllm_engine, "responses through the gateway"), **key)
        assert again == first  # replayed: the same events, the same response id
        cut = len(first) // 2
        rest = _events(
            gw.url,
            _body(vllm_engine, "responses through the gateway"),
            **key,
            **{"last-event-id": str(first[cut][0])},
        )
        assert rest == first[cut + 1 :]
        response_id = first[0][1]["response"]["id"]
        r = httpx2.get(
            f"{gw.url}/v1/responses/{response_id}?stream=true&starting_after={first[cut][0]}",
            timeout=60,
        )
        assert r.status_code == 200, r.text
        after = [(ev.id, orjson.loads(ev.data)) for ev in SSEDecoder().feed(r.content)]
        assert after == first[cut + 1 :]
        assert len(vllm_engine.requests_received()) - before == 1
        plain = httpx2.post(
            gw.url + "/v1/responses", json=_body(vllm_engine, "a plain one", False), timeout=120
        )
        assert plain.status_code == 200, plain.text
        assert plain.json()["status"] in ("completed", "incomplete")  # max_output_tokens
