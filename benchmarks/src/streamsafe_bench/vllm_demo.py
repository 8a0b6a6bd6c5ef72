"""``streamsafe demo --engine vllm``: the report's storm and a cut stream against the real vLLM.

The simulator demo shows the mechanism in a minute; this one shows it on the engine the project
exists to protect, vLLM 0.32 on this machine's CPU serving the tiny model
(:mod:`streamsafe_bench.vllm_engine`). Everything is counted at vLLM, from its request log.

**The storm.** ``calls`` concurrent plain (non-streamed) chats with the clients' own retries
(openai's and llama-stack-client's defaults: 2) and a short timeout, while the engine is busy
past it (its engine core paused for ``stall_s``, as a long prefill or a full batch would hold
it), the same stall on every path:

- straight to vLLM, every timeout is a retry, a new request, the one before abandoned at the
  engine: up to three vLLM requests per call, and a call answered only where its last attempt
  outlasts the stall;
- through the gateway (default flags), the client states its read timeout and is kept alive
  (``102 Processing``) until the engine goes on; a retry that comes anyway
  (``x-stainless-retry-count``) attaches to the generation already waiting: one vLLM request
  per call.

**A cut stream.** Greedy streams cut at a random event between the gateway and vLLM (a network
that resets the connection), continued by the gateway. By token ids (the default against vLLM)
and, for comparison, by text (the caller sets ``return_token_ids: false``): how many come back
exactly as an unbroken stream, how many carry a usage of exactly ``max_tokens``, and the most
tokens any caller got beyond the unbroken answer (by vLLM's tokenizer).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.relay.replay import answer_pieces
from streamsafe.server import ServerThread
from streamsafe_bench.cutting_proxy import CuttingProxy, serve_proxy
from streamsafe_bench.vllm_engine import VLLMEngine, VLLMOptions

__all__ = ["VLLMDemoSettings", "run_vllm_demo"]


@dataclass(frozen=True)
class VLLMDemoSettings:
    """Sizes of one run: ``calls`` in the storm, each ``storm_tokens`` long; ``cuts`` streams of
    ``cut_tokens`` each way of continuing."""

    calls: int = 8
    storm_tokens: int = 48
    cuts: int = 20
    cut_tokens: int = 120
    seed: int = 11
    #: The clients' timeout for each attempt (the 60 s default, time-compressed).
    timeout_s: float = 2.0
    #: How long the engine is busy once the calls went out, the same on every path: past the
    #: first attempt's timeout and into the second attempt.
    stall_s: float = 5.0

    @classmethod
    def quick(cls) -> VLLMDemoSettings:
        return cls(calls=4, cuts=6, cut_tokens=60)


def _chat(model: str, content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


@contextlib.contextmanager
def _gateway(upstream: str) -> Iterator[tuple[str, Gateway]]:
    """The gateway with its default flags in front of ``upstream``: its URL and itself."""
    gateway = Gateway(GatewayConfig(upstream=upstream))
    with ServerThread(gateway) as server:
        yield server.url, gateway


def _answer(url: str, body: dict[str, Any]) -> str:
    r = httpx2.post(url + "/v1/chat/completions", json=body, timeout=300.0, trust_env=False)
    r.raise_for_status()
    text: str = r.json()["choices"][0]["message"]["content"]
    return text


def _openai_calls(base: str, timeout: float) -> Callable[[dict[str, Any]], str]:
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="demo", timeout=timeout, max_retries=2)
    return lambda body: client.chat.completions.create(**body).choices[0].message.content or ""


def _llama_stack_calls(base: str, timeout: float) -> Callable[[dict[str, Any]], str]:
    from llama_stack_client import LlamaStackClient

    client = LlamaStackClient(base_url=base, timeout=timeout)

    def call(body: dict[str, Any]) -> str:
        answer: Any = client.chat.completions.create(**body)
        return str(answer.choices[0].message.content or "")

    return call


def _wait(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


def _storm_row(
    name: str,
    engine: VLLMEngine,
    call: Callable[[dict[str, Any]], str],
    bodies: list[dict[str, Any]],
    wanted: list[str],
    stall_s: float,
) -> dict[str, Any]:
    """One path: the calls at once, the engine busy (paused) for ``stall_s`` (or until every
    call ended)."""
    before = len(engine.requests_received())
    got: list[str | None] = [None] * len(bodies)

    def one(i: int) -> None:
        try:
            got[i] = call(bodies[i])
        except Exception as exc:
            got[i] = type(exc).__name__

    t0 = time.monotonic()
    engine.pause()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    _wait(lambda: not any(t.is_alive() for t in threads), stall_s)
    engine.resume()
    for t in threads:
        t.join(300)
    seconds = time.monotonic() - t0
    _wait(lambda: len(engine.requests_received()) - before >= len(bodies), 5.0)
    requests = len(engine.requests_received()) - before
    exact = sum(g == w for g, w in zip(got, wanted, strict=True))
    errors = sorted({g for g, w in zip(got, wanted, strict=True) if g != w and g is not None})
    return {
        "name": name,
        "stall_s": stall_s,
        "calls": len(bodies),
        "vllm_requests": requests,
        "per_call": round(requests / len(bodies), 2),
        "exact": exact,
        "errors": [e for e in errors if len(e) < 40],
        "seconds": round(seconds, 1),
    }


def storm(engine: VLLMEngine, s: VLLMDemoSettings) -> tuple[float, list[dict[str, Any]]]:
    """The storm's rows (see the module docstring) and the clients' timeout."""
    timeout = s.timeout_s
    bodies = [_chat(engine.model, f"storm {s.seed}-{i}", s.storm_tokens) for i in range(s.calls)]
    with ThreadPoolExecutor(s.calls) as pool:
        wanted = list(pool.map(lambda b: _answer(engine.url, b), bodies))
    rows = [
        _storm_row(
            "openai -> vLLM", engine, _openai_calls(engine.url, timeout), bodies, wanted, s.stall_s
        )
    ]
    for name, calls in (
        ("openai -> streamsafe -> vLLM", _openai_calls),
        ("llama-stack-client 0.2 -> streamsafe -> vLLM", _llama_stack_calls),
    ):
        with _gateway(engine.url) as (url, _):
            rows.append(_storm_row(name, engine, calls(url, timeout), bodies, wanted, s.stall_s))
    return timeout, rows


def _stream(url: str, body: dict[str, Any]) -> tuple[str, int, int, float]:
    """(answer text, content chunks, usage.completion_tokens, the longest wait between two
    events in seconds) of one stream. The text is a chat delta's content and tool-call
    arguments; the longest wait, through a cut, is the time the gateway took to recover."""
    text: list[str] = []
    chunks = usage = 0
    gap = 0.0
    with httpx2.stream(
        "POST", url + "/v1/chat/completions", json=body, timeout=300.0, trust_env=False
    ) as resp:
        last = None
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if last is not None:
                gap = max(gap, now - last)
            last = now
            chunk = orjson.loads(line[6:])
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or ():
                content, _ = answer_pieces(choice)
                if content:
                    text.append(content)
                    chunks += 1
    return "".join(text), chunks, usage, gap


def _tokens(engine: VLLMEngine, text: str) -> int:
    """Tokens in ``text`` by vLLM's own tokenizer (``/tokenize``)."""
    r = httpx2.post(
        engine.url + "/tokenize",
        json={"model": engine.model, "prompt": text, "add_special_tokens": False},
        timeout=30.0,
        trust_env=False,
    )
    r.raise_for_status()
    count: int = r.json()["count"]
    return count


