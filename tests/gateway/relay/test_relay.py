"""The streaming relay: ids on every event, the right text, replay and resume."""

from __future__ import annotations

import orjson
from gateway_helpers import (
    Stack,
    chat_body,
    content_of,
    fast_sim,
    make_stack,
    post_stream,
    sse_payloads,
    wait_for,
)

from streamsafe.engine_sim import expected_text


def test_stream_relays_every_event_with_ids_and_correct_text(stack: Stack) -> None:
    body = chat_body(max_tokens=8)
    r = post_stream(stack.url, body)
    assert r.status_code == 200
    assert r.headers["x-stream-resumable"] == "true"
    events = sse_payloads(r.text)
    assert [i for i, _ in events] == list(range(len(events)))
    assert events[-1][1] == "[DONE]"
    assert content_of(events) == expected_text(body, 8, 0)
    assert stack.gw.stats()["generations_completed"] == 1


def _keyed(key: str, **extra: str) -> dict[str, str]:
    return {"Idempotency-Key": key, **extra}


def test_keyed_duplicate_of_live_generation_attaches_instead_of_starting_another() -> None:
    import threading

    import httpx2

    with make_stack(fast_sim(itl_ms=15.0)) as s:
        body = chat_body(max_tokens=20)
        results: list[httpx2.Response] = []

        def first() -> None:
            results.append(post_stream(s.url, body, _keyed("k1")))

        t = threading.Thread(target=first)
        t.start()
        wait_for(lambda: s.gw.stats()["events_relayed"] >= 3, what="first events")
        second = post_stream(s.url, body, _keyed("k1", **{"X-Retry-Count": "1"}))
        t.join(10)
        assert second.status_code == 200
        assert sse_payloads(second.text) == sse_payloads(results[0].text)
        assert content_of(sse_payloads(second.text)) == expected_text(body, 20, 0)
        assert s.sim.stats()["generations_started"] == 1
        stats = s.gw.stats()
        assert stats["attached"] == 1
        assert stats["retries_seen"] == 1


def test_keyed_duplicate_of_finished_generation_replays_it(stack: Stack) -> None:
    body = chat_body(max_tokens=6)
    first = post_stream(stack.url, body, _keyed("k2"))
    second = post_stream(stack.url, body, _keyed("k2"))
    assert second.text == first.text
    assert stack.sim.stats()["generations_started"] == 1
    assert stack.gw.stats()["replayed"] == 1


def test_key_reused_with_a_different_body_is_422(stack: Stack) -> None:
    post_stream(stack.url, chat_body("one"), _keyed("k3"))
    r = post_stream(stack.url, chat_body("two"), _keyed("k3"))
    assert r.status_code == 422
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert stack.sim.stats()["generations_started"] == 1


def test_other_tenant_with_same_key_gets_its_own_generation() -> None:
    with make_stack(api_keys=("key-a", "key-b", "key-c")) as s:
        body_a = chat_body("secret of tenant a", max_tokens=6)
        body_b = chat_body("tenant b asks", max_tokens=6)
        a = post_stream(s.url, body_a, _keyed("shared", Authorization="Bearer key-a"))
        # Same key, other body, other tenant: not a 422 (keys are per tenant), its own text.
        b = post_stream(s.url, body_b, _keyed("shared", Authorization="Bearer key-b"))
        # Same key and same body, other tenant: still a generation of its own, never an attach.
        c = post_stream(s.url, body_a, _keyed("shared", Authorization="Bearer key-c"))
        assert a.status_code == b.status_code == c.status_code == 200
        assert content_of(sse_payloads(b.text)) == expected_text(body_b, 6, 0)
        assert "secret" not in b.text
        assert s.sim.stats()["generations_started"] == 3
        assert s.gw.stats()["attached"] == s.gw.stats()["replayed"] == 0


def test_resume_from_every_last_event_id_gives_exactly_the_rest(stack: Stack) -> None:
    body = chat_body(max_tokens=7)
    full = sse_payloads(post_stream(stack.url, body, _keyed("k4")).text)
    for last in range(-1, len(full)):
        r = post_stream(stack.url, body, _keyed("k4", **{"Last-Event-ID": str(last)}))
        assert r.status_code == 200
        assert sse_payloads(r.text) == full[last + 1 :], last
    assert stack.sim.stats()["generations_started"] == 1
    assert stack.gw.stats()["resumed"] == len(full) + 1


def test_resume_of_a_live_stream_gives_the_rest_then_live() -> None:
    with make_stack(fast_sim(itl_ms=10.0)) as s:
        body = chat_body(max_tokens=15)
        import httpx2

        with httpx2.Client(timeout=10) as client:
            with client.stream(
                "POST", s.url + "/v1/chat/completions", json=body, headers=_keyed("k5")
            ) as first:
                lines = first.iter_lines()
                seen = []
                for line in lines:
                    if line.startswith("id: "):
                        seen.append(int(line[4:]))
                    if len(seen) == 3:
                        break
            # The first connection is closed mid-stream; resume within the grace period.
            r = post_stream(s.url, body, _keyed("k5", **{"Last-Event-ID": "2"}))
        events = sse_payloads(r.text)
        assert events[0][0] == 3
        assert events[-1][1] == "[DONE]"
        assert s.sim.stats()["generations_started"] == 1


