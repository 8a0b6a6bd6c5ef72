"""Work nobody waits for any more, in front of the real vLLM: the gateway keeps a generation for
its grace period after the last caller left (a retry or a resume may still come), then aborts it
at vLLM, which logs the abort."""

from __future__ import annotations

import time

import httpx2
import pytest
from vllm_helpers import chat_body, gateway, wait_until

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(90, func_only=True)

GRACE = 1.5


def test_a_generation_its_caller_left_is_aborted_at_vllm_after_the_grace(
    vllm_engine: VLLMEngine,
) -> None:
    body = chat_body(vllm_engine, "nobody reads me", 900, seed=4001, stream=True)
    aborted = len(vllm_engine.requests_aborted())
    with gateway(vllm_engine, grace=GRACE) as gw, httpx2.Client(timeout=60.0) as client:
        with client.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line == "id: 3":
                    break
        left = time.monotonic()
        # The engine stops generating, so the 900 tokens cannot end the generation first: only
        # the gateway's abort can. vLLM's API server still notices its client leaving and logs.
        vllm_engine.pause()
        wait_until(
            lambda: len(vllm_engine.requests_aborted()) > aborted, timeout=GRACE + 10, what="abort"
        )
        waited = time.monotonic() - left
        vllm_engine.resume()
    received = vllm_engine.requests_received(seed=4001)
    assert vllm_engine.requests_aborted()[aborted:] == received
    assert len(received) == 1
    assert waited >= GRACE
