"""A stall ends inside one bound (``stall_timeout``): an answer that went quiet, was cut and is
continued on an engine that is silent again ends with a clear error ``stall_timeout`` after its
last token, not after one first-token timeout per continuation."""

from __future__ import annotations

import orjson
from gateway_helpers import chat_body, content_of, fast_sim, make_stack, post_stream, sse_payloads

from streamsafe.engine_sim import Fault


def test_a_continuation_silent_past_the_stall_bound_ends_the_answer_with_a_clear_error() -> None:
    # The first attempt goes silent after 3 events (cut by the 1 s idle bound); its continuation
    # would not answer for 30 s. The first-token timeout (20 s) is not what ends it.
    sim = fast_sim(
        faults=(Fault.parse("hang:3:1.0@fresh"), Fault.parse("stall:30:1.0@continuation"))
    )
    with make_stack(
        sim, idle_timeout=1.0, stall_timeout=1.5, first_token_timeout=20.0, max_continuations=5
    ) as s:
        r = post_stream(s.url, chat_body("stalls twice", max_tokens=20))
        payloads = sse_payloads(r.text)
        assert payloads[-1][1] == "[DONE]"
        error = orjson.loads(payloads[-2][1])["error"]
        assert "stalled" in error["message"]
        assert len(content_of(payloads).split()) == 2  # what came before the stall, kept
        assert s.sim.stats()["requests_received"] == 2  # the silent engine was not asked again


def test_a_continuation_that_answers_within_the_bound_is_whole() -> None:
    sim = fast_sim(
        faults=(Fault.parse("hang:3:1.0@fresh"), Fault.parse("stall:0.2:1.0@continuation"))
    )
    with make_stack(sim, idle_timeout=1.0, stall_timeout=5.0) as s:
        body = chat_body("stalls once", max_tokens=20)
        r = post_stream(s.url, body)
        payloads = sse_payloads(r.text)
        assert payloads[-1][1] == "[DONE]"
        assert not any('"error"' in data for _, data in payloads)
