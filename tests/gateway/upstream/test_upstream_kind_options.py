"""The gateway's kind-dependent behaviour and the options for the positions around Llama Stack,
against the simulator: --collapse-identical, --json-keepalive, no continuation where the kind
cannot continue, the kind probe and the 405/404 rules per kind."""

from __future__ import annotations

import threading

import httpx2
import openai
import orjson
import pytest
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

from streamsafe.engine_sim import Fault, expected_text
from streamsafe.gateway.serving.completion_id import own_completion_id


def _post_json(url: str, body: dict[str, object], out: list[httpx2.Response]) -> None:
    with httpx2.Client(timeout=20) as client:
        out.append(client.post(url + "/v1/chat/completions", json=body))


def _while_the_first_runs(s: Stack, body: dict[str, object]) -> list[httpx2.Response]:
    """``body`` posted twice without a marker, the second while the first copy runs."""
    out: list[httpx2.Response] = []
    first = threading.Thread(target=_post_json, args=(s.url, body, out))
    first.start()
    wait_for(lambda: s.sim.stats()["active"] == 1, what="the first copy runs")
    _post_json(s.url, body, out)
    first.join(20)
    return out


@pytest.mark.parametrize(
    "determined", [{"temperature": 0}, {"temperature": "0.0"}, {"seed": 7}, {"seed": "7"}]
)
@pytest.mark.parametrize("stream", [True, False])
def test_identical_deterministic_requests_share_one_generation_by_default(
    determined: dict[str, object], stream: bool
) -> None:
    # Behind a server a client's retry arrives unmarked; a greedy or seeded request has one
    # answer, so sharing it is always safe, streamed or not.
    with make_stack(fast_sim(itl_ms=10.0)) as s:
        body = {**chat_body("same prompt", max_tokens=30, stream=stream), **determined}
        out = _while_the_first_runs(s, body)
        assert [r.status_code for r in out] == [200, 200]
        assert s.sim.stats()["generations_started"] == 1
        assert s.gw.stats()["attached"] == 1


def test_identical_sampled_plain_calls_share_one_generation_by_default() -> None:
    # A server (OGX, Llama Stack) runs a plain call on after its client gave up, and sends the
    # client's retry on as a fresh call: the retry finds the first copy and waits for it.
    with make_stack(fast_sim(itl_ms=10.0)) as s:
        body = chat_body("same prompt", max_tokens=30, stream=False)
        out = _while_the_first_runs(s, body)
        texts = [r.json()["choices"][0]["message"]["content"] for r in out]
        assert texts[0] == texts[1]
        assert s.sim.stats()["generations_started"] == 1


def test_a_finished_sampled_plain_call_is_replayed_only_once_a_copy_of_it_came_while_it_ran() -> (
    None
):
    with make_stack(fast_sim(itl_ms=10.0), grace=30.0) as s:
        alone = chat_body("asked twice", max_tokens=10, stream=False)
        for _ in range(2):  # one after the other: two calls, two samples
            _post_json(s.url, alone, [])
        assert s.sim.stats()["generations_started"] == 2
        retried = chat_body("retried", max_tokens=30, stream=False)
        _while_the_first_runs(s, retried)  # the second copy joined the running one
        assert s.sim.stats()["generations_started"] == 3
        out: list[httpx2.Response] = []
        _post_json(s.url, retried, out)  # the third, after it finished: the same answer
        assert out[0].status_code == 200
        assert s.sim.stats()["generations_started"] == 3


def test_identical_sampled_streams_stay_apart_by_default() -> None:
    # A server cancels an abandoned stream: an identical sampled stream is a new wish for a
    # sample, running or not.
    with make_stack(fast_sim(itl_ms=10.0)) as s:
        body = chat_body("same prompt", max_tokens=30, stream=True)
        _while_the_first_runs(s, body)
        assert s.sim.stats()["generations_started"] == 2
        assert s.gw.stats()["attached"] == 0


@pytest.mark.parametrize(
    ("setting", "body", "joined"),
    [
        ("deterministic", chat_body("p", max_tokens=30, stream=False), False),
        ("deterministic", {**chat_body("p", max_tokens=30), "temperature": 0}, True),
        ("off", {**chat_body("p", max_tokens=30, stream=False), "temperature": 0}, False),
        ("all", chat_body("p", max_tokens=30, stream=True), True),
    ],
)
def test_collapse_identical_settings(setting: str, body: dict[str, object], joined: bool) -> None:
    with make_stack(fast_sim(itl_ms=10.0), collapse_identical=setting) as s:
        _while_the_first_runs(s, body)
        assert s.sim.stats()["generations_started"] == (1 if joined else 2)


def test_collapse_identical_attaches_a_fresh_call_to_the_running_copy() -> None:
    with make_stack(fast_sim(itl_ms=10.0), collapse_identical="all", grace=0.0) as s:
        body = chat_body("same prompt", max_tokens=30, stream=False)
        out: list[httpx2.Response] = []
        first = threading.Thread(target=_post_json, args=(s.url, body, out))
        first.start()
        wait_for(lambda: s.sim.stats()["active"] == 1, what="the first copy runs")
        _post_json(s.url, body, out)  # no retry marker, no key: a fresh call
        first.join(20)
        assert [r.status_code for r in out] == [200, 200]
        answers = [r.json() for r in out]  # in the order they finished: either may be first
        # Two callers, one generation, two completion ids: behind Llama Stack each call stores
        # its answer under its id, and a second insert of the same id failed with a 500.
        engine_id, own_id = sorted((a.pop("id") for a in answers), key=len)
        assert own_id.startswith(engine_id + "-")
        assert answers[0] == answers[1]
        assert s.sim.stats()["generations_started"] == 1
        assert s.gw.stats()["attached"] == 1
        # Within grace (0 here) only: after the copy finished, the same prompt is new work.
        _post_json(s.url, body, out)
        assert s.sim.stats()["generations_started"] == 2


