"""The report's deployment today with the real engine: OGX 1.5.0 (``remote::vllm``) in front of the
real vLLM, and the gateway with its default flags in front of OGX. vLLM's engine is stalled past
the clients' timeout (3 s, their 2 retries), as a busy engine is; every call is counted in vLLM's
own request log (each test tags its requests with a seed of its own, 7001-7999, which no
other file of this folder uses: they share the session's vLLM)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from vllm_helpers import greedy_text

from server_stops import stop_later
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.client_calls import run_calls
from streamsafe_bench.ogx_server import (
    LLAMA_STACK_07,
    OGX,
    OGXServer,
    ServerUnavailable,
    find_venv,
)
from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(180, func_only=True)

CALLS = 8
TIMEOUT = 3.0
#: How long vLLM's engine stalls once the calls went out: past the first attempt's timeout.
STALL = 4.5


def _venv(flavor: Any) -> Any:
    try:
        return find_venv(flavor)
    except ServerUnavailable as exc:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"{exc}; CI runs the real server and never skips it", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def ogx(vllm_engine: VLLMEngine) -> Iterator[OGXServer]:
    """OGX in front of the session's vLLM (which it serves as ``vllm/<model>``)."""
    server = OGXServer(vllm_engine.url, flavor=OGX, venv=_venv(OGX)).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def gateway_in_front(ogx: OGXServer) -> Iterator[ServerThread]:
    """The gateway with its default flags in front of OGX."""
    server = ServerThread(Gateway(GatewayConfig(upstream=ogx.url))).start()
    try:
        yield server
    finally:
        stop_later(server)


def _calls(vllm: VLLMEngine, seed: int, stream: bool) -> list[dict[str, Any]]:
    return [
        {
            "model": f"vllm/{vllm.model}",
            "messages": [{"role": "user", "content": f"caller {i} of the stalled engine"}],
            "max_tokens": 16,
            "stream": stream,
            "params": {"temperature": 0, "seed": seed},
        }
        for i in range(CALLS)
    ]


def _stalled(vllm: VLLMEngine, run: Any) -> list[dict[str, Any]]:
    """``run()`` while vLLM's engine stalls for :data:`STALL` seconds from the start."""
    results: list[dict[str, Any]] = []
    vllm.pause()
    caller = threading.Thread(target=lambda: results.extend(run()))
    caller.start()
    time.sleep(STALL)
    vllm.resume()
    caller.join(120)
    return results


def _plain(vllm: VLLMEngine, url: str, seed: int) -> list[dict[str, Any]]:
    plan = {
        "client": "llama-stack-client",
        "base_url": url,
        "calls": _calls(vllm, seed, stream=False),
        "timeout": TIMEOUT,
        "max_retries": 2,
    }
    return run_calls(_venv(LLAMA_STACK_07) / "bin" / "python", plan)


def _expected(vllm: VLLMEngine) -> list[str]:
    return [
        greedy_text(vllm, f"caller {i} of the stalled engine", 16, seed=7999) for i in range(CALLS)
    ]


def test_plain_calls_through_the_gateway_and_ogx_are_one_vllm_request_each(
    vllm_engine: VLLMEngine, ogx: OGXServer
) -> None:
    with gateway_in_front(ogx) as gw:
        results = _stalled(vllm_engine, lambda: _plain(vllm_engine, gw.url, seed=7001))
    assert [r["text"] for r in results] == _expected(vllm_engine), results
    assert len(vllm_engine.requests_received(seed=7001)) == CALLS


def test_without_the_gateway_each_retry_is_another_vllm_request(
    vllm_engine: VLLMEngine, ogx: OGXServer
) -> None:
    results = _stalled(vllm_engine, lambda: _plain(vllm_engine, ogx.url, seed=7002))
    received = len(vllm_engine.requests_received(seed=7002))
    assert received >= 2 * CALLS, (received, [r["error"] for r in results])


def test_openai_streams_through_the_gateway_and_ogx_are_one_vllm_request_each(
    vllm_engine: VLLMEngine, ogx: OGXServer
) -> None:
    def streams(url: str) -> list[dict[str, Any]]:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=TIMEOUT, max_retries=2)
        out: list[dict[str, Any]] = [{} for _ in range(CALLS)]

        def one(i: int, call: dict[str, Any]) -> None:
            try:
                stream = client.chat.completions.create(
                    model=call["model"],
                    messages=call["messages"],
                    max_tokens=call["max_tokens"],
                    stream=True,
                    **call["params"],
                )
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                out[i] = {"text": text, "error": None}
            except Exception as exc:
                out[i] = {"text": "", "error": type(exc).__name__}

        threads = [
            threading.Thread(target=one, args=(i, c))
            for i, c in enumerate(_calls(vllm_engine, 7003, stream=True))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return out

    with gateway_in_front(ogx) as gw:
        results = _stalled(vllm_engine, lambda: streams(gw.url))
    assert [r["text"] for r in results] == _expected(vllm_engine), results
    assert len(vllm_engine.requests_received(seed=7003)) == CALLS
