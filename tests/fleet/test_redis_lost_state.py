"""Redis that lost the replicas' state, and replicas that cannot read each other's records
(issue 33, row 6): one key ran two engine generations. Redis flushed (or restarted empty) under
a live fleet: a retry on another replica found the key free and started it again. Replicas with
different ``--redis-secret``: a keyed retry on the other replica could not read the record and
silently took the key over. Now both are refused loudly (``/ready`` 503, a log line naming the
cause, a 503 JSON error with ``Retry-After``) and no key runs twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import redis
from fleet_helpers import Process, RedisProcess

from streamsafe.engine_sim import expected_text
from waiting import wait_until

pytestmark = pytest.mark.timeout(120)

MODEL = "sim-llama-8b"
URL = "/v1/chat/completions"


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "15", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def _serve(sim: Process, redis_server: RedisProcess, *extra: str) -> Process:
    args = ("--upstream", sim.url, "--redis", redis_server.url, "--lease", "1", *extra)
    return Process("serve", *args)


def _chat(content: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _generations(sim: Process) -> int:
    return int(httpx2.get(sim.url + "/stats", timeout=10).json()["generations_started"])


def _text(response: httpx2.Response, stream: bool) -> str:
    assert response.status_code == 200, response.text
    if not stream:
        return str(response.json()["choices"][0]["message"]["content"])
    parts = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            payload = httpx2.Response(200, content=line[6:]).json()
            assert "error" not in payload, payload
            parts.append(payload["choices"][0]["delta"].get("content") or "")
    return "".join(parts)


def _until_answered(url: str, body: dict[str, Any], key: str, refusals: list[str]) -> str:
    """A client that retries on 503 as told (Retry-After), for 30 s at most: the answer."""
    deadline = time.monotonic() + 30
    while True:
        r = httpx2.post(url + URL, json=body, headers={"Idempotency-Key": key}, timeout=30)
        if r.status_code != 503:
            return _text(r, bool(body["stream"]))
        error = r.json()["error"]
        assert error["code"] == 503 and "redis lost" in error["message"], error
        refusals.append(error["message"])
        assert time.monotonic() < deadline, refusals
        time.sleep(min(float(r.headers["retry-after"]), 2.0))  # as told: the behaviour


def _not_ready_because(proc: Process, words: str) -> bool:
    r = httpx2.get(proc.url + "/ready", timeout=10)
    return r.status_code == 503 and words in r.json()["error"]["message"]


def test_redis_flushed_under_a_live_fleet_no_key_runs_twice(
    sim: Process, own_redis: RedisProcess
) -> None:
    owner, other = _serve(sim, own_redis), _serve(sim, own_redis)
    try:
        for proc in (owner, other):  # each has seen the other's heartbeat
            wait_until(lambda p=proc: httpx2.get(p.url + "/stats").json()["fleet_replicas"] == 2)
        finished = {
            f"flushed-done-{stream}": _chat(f"answered before the flush {stream}", 8, stream)
            for stream in (True, False)
        }
        for key, body in finished.items():
            headers = {"Idempotency-Key": key}
            first = httpx2.post(owner.url + URL, json=body, headers=headers, timeout=30)
            assert _text(first, bool(body["stream"])) == expected_text(body, 8, 0)
        # One still running on the owner when Redis is flushed (400 tokens of 15 ms).
        live_key, live = "flushed-live", _chat("running through the flush", 400, True)
        with httpx2.stream(
            "POST", owner.url + URL, json=live, headers={"Idempotency-Key": live_key}
        ) as running:
            lines = running.iter_lines()
            wait_until(lambda: next(lines).startswith("data: {"), what="the live stream flows")
            started = _generations(sim)
            redis.Redis.from_url(own_redis.url).flushall()
            refusals: list[str] = []
            for key, body in finished.items():
                for proc in (other, owner):
                    again = _until_answered(proc.url, body, key, refusals)
                    assert again == expected_text(body, 8, 0)
            retried = _until_answered(other.url, live, live_key, refusals)
            assert retried == expected_text(live, 400, 0)
            assert _generations(sim) == started  # no key ran a second generation
        # Said loudly on the replica that found it out.
        assert any("redis_state_lost" in line for line in other.output + owner.output)
    finally:
        owner.stop()
        other.stop()


def test_replicas_whose_redis_was_flushed_are_not_ready_for_a_moment(
    sim: Process, own_redis: RedisProcess
) -> None:
    procs = [_serve(sim, own_redis) for _ in range(2)]
    try:
        for proc in procs:  # each has seen the other's heartbeat
            wait_until(lambda p=proc: httpx2.get(p.url + "/stats").json()["fleet_replicas"] == 2)
            assert httpx2.get(proc.url + "/ready", timeout=10).status_code == 200
        redis.Redis.from_url(own_redis.url).flushall()
        for proc in procs:
            wait_until(lambda p=proc: _not_ready_because(p, "redis lost"), what="/ready says")
        for proc in procs:
            wait_until(lambda p=proc: httpx2.get(p.url + "/ready", timeout=10).status_code == 200)
    finally:
        for proc in procs:
            proc.stop()


def test_replicas_with_different_secrets_never_run_a_key_twice(
    sim: Process, own_redis: RedisProcess
) -> None:
    owner = _serve(sim, own_redis, "--redis-secret", "fleet-secret")
    other: Process | None = None
    try:
        body = _chat("sealed with the owner's secret", 8, True)
        key = {"Idempotency-Key": "two-secrets-1"}
        first = httpx2.post(owner.url + URL, json=body, headers=key, timeout=30)
        assert _text(first, True) == expected_text(body, 8, 0)
        # Started once the fleet is there: its secret is the odd one.
        other = _serve(sim, own_redis, "--redis-secret", "another-secret")
        started = _generations(sim)
        again = httpx2.post(other.url + URL, json=body, headers=key, timeout=30)
        assert again.status_code == 503, again.text
        error = again.json()["error"]
        assert error["type"] == "service_unavailable" and "--redis-secret" in error["message"]
        assert again.headers["retry-after"]
        assert _generations(sim) == started  # not started again there
        # The key is still the owner's: a retry there replays its answer.
        replay = httpx2.post(owner.url + URL, json=body, headers=key, timeout=30)
        assert _text(replay, True) == expected_text(body, 8, 0)
        assert _generations(sim) == started
        wait_until(lambda: _not_ready_because(other, "--redis-secret"), what="/ready says why")
        assert httpx2.get(owner.url + "/ready", timeout=10).status_code == 200
        assert any("redis_secret_mismatch" in line for line in other.output)
    finally:
        owner.stop()
        if other is not None:
            other.stop()
