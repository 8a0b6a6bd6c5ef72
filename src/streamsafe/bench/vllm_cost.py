"""``streamsafe bench vllm``: what the gateway costs in front of the real vLLM.

The same greedy streams go straight to vLLM 0.32 (CPU, the tiny model) and through the gateway
(``streamsafe serve --upstream``, default flags, its own process), interleaved: each round runs
both paths, in alternating order, at each concurrency (at least 8 streams a path, in batches of
that many at once), so both see the same machine. Per stream:
time to first token (request sent to first content chunk) and tokens per second (its tokens over
the time from the request to its last token: a rate from the first to the last token alone
jumps to thousands whenever the reading process is descheduled and finds a burst). Reported:
medians per path and concurrency, and the gateway's as a ratio of the direct path's. The tiny
model generates far faster than a real one, which makes any added cost per chunk easier to see,
not harder.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from streamsafe.bench.processes import ServerProcess
from streamsafe.bench.report import add_output_flags, write_json
from streamsafe.bench.stats import median

__all__ = ["VLLMCostSettings", "register", "run"]


@dataclass(frozen=True)
class VLLMCostSettings:
    """Rounds, concurrencies and tokens per stream."""

    rounds: int = 8
    concurrency: tuple[int, ...] = (1, 8)
    max_tokens: int = 200


@dataclass(frozen=True)
class _Stream:
    ttft_s: float
    tokens_per_s: float


def _one(url: str, model: str, prompt: str, max_tokens: int) -> _Stream:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    with httpx2.stream(
        "POST", url + "/v1/chat/completions", json=body, timeout=300.0, trust_env=False
    ) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if isinstance(chunk.get("usage"), dict):
                tokens = chunk["usage"]["completion_tokens"]
            elif any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                last = time.perf_counter()
                first = first or last
    if first is None or last is None:
        raise RuntimeError(f"no token from {url}")
    return _Stream(first - t0, tokens / (last - t0))


@contextlib.contextmanager
def _paths(vllm_url: str) -> Iterator[dict[str, str]]:
    gateway = ServerProcess("serve", "--upstream", vllm_url, "--log-level", "warning")
    try:
        yield {"direct": vllm_url, "streamsafe": gateway.url}
    finally:
        gateway.stop()


def run(s: VLLMCostSettings) -> dict[str, Any]:
    """Start vLLM and the gateway, measure, stop them; the report as a dict."""
    from streamsafe.bench.vllm_engine import VLLMEngine

    samples: dict[tuple[str, int], list[_Stream]] = {}
    prompts = (f"cost {i}" for i in itertools.count())
    with VLLMEngine() as engine:
        with _paths(engine.url) as paths:
            names = list(paths)
            for r in range(s.rounds):
                for c in s.concurrency:
                    for name in names if r % 2 == 0 else names[::-1]:
                        # At least 8 streams per path and round, in batches of c at once.
                        for _ in range(max(1, 8 // c)):
                            batch = [next(prompts) for _ in range(c)]
                            with ThreadPoolExecutor(c) as pool:
                                got = pool.map(
                                    lambda p, u=paths[name]: _one(u, engine.model, p, s.max_tokens),
                                    batch,
                                )
                                samples.setdefault((name, c), []).extend(got)
        startup = engine.startup_s
    rows = []
    for c in s.concurrency:
        direct = _summary(samples[("direct", c)])
        through = _summary(samples[("streamsafe", c)])
        rows.append(
            {
                "concurrency": c,
                "direct": direct,
                "streamsafe": through,
                "ttft_added_ms": round((through["ttft_ms"] - direct["ttft_ms"]), 2),
                "tokens_per_s_ratio": round(through["tokens_per_s"] / direct["tokens_per_s"], 3),
            }
        )
    return {"settings": s.__dict__, "vllm_startup_s": startup, "rows": rows}


def _summary(streams: list[_Stream]) -> dict[str, Any]:
    ttft = median([x.ttft_s for x in streams]) or 0.0
    rate = median([x.tokens_per_s for x in streams]) or 0.0
    return {
        "streams": len(streams),
        "ttft_ms": round(ttft * 1e3, 2),
        "tokens_per_s": round(rate, 1),
    }


def _main(args: argparse.Namespace) -> int:
    from streamsafe.bench.vllm_engine import VLLMUnavailable

    conc = tuple(int(x) for x in args.concurrency.split(","))
    settings = VLLMCostSettings(args.rounds, conc, args.max_tokens)
    try:
        report = run(settings)
    except VLLMUnavailable as exc:
        print(f"bench vllm: {exc}")
        return 2
    for row in report["rows"]:
        d, g = row["direct"], row["streamsafe"]
        print(
            f"concurrency {row['concurrency']}: TTFT {d['ttft_ms']:.1f} ms direct, "
            f"{g['ttft_ms']:.1f} ms through streamsafe ({row['ttft_added_ms']:+.1f} ms); "
            f"{d['tokens_per_s']:.0f} vs {g['tokens_per_s']:.0f} tokens/s per stream "
            f"({row['tokens_per_s_ratio']:.3f}x)"
        )
    write_json(args.json, report)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "vllm", help="the gateway's cost in front of the real vLLM: TTFT and tokens/s, interleaved"
    )
    p.add_argument("--rounds", type=int, default=8, help="rounds, each path once (default 8)")
    p.add_argument("--concurrency", default="1,8", help="streams at once, comma-separated")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per stream (default 200)")
    add_output_flags(p)
    p.set_defaults(func=_main)
