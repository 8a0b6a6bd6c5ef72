"""Replay and verify (docs/design.md, Continuation): which continuation a request gets, decided
before its first token, and the replayed answer's rewrite: whatever the chunking of the first
answer and of its replay, the caller ends with the whole answer once (text, token ids,
logprobs), and a replay that differs from what was delivered is never stitched to it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.relay.continuation_plan import plan_continuation
from streamsafe.gateway.relay.replay import Replay, answer_pieces
from streamsafe.sse import DONE

pytestmark = pytest.mark.unit

CHAT = "/v1/chat/completions"


def test_the_plan_table() -> None:
    base = {"model": "m", "messages": [], "temperature": 0}
    rows: list[tuple[dict[str, Any], str]] = [
        ({}, "ids"),
        ({"temperature": 0.8}, "ids"),  # another draw, as good as the first
        ({"temperature": 0, "seed": 3}, "ids"),
        ({"stop": []}, "ids"),
        ({"stop_token_ids": [5]}, "ids"),  # a token stop sees the ids, not the text
        ({"repetition_penalty": 1.2}, "ids"),  # vLLM applies it to prompt and answer alike
        ({"frequency_penalty": 0}, "ids"),
        ({"logprobs": False}, "ids"),
        ({"response_format": {"type": "text"}}, "ids"),
        ({"stop": "Observation:"}, "replay"),
        ({"stop": ["\n\n"]}, "replay"),
        ({"frequency_penalty": 1.0}, "replay"),
        ({"presence_penalty": -0.5}, "replay"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "replay"),
        ({"structured_outputs": {"json": {}}}, "replay"),
        ({"tools": [{"type": "function"}], "tool_choice": "auto"}, "replay"),
        ({"logprobs": True, "top_logprobs": 2}, "replay"),
        ({"temperature": 0.8, "seed": 7}, "replay"),
        ({"seed": 7, "temperature": None}, "replay"),  # the engine's default temperature
        ({"return_token_ids": False}, "replay"),
        ({"n": 2}, "none"),
        ({"best_of": 3}, "none"),
        ({"n": 2, "stop": ["x"]}, "none"),
    ]
    for extra, way in rows:
        body = {**base, **extra}
        if body.get("temperature") is None:
            body.pop("temperature")
        assert plan_continuation(CHAT, body).way == way, extra
    # A completion's logprobs is a count: 0 asks for none.
    assert plan_continuation("/v1/completions", {"logprobs": 0}).way == "ids"
    assert plan_continuation("/v1/completions", {"logprobs": 1}).way == "replay"


_FEATURES = st.fixed_dictionaries(
    {},
    optional={
        "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
        "frequency_penalty": st.floats(-2, 2),
        "presence_penalty": st.floats(-2, 2),
        "logprobs": st.booleans(),
        "seed": st.integers(0, 9),
        "temperature": st.floats(0, 2),
        "n": st.integers(1, 3),
        "tools": st.lists(st.just({"type": "function"}), max_size=1),
    },
)


@given(_FEATURES)
def test_a_request_is_continued_by_ids_only_where_its_state_is_its_tokens(
    body: dict[str, Any],
) -> None:
    plan = plan_continuation(CHAT, body)
    assert (plan.way == "none") == (body.get("n", 1) != 1)
    stateful = (
        bool(body.get("stop"))
        or bool(body.get("frequency_penalty"))
        or bool(body.get("presence_penalty"))
        or body.get("logprobs") is True
        or bool(body.get("tools"))
        or (body.get("seed") is not None and body.get("temperature") != 0)
    )
    if plan.way != "none":
        assert (plan.way == "replay") == stateful, body
        assert (plan.why == "") == (plan.way == "ids")


# An answer: tokens, each an id, its text and its logprob.
_TOKENS = st.lists(st.tuples(st.integers(0, 50), st.text("abc ", max_size=2)), max_size=30)


@st.composite
def _stream(draw: st.DrawFn, tokens: list[tuple[int, str]]) -> list[bytes]:
    """``tokens`` as a chat stream: a role chunk, chunks of one or more tokens whose text may lag
    their ids (held back, as for a stop string), the finish, a usage chunk."""
    full = "".join(t for _, t in tokens)
    chunks = [_chunk("", [], [], role=True)]
    released = 0
    i = 0
    while i < len(tokens):
        n = draw(st.integers(1, 3))
        part = tokens[i : i + n]
        i += len(part)
        made = len("".join(t for _, t in tokens[:i]))
        upto = made if i == len(tokens) else draw(st.integers(released, made))
        ids = [t for t, _ in part]
        chunks.append(_chunk(full[released:upto], ids, [float(-t) for t in ids]))
        released = upto
    chunks.append(_chunk("", [], [], finish="length"))
    chunks.append(orjson.dumps({"id": "c", "choices": [], "usage": {"completion_tokens": i}}))
    return chunks


def _chunk(
    text: str, ids: list[int], logprobs: list[float], role: bool = False, finish: str | None = None
) -> bytes:
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    choice["token_ids"] = ids
    choice["logprobs"] = {"content": [{"logprob": p} for p in logprobs]}
    return orjson.dumps({"id": "c", "choices": [choice]})


def _read(payloads: list[bytes]) -> tuple[str, list[int], list[float], bool]:
    """(text, token ids, logprobs, finished) of a stream's chunks."""
    text, ids, logprobs, finished = "", [], [], False
    for payload in payloads:
        if payload == DONE:
            continue
        for choice in orjson.loads(payload)["choices"]:
            piece, got = answer_pieces(choice)
            text += piece
            ids += got or []
            logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content", [])]
            finished = finished or bool(choice.get("finish_reason"))
    return text, ids, logprobs, finished


