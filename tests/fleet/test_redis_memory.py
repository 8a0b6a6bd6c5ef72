"""What Redis holds of finished generations follows what the replicas keep (issue 23, row 9):
``--max-kept-mb`` bounded each replica's copies only, and Redis kept every answer for
``--keep-finished`` (150 generations of 1,500 tokens: 54 MB in Redis, 1 MiB on the replica)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
import redis
from fleet_helpers import Process, RedisProcess, key_names

from waiting import wait_until

pytestmark = pytest.mark.timeout(90)

MODEL = "sim-llama-8b"


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "0.2", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def _logs(client: redis.Redis) -> int:
    # Every generation's log, named as the store names one (a glob: "{*}" is literal braces).
    return sum(1 for _ in client.scan_iter(match=key_names().log_key("*"), _type="STREAM"))


def test_redis_lets_go_of_the_answers_a_replica_evicted(
    sim: Process, own_redis: RedisProcess
) -> None:
    owner = Process(
        "serve", "--upstream", sim.url, "--redis", own_redis.url, "--lease", "1",
        "--max-kept-mb", "0.1",
    )  # fmt: skip
    try:
        client = redis.Redis.from_url(own_redis.url)
        for i in range(20):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"answer {i}"}],
                "max_tokens": 200,
                "stream": True,
            }
            r = httpx2.post(owner.url + "/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        stats = httpx2.get(owner.url + "/stats", timeout=10).json()
        assert stats["evicted"] >= 10 and stats["kept_generations"] < 10
        # Evicted ones lapse two leases after their eviction.
        wait_until(
            lambda: _logs(client) <= stats["kept_generations"] + 1,
            10,
            lambda: f"{_logs(client)} logs in Redis, {stats}",
            every=0.2,
        )
    finally:
        owner.stop()