def test_collapsed_identical_streams_each_carry_one_completion_id_of_their_own() -> None:
    with make_stack(fast_sim(itl_ms=10.0), collapse_identical="all") as s:
        body = chat_body("same stream", max_tokens=20)
        out: list[httpx2.Response] = []
        first = threading.Thread(target=lambda: out.append(post_stream(s.url, body)))
        first.start()
        wait_for(lambda: s.sim.stats()["tokens_generated"] > 2, what="the first copy streams")
        second = post_stream(s.url, body)
        first.join(20)
        streams = [out[0], second]
        ids = []
        for resp in streams:
            chunks = [orjson.loads(d) for _, d in sse_payloads(resp.text) if d != "[DONE]"]
            assert len({c["id"] for c in chunks}) == 1  # one id through the stream
            ids.append(chunks[0]["id"])
            assert content_of(sse_payloads(resp.text)) == expected_text(body, 20)
        assert ids[1].startswith(ids[0] + "-")
        assert s.sim.stats()["generations_started"] == 1
        # A retry marked as one is the same caller: the engine's id as it came.
        retry = post_stream(s.url, body, {"x-stainless-retry-count": "1"})
        assert orjson.loads(sse_payloads(retry.text)[0][1])["id"] == ids[0]


def test_own_completion_id_changes_only_a_leading_id() -> None:
    rename = own_completion_id(b"ab12")
    assert rename(b'{"id":"chatcmpl-1","object":"x"}') == b'{"id":"chatcmpl-1-ab12","object":"x"}'
    assert rename(b'{ "id" : "c-2", "n": 1}') == b'{ "id" : "c-2-ab12", "n": 1}'
    for unchanged in (b"[DONE]", b'{"event":{"id":"x"}}', b'{"error":{"message":"m"}}'):
        assert rename(unchanged) == unchanged


def test_json_keepalive_sends_whitespace_then_the_answer() -> None:
    with make_stack(fast_sim(itl_ms=20.0), json_keepalive=True, heartbeat=0.05) as s:
        body = chat_body("slow", max_tokens=20, stream=False)
        with httpx2.Client(timeout=20) as client:
            r = client.post(s.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert r.content.startswith(b" ") and r.content.lstrip().startswith(b"{")
        answer = orjson.loads(r.content)  # leading whitespace is valid JSON
        content = answer["choices"][0]["message"]["content"]
        assert content == expected_text(body, 20)


def test_json_keepalive_spaces_come_within_the_read_timeout_the_client_states() -> None:
    # The heartbeat (10 s) and the commit wait (1 s) are both longer than half the openai
    # client's read timeout (1.2 s, sent as x-stainless-read-timeout); the answer takes about
    # 3 s. The spaces must come within the client's timeout, or it gives up inside the body.
    with make_stack(fast_sim(itl_ms=100.0), json_keepalive=True, heartbeat=10.0) as s:
        client = openai.OpenAI(
            base_url=s.url + "/v1",
            api_key="x",
            max_retries=0,
            timeout=openai.Timeout(20.0, read=1.2),
        )
        body = chat_body("slow", max_tokens=30, stream=False)
        answer = client.chat.completions.create(
            model=body["model"], messages=body["messages"], max_tokens=30
        )
        assert answer.choices[0].message.content == expected_text(body, 30)


def test_json_keepalive_failure_after_commit_is_a_200_with_the_error_body() -> None:
    # An engine that does not say its memory (the gateway would keep this request off it).
    sim = fast_sim(itl_ms=20.0, memory_tokens=40, default_max_tokens=200, publish_kv_cache=False)
    with make_stack(sim, json_keepalive=True, heartbeat=0.05) as s:
        body = chat_body("dies", max_tokens=200, stream=False)
        with httpx2.Client(timeout=20) as client:
            r = client.post(s.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.content.startswith(b" ")
        assert "error" in orjson.loads(r.content)


def test_a_kind_that_cannot_continue_ends_a_broken_stream_with_an_error_event() -> None:
    sim = fast_sim(faults=(Fault.parse("cut:5:1.0"),))
    with make_stack(sim, upstream_kind="openai") as s:
        r = post_stream(s.url, chat_body("cut", max_tokens=16))
        payloads = sse_payloads(r.text)
        assert r.status_code == 200
        error = orjson.loads(payloads[-2][1])["error"]
        assert error["type"] == "upstream_error" and payloads[-1][1] == "[DONE]"
        assert len(content_of(payloads).split()) == 4  # 5 events came: the role and 4 tokens
        assert s.gw.stats()["continued"] == 0 and s.sim.stats()["continuations"] == 0


def test_vllm_continues_the_same_broken_stream() -> None:
    sim = fast_sim(faults=(Fault.parse("cut:5:1.0"),))
    with make_stack(sim, upstream_kind="auto", max_continuations=10) as s:
        assert s.gw.stats()["upstream_kind"] == "vllm"  # probed at start
        body = chat_body("cut", max_tokens=16)
        r = post_stream(s.url, body)
        assert content_of(sse_payloads(r.text)) == expected_text(body, 16)
        assert s.gw.stats()["continued"] >= 1


def test_llama_stack_routes_are_unknown_in_front_of_vllm() -> None:
    with make_stack(upstream_kind="vllm") as s, httpx2.Client(timeout=10) as client:
        r = client.post(s.url + "/v1/inference/chat-completion", json={"model_id": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == 404
        r = client.get(s.url + "/v1/chat/completions")
        assert r.status_code == 405
