"""Admission over HTTP: shed before commit, places kept for clients that step back or leave,
fairness across tenants. Real gateway and simulator on loopback."""

from __future__ import annotations

import threading
import time

import httpx2
import pytest
from gateway_helpers import (
    chat_body,
    content_of,
    fast_sim,
    make_stack,
    post_stream,
    sse_payloads,
    wait_for,
)

from streamsafe.engine_sim import expected_text


def _in_thread(fn: object, *args: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn(*args)))  # type: ignore[operator]
    t.start()
    return t, out


def test_first_token_commit_steps_back_a_client_that_would_time_out_and_keeps_its_place() -> None:
    # One place; the engine is busy with a long answer. A Stainless client says it times out
    # after 0.2 s: rather than let it time out (and its retry queue again, or the work run for
    # nobody), the gateway answers 429 with Retry-After and keeps the generation's place.
    with make_stack(fast_sim(itl_ms=20.0), commit="first-token", max_inflight=1) as s:
        busy, _ = _in_thread(post_stream, s.url, chat_body("busy", max_tokens=60))
        wait_for(lambda: s.gw.stats()["inflight"] == 1, what="engine busy")
        body = chat_body("patient", max_tokens=5)
        first = post_stream(
            s.url, body, {"x-stainless-read-timeout": "0.2", "x-stainless-retry-count": "0"}
        )
        assert first.status_code == 429
        assert first.json()["error"]["type"] == "rate_limit_error"
        assert int(first.headers["retry-after"]) >= 1
        assert int(first.headers["retry-after-ms"]) > 0
        assert s.gw.stats()["queued"] == 1  # its place is kept, dormant
        wait_for(lambda: s.gw.stats()["shed"] == 1, what="the step-back counted")
        # The client's retry (same body, marked as a retry) attaches to the kept generation.
        again = post_stream(
            s.url, body, {"x-stainless-read-timeout": "30", "x-stainless-retry-count": "1"}
        )
        busy.join(20)
        assert again.status_code == 200
        assert content_of(sse_payloads(again.text)) == expected_text(body, 5, 0)
        stats = s.gw.stats()
        assert stats["attached"] == 1 and stats["generations_started"] == 2
        assert s.sim.stats()["generations_started"] == 2


def test_queued_generation_nobody_waits_for_is_skipped_and_keeps_its_place() -> None:
    with make_stack(fast_sim(itl_ms=20.0), max_inflight=1, grace=30.0) as s:
        busy, _ = _in_thread(post_stream, s.url, chat_body("busy", max_tokens=40))
        wait_for(lambda: s.gw.stats()["inflight"] == 1, what="engine busy")
        left = chat_body("left", max_tokens=5)
        key = {"Idempotency-Key": "left-and-back"}
        with (
            httpx2.Client(timeout=10) as client,
            client.stream("POST", s.url + "/v1/chat/completions", json=left, headers=key) as r,
        ):
            assert r.status_code == 200  # committed early, then the client leaves
        wait_for(lambda: s.gw.stats()["subscribers"] == 1, what="the client gone")
        later, out = _in_thread(post_stream, s.url, chat_body("later", max_tokens=5))
        busy.join(20)
        later.join(20)
        assert out[0].status_code == 200  # type: ignore[attr-defined]
        # "later" ran; "left" was passed over without running for nobody, and kept its place.
        assert s.sim.stats()["generations_started"] == 2
        # The relay gives its place back just after the answer's last byte: wait for that.
        wait_for(lambda: s.gw.stats()["inflight"] == 0, what="the place of 'later' given back")
        assert s.gw.stats()["queued"] == 1
        back = post_stream(s.url, left, key)
        assert back.status_code == 200
        assert content_of(sse_payloads(back.text)) == expected_text(left, 5, 0)
        assert s.sim.stats()["generations_started"] == 3
        assert s.gw.stats()["generations_aborted"] == 0


