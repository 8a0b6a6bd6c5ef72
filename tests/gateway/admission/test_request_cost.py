"""What a request costs the engine, read as vLLM reads it (streamsafe.request_cost): numbers
written as strings or integral floats, prompt lists and token-id prompts are counted as the
engine will run them, and what the engine would refuse is the caller's 400 at the gateway."""

from __future__ import annotations

import threading
from typing import Any

import httpx2
import pytest
from gateway_helpers import MODEL, chat_body, fast_sim, make_stack, post_stream
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.gateway.admission.admission import request_cost
from streamsafe.request_cost import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    MAX_REQUEST_COST,
    InvalidField,
    is_deterministic,
    read_cost,
    read_int,
)

pytestmark = pytest.mark.unit

SPACES = st.sampled_from(["", " ", "\t", "\n", "\xa0", "\u3000", " \r\n"])


@st.composite
def written_ints(draw: st.DrawFn) -> tuple[int, object]:
    """An integer and one way a client may write it that vLLM reads as that integer."""
    value = draw(st.integers(-(10**12), 10**12))
    form = draw(st.sampled_from(["int", "float", "str", "str-float", "underscored"]))
    if form == "int":
        return value, value
    if form == "float":
        return value, float(value)
    digits = str(abs(value))
    if form == "underscored" and len(digits) > 1:
        cut = draw(st.integers(1, len(digits) - 1))
        digits = digits[:cut] + "_" + digits[cut:]
    sign = "-" if value < 0 else draw(st.sampled_from(["", "+"]))
    zeros = "." + "0" * draw(st.integers(1, 3)) if form == "str-float" else ""
    return value, draw(SPACES) + sign + digits + zeros + draw(SPACES)


@given(written_ints())
def test_an_integer_is_read_however_vllm_accepts_it_written(case: tuple[int, object]) -> None:
    value, written = case
    assert read_int({"max_tokens": written}, "max_tokens") == value


@pytest.mark.parametrize(
    "written",
    [
        *("5e3", "5000.", "5000.5", "0x10", "1__0", "_1", "1_", "+-5", "5 000", "", "٣", "abc"),
        *(5000.5, float("inf"), float("nan"), 1e20, [5000], {"v": 1}),
    ],
)
def test_a_number_vllm_refuses_is_refused(written: object) -> None:
    with pytest.raises(InvalidField) as caught:
        read_int({"max_tokens": written}, "max_tokens")
    assert caught.value.field == "max_tokens"


def test_booleans_and_huge_numbers_read_as_vllm_reads_them() -> None:
    assert read_int({"n": True}, "n") == 1
    assert read_int({"n": False}, "n") == 0
    assert read_int({"max_tokens": "9" * 200}, "max_tokens") == MAX_REQUEST_COST
    assert read_int({"max_tokens": 2**70}, "max_tokens") == MAX_REQUEST_COST


@given(st.integers(1, 10**9), st.sampled_from([str, float, int]))
def test_a_limit_costs_the_same_however_it_is_written(limit: int, form: Any) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    expected = request_cost({**body, "max_tokens": limit}, 100)
    assert request_cost({**body, "max_tokens": form(limit)}, 100) == expected
    assert request_cost({**body, "max_completion_tokens": form(limit)}, 100) == expected


def test_a_chat_reads_max_completion_tokens_before_max_tokens() -> None:
    body = {"messages": [], "max_completion_tokens": "7", "max_tokens": 5}
    assert read_cost(body, chat=True).max_tokens == 7
    # A completions request has no max_completion_tokens (vLLM ignores the field).
    assert read_cost({"prompt": "x", "max_completion_tokens": 7}, chat=False).max_tokens == 16


def test_a_prompt_list_costs_one_generation_per_prompt() -> None:
    one = read_cost({"prompt": "word " * 80, "max_tokens": 1000}, chat=False)
    many = read_cost({"prompt": ["word " * 80] * 400, "max_tokens": 1000}, chat=False)
    assert many.prompts == 400 and many.prompt_tokens == 400 * one.prompt_tokens
    assert many.tokens(1024) == 400 * one.tokens(1024) >= 400 * 1000


def test_token_id_prompts_count_one_token_per_id() -> None:
    ids = list(range(100_000, 100_500))
    assert read_cost({"prompt": ids}, chat=False).prompt_tokens == 500
    cost = read_cost({"prompt": [ids, ids[:100]], "max_tokens": 10}, chat=False)
    assert (cost.prompt_tokens, cost.prompts) == (600, 2)
    assert cost.tokens(1024) == 600 + 2 * 10


