"""A broken upstream stream is continued (vLLM's continue_final_message), not failed and not
re-generated: subscribers see one unbroken stream with exactly the engine's text."""

from __future__ import annotations

import orjson
from gateway_helpers import chat_body, content_of, fast_sim, make_stack, post_stream, sse_payloads

from streamsafe.engine_sim import Fault, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.generations.event_log import MemoryEventLog
from streamsafe.gateway.generations.request import Continuation, GenerationRequest
from streamsafe.gateway.relay.continuation import (
    Partial,
    Reshape,
    continuation_for,
    owed_usage,
    read_partial,
    tokenize_body,
    with_token_ids,
)
from streamsafe.gateway.relay.replay import Replay
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.server import ServerThread
from streamsafe_bench.cutting_proxy import CuttingProxy, serve_proxy

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")


def test_cut_upstream_stream_is_continued_and_the_client_sees_the_exact_text() -> None:
    # Every engine response is cut after 5 data events (the role chunk and 4 tokens).
    sim = fast_sim(faults=(Fault.parse("cut:5:1"),))
    body = chat_body("continue me", max_tokens=20)
    with make_stack(sim, max_continuations=5) as s:
        resp = post_stream(s.url, body)
        assert resp.status_code == 200
        payloads = sse_payloads(resp.text)
        assert payloads[-1][1] == "[DONE]"
        assert content_of(payloads) == expected_text(body, 20)
        assert [i for i, _ in payloads] == list(range(len(payloads)))  # one numbering
        roles = [p for _, p in payloads if '"role"' in p]
        assert len(roles) == 1  # the continuations' role chunks are not repeated
        sim_stats = s.sim.stats()
        assert sim_stats["continuations"] >= 1
        assert sim_stats["generations_started"] - sim_stats["continuations"] == 1
        gw = s.gw.stats()
        assert gw["continued"] == sim_stats["continuations"]
        assert gw["generations_completed"] == 1


def test_continuations_are_bounded_then_the_stream_ends_with_an_error_event() -> None:
    sim = fast_sim(faults=(Fault.parse("cut:5:1"),))
    with make_stack(sim, max_continuations=1) as s:
        resp = post_stream(s.url, chat_body("too broken", max_tokens=40))
        payloads = sse_payloads(resp.text)
        assert payloads[-1][1] == "[DONE]"
        error = orjson.loads(payloads[-2][1])["error"]
        assert error["message"].startswith("upstream")
        assert s.sim.stats()["continuations"] == 1
        assert s.gw.stats()["generations_failed"] == 1


def test_no_continuation_when_disabled() -> None:
    sim = fast_sim(faults=(Fault.parse("cut:5:1"),))
    with make_stack(sim, max_continuations=0) as s:
        resp = post_stream(s.url, chat_body("x", max_tokens=40))
        assert "error" in sse_payloads(resp.text)[-2][1]
        assert s.sim.stats()["continuations"] == 0


def _request(path: str, body: dict[str, object]) -> GenerationRequest:
    return GenerationRequest("t", path, orjson.dumps(body), b"fp", 1, True, route=CHAT)


def test_a_continuation_by_text_asks_only_for_the_tokens_still_owed() -> None:
    body = chat_body("q", max_tokens=10)
    ask = continuation_for(_request("/v1/chat/completions", body), Partial("a b c", 3, False))
    assert isinstance(ask, Continuation)
    assert ask.path == "/v1/chat/completions" and ask.rewrite is None
    cont = orjson.loads(ask.body)
    assert cont["messages"][-1] == {"role": "assistant", "content": "a b c"}
    assert cont["continue_final_message"] is True
    assert cont["add_generation_prompt"] is False
    assert cont["max_tokens"] == 7
    assert cont["messages"][:-1] == body["messages"]
    assert ask.tokens_before == 3


def test_only_single_choice_streams_are_continued_and_completions_only_by_ids() -> None:
    partial = Partial("a", 1, False)
    no_ids = continuation_for(_request("/v1/completions", {"prompt": "p"}), partial)
    assert no_ids == "a completion is continued only by its token ids"
    two = {**chat_body("q"), "n": 2}
    assert "n > 1" in str(continuation_for(_request("/v1/chat/completions", two), partial))
    by_ids = Partial("a", 1, False, token_ids=[5], prompt_ids=[1, 2])
    assert "n > 1" in str(continuation_for(_request("/v1/chat/completions", two), by_ids))
    unread = continuation_for(_request("/v1/chat/completions", chat_body("q")), None)
    assert unread == "its answer so far could not be read back"


