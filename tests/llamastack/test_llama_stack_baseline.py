"""What the real Llama Stack 0.2.12 server (remote::vllm in front of the simulator) does, pinned:
the behaviour the gateway builds on in front of it and behind it, and the facts the upstream-kind
table (streamsafe.gateway.upstream.kinds) states about it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import httpx2
import orjson
import pytest

from conftest import MODEL, LlamaStackTier
from streamsafe.engine_sim import Fault, expected_text
from streamsafe.gateway.upstream.answer_end import ends_answer
from streamsafe.gateway.upstream.error_events import parse_error_event
from streamsafe.gateway.upstream.kinds import KINDS, Wire
from streamsafe.sse import SSEDecoder
from waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(90)

LS = KINDS["llama-stack"]


def _messages(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def _native_chat(content: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model_id": MODEL,
        "messages": _messages(content),
        "stream": stream,
        "sampling_params": {"max_tokens": max_tokens},
    }


def _expected(content: str, max_tokens: int) -> str:
    """What the engine generates for this chat (Llama Stack passes the messages on as they are)."""
    return expected_text({"model": MODEL, "messages": _messages(content)}, max_tokens)


def _stream(url: str, body: dict[str, Any]) -> tuple[int, list[bytes], bytes]:
    """(status, every event's data, the raw body) of a streamed POST."""
    decoder = SSEDecoder()
    payloads: list[bytes] = []
    raw = b""
    with (
        httpx2.Client(trust_env=False, timeout=30) as client,
        client.stream("POST", url, json=body) as response,
    ):
        for chunk in response.iter_bytes():
            raw += chunk
            payloads.extend(e.raw for e in decoder.feed(chunk))
        return response.status_code, payloads, raw


def _native_chat_text(payloads: list[bytes]) -> str:
    return "".join(orjson.loads(p)["event"]["delta"]["text"] for p in payloads)


def test_models_list_names_the_engine_model(tier: LlamaStackTier) -> None:
    response = httpx2.get(tier.url + LS.models_path, timeout=10)
    assert response.status_code == 200
    assert [m["identifier"] for m in response.json()["data"]] == [MODEL]
    health = httpx2.get(tier.url + LS.health_path, timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "OK"}


def test_native_chat_stream_drops_the_token_sent_with_finish_reason(tier: LlamaStackTier) -> None:
    whole = _expected("tell me a story", 12)
    unary = httpx2.post(
        tier.url + "/v1/inference/chat-completion",
        json=_native_chat("tell me a story", 12, stream=False),
        timeout=30,
    )
    assert unary.status_code == 200
    assert unary.json()["completion_message"]["content"] == whole

    status, payloads, raw = _stream(
        tier.url + "/v1/inference/chat-completion", _native_chat("tell me a story", 12, True)
    )
    assert status == 200
    assert b"[DONE]" not in raw and b"\nid:" not in raw and not raw.startswith(b"id:")
    assert orjson.loads(payloads[0])["event"]["event_type"] == "start"
    # The engine's last token travels with finish_reason; Llama Stack's native chat drops it.
    assert _native_chat_text(payloads) == whole.rsplit(" ", 1)[0]
    assert ends_answer(Wire.LLAMA_STACK_CHAT, payloads[-1])
    assert not any(ends_answer(Wire.LLAMA_STACK_CHAT, p) for p in payloads[:-1])


def test_native_completion_stream_keeps_every_token(tier: LlamaStackTier) -> None:
    body = {"model_id": MODEL, "content": "once upon a time", "sampling_params": {"max_tokens": 9}}
    unary = httpx2.post(tier.url + "/v1/inference/completion", json=body, timeout=30)
    assert unary.status_code == 200
    content = unary.json()["content"]
    assert len(content.split()) == 9

    status, payloads, raw = _stream(tier.url + "/v1/inference/completion", {**body, "stream": True})
    assert status == 200 and b"[DONE]" not in raw
    assert "".join(orjson.loads(p)["delta"] for p in payloads) == content
    assert ends_answer(Wire.LLAMA_STACK_COMPLETION, payloads[-1])
    assert not any(ends_answer(Wire.LLAMA_STACK_COMPLETION, p) for p in payloads[:-1])


def test_openai_route_streams_the_whole_answer_without_done(tier: LlamaStackTier) -> None:
    body = {"model": MODEL, "messages": _messages("hello"), "max_tokens": 10, "stream": True}
    status, payloads, raw = _stream(tier.url + "/v1/openai/v1/chat/completions", body)
    assert status == 200 and b"[DONE]" not in raw
    chunks = [orjson.loads(p) for p in payloads]
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks)
    assert text == _expected("hello", 10)
    assert ends_answer(Wire.OPENAI_CHAT, payloads[-1])
    assert not any(ends_answer(Wire.OPENAI_CHAT, p) for p in payloads[:-1])


