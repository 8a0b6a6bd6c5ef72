"""``streamsafe bench vllm``: what the gateway costs in front of the real vLLM.

The same greedy streams (the same prompts) go straight to vLLM 0.32 (CPU, the tiny model) and
through the gateway (``streamsafe serve --upstream``, default flags, its own process),
interleaved: each round runs both paths, in alternating order (the second path of a round finds
its prompts in vLLM's prefix cache, so the order turns), at each concurrency (at least 8
streams a path, in batches of that many at once), so both see the same machine. The rounds go
on until the 95 % interval of the tokens/s ratio (the median of the rounds' ratios,
bootstrapped) lies within ``tolerance`` of it at every concurrency, or until ``max_rounds``,
when the report says it could not. Per stream:
time to first token (request sent to first content chunk) and tokens per second (its tokens over
the time from the request to its last token: a rate from the first to the last token alone
jumps to thousands whenever the reading process is descheduled and finds a burst). Reported:
medians per path and concurrency; the gateway's as a ratio of the direct path's, round by round
(their median, lowest, highest and interval). The tiny
model generates far faster than a real one, which makes any added cost per chunk easier to see,
not harder.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from streamsafe_bench.processes import ServerProcess
from streamsafe_bench.report import add_output_flags, write_json
from streamsafe_bench.stats import interval, median, spread

__all__ = ["VLLMCostSettings", "register", "run"]


@dataclass(frozen=True)
class VLLMCostSettings:
    """Rounds (at least ``rounds``, at most ``max_rounds``, until the ratio's interval is within
    ``tolerance`` of it), concurrencies and tokens per stream."""

    rounds: int = 6
    concurrency: tuple[int, ...] = (1, 8)
    max_tokens: int = 200
    max_rounds: int = 24
    tolerance: float = 0.05


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
    from streamsafe_bench.vllm_engine import VLLMEngine

    samples: dict[tuple[str, int], list[_Stream]] = {}
    ratios: dict[int, list[float]] = {c: [] for c in s.concurrency}
    prompts = (f"cost {i}" for i in itertools.count())
    rounds = 0
    with VLLMEngine() as engine, _paths(engine.url) as paths:
        names = list(paths)
        while rounds < s.max_rounds and not (
            rounds >= s.rounds and all(_settled(r, s.tolerance) for r in ratios.values())
        ):
            for c in s.concurrency:
                # At least 8 streams per path and round, in batches of c at once: the same
                # prompts on both paths.
                batches = [[next(prompts) for _ in range(c)] for _ in range(max(1, 8 // c))]
                got: dict[str, list[_Stream]] = {}
                for name in names if rounds % 2 == 0 else names[::-1]:
                    for batch in batches:
                        with ThreadPoolExecutor(c) as pool:
                            got.setdefault(name, []).extend(
                                pool.map(
                                    lambda p, u=paths[name]: _one(u, engine.model, p, s.max_tokens),
                                    batch,
                                )
                            )
                for name, streams in got.items():
                    samples.setdefault((name, c), []).extend(streams)
                direct, through = _rate(got["direct"]), _rate(got["streamsafe"])
                ratios[c].append(through / direct if direct else 0.0)
            rounds += 1
        startup = engine.startup_s
    rows = [_row(c, samples, ratios[c], s.tolerance) for c in s.concurrency]
    settled = all(row["settled"] for row in rows)
    return {
        "settings": s.__dict__,
        "rounds": rounds,
        "settled": settled,
        "vllm_startup_s": startup,
        "rows": rows,
    }


def _rate(streams: list[_Stream]) -> float:
    return median([x.tokens_per_s for x in streams]) or 0.0


def _settled(ratios: list[float], tolerance: float) -> bool:
    """Whether the interval of the ratios' median lies within ``tolerance`` of it."""
    bounds = interval(ratios, random.Random(0))
    mid = median(ratios)
    if bounds is None or not mid:
        return False
    return bounds[0] >= mid * (1 - tolerance) and bounds[1] <= mid * (1 + tolerance)


def _row(
    c: int, samples: dict[tuple[str, int], list[_Stream]], ratios: list[float], tolerance: float
) -> dict[str, Any]:
    direct = _summary(samples[("direct", c)])
    through = _summary(samples[("streamsafe", c)])
    bounds = interval(ratios, random.Random(0))
    low_high = spread(ratios)
    return {
        "concurrency": c,
        "direct": direct,
        "streamsafe": through,
        "ttft_added_ms": round((through["ttft_ms"] - direct["ttft_ms"]), 2),
        "tokens_per_s_ratio": round(median(ratios) or 0.0, 3),
        "ratio_rounds": [round(r, 3) for r in ratios],
        "ratio_spread": None if low_high is None else [round(x, 3) for x in low_high],
        "ratio_interval": None if bounds is None else [round(x, 3) for x in bounds],
        "settled": _settled(ratios, tolerance),
    }


def _summary(streams: list[_Stream]) -> dict[str, Any]:
    ttft = median([x.ttft_s for x in streams]) or 0.0
    rate = median([x.tokens_per_s for x in streams]) or 0.0
    return {
        "streams": len(streams),
        "ttft_ms": round(ttft * 1e3, 2),
        "tokens_per_s": round(rate, 1),
    }


def _main(args: argparse.Namespace) -> int:
    from streamsafe_bench.vllm_engine import VLLMUnavailable

    conc = tuple(int(x) for x in args.concurrency.split(","))
    settings = VLLMCostSettings(
        args.rounds, conc, args.max_tokens, max(args.rounds, args.max_rounds), args.tolerance
    )
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
            f"{d['tokens_per_s']:.0f} vs {g['tokens_per_s']:.0f} tokens/s per stream; "
            f"ratio {row['tokens_per_s_ratio']:.3f}x over {len(row['ratio_rounds'])} rounds"
            + _bounds(" (rounds %.3f-%.3f", row["ratio_spread"])
            + _bounds(", 95 %% interval %.3f-%.3f)", row["ratio_interval"])
        )
    if not report["settled"]:
        print(
            f"bench vllm: the ratio's interval did not come within {settings.tolerance:.0%} of it "
            f"in {report['rounds']} rounds: this machine is too noisy for a closer figure"
        )
    write_json(args.json, report)
    return 0


def _bounds(form: str, bounds: list[float] | None) -> str:
    return "" if bounds is None else form % tuple(bounds)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "vllm", help="the gateway's cost in front of the real vLLM: TTFT and tokens/s, interleaved"
    )
    p.add_argument(
        "--rounds", type=int, default=6, help="rounds at least, each path once (default 6)"
    )
    p.add_argument(
        "--max-rounds",
        type=int,
        default=24,
        help="rounds at most, while the ratio's 95%% interval is wider than --tolerance (24)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="how close to the ratio its 95%% interval must lie, each way (default 0.05: 5%%)",
    )
    p.add_argument("--concurrency", default="1,8", help="streams at once, comma-separated")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per stream (default 200)")
    add_output_flags(p)
    p.set_defaults(func=_main)
