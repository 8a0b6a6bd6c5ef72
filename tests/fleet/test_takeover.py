"""A replica that takes over a generation another replica ran never sends an error after the
answer is whole (issue 30, takeover row). In 4 of 20 kills the dead owner had sent ``[DONE]``
before it recorded the end; the replica that took it over appended an error event and a second
``[DONE]`` to the finished answer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
import redis
from fleet_helpers import (
    Process,
    RedisProcess,
    chat_body,
    claim_name,
    key_names,
    sse_events,
    whole_text,
)

from streamsafe.engine_sim import expected_text
from streamsafe.gateway.generations.generation import State

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "15", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def _serve(sim: Process, redis_server: RedisProcess) -> Process:
    return Process("serve", "--upstream", sim.url, "--redis", redis_server.url, "--lease", "1")


def _generations(sim: Process) -> int:
    return int(httpx2.get(sim.url + "/stats", timeout=10).json()["generations_started"])


def _as_if_killed_before_recording_its_end(client: redis.Redis, key: str) -> None:
    """Make Redis hold what a replica killed right after its answer's end went out left: the
    whole log, the record still running, no lease."""
    names = key_names()
    gen_id = client.get(claim_name(key)).decode()  # type: ignore[union-attr]
    client.hset(names.meta_key(gen_id), "state", State.RUNNING.value)
    client.delete(names.lease_key(gen_id))


@pytest.mark.parametrize("stream", [True, False])
def test_a_whole_answer_whose_end_was_not_recorded_is_finished_not_failed_on_takeover(
    sim: Process, own_redis: RedisProcess, stream: bool
) -> None:
    owner, other = _serve(sim, own_redis), _serve(sim, own_redis)
    try:
        key = f"whole-not-recorded-{stream}"
        body = chat_body("the owner dies after its answer", 12, stream)
        headers = {"Idempotency-Key": key}
        url = "/v1/chat/completions"
        first = httpx2.post(owner.url + url, json=body, headers=headers, timeout=30)
        assert first.status_code == 200
        started = _generations(sim)
        owner.kill()
        _as_if_killed_before_recording_its_end(redis.Redis.from_url(own_redis.url), key)
        # A retry of the call on another replica: it finds the generation, follows it, and
        # takes it over once the dead owner's lease is seen gone.
        if stream:
            with httpx2.stream("POST", other.url + url, json=body, headers=headers) as r:
                assert r.status_code == 200
                got = list(sse_events(r))
            assert [i for i, _ in got] == list(range(len(got)))
            assert whole_text(got) == expected_text(body, 12, 0)
        else:
            again = httpx2.post(other.url + url, json=body, headers=headers, timeout=30)
            assert again.status_code == 200, again.text
            assert again.json() == first.json()
        assert _generations(sim) == started  # finished, not asked again
    finally:
        owner.kill()
        other.stop()


def test_ten_owners_killed_mid_stream_each_answer_exact_and_never_an_error_after_it(
    sim: Process, redis_server: RedisProcess
) -> None:
    other = _serve(sim, redis_server)
    try:
        probe = chat_body("how long is an answer", 12)
        with httpx2.stream("POST", other.url + "/v1/chat/completions", json=probe) as r:
            length = len(list(sse_events(r)))
        # Kills spread over the answer, most of them at its end: after the last token, after
        # the chunk with the finish_reason, after [DONE].
        kill_after = [3, 6, length - 3, length - 2, length - 2, length - 1, length - 1]
        kill_after += [length, length, length]
        for trial, n in enumerate(kill_after):
            owner = _serve(sim, redis_server)
            try:
                body = chat_body(f"owner killed, trial {trial}", 12)
                headers = {"Idempotency-Key": f"ten-kills-{trial}"}
                got: list[tuple[int, bytes]] = []
                url = owner.url + "/v1/chat/completions"
                with httpx2.stream("POST", url, json=body, headers=headers) as r:
                    for event in sse_events(r):
                        got.append(event)
                        if len(got) == n:
                            owner.kill()
                            break
                if got[-1][1] != b"[DONE]":  # not whole yet: resume on the other replica
                    resume = {**headers, "Last-Event-ID": str(got[-1][0])}
                    url = other.url + "/v1/chat/completions"
                    with httpx2.stream("POST", url, json=body, headers=resume, timeout=30) as r:
                        assert r.status_code == 200
                        got += list(sse_events(r))
                assert [i for i, _ in got] == list(range(len(got))), (trial, n)
                assert whole_text(got) == expected_text(body, 12, 0), (trial, n)
                # A retry once it is over replays the same answer, nothing after it.
                url = other.url + "/v1/chat/completions"
                with httpx2.stream("POST", url, json=body, headers=headers, timeout=30) as r:
                    assert whole_text(list(sse_events(r))) == expected_text(body, 12, 0), (trial, n)
            finally:
                owner.kill()
    finally:
        other.stop()