def test_stream_headers_arrive_before_the_engine_starts_the_request(tier: LlamaStackTier) -> None:
    sim = tier.engine(max_num_seqs=1, itl_ms=5.0)
    occupier = {"model": MODEL, "messages": _messages("occupy"), "max_tokens": 4000, "stream": True}
    body = _native_chat("wait your turn", 5, stream=True)
    with httpx2.Client(trust_env=False, timeout=30) as client:
        busy = client.send(
            client.build_request("POST", tier.slot_url + "/v1/chat/completions", json=occupier),
            stream=True,
        )
        wait_until(lambda: sim.stats()["active"] == 1, what="the occupier runs")
        with client.stream("POST", tier.url + "/v1/inference/chat-completion", json=body) as r:
            # Headers are here while the engine has not started this request: the occupier
            # still runs alone (max_num_seqs=1), so Llama Stack's request is at most queued.
            # (Whether it is queued yet is a race with the headers: the engine counts a
            # generation as started when it admits it to the queue.)
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            stats = sim.stats()
            seen = [
                (q.path, q.headers.get("x-stainless-retry-count"))
                for q in tier.deployment.slot.seen
            ]
            assert stats["active"] == 1, (seen, stats)
            assert stats["generations_completed"] == stats["generations_aborted"] == 0, (
                seen,
                stats,
            )
            busy.close()  # the engine aborts the occupier and serves ours
            raw = r.read()
    assert raw.count(b"data: ") == 6  # start, 4 of 5 tokens (the last one dropped), complete
    assert sim.stats()["generations_started"] == 2


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/inference/chat-completion", _native_chat("a long answer please", 600, stream=True)),
        (
            "/v1/openai/v1/chat/completions",
            {"model": MODEL, "messages": _messages("long"), "max_tokens": 600, "stream": True},
        ),
    ],
)
async def test_mid_stream_disconnect_leaves_the_engine_request_running(
    tier: LlamaStackTier, path: str, body: dict[str, Any]
) -> None:
    sim = tier.engine(itl_ms=2.0)
    async with (
        httpx2.AsyncClient(trust_env=False, timeout=30) as client,
        client.stream("POST", tier.url + path, json=body) as r,
    ):
        async for chunk in r.aiter_bytes():
            if b'"progress"' in chunk or b'"content":"' in chunk:
                break  # the caller leaves after its first token
    # Llama Stack closes its generator but not its engine request: the engine finishes it.
    await _until(lambda: sim.stats()["generations_completed"] == 1, "the engine finished it")
    assert sim.stats()["generations_aborted"] == 0
    assert sim.stats()["tokens_generated"] == 600


async def test_unary_disconnect_leaves_the_engine_request_running(tier: LlamaStackTier) -> None:
    sim = tier.engine(itl_ms=2.0)
    body = _native_chat("a long answer please", 400, stream=False)
    async with httpx2.AsyncClient(trust_env=False, timeout=30) as client:
        call = asyncio.create_task(
            client.post(tier.url + "/v1/inference/chat-completion", json=body)
        )
        await _until(lambda: sim.stats()["active"] == 1, "the engine runs it")
        call.cancel()  # the caller gives up, as a client's read timeout does
        with pytest.raises(asyncio.CancelledError):
            await call
    # Llama Stack keeps waiting for the whole answer: this is what piles copies up.
    await _until(lambda: sim.stats()["generations_completed"] == 1, "the engine finished it")
    assert sim.stats()["generations_aborted"] == 0
    assert sim.stats()["tokens_generated"] == 400