#: The continuation rows: how a request's cut stream is continued (docs/design.md, Continuation)
#: and the request features that choose it.
CUT_ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("by token ids (default)", {}),
    ("replayed: the caller declined token ids", {"return_token_ids": False}),
    ("replayed: stop strings", {"stop": ["\n\n\n", "###"]}),
    ("replayed: frequency penalty", {"frequency_penalty": 1.0}),
    (
        "replayed: json schema",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
                },
            }
        },
    ),
    ("replayed: logprobs", {"logprobs": True, "top_logprobs": 2}),
    ("replayed: seeded sample", {"temperature": 0.8, "seed": 7}),
)


def cut_streams(engine: VLLMEngine, s: VLLMDemoSettings) -> list[dict[str, Any]]:
    """The continuation rows (:data:`CUT_ROWS`): for each, ``s.cuts`` streams straight to vLLM,
    then the same through the gateway, each cut once at a random event between it and vLLM."""
    rng = random.Random(s.seed)
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    rows = []
    for r, (name, extra) in enumerate(CUT_ROWS):
        prompts = [f"cut {s.seed}-{r}-{i}" for i in range(s.cuts)]

        def body(p: str, extra: dict[str, Any] = extra) -> dict[str, Any]:
            return _chat(engine.model, p, s.cut_tokens, **usage, **extra)

        with ThreadPoolExecutor(4) as pool:
            wanted = list(pool.map(lambda p: _stream(engine.url, body(p)), prompts))
        proxy = CuttingProxy(engine.url)
        proxy.plan.update(
            (p, rng.randint(2, max(2, w[1]))) for p, w in zip(prompts, wanted, strict=True)
        )
        with (
            serve_proxy(proxy) as net,
            _gateway(net.url) as (url, _),
            ThreadPoolExecutor(4) as pool,
        ):
            got = list(pool.map(lambda p: _stream(url, body(p)), prompts))
        pairs = list(zip(got, wanted, strict=True))
        rows.append(
            {
                "name": name,
                "streams_cut": proxy.cuts,
                "exact": sum(g[0] == w[0] for g, w in pairs),
                "usage_exact": sum(g[2] == w[2] for g, w in pairs),
                # What the callers got beyond the unbroken answer, counted by vLLM's tokenizer
                # (a usage chunk counts what the gateway believes it sent).
                "max_extra_tokens": max(
                    _tokens(engine, g[0]) - _tokens(engine, w[0]) for g, w in pairs
                ),
                # The longest wait a caller saw, through the cut, against the same answer's
                # longest wait straight (medians over the row's streams).
                "recover_ms": round(statistics.median(g[3] for g, _ in pairs) * 1000),
                "straight_gap_ms": round(statistics.median(w[3] for _, w in pairs) * 1000),
            }
        )
    return rows


def run_vllm_demo(
    s: VLLMDemoSettings, *, on_row: Callable[[str, dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Start the real vLLM, run the storm and the cuts, stop it; every figure as a dict."""
    with VLLMEngine(VLLMOptions()) as engine:
        timeout, storm_rows = storm(engine, s)
        for row in storm_rows:
            if on_row:
                on_row("storm", row)
        cut_rows = cut_streams(engine, s)
        for row in cut_rows:
            if on_row:
                on_row("cut", row)
        return {
            "vllm_startup_s": round(engine.startup_s or 0.0, 1),
            "client_timeout_s": round(timeout, 2),
            "settings": s.__dict__,
            "storm": storm_rows,
            "continuation": cut_rows,
        }
