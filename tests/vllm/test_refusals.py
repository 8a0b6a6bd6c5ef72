"""vLLM's load shedding (``--max-num-queued-reqs``) refuses a request in two forms: a 503 status,
or a 200 whose first event is an error carrying 503 (the admission check that runs again once
the stream has started). Neither started anything, so neither may reach a caller as a failure:
the gateway takes both as the refusal they are and asks again; the streamsafe client does the
same straight to vLLM."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx2
import orjson
import pytest
from vllm_helpers import gateway

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(300, func_only=True)

STREAMS = 24
#: Short answers: a call the engine keeps refusing while the gateway's own generations run there
#: waits for room up to the queue timeout (20 s); 24 streams of 32 tokens through a vLLM that
#: holds 2 outlasted it on a machine with two busy loops beside the suite, and so did 16 tokens
#: once (2026-12-07).
TOKENS = 8


def _body(vllm: VLLMEngine, i: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": vllm.model,
        "messages": [{"role": "user", "content": f"shed {i}"}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
        **extra,
    }


def _flood(call: Callable[[int], Any]) -> list[Any]:
    out: list[Any] = [None] * STREAMS
    start = threading.Barrier(STREAMS)

    def one(i: int) -> None:
        start.wait()
        try:
            out[i] = call(i)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _raw(url: str, body: dict[str, Any]) -> tuple[int, str]:
    """(status, first event's data) of a stream straight to ``url``."""
    with httpx2.stream(
        "POST", url + "/v1/chat/completions", json=body, timeout=60.0, trust_env=False
    ) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, resp.text
        for line in resp.iter_lines():
            if line.startswith("data: "):
                return 200, line[6:]
    return 200, ""


@pytest.fixture(scope="module")
def shedding(start_vllm_module: Callable[..., VLLMEngine]) -> VLLMEngine:
    """A vLLM that holds two requests at most (running and waiting together), so a burst is
    refused in both forms."""
    return start_vllm_module("--max-num-queued-reqs", "2", max_num_seqs=2)


def test_vllm_sheds_a_burst_in_both_forms(shedding: VLLMEngine) -> None:
    # Measured: a fresh server's first burst is refused in-band (its count of requests is
    # behind), later bursts with the status; now and then four bursts showed one form only
    # (2026-12-07). Bursts until both were seen.
    forms: set[str] = set()
    for _ in range(8):
        for status, data in _flood(lambda i: _raw(shedding.url, _body(shedding, i))):
            if status == 503:
                assert orjson.loads(data)["error"]["code"] == 503
                forms.add("status")
            elif data.startswith('{"error"'):
                assert orjson.loads(data)["error"]["code"] == 503
                forms.add("in-band")
        if len(forms) == 2:
            break
    assert forms == {"status", "in-band"}


def test_through_the_gateway_no_caller_sees_a_refusal(shedding: VLLMEngine) -> None:
    import openai

    with gateway(shedding) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", timeout=30.0)

        def call(i: int) -> str:
            body = _body(shedding, i)
            stream = client.chat.completions.create(**body)
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        results = _flood(call)
    failures = [r for r in results if not isinstance(r, str)]
    assert not failures, failures
    assert all(results)


def test_the_streamsafe_client_retries_both_forms_straight_to_vllm(shedding: VLLMEngine) -> None:
    from streamsafe import AsyncClient, RetryPolicy, StreamError

    async def run() -> list[Any]:
        # Retries enough for a burst of 24 on room for 2: the point is what is retried.
        policy = RetryPolicy(max_retries=20, max_delay=1.0)
        async with AsyncClient(
            base_url=shedding.url + "/v1", api_key="x", retry=policy, budget=None
        ) as c:

            async def one(i: int) -> Any:
                try:
                    stream = await c.chat.completions.create(**_body(shedding, i))
                    async for _ in stream:
                        pass
                    return stream.text
                except Exception as exc:
                    return exc

            return await asyncio.gather(*(one(i) for i in range(STREAMS)))

    results = asyncio.run(run())
    assert not [r for r in results if isinstance(r, StreamError)], results
    assert all(isinstance(r, str) and r for r in results), results
