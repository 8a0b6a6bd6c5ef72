"""Every continuation is exact or refused (docs/design.md, Continuation), against the real vLLM:
streams of requests whose engine state is more than their tokens (stop strings, penalties, a JSON
schema, a named tool, logprobs, a seeded sample) are cut once at a random event between the
gateway and vLLM and come back exactly as the same request straight to vLLM answers (text, token
ids, logprobs, usage, finish reason), replayed and verified; several choices end with an error
that says why. Ten cuts per row, drawn with a fixed seed."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson
import pytest

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.relay.replay import answer_pieces
from streamsafe.server import ServerThread
from streamsafe_bench.cutting_proxy import CuttingProxy, serve_proxy

pytestmark = pytest.mark.timeout(300)

TOKENS = 40
CUTS = 10

_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
        },
    },
}


@dataclass
class Answer:
    """What a client read of one chat stream."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[str, float]] = field(default_factory=list)
    events: int = 0
    usage: dict[str, int] | None = None
    finish: list[str] = field(default_factory=list)
    error: str | None = None

    def same(self, other: Answer) -> bool:
        """Equal as a caller sees it; logprobs equal to 1e-3 (the CPU's batched sums)."""
        return (
            (self.text, self.ids, self.usage, self.finish, self.error)
            == (other.text, other.ids, other.usage, other.finish, other.error)
            and [t for t, _ in self.logprobs] == [t for t, _ in other.logprobs]
            and all(
                abs(a - b) < 1e-3
                for (_, a), (_, b) in zip(self.logprobs, other.logprobs, strict=True)
            )
        )


def _read(base: str, body: dict[str, Any]) -> Answer:
    """One stream, read whole. A 503 before any work (the gateway found vLLM's ``/health`` slow
    on this loaded machine and refused, nothing started) is asked again after its
    ``Retry-After``, as a client does: this file is about the continuation of a cut answer."""
    for _ in range(10):
        with httpx2.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as resp:
            if resp.status_code == 503 and "retry-after" in resp.headers:
                resp.read()
                time.sleep(float(resp.headers["retry-after"]))  # the refusal's own wait
                continue
            assert resp.status_code == 200, resp.read()
            return _answer(resp)
    raise AssertionError(f"refused ten times: {body['messages']}")


def _answer(resp: httpx2.Response) -> Answer:
    """What a client read of one chat stream's events."""
    answer = Answer()
    for line in resp.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        answer.events += 1
        chunk = orjson.loads(line[6:])
        if "error" in chunk:
            answer.error = chunk["error"]["message"]
            continue
        if chunk.get("usage"):
            usage = chunk["usage"]
            answer.usage = {k: usage[k] for k in ("prompt_tokens", "completion_tokens")}
        for choice in chunk.get("choices", ()):
            text, ids = answer_pieces(choice)
            answer.text += text
            answer.ids += ids or []
            for entry in (choice.get("logprobs") or {}).get("content") or ():
                answer.logprobs.append((entry["token"], entry["logprob"]))
            if choice.get("finish_reason"):
                answer.finish.append(choice["finish_reason"])
    return answer


@pytest.fixture(scope="module")
def cut_gateway(vllm_engine: Any) -> Iterator[tuple[CuttingProxy, str]]:
    """The gateway with its default flags, in front of a network that cuts planned streams."""
    proxy = CuttingProxy(vllm_engine.url)
    with (
        serve_proxy(proxy) as net,
        ServerThread(Gateway(GatewayConfig(upstream=net.url))) as server,
    ):
        yield proxy, server.url


def _body(model: str, marker: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me about {marker}."}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        **extra,
    }


def _rows(vllm_engine: Any, proxy: CuttingProxy, url: str, row: str, **extra: Any) -> list[Any]:
    """For ``CUTS`` prompts: (straight to vLLM, through the gateway with one cut, cut point)."""
    rng = random.Random(row)
    markers = [f"{row} {i}" for i in range(CUTS)]
    model = vllm_engine.model
    with ThreadPoolExecutor(4) as pool:
        wanted = list(pool.map(lambda m: _read(vllm_engine.url, _body(model, m, **extra)), markers))
        for marker, want in zip(markers, wanted, strict=True):
            # Anywhere from just after the role chunk to just before the answer's last event.
            proxy.plan[marker] = rng.randint(2, max(2, want.events - 1))
        cuts = dict(proxy.plan)
        got = list(pool.map(lambda m: _read(url, _body(model, m, **extra)), markers))
    return [(w, g, cuts[m]) for m, w, g in zip(markers, wanted, got, strict=True)]