def test_a_continuation_by_ids_sends_the_prompt_and_the_answer_so_far_as_ids() -> None:
    body = {
        **chat_body("q", max_tokens=10),
        "temperature": 0.0,
        "seed": 3,
        "stop_token_ids": [9],
        "messages": [{"role": "user", "content": "q"}],
        "stream_options": {"include_usage": True},
        "min_tokens": 4,
    }
    # Three tokens in two chunks (one special token came with empty text).
    partial = Partial("a b", 2, False, token_ids=[7, 8, 2], prompt_ids=[1, 5, 6])
    ask = continuation_for(_request("/v1/chat/completions", body), partial)
    assert isinstance(ask, Continuation)
    assert ask.path == "/v1/completions" and ask.tokens_before == 3
    cont = orjson.loads(ask.body)
    assert cont["prompt"] == [1, 5, 6, 7, 8, 2]
    assert cont["max_tokens"] == 7 and cont["min_tokens"] == 1
    assert (cont["temperature"], cont["seed"], cont["stop_token_ids"]) == (0.0, 3, [9])
    assert cont["stream"] is True and cont["return_token_ids"] is True
    assert cont["stream_options"] == {"include_usage": True}
    assert "messages" not in cont and "continue_final_message" not in cont
    # max_completion_tokens, the newer name, counts first; a completion stays on its route.
    newer = {**body, "max_completion_tokens": 6}
    ask = continuation_for(_request("/v1/chat/completions", newer), partial)
    assert isinstance(ask, Continuation) and orjson.loads(ask.body)["max_tokens"] == 3
    prompt = {"model": "m", "prompt": "p", "stream": True, "max_tokens": 5}
    ask = continuation_for(_request("/v1/openai/v1/completions", prompt), partial)
    assert isinstance(ask, Continuation) and ask.path == "/v1/openai/v1/completions"


def test_what_a_completion_by_ids_cannot_carry_is_replayed_and_verified() -> None:
    partial = Partial("a", 1, False, token_ids=[7], prompt_ids=[1])
    for extra in (
        {"logprobs": True},
        {"response_format": {"type": "json_object"}},
        {"stop": ["Observation:"]},
        {"frequency_penalty": 1.0},
        {"temperature": 0.8, "seed": 7},
    ):
        req = _request("/v1/chat/completions", {**chat_body("q"), **extra})
        ask = continuation_for(req, partial)
        assert isinstance(ask, Continuation) and isinstance(ask.rewrite, Replay), extra
        # The request as it was, to its own route; the replay's usage counts the whole answer.
        assert (ask.path, ask.body, ask.tokens_before) == (req.path, req.body, 0)


async def test_read_partial_takes_token_ids_only_where_every_token_came_with_its_id() -> None:
    def chunk(delta: dict[str, object], ids: list[int] | None, **extra: object) -> bytes:
        choice: dict[str, object] = {"index": 0, "delta": delta, "finish_reason": None}
        if ids is not None:
            choice["token_ids"] = ids
        return orjson.dumps({"id": "c", "choices": [choice], **extra})

    role = chunk({"role": "assistant", "content": ""}, None, prompt_token_ids=[1, 2])
    log = await _log_of(
        role, chunk({"content": "a"}, [5]), chunk({}, [9]), chunk({"content": "bc"}, [6, 7])
    )
    partial = await read_partial(log)
    assert partial is not None
    assert partial.token_ids == [5, 9, 6, 7] and partial.prompt_ids == [1, 2]
    assert (partial.text, partial.chunks, partial.tokens) == ("abc", 2, 4)
    missing = await read_partial(await _log_of(role, chunk({"content": "a"}, None)))
    assert missing is not None and missing.token_ids is None and missing.tokens == 1
    no_prompt = await read_partial(await _log_of(chunk({"content": "a"}, [5])))
    assert no_prompt is not None and no_prompt.token_ids is None


def test_reshape_makes_a_completion_chunk_the_callers_chat_chunk() -> None:
    stamp = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}
    reshape = Reshape(stamp, chat=True)
    first = {
        "index": 0,
        "text": " x",
        "finish_reason": None,
        "prompt_token_ids": [1],
        "token_ids": [4],
    }
    out = orjson.loads(
        reshape.one(
            orjson.dumps(
                {
                    "id": "cmpl-9",
                    "object": "text_completion",
                    "created": 9,
                    "model": "m",
                    "choices": [first],
                }
            )
        )
    )
    assert out == {
        **stamp,
        "choices": [
            {"index": 0, "delta": {"content": " x"}, "finish_reason": None, "token_ids": [4]}
        ],
    }
    end = {"index": 0, "text": "", "finish_reason": "length", "token_ids": [3]}
    out = orjson.loads(reshape.one(orjson.dumps({"id": "cmpl-9", "choices": [end]})))
    assert out["choices"][0]["delta"] == {} and out["choices"][0]["finish_reason"] == "length"
    usage = orjson.loads(
        reshape.one(orjson.dumps({"id": "cmpl-9", "choices": [], "usage": {"prompt_tokens": 4}}))
    )
    assert usage == {**stamp, "choices": [], "usage": {"prompt_tokens": 4}}
    for raw in (b"[DONE]", b'{"error": {"message": "x"}}'):
        assert reshape.one(raw) == raw
    completion = Reshape({"id": "cmpl-1", "created": 1}, chat=False)
    out = orjson.loads(
        completion.one(orjson.dumps({"id": "cmpl-9", "created": 2, "choices": [first]}))
    )
    assert out["id"] == "cmpl-1" and out["choices"][0]["text"] == " x"
    assert "prompt_token_ids" not in out["choices"][0]


