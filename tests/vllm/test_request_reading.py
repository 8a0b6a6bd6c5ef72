"""The gateway reads what a request costs exactly as the real vLLM does: for generated bodies,
streamsafe.request_cost's reading of every cost field (the completion limit, n, the number of
prompts) equals vLLM 0.32's own request models' (run in the vLLM virtualenv), and a body vLLM
refuses is one the gateway refuses. Then one through the gateway: a limit written as a string
is what the real vLLM generates."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_helpers import gateway

from streamsafe.request_cost import MAX_REQUEST_COST, InvalidField, read_cost
from streamsafe_bench.vllm_engine import VLLMEngine

HERE = Path(__file__).parent


class VLLMReader:
    """vllm_reading.py in the vLLM virtualenv, asked one body at a time."""

    def __init__(self, venv: Path) -> None:
        self._proc = subprocess.Popen(
            [str(venv / "bin" / "python"), str(HERE / "vllm_reading.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def read(self, chat: bool, body: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"chat": chat, "body": body}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        assert line, "vllm_reading.py ended"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(10)


@pytest.fixture(scope="module")
def vllm_reader(vllm_venv: Path) -> Iterator[VLLMReader]:
    reader = VLLMReader(vllm_venv)
    try:
        yield reader
    finally:
        reader.close()


SPACE = st.sampled_from(["", " ", "\t", "\n", "\xa0", "\u2003", "\x1c", "\u200b"])
DIGITS = st.text(alphabet="0123456789_", min_size=1, max_size=8)


@st.composite
def number_texts(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "+", "-", "+-"]))
    tail = draw(st.sampled_from(["", ".0", ".00", ".", ".5", "e3", ".0_0", "x"]))
    return draw(SPACE) + sign + draw(DIGITS) + tail + draw(SPACE)


NUMBERS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
    st.integers(0, 10**5).map(float),
    st.sampled_from([1e19, 9.2e18, -0.0, 2.0**62]),
    number_texts(),
    st.sampled_from(["", "abc", "٣", "0x10", "1e3"]),
)
TOKEN_IDS = st.lists(st.integers(0, 500), min_size=1, max_size=5)
# Prompts vLLM accepts (an empty one is its 400, whatever the numbers), so every refusal comes
# from a cost field.
PROMPTS = st.one_of(
    st.text(min_size=1, max_size=20),
    st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=4),
    TOKEN_IDS,
    st.lists(TOKEN_IDS, min_size=1, max_size=4),
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bool, dict[str, Any]]:
    chat = draw(st.booleans())
    body: dict[str, Any] = {"model": "m"}
    if chat:
        body["messages"] = [{"role": "user", "content": draw(st.text(max_size=20))}]
    else:
        body["prompt"] = draw(PROMPTS)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        if draw(st.booleans()):
            body[name] = draw(NUMBERS)
    return chat, body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
@pytest.mark.timeout(300)
def test_the_gateway_reads_every_cost_field_as_vllm_does(
    vllm_reader: VLLMReader, asked: tuple[bool, dict[str, Any]]
) -> None:
    chat, body = asked
    expected = vllm_reader.read(chat, body)
    try:
        cost = read_cost(body, chat=chat)
    except InvalidField:
        assert expected == {"refused": True}, body
        return
    if body.get("n") is None and not chat and "n" in body:
        # vLLM's completions model has `n: int` (null refused); a gateway that reads null as
        # "not given" lets the engine answer that 400 itself: nothing runs, nothing is counted.
        assert expected == {"refused": True}
        return
    assert expected != {"refused": True}, body
    # The reading bounds a number past any engine's memory (MAX_REQUEST_COST).
    limit, n = (None if v is None else _bounded(v) for v in (expected["max_tokens"], expected["n"]))
    assert (cost.max_tokens, cost.n, cost.prompts) == (limit, n, expected["prompts"]), body


def _bounded(value: int) -> int:
    return max(-MAX_REQUEST_COST, min(MAX_REQUEST_COST, value))


@pytest.mark.timeout(180)
def test_a_limit_written_as_a_string_is_what_the_real_vllm_generates(
    vllm_engine: VLLMEngine,
) -> None:
    with gateway(vllm_engine) as gw:
        for written in ("5", 5.0, " 5 "):
            body = {
                "model": vllm_engine.model,
                "messages": [{"role": "user", "content": "count"}],
                "max_tokens": written,
                "temperature": 0,
                "ignore_eos": True,
            }
            r = httpx2.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 5
