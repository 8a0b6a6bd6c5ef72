"""Secrets in Redis (issue 23, row 12): a generation's record held the prompt and the provider
data (``X-LlamaStack-Provider-Data``: provider API keys) in clear. With ``--redis-secret`` both
are sealed and a dead owner's generation is still taken over; without it the provider data
never reaches Redis, and such a generation ends with a 503 rather than run elsewhere under
other credentials. Issue 33, row 7: the answers (event logs) were kept in clear even with a
secret, and idempotency keys were part of key names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import redis
from fleet_helpers import Process, RedisProcess

from streamsafe.engine_sim import expected_text

pytestmark = pytest.mark.timeout(90)

MODEL = "sim-llama-8b"
SECRET_KEY = "sk-provider-secret-1234"
PROVIDER = {"X-LlamaStack-Provider-Data": json.dumps({"together_api_key": SECRET_KEY})}


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "15", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def _serve(sim: Process, redis_server: RedisProcess, *extra: str) -> Process:
    args = ("--upstream", sim.url, "--redis", redis_server.url, "--lease", "1", *extra)
    return Process("serve", *args)


def _events(response: httpx2.Response) -> Iterator[tuple[int, bytes]]:
    event_id = -1
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            yield event_id, line[6:].encode()


def _everything_in(client: redis.Redis) -> bytes:
    """Every key name and every value Redis holds, as bytes."""
    out = []
    for key in client.scan_iter():
        out.append(key)
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            out += [k + v for k, v in client.hgetall(key).items()]
        elif kind == b"stream":
            out += [b"".join(k + v for k, v in f.items()) for _, f in client.xrange(key)]
        elif kind == b"set":
            out += list(client.smembers(key))
        elif kind == b"zset":
            out += list(client.zrange(key, 0, -1))
    return b"\n".join(out)


def _killed_mid_stream(
    owner: Process, client: redis.Redis, body: dict[str, Any], headers: dict[str, str]
) -> tuple[list[tuple[int, bytes]], bytes]:
    """A keyed stream's events until its owner is killed -9 after the 5th, and what Redis held
    then."""
    got: list[tuple[int, bytes]] = []
    held = b""
    url = owner.url + "/v1/chat/completions"
    with (
        pytest.raises(httpx2.HTTPError),
        httpx2.stream("POST", url, json=body, headers=headers) as r,
    ):
        for event in _events(r):
            got.append(event)
            if len(got) == 5:
                held = _everything_in(client)
                owner.kill()
    return got, held


@pytest.mark.parametrize("secret", [True, False])
def test_prompt_and_provider_data_in_redis_and_a_dead_owner_s_generation(
    sim: Process, own_redis: RedisProcess, secret: bool
) -> None:
    extra = ("--redis-secret", "fleet-secret") if secret else ()
    owner, other = _serve(sim, own_redis, *extra), _serve(sim, own_redis, *extra)
    try:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "my private question"}],
            "max_tokens": 60,
            "stream": True,
        }
        headers = {"Idempotency-Key": f"secrets-{secret}", **PROVIDER}
        client = redis.Redis.from_url(own_redis.url)
        got, held = _killed_mid_stream(owner, client, body, headers)
        assert SECRET_KEY.encode() not in held
        assert (b"my private question" in held) is not secret  # sealed only with a secret
        resume = {**headers, "Last-Event-ID": str(got[-1][0])}
        url = other.url + "/v1/chat/completions"
        with httpx2.stream("POST", url, json=body, headers=resume, timeout=30) as r:
            assert r.status_code == 200
            got += list(_events(r))
        payloads = [json.loads(data) for _, data in got if data != b"[DONE]"]
        if secret:  # taken over and continued, exactly
            text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
            assert text == expected_text(body, 60, 0)
        else:  # not continued under other credentials than its caller's
            error = payloads[-1]["error"]
            assert error["code"] == 503 and "redis-secret" in error["message"]
    finally:
        owner.kill()
        other.stop()


def _generations(sim: Process) -> int:
    return int(httpx2.get(sim.url + "/stats", timeout=10).json()["generations_started"])


def test_with_a_secret_redis_holds_no_answer_nor_key_and_another_secret_is_refused(
    sim: Process, own_redis: RedisProcess
) -> None:
    """Neither the answer's events, nor the idempotency key, nor the prompt are anywhere in
    Redis (key names included), mid-stream or once it ended; a replica with the same secret
    resumes a dead owner's stream exactly, one with another secret refuses with a 503 naming
    --redis-secret and starts nothing."""
    owner = _serve(sim, own_redis, "--redis-secret", "fleet-secret")
    other = _serve(sim, own_redis, "--redis-secret", "fleet-secret")
    stranger: Process | None = None
    try:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "my private question"}],
            "max_tokens": 40,
            "stream": True,
        }
        idem = "my-idempotency-key-7"
        headers = {"Idempotency-Key": idem}
        client = redis.Redis.from_url(own_redis.url)
        got, held = _killed_mid_stream(owner, client, body, headers)
        completion_id = json.loads(got[0][1])["id"].encode()
        # Every chunk of the answer names its object and its completion's id.
        secrets = [b"my private question", idem.encode(), b"chat.completion", completion_id]
        answer = [data for _, data in got]
        for clear in secrets + answer:
            assert clear not in held, clear
        stranger = _serve(sim, own_redis, "--redis-secret", "another-secret")
        started = _generations(sim)
        resume = {**headers, "Last-Event-ID": str(got[-1][0])}
        url = "/v1/chat/completions"
        refused = httpx2.post(stranger.url + url, json=body, headers=resume, timeout=30)
        assert refused.status_code == 503, refused.text
        assert "--redis-secret" in refused.json()["error"]["message"]
        assert _generations(sim) == started  # never a second generation
        with httpx2.stream("POST", other.url + url, json=body, headers=resume, timeout=30) as r:
            assert r.status_code == 200
            got += list(_events(r))
        ids = [event_id for event_id, _ in got]
        assert ids == list(range(len(got)))  # every event once, in order
        payloads = [json.loads(data) for _, data in got if data != b"[DONE]"]
        text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
        assert text == expected_text(body, 40, 0)
        held = _everything_in(client)  # kept for replay: still sealed
        for clear in secrets + [data for _, data in got if data != b"[DONE]"]:
            assert clear not in held, clear
    finally:
        owner.kill()
        other.stop()
        if stranger is not None:
            stranger.stop()
