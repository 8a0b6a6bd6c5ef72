"""Resume with ``Last-Event-ID`` through the gateway in front of the real vLLM: a caller that
lost its connection anywhere in a greedy stream gets exactly the rest, from the one generation
vLLM ran."""

from __future__ import annotations

import random

import httpx2
import pytest
from vllm_helpers import chat_body, gateway, greedy_text, sse_events, stream_text

from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(120, func_only=True)

STREAMS = 12
MAX_TOKENS = 60


def test_a_stream_cut_anywhere_and_resumed_by_last_event_id_is_exact(
    vllm_engine: VLLMEngine,
) -> None:
    rng = random.Random(3000)
    with gateway(vllm_engine) as gw, httpx2.Client(timeout=60.0) as client:
        for n in range(STREAMS):
            body = chat_body(vllm_engine, f"resumed story {n}", MAX_TOKENS, seed=3001, stream=True)
            headers = {"Idempotency-Key": f"vllm-resume-{n}"}
            cut = rng.randrange(1, MAX_TOKENS)
            lines = []
            with client.stream(
                "POST", gw.url + "/v1/chat/completions", json=body, headers=headers
            ) as first:
                for line in first.iter_lines():
                    lines.append(line)
                    if line == f"id: {cut}":
                        break
            # The event whose id line was read last has not been read whole: resume after the
            # one before it, as a client that saw only whole events does.
            before = "\n".join(lines[:-1]) + "\n\n"
            seen = sse_events(before)
            last = seen[-1][0] if seen else -1
            rest = client.post(
                gw.url + "/v1/chat/completions",
                json=body,
                headers={**headers, "Last-Event-ID": str(last)},
            )
            assert rest.status_code == 200
            events = seen + sse_events(rest.text)
            assert [i for i, _ in events] == list(range(len(events))), cut
            assert events[-1][1] == "[DONE]"
            wanted = greedy_text(vllm_engine, f"resumed story {n}", MAX_TOKENS, seed=3002)
            assert stream_text(events) == wanted, cut
        assert gw.gw.stats()["resumed"] == STREAMS
    assert len(vllm_engine.requests_received(seed=3001)) == STREAMS
