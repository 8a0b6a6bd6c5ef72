"""Redis restarted empty under two replicas (issue 23, row 5): a finished generation's key must
not run again. It did: a retry with the same Idempotency-Key made a second generation, and the
replica that held the first answered its own retry with the second answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import redis
from fleet_helpers import Process, RedisProcess, claim_name

from waiting import poll, wait_until

pytestmark = pytest.mark.timeout(90)

MODEL = "sim-llama-8b"


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "2", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def _serve(sim: Process, redis_server: RedisProcess) -> Process:
    return Process("serve", "--upstream", sim.url, "--redis", redis_server.url, "--lease", "1")


def _send(url: str, body: dict[str, Any], key: str) -> httpx2.Response:
    """The answer, asked again as a client does while the fleet says (503, Retry-After) that
    Redis lost its state and it writes back what it holds (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        r = httpx2.post(
            url + "/v1/chat/completions", json=body, headers={"Idempotency-Key": key}, timeout=30
        )
        if r.status_code != 503 or "redis lost" not in r.text or time.monotonic() > deadline:
            return r
        time.sleep(float(r.headers["retry-after"]))  # a client doing as told: the behaviour


def _post(url: str, body: dict[str, Any], key: str) -> dict[str, Any]:
    r = _send(url, body, key)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _generations(sim: Process) -> int:
    return int(httpx2.get(sim.url + "/stats", timeout=10).json()["generations_started"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_finished_generation_s_key_holds_after_redis_restarted_empty(
    sim: Process, own_redis: RedisProcess, stream: bool
) -> None:
    owner, other = _serve(sim, own_redis), _serve(sim, own_redis)
    try:
        key = f"restart-empty-{stream}"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"kept across a restart {stream}"}],
            "max_tokens": 6,
            "stream": stream,
        }
        if stream:
            r = httpx2.post(
                owner.url + "/v1/chat/completions",
                json=body,
                headers={"Idempotency-Key": key},
                timeout=30,
            )
            first: Any = r.text
        else:
            first = _post(owner.url, body, key)
        started = _generations(sim)
        own_redis.kill()
        own_redis.start()  # empty: no persistence
        # The owner sees the new run id within a renewal (a third of a lease) and writes back
        # what it keeps: the claim among it.
        client = redis.Redis.from_url(own_redis.url)
        # Not a check: the requests below are told to come back (503) until it is done.
        poll(lambda: client.exists(claim_name(key)), 5, every=0.1)
        for url in (owner.url, other.url):
            again = _send(url, body, key).text if stream else _post(url, body, key)
            assert again == first
        assert _generations(sim) == started
    finally:
        owner.stop()
        other.stop()


def test_a_replica_back_from_an_outage_on_another_redis_has_written_back_what_it_keeps(
    sim: Process, own_redis: RedisProcess
) -> None:
    # Redis away long enough for the replica to notice (its renewals fail), then back empty (a
    # restart, or a Sentinel failover to a replica that lacked the last writes): by the time
    # the replica says it is back, the claim of a generation it finished and keeps for replay
    # is in Redis again, so a retry on another replica finds it (before, it came a renewal
    # later, and a retry in between ran the generation again).
    owner = _serve(sim, own_redis)
    try:
        key = "back-from-an-outage"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "kept across an outage"}],
            "max_tokens": 6,
        }
        _post(owner.url, body, key)
        own_redis.kill()
        wait_until(lambda: _stats(owner)["redis_degraded"] == 1, 20, "the outage seen")
        own_redis.start()  # empty: no persistence
        client = redis.Redis.from_url(own_redis.url)
        wait_until(lambda: _stats(owner)["redis_degraded"] == 0, 30, "back on Redis")
        assert client.exists(claim_name(key))
    finally:
        owner.stop()


def _stats(proc: Process) -> dict[str, Any]:
    return dict(httpx2.get(proc.url + "/stats", timeout=10).json())