def test_a_stream_asks_for_token_ids_unless_the_caller_said() -> None:
    asked = with_token_ids({"model": "m", "stream": True})
    assert asked is not None and orjson.loads(asked)["return_token_ids"] is True
    assert with_token_ids({"model": "m", "return_token_ids": False}) is None
    assert with_token_ids({"model": "m", "n": 2}) is None


def test_tokenize_body_asks_for_the_prompt_only_where_usage_was_asked() -> None:
    usage = {"stream_options": {"include_usage": True}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    chat = {**chat_body("q"), **usage, "tools": tools, "temperature": 0.5}
    ask = tokenize_body(_request("/v1/chat/completions", chat))
    assert ask is not None
    assert orjson.loads(ask) == {
        "model": chat["model"],
        "messages": chat["messages"],
        "add_generation_prompt": True,
        "tools": tools,
    }
    completion = {"model": "m", "prompt": "p", "stream": True, **usage}
    ask = tokenize_body(_request("/v1/completions", completion))
    assert ask is not None and orjson.loads(ask) == {"model": "m", "prompt": "p"}
    # No usage asked, usage off, a prompt that is not one string, a body that is not an object.
    assert tokenize_body(_request("/v1/chat/completions", chat_body("q"))) is None
    off = {**chat_body("q"), "stream_options": {"include_usage": False}}
    assert tokenize_body(_request("/v1/chat/completions", off)) is None
    listed = {"model": "m", "prompt": ["a", "b"], **usage}
    assert tokenize_body(_request("/v1/completions", listed)) is None
    raw = GenerationRequest("t", "/v1/chat/completions", b"[1]", b"fp", 1, True, route=CHAT)
    assert tokenize_body(raw) is None


async def _log_of(*payloads: bytes) -> MemoryEventLog:
    log = MemoryEventLog()
    await log.append(payloads)
    return log


async def test_read_partial_counts_content_and_remembers_the_stamp_and_usage() -> None:
    stamp = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m"}

    def chunk(text: str, finish: str | None = None, **extra: object) -> bytes:
        choice = {"index": 0, "text": text, "finish_reason": finish}
        return orjson.dumps({**stamp, "choices": [choice], **extra})

    partial = await read_partial(await _log_of(chunk("a"), chunk(" b"), chunk("", "length")))
    assert partial is not None
    assert (partial.text, partial.chunks, partial.finished) == ("a b", 2, True)
    assert not partial.usage_seen and partial.stamp == stamp
    owed = orjson.loads(owed_usage(partial, 11))
    assert owed == {
        **stamp,
        "choices": [],
        "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13},
    }
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    seen = await read_partial(await _log_of(chunk("a", "stop"), chunk("", usage=usage)))
    assert seen is not None and seen.usage_seen
    nulls = await read_partial(await _log_of(chunk("a", "stop", usage=None)))
    assert nulls is not None and not nulls.usage_seen


def test_a_cut_stream_with_stop_strings_is_replayed_and_the_client_sees_the_exact_text() -> None:
    # Stop strings: vLLM holds back text that may begin one while the ids go out, so the
    # answer is asked again whole and only what the caller has not read is relayed. A proxy
    # between the gateway and the engine cuts the first answer once, after 6 events.
    body = {**chat_body("replay me", max_tokens=20), "stop": ["never said"]}
    sim = Simulator(fast_sim())
    with ServerThread(sim) as engine:
        proxy = CuttingProxy(engine.url)
        proxy.plan["replay me"] = 6
        with serve_proxy(proxy) as net:
            gw = Gateway(GatewayConfig(upstream=net.url, heartbeat=0.05))
            with ServerThread(gw) as server:
                payloads = sse_payloads(post_stream(server.url, body).text)
                stats = gw.stats()
    assert proxy.cuts == 1
    assert payloads[-1][1] == "[DONE]"
    assert content_of(payloads) == expected_text(body, 20)
    assert [i for i, _ in payloads] == list(range(len(payloads)))  # one numbering
    assert sum('"role"' in p for _, p in payloads) == 1
    # Asked again whole (no continue_final_message), once.
    assert [p for p in proxy.paths if p.endswith("/completions")] == ["/v1/chat/completions"] * 2
    assert sim.stats()["continuations"] == 0 and sim.stats()["generations_completed"] == 1
    assert (stats["continued"], stats["generations_completed"]) == (1, 1)