def test_a_completion_without_a_limit_costs_vllms_default() -> None:
    cost = read_cost({"prompt": "x"}, chat=False)
    assert cost.max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS
    assert read_cost({"messages": []}, chat=True).max_tokens is None


@pytest.mark.parametrize(
    ("field", "value"), [("max_tokens", -1), ("max_completion_tokens", "-5"), ("n", 0)]
)
def test_values_vllm_refuses_are_invalid(field: str, value: object) -> None:
    with pytest.raises(InvalidField) as caught:
        read_cost({"messages": [], field: value}, chat=True)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("sampling", "determined"),
    [
        ({}, False),
        ({"temperature": 0}, True),
        ({"temperature": 0.0}, True),
        ({"temperature": " 0 "}, True),
        ({"temperature": 0.7}, False),
        ({"temperature": "hot"}, False),
        ({"temperature": None}, False),
        ({"seed": 7}, True),
        ({"seed": "7", "temperature": 1.0}, True),
        ({"seed": None, "temperature": 1}, False),
        ({"seed": "x"}, False),
    ],
)
def test_a_request_is_deterministic_where_greedy_or_seeded(
    sampling: dict[str, object], determined: bool
) -> None:
    assert is_deterministic({"messages": [], **sampling}) is determined


# -- through the gateway, in front of an engine that reads numbers as vLLM does -----------------

BUDGET = 2000


def _completions(url: str, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.post(url + "/v1/completions", json=body, timeout=10)


@pytest.mark.integration
@pytest.mark.parametrize(
    "asked",
    [
        {"max_tokens": "5000"},
        {"max_tokens": 5000.0},
        {"max_completion_tokens": "5000"},
        {"max_tokens": " 5_000 "},
        {"max_tokens": 1000, "n": "3"},
    ],
)
def test_a_limit_written_leniently_is_refused_where_it_cannot_fit(asked: dict[str, Any]) -> None:
    with make_stack(fast_sim(memory_tokens=6000), max_memory_tokens=BUDGET) as s:
        r = post_stream(s.url, {**chat_body(max_tokens=8), "max_tokens": None, **asked})
        assert r.status_code == 400, r.text
        assert "tokens of engine memory" in r.json()["error"]["message"]
        assert s.sim.stats()["requests_received"] == 0


@pytest.mark.integration
def test_a_prompt_list_that_cannot_fit_never_reaches_the_engine() -> None:
    prompts = ["word " * 80] * 40  # 40 prompts of 100 tokens, 16 tokens each by default
    with make_stack(fast_sim(memory_tokens=6000), max_memory_tokens=BUDGET) as s:
        r = _completions(s.url, {"model": MODEL, "prompt": prompts})
        assert r.status_code == 400, r.text
        assert "tokens of engine memory" in r.json()["error"]["message"]
        assert s.sim.stats()["requests_received"] == 0
        # One such prompt fits and is served.
        r = _completions(s.url, {"model": MODEL, "prompt": prompts[:1], "max_tokens": "4"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4


@pytest.mark.integration
@pytest.mark.parametrize(
    ("asked", "field"),
    [
        ({"max_tokens": "5e3"}, "max_tokens"),
        ({"max_tokens": 12.5}, "max_tokens"),
        ({"max_completion_tokens": "lots"}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"max_tokens": -3}, "max_tokens"),
    ],
)
def test_a_number_the_engine_refuses_is_a_clear_400(asked: dict[str, Any], field: str) -> None:
    with make_stack() as s:
        r = post_stream(s.url, {**chat_body(), **asked})
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == field and field in error["message"]
        assert s.sim.stats()["requests_received"] == 0


@pytest.mark.integration
def test_limits_written_as_strings_cannot_overfill_the_engine() -> None:
    # The report's finding: four streams of "2500" under a budget of 6000 were counted as the
    # default 1024 each, all admitted at once, and the engine (6000 tokens) died.
    sim = fast_sim(memory_tokens=6000, itl_ms=0.5, default_max_tokens=4096)
    with make_stack(sim, max_memory_tokens=6000, queue_timeout=30.0) as s:
        results: list[httpx2.Response] = []

        def one(i: int) -> None:
            body = {**chat_body(f"user {i}"), "max_tokens": "2500"}
            results.append(post_stream(s.url, body))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
        assert [r.status_code for r in results] == [200] * 4
        assert all(r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text for r in results)
        stats = s.sim.stats()
        assert stats["crashes"] == 0 and stats["memory_peak_tokens"] <= 6000