@settings(max_examples=300)
@given(st.data(), _TOKENS)
def test_a_replay_gives_the_caller_the_rest_of_the_answer_once(
    data: st.DataObject, tokens: list[tuple[int, str]]
) -> None:
    first = data.draw(_stream(tokens))
    replayed = [*data.draw(_stream(tokens)), DONE]
    # The caller got the first chunks of the first answer (before its finish), then it broke.
    cut = data.draw(st.integers(1, len(first) - 2))
    delivered = first[:cut]
    text, ids, _, _ = _read(delivered)
    replay = Replay(text, ids)
    out: list[bytes] = []
    i = 0
    while i < len(replayed):  # the replay's chunks in reads of any size
        n = data.draw(st.integers(1, 4))
        out += replay(replayed[i : i + n])
        i += n
    assert replay.diverged is None
    assert replay.passed
    whole = _read(delivered + out)
    assert whole[0] == "".join(t for _, t in tokens)
    assert whole[1] == [t for t, _ in tokens]
    assert whole[2] == [float(-t) for t, _ in tokens]
    assert whole[3]  # the finish came once
    assert out[-2:] == replayed[-2:]  # the usage (the whole answer's) and [DONE] as they came


@settings(max_examples=200)
@given(st.data(), _TOKENS.filter(lambda t: len(t) >= 2))
def test_a_replay_that_differs_from_what_was_delivered_is_never_stitched(
    data: st.DataObject, tokens: list[tuple[int, str]]
) -> None:
    first = data.draw(_stream(tokens))
    cut = data.draw(st.integers(2, len(first) - 2))
    text, ids, _, _ = _read(first[:cut])
    if not ids:
        return
    # Another answer: one delivered token differs (in its id, and in its text where it has any).
    k = data.draw(st.integers(0, len(ids) - 1))
    other = list(tokens)
    other[k] = (other[k][0] + 1, other[k][1] + "x")
    replay = Replay(text, ids)
    out = replay([*data.draw(_stream(other)), DONE])
    assert replay.diverged is not None and "differs" in replay.diverged
    assert _read(out)[1] == []  # nothing of the other answer reached the caller


def test_a_replay_that_ends_early_diverges() -> None:
    replay = Replay("abc", [1, 2, 3])
    out = replay([_chunk("a", [1], [0.0]), _chunk("", [], [], finish="stop"), DONE])
    assert out == [] and replay.diverged is not None and "ended before" in replay.diverged


def test_a_tool_call_replayed_keeps_the_id_the_caller_has() -> None:
    def call(args: str, ids: list[int], head: bool = False) -> bytes:
        tool: dict[str, Any] = {"index": 0, "function": {"arguments": args}}
        if head:
            tool.update(id="chatcmpl-tool-NEW", type="function")
            tool["function"]["name"] = "f"
        choice = {"index": 0, "delta": {"tool_calls": [tool]}, "token_ids": ids}
        return orjson.dumps({"id": "c", "choices": [choice]})

    # Delivered: the call's head and '{"a": 1'; the replay comes in other chunks.
    replay = Replay('{"a": 1', [1, 2])
    out = replay([call('{"a"', [1], head=True), call(': 1, "b": 2}', [2, 3])])
    assert replay.passed and len(out) == 1
    tool = orjson.loads(out[0])["choices"][0]["delta"]["tool_calls"][0]
    assert tool == {"index": 0, "function": {"arguments": ', "b": 2}'}}
    assert orjson.loads(out[0])["choices"][0]["token_ids"] == [3]