ROWS: dict[str, dict[str, Any]] = {
    "frequency penalty": {"frequency_penalty": 1.0},
    "presence penalty": {"presence_penalty": 1.0},
    "json schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": _SCHEMA},
        }
    },
    "logprobs": {"logprobs": True, "top_logprobs": 2},
    "seeded sample": {"temperature": 0.8, "seed": 7},
}


#: A named tool: vLLM 0.32 serves one only with a tool-call parser, which takes one only with
#: auto tool choice; a parser changes how every chat streams (special tokens no longer come as
#: empty chunks), so this row has its own vLLM rather than the session's.
NAMED_TOOL = {
    "tools": [_TOOL],
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
}


@pytest.fixture(scope="module")
def tool_engine(start_vllm_module: Any) -> Any:
    return start_vllm_module("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


def _exact_or_refused(row: str, engine: Any, proxy: CuttingProxy, url: str, **extra: Any) -> None:
    cuts_before = proxy.cuts
    results = _rows(engine, proxy, url, row, **extra)
    assert proxy.cuts - cuts_before == CUTS
    exact = [g.same(w) for w, g, _ in results]
    refused = sum(g.error is not None for _, g, _ in results)
    print(f"\n{row}: {sum(exact)}/{CUTS} exact, {refused} ended with an error")
    # Exact, or ended with an error that says it could not be continued exactly: never a
    # stitched answer presented as whole.
    for (_, got, cut), ok in zip(results, exact, strict=True):
        assert ok or (got.error is not None and "exactly" in got.error), (row, cut, got)
    assert sum(exact) >= 8, [(cut, w.text, g.text, g.error) for w, g, cut in results]


@pytest.mark.parametrize("row", list(ROWS))
def test_cut_streams_of_stateful_requests_come_back_exact(
    row: str, vllm_engine: Any, cut_gateway: tuple[CuttingProxy, str]
) -> None:
    proxy, url = cut_gateway
    _exact_or_refused(row, vllm_engine, proxy, url, **ROWS[row])


def test_cut_streams_of_a_named_tool_call_come_back_exact(tool_engine: Any) -> None:
    proxy = CuttingProxy(tool_engine.url)
    with (
        serve_proxy(proxy) as net,
        ServerThread(Gateway(GatewayConfig(upstream=net.url))) as server,
    ):
        _exact_or_refused("named tool", tool_engine, proxy, server.url, **NAMED_TOOL)


def test_stop_strings_cut_before_and_inside_the_stop_come_back_exact(
    vllm_engine: Any, cut_gateway: tuple[CuttingProxy, str]
) -> None:
    proxy, url = cut_gateway
    model = vllm_engine.model
    rng = random.Random("stop")
    markers = [f"stop {i}" for i in range(CUTS)]
    # Each prompt's stop: three characters of its own greedy answer, past its middle, so the
    # answer with the stop ends early and a cut may fall before the stop or inside its span.
    stops: dict[str, str] = {}
    for marker in markers:
        whole = _read(vllm_engine.url, _body(model, marker)).text
        at = rng.randint(len(whole) // 2, max(len(whole) // 2, len(whole) - 4))
        stop = whole[at : at + 3]
        stops[marker] = stop if stop.strip() and whole.find(stop) == at else whole[-3:]
    wanted = {m: _read(vllm_engine.url, _body(model, m, stop=[stops[m]])) for m in markers}
    for i, marker in enumerate(markers):
        events = wanted[marker].events
        # Half the cuts in the last three events (inside the held-back span), half anywhere.
        low = max(2, events - 3) if i % 2 else 2
        proxy.plan[marker] = rng.randint(low, max(low, events - 1))
    with ThreadPoolExecutor(4) as pool:
        got = dict(
            zip(
                markers,
                pool.map(lambda m: _read(url, _body(model, m, stop=[stops[m]])), markers),
                strict=True,
            )
        )
    exact = [got[m].same(wanted[m]) for m in markers]
    print(f"\nstop strings: {sum(exact)}/{CUTS} exact")
    for marker, ok in zip(markers, exact, strict=True):
        assert ok or "exactly" in (got[marker].error or ""), (marker, got[marker])
        assert stops[marker] not in got[marker].text  # never past the stop
    assert sum(exact) >= 8, [(wanted[m].text, got[m].text, got[m].error) for m in markers]


def test_a_cut_stream_of_several_choices_ends_with_an_error_that_says_why(
    vllm_engine: Any, cut_gateway: tuple[CuttingProxy, str]
) -> None:
    proxy, url = cut_gateway
    model = vllm_engine.model
    body = _body(model, "two choices", n=2, temperature=0.8)  # vLLM: n > 1 is never greedy
    whole = _read(vllm_engine.url, body)
    proxy.plan["two choices"] = whole.events // 2
    got = _read(url, body)
    assert got.error is not None and "n > 1" in got.error and "exactly" in got.error