def test_unkeyed_identical_bodies_that_are_not_retries_stay_independent(stack: Stack) -> None:
    body = chat_body(max_tokens=4)
    post_stream(stack.url, body)
    post_stream(stack.url, body)
    assert stack.sim.stats()["generations_started"] == 2


def test_unkeyed_retry_attaches_to_newest_generation_with_same_body(stack: Stack) -> None:
    body = chat_body(max_tokens=4)
    first = post_stream(stack.url, body)
    again = post_stream(stack.url, body, {"x-stainless-retry-count": "1"})
    assert again.text == first.text
    assert stack.sim.stats()["generations_started"] == 1


def test_non_streaming_retry_gets_the_same_completion(stack: Stack) -> None:
    body = chat_body(max_tokens=5, stream=False)
    first = post_stream(stack.url, body)
    again = post_stream(stack.url, body, {"x-stainless-retry-count": "1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert first.json()["choices"][0]["message"]["content"] == expected_text(body, 5, 0)
    assert stack.sim.stats()["generations_started"] == 1


def test_resume_past_the_end_of_a_finished_stream_is_400_and_at_its_end_is_empty(
    stack: Stack,
) -> None:
    body = chat_body(max_tokens=3)
    first = post_stream(stack.url, body, _keyed("past-end"))
    ids = [i for i, _ in sse_payloads(first.text) if i is not None]
    last = ids[-1]  # the [DONE] event's id
    past = post_stream(stack.url, body, _keyed("past-end", **{"Last-Event-ID": str(last + 5)}))
    assert past.status_code == 400
    error = past.json()["error"]
    assert error["param"] == "Last-Event-ID" and str(last + 5) in error["message"]
    # Resuming after the very last event is valid: nothing more comes.
    done = post_stream(stack.url, body, _keyed("past-end", **{"Last-Event-ID": str(last)}))
    assert done.status_code == 200 and sse_payloads(done.text) == []
    assert stack.sim.stats()["generations_started"] == 1


def test_resume_of_a_live_stream_past_where_it_ends_gets_an_error_not_an_empty_stream() -> None:
    import threading

    with make_stack(fast_sim(itl_ms=15.0)) as s:
        body = chat_body(max_tokens=20)
        first: list[object] = []
        runner = threading.Thread(
            target=lambda: first.append(post_stream(s.url, body, _keyed("live-past")))
        )
        runner.start()
        wait_for(lambda: s.sim.stats()["tokens_generated"] > 0, what="the stream under way")
        past = post_stream(s.url, body, _keyed("live-past", **{"Last-Event-ID": "100000"}))
        runner.join(10)
        # Committed before the generation ended (early commit), so the refusal is an error
        # event: the stream ended cleanly with no event at all before.
        assert past.status_code == 200
        events = sse_payloads(past.text)
        assert [d for _, d in events][-1] == "[DONE]"
        error = orjson.loads(events[0][1])["error"]
        assert error["param"] == "Last-Event-ID" and "100000" in error["message"]
        assert s.sim.stats()["generations_started"] == 1


def test_resume_of_unknown_generation_is_410(stack: Stack) -> None:
    r = post_stream(stack.url, chat_body(), _keyed("never-seen", **{"Last-Event-ID": "3"}))
    assert r.status_code == 410


def test_finished_generation_is_forgotten_after_keep_finished_even_if_replayed() -> None:
    # Long enough that the replay comes before expiry even on a loaded machine; whether the
    # replay moved the deadline is read from the retention ledger, not from the wall clock.
    with make_stack(keep_finished=5.0) as s:
        body = chat_body(max_tokens=3)
        post_stream(s.url, body, _keyed("ttl"))
        kept = s.gw.registry.kept
        due = kept.due()
        assert due is not None and len(kept) == 1
        post_stream(s.url, body, _keyed("ttl"))
        assert s.gw.stats()["replayed"] == 1
        assert kept.due() == due  # not extended
        wait_for(lambda: s.gw.stats()["kept_generations"] == 0, timeout=20, what="retention expiry")
        post_stream(s.url, body, _keyed("ttl"))
        assert s.sim.stats()["generations_started"] == 2


def test_memory_cap_evicts_oldest_finished_generation_first() -> None:
    with make_stack(max_kept_bytes=12_000) as s:  # room for about three
        for i in range(4):
            post_stream(s.url, chat_body(f"user {i}", max_tokens=6), _keyed(f"cap{i}"))
        stats = s.gw.stats()
        assert stats["evicted"] >= 1
        assert stats["kept_bytes"] <= 12_000
        # The newest is still replayable; the oldest starts over.
        post_stream(s.url, chat_body("user 3", max_tokens=6), _keyed("cap3"))
        assert s.gw.stats()["replayed"] == 1
        post_stream(s.url, chat_body("user 0", max_tokens=6), _keyed("cap0"))
        assert s.sim.stats()["generations_started"] == 5