def test_a_wait_predicted_past_the_queue_timeout_gets_a_real_429_before_any_commit() -> None:
    # One place, 0.2 s a generation, a 0.5 s queue timeout: of 8 requests at once, those whose
    # predicted wait is past the timeout are refused at once with a real 429; the others get a
    # whole stream. Never a 200 that ends in an in-band 429.
    sim = fast_sim(itl_ms=10.0)
    with make_stack(sim, max_inflight=1, queue_timeout=0.5, queue_size=16) as s:
        for i in range(2):  # the drain rate becomes known
            assert post_stream(s.url, chat_body(f"warm {i}", max_tokens=20)).status_code == 200
        threads = [
            _in_thread(post_stream, s.url, chat_body(f"u{i}", max_tokens=20)) for i in range(8)
        ]
        for t, _ in threads:
            t.join(30)
        responses = [out[0] for _, out in threads]
        codes = sorted(r.status_code for r in responses)  # type: ignore[attr-defined]
        assert set(codes) == {200, 429}
        for r in responses:
            if r.status_code == 200:  # type: ignore[attr-defined]
                payloads = sse_payloads(r.text)  # type: ignore[attr-defined]
                assert payloads[-1][1] == "[DONE]"
                assert not any('"error"' in data for _, data in payloads)
            else:
                assert int(r.headers["retry-after"]) >= 1  # type: ignore[attr-defined]
        assert s.gw.stats()["shed"] == codes.count(429)


def test_a_tenant_that_floods_the_queue_does_not_starve_another() -> None:
    keys = ("key-flood", "key-other")
    with make_stack(
        fast_sim(itl_ms=20.0), api_keys=keys, max_inflight=1, queue_size=4, commit="first-token"
    ) as s:
        done: list[tuple[float, str, int]] = []
        lock = threading.Lock()

        def call(key: str, name: str, max_tokens: int = 20) -> None:
            body = chat_body(name, max_tokens=max_tokens)
            r = post_stream(s.url, body, {"Authorization": f"Bearer {key}"})
            with lock:
                done.append((time.monotonic(), name, r.status_code))

        # The flood's first request holds the only place for a few seconds (150 tokens), long
        # enough for the rest to line up behind it on a loaded machine.
        running = threading.Thread(target=call, args=(keys[0], "flood running", 150))
        running.start()
        wait_for(lambda: s.gw.stats()["inflight"] == 1, what="the place taken")
        flood = [threading.Thread(target=call, args=(keys[0], f"flood {i}")) for i in range(4)]
        for t in flood:
            t.start()
        wait_for(lambda: s.gw.stats()["queued"] == 4, what="the queue full of one tenant")
        other = threading.Thread(target=call, args=(keys[1], "other"))
        other.start()
        for t in [running, *flood, other]:
            t.join(30)
        by_name = {name: code for _, name, code in done}
        assert by_name["other"] == 200  # a place was made for it: the flood's newest was shed
        assert sorted(by_name.values()).count(429) == 1
        finished = [name for _, name, code in sorted(done) if code == 200]
        # With one place, generations finish in admission order: "other" came after four of
        # the flood's requests were queued, yet ran right after the one running.
        assert finished[:2] == ["flood running", "other"]


def test_tenant_weights_are_given_by_api_key_and_reach_admission() -> None:
    from streamsafe.gateway import Gateway, GatewayConfig
    from streamsafe.gateway.serving.requests import tenant_id

    config = GatewayConfig(api_keys=("gold", "std"), tenant_weights=(("gold", 3.0),))
    assert Gateway(config).admission.core.weights == {tenant_id(b"gold"): 3.0}
    with pytest.raises(ValueError, match="weights"):
        GatewayConfig(tenant_weights=(("gold", 0.0),))


def test_serve_reads_tenant_weights_as_key_equals_weight() -> None:
    import argparse

    from streamsafe.gateway.cli import add_arguments, build_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--api-key", "a=b", "--tenant-weight", "a=b=2.5"])
    assert build_config(args, "http://127.0.0.1:1").tenant_weights == (("a=b", 2.5),)
    # A ValueError, which `streamsafe serve` reports in one line (exit 2), naming no key.
    with pytest.raises(ValueError, match="KEY=WEIGHT") as caught:
        build_config(parser.parse_args(["--tenant-weight", "a"]), "http://127.0.0.1:1")
    assert "'a'" not in str(caught.value)