def test_engine_failures_are_retried_by_llama_stack_then_masked(tier: LlamaStackTier) -> None:
    sim = tier.engine(faults=(Fault.parse("status:503:1.0"),))
    unary = httpx2.post(
        tier.url + "/v1/inference/chat-completion", json=_native_chat("x", 4, False), timeout=30
    )
    assert unary.status_code == 500
    assert unary.json() == {"detail": "Internal server error: An unexpected error occurred."}
    # Llama Stack's upstream client is AsyncOpenAI(max_retries=2), marking its retries.
    counts = [r.headers.get("x-stainless-retry-count") for r in tier.slot.seen]
    assert counts == ["0", "1", "2"]
    assert sim.stats()["requests_received"] == 3

    status, payloads, _ = _stream(
        tier.url + "/v1/inference/chat-completion", _native_chat("x", 4, True)
    )
    assert status == 200  # sent before the engine was asked
    assert len(payloads) == 1
    error = parse_error_event(LS, payloads[0])
    assert error is not None and error.status == 500 and error.upstream_failure
    assert error.message == "500: Internal server error: An unexpected error occurred."
    assert sim.stats()["requests_received"] == 6

    status, payloads, _ = _stream(
        tier.url + "/v1/openai/v1/chat/completions",
        {"model": MODEL, "messages": _messages("x"), "max_tokens": 4, "stream": True},
    )
    assert status == 200 and len(payloads) == 1
    error = parse_error_event(LS, payloads[0])
    assert error is not None and error.upstream_failure


def test_broken_engine_stream_ends_with_a_masked_error_event(tier: LlamaStackTier) -> None:
    sim = tier.engine(faults=(Fault.parse("cut:4:1.0"),))
    status, payloads, _ = _stream(
        tier.url + "/v1/inference/chat-completion", _native_chat("cut me", 20, True)
    )
    assert status == 200
    error = parse_error_event(LS, payloads[-1])
    assert error is not None and error.upstream_failure
    assert not any(ends_answer(Wire.LLAMA_STACK_CHAT, p) for p in payloads)
    assert 1 <= len(payloads) - 2 <= 4  # start, some tokens, the error
    assert sim.stats()["requests_received"] == 1  # never retried once the stream began


async def test_llama_stack_client_reads_a_masked_error_as_an_ordinary_chunk(
    tier: LlamaStackTier,
) -> None:
    from llama_stack_client import AsyncLlamaStackClient

    tier.engine(faults=(Fault.parse("status:503:1.0"),))
    async with AsyncLlamaStackClient(base_url=tier.url, timeout=30) as client:
        stream = await client.inference.chat_completion(
            model_id=MODEL, messages=_messages("x"), stream=True, sampling_params={"max_tokens": 4}
        )
        chunks = [chunk async for chunk in stream]
    assert len(chunks) == 1 and chunks[0].event is None  # no exception: the caller must look


async def test_client_retry_reaches_the_engine_as_a_fresh_call(tier: LlamaStackTier) -> None:
    from llama_stack_client import APITimeoutError, AsyncLlamaStackClient

    sim = tier.engine(itl_ms=4.0)
    async with AsyncLlamaStackClient(
        base_url=tier.url, timeout=httpx.Timeout(0.5, connect=5.0), max_retries=2
    ) as client:
        with pytest.raises(APITimeoutError):
            await client.inference.chat_completion(
                model_id=MODEL, messages=_messages("slow"), sampling_params={"max_tokens": 500}
            )
    await _until(lambda: sim.stats()["generations_started"] == 3, "three copies")
    # Each client attempt became a fresh Llama Stack call: count 0, no key, same body.
    seen = [r for r in tier.slot.seen if r.path == "/v1/chat/completions"]
    assert [r.headers.get("x-stainless-retry-count") for r in seen] == ["0", "0", "0"]
    assert not any("idempotency-key" in r.headers for r in seen)
    assert sim.stats()["generations_aborted"] == 0


async def _until(predicate: Any, what: str, limit_s: float = 30.0) -> None:
    await wait_until_async(predicate, limit_s, what)
