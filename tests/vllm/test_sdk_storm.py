"""The storm through unmodified SDKs against the real vLLM: 8 plain calls with a 2 s timeout and
the SDK's 2 retries while the engine is busy (stopped) past the timeout. Engine requests are
counted in vLLM's own request log. Straight with the plain SDK every call reaches the engine
two or three times; with ``streamsafe.http_client()`` once, and every call is answered; through
the gateway once, anthropic's Messages calls too (docs/sdk.md has the figures; ``-s`` prints
them)."""

from __future__ import annotations

import os
import sys
import time

import httpx2
import pytest
from vllm_helpers import gateway, wait_until

from streamsafe_bench.vllm_engine import VLLMEngine

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sdk"))
from sdk_storm import CALLS, Storm, run_storm

#: How long the engine is stopped. 3.5 s: past the SDK's first 2 s wait and into its second
#: (which ends 4.4 s in at the earliest), so the plain SDK sends at least two copies, while
#: streamsafe's transport has 3.6 s left of the SDK's three waits (7.1 s at the least) to answer
#: on the first one. 5 s: past the second wait too (4.5 s in at the latest), so the plain SDK
#: sends all three copies; 2.1 s are left for the first attempt's answer.
STALLS = (3.5, 5.0)
TIMEOUT = 2.0
TOKENS = 16


def _engine_idle(vllm: VLLMEngine) -> bool:
    text = httpx2.get(vllm.url + "/metrics", timeout=5.0, trust_env=False).text
    busy = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            busy += float(line.rsplit(" ", 1)[1])
    return busy == 0


def _storm(
    vllm: VLLMEngine, sdk: str, base_url: str, *, safe: bool, stall_for: float = STALLS[0]
) -> tuple[int, list[str]]:
    """Engine requests the storm cost, and what each call gave."""
    before = len(vllm.requests_received())
    storm = Storm(sdk, base_url, vllm.model, TIMEOUT, TOKENS, safe)
    started = time.monotonic()
    # Stopped before the first request goes out, so every copy meets the stopped engine.
    timer = vllm.stall(stall_for)
    results = run_storm(storm)
    timer.join(stall_for + 5)
    vllm.resume()
    wait_until(lambda: _engine_idle(vllm), what="the engine to finish the storm's work")
    sent = len(vllm.requests_received()) - before
    print(
        f"| {sdk} | {'http_client()' if safe else 'plain'} | {base_url} | {stall_for} s "
        f"| {sent / CALLS:.2f} "
        f"| {results.count('ok')}/{CALLS} | {time.monotonic() - started:.1f} s |"
    )
    return sent, results


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stall_for", STALLS)
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_straight_to_vllm_the_plain_sdk_sends_copies_and_http_client_one(
    vllm_engine: VLLMEngine, sdk: str, stall_for: float
) -> None:
    pytest.importorskip(sdk)
    url = vllm_engine.url
    sent, results = _storm(vllm_engine, sdk, url, safe=False, stall_for=stall_for)
    # Two copies of every call at least; past the second wait, three of (almost) every call.
    assert sent >= (2 * CALLS + CALLS // 2 if stall_for == STALLS[1] else 2 * CALLS), results
    sent, results = _storm(vllm_engine, sdk, url, safe=True, stall_for=stall_for)
    assert sent == CALLS, results
    if stall_for == STALLS[0]:
        assert results == ["ok"] * CALLS


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sdk", ["openai", "anthropic", "llama-stack-client"])
def test_through_the_gateway_each_call_is_one_engine_request(
    vllm_engine: VLLMEngine, sdk: str
) -> None:
    pytest.importorskip(sdk.replace("-", "_"))
    with gateway(vllm_engine) as gw:
        plain_sent, plain = _storm(vllm_engine, sdk, gw.url, safe=False)
        safe_sent, safe = _storm(vllm_engine, sdk, gw.url, safe=True)
    assert safe_sent == CALLS and safe == ["ok"] * CALLS
    # The gateway keeps a plain call's client waiting (102 Processing): one request already.
    assert plain_sent == CALLS and plain == ["ok"] * CALLS
