"""SIGTERM (or Ctrl-C) drains a real ``streamsafe serve`` process: new work is refused at once
with 503 and Retry-After while running streams finish whole, then the process exits; past
``--drain-timeout`` the streams still running end with an error event."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx2
import orjson
from engine_process import engine_process
from gateway_helpers import chat_body, content_of, sse_payloads, wait_for

from streamsafe.engine_sim import expected_text
from streamsafe_bench.processes import ServerProcess


def _streams(url: str, n: int, max_tokens: int) -> tuple[list[threading.Thread], list[Any]]:
    """``n`` streams started on threads; each result is ``(status, payloads, end time)``."""
    results: list[Any] = [None] * n

    def one(i: int) -> None:
        body = chat_body(f"stream {i}", max_tokens=max_tokens)
        with httpx2.Client(timeout=30) as client:
            r = client.post(url + "/v1/chat/completions", json=body)
        results[i] = (r.status_code, sse_payloads(r.text), time.monotonic(), body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def _gateway(upstream: str, *args: str) -> ServerProcess:
    return ServerProcess("serve", "--upstream", upstream, "--log-format", "json", *args)


def test_sigterm_lets_running_streams_finish_and_refuses_new_work_at_once() -> None:
    with engine_process("--itl-ms", "25") as engine:
        gateway = _gateway(engine.url, "--drain-timeout", "30")
        try:
            url = gateway.url
            threads, results = _streams(url, 4, 60)  # about 1.5 s each
            wait_for(lambda: engine.stats()["generations_started"] == 4, what="4 streams")
            gateway.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: any('"drain_begun"' in line for line in gateway.output))
            asked = time.monotonic()
            refused = httpx2.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
            assert time.monotonic() - asked < 1.0
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert httpx2.get(url + "/ready", timeout=5).status_code == 503
            assert httpx2.get(url + "/health", timeout=5).status_code == 200
            for t in threads:
                t.join(30)
            last = max(r[2] for r in results)
            gateway.proc.wait(10)
            exited = time.monotonic()
            started = engine.stats()["generations_started"]
        finally:
            gateway.kill()
    for status, payloads, _end, body in results:
        assert status == 200 and payloads[-1][1] == "[DONE]"
        assert content_of(payloads) == expected_text(body, 60)  # whole: every token once
    assert gateway.proc.returncode == 0
    assert exited - last < 5.0, f"exited {exited - last:.1f} s after the last stream"
    assert started == 4  # the refused request never went upstream
    lines = [orjson.loads(line) for line in gateway.output if line.startswith("{")]
    events = [x["event"] for x in lines if x.get("event", "").startswith("drain")]
    assert events == ["drain_begun", "drained"]  # no drain_timeout: nothing was cut
    assert sum(1 for x in lines if x.get("outcome") == "completed") == 4


def test_streams_past_the_drain_timeout_end_with_an_error_event() -> None:
    with engine_process("--itl-ms", "25") as engine:
        gateway = _gateway(engine.url, "--drain-timeout", "0.5")
        try:
            threads, results = _streams(gateway.url, 2, 400)  # about 10 s each
            wait_for(lambda: engine.stats()["generations_started"] == 2, what="2 streams")
            signalled = time.monotonic()
            gateway.proc.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(30)
            gateway.proc.wait(10)
            exited = time.monotonic()
            wait_for(lambda: engine.stats()["generations_aborted"] == 2, what="both aborted")
        finally:
            gateway.kill()
    for status, payloads, _end, _body in results:
        assert status == 200 and payloads[-1][1] == "[DONE]"
        error = orjson.loads(payloads[-2][1])["error"]
        assert "shutting down" in error["message"]
    assert exited - signalled < 5.0
