"""``streamsafe bench simulator``: where the simulator, not the system under test, becomes the
limit.

One simulator process (``streamsafe simulate``, with uvloop, as benchmarks run it) serves N
concurrent chat streams; a load process reads them over raw sockets (counting token events with
``bytes.count``, so the reader costs far less than the server). For each N we compare each
stream's observed inter-token interval, first token to last, with the configured one
(``itl_ms``, with ``itl_ms_per_seq = 0`` so the configured value does not move with N). N doubles
until the mean interval is more than ``tolerance`` (10 %) above configured; the answer is the
highest streamed tokens/s seen while within it.

The simulator and the load share this machine's cores, so the figure is a floor for the
simulator alone, and it moves with whatever else runs; it is a ceiling for benchmark configs, not
a performance claim.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from streamsafe_bench.report import add_output_flags, write_json
from streamsafe_bench.stats import percentile

__all__ = ["measure_level", "register", "run"]


def register(subparsers: Any) -> None:
    """Add ``bench simulator``."""
    p = subparsers.add_parser(
        "simulator", help="highest streamed tokens/s one simulator sustains at its configured ITL"
    )
    p.add_argument("--itl-ms", type=float, default=10.0, help="configured ITL (default 10)")
    p.add_argument("--seconds", type=float, default=2.0, help="length of each stream (2)")
    p.add_argument("--start", type=int, default=50, help="first number of streams (50)")
    p.add_argument("--max-streams", type=int, default=6400, help="stop doubling here (6400)")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed ITL excess (0.10)")
    add_output_flags(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    report = run(
        itl_ms=args.itl_ms,
        seconds=args.seconds,
        start=args.start,
        max_streams=args.max_streams,
        tolerance=args.tolerance,
    )
    write_json(args.json, report)
    return 0


def _simulator_command(port: int, itl_ms: float, max_tokens: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamsafe.cli",
        "simulate",
        "--port",
        str(port),
        "--itl-ms",
        str(itl_ms),
        "--itl-ms-per-seq",
        "0",
        "--prefill-ms-per-token",
        "0",
        "--max-num-seqs",
        "1000000",
        "--memory-tokens",
        str(10**12),
        "--default-max-tokens",
        str(max_tokens),
    ]


def measure_level(
    port: int, pid: int, streams: int, itl_ms: float, seconds: float
) -> dict[str, Any]:
    """Run ``streams`` concurrent streams of ``seconds`` each; return the level's figures."""
    from streamsafe_bench.load import TOKEN, run_load
    from streamsafe_bench.processes import cpu_seconds

    max_tokens = max(10, round(seconds * 1000 / itl_ms))
    cpu0 = cpu_seconds([pid])
    load = run_load(f"http://127.0.0.1:{port}", streams, max_tokens, f"n{streams}", marker=TOKEN)
    cpu = cpu_seconds([pid]) - cpu0
    wall = load.wall_s
    ratios = []
    tokens = 0
    sustained = 0.0  # sum of per-stream rates: the rate while all streams are in flight
    for s in load.streams:
        count = len(s.arrivals)
        tokens += count
        if count < 2:
            continue
        first, last = s.arrivals[0], s.arrivals[-1]
        first_batch = s.arrivals.count(first)  # tokens that came in the first read
        if count - first_batch >= 1 and last > first:
            interval = (last - first) / (count - first_batch)
            ratios.append(interval * 1000 / itl_ms)
            sustained += 1 / interval
    arrived = [s.arrivals for s in load.streams if s.arrivals]
    complete = sum(1 for s in load.streams if len(s.arrivals) == max_tokens)
    first_t = min(a[0] for a in arrived)
    last_t = max(a[-1] for a in arrived)
    ratios.sort()
    return {
        "streams": streams,
        "max_tokens": max_tokens,
        "complete_streams": complete,
        "configured_tokens_per_s": round(streams * 1000 / itl_ms, 1),
        "measured_tokens_per_s": round(sustained, 1),
        "aggregate_tokens_per_s": round(tokens / max(1e-9, last_t - first_t), 1),
        "itl_ratio_mean": round(statistics.fmean(ratios), 4) if ratios else None,
        "itl_ratio_p90": round(percentile(ratios, 0.9) or 0, 4) if ratios else None,
        "itl_ratio_max": round(ratios[-1], 4) if ratios else None,
        "simulator_cpu_pct": round(100 * cpu / wall, 1),
        "load_cpu_pct": round(100 * load.cpu_s / wall, 1),
        "wall_s": round(wall, 2),
    }


def _check(
    port: int, pid: int, streams: int, itl_ms: float, seconds: float, tolerance: float
) -> dict[str, Any]:
    level = measure_level(port, pid, streams, itl_ms, seconds)
    ok = (
        level["itl_ratio_mean"] is not None
        and level["itl_ratio_mean"] <= 1 + tolerance
        and level["complete_streams"] == streams
    )
    level["within_tolerance"] = ok
    print(
        f"streams {streams:5d}: {level['measured_tokens_per_s']:9.0f} tok/s "
        f"(configured {level['configured_tokens_per_s']:9.0f}), ITL ratio mean "
        f"{level['itl_ratio_mean']} p90 {level['itl_ratio_p90']}, CPU simulator "
        f"{level['simulator_cpu_pct']} % load {level['load_cpu_pct']} %"
        + ("" if ok else "  <- past tolerance"),
        flush=True,
    )
    return level


def run(
    *,
    itl_ms: float = 10.0,
    seconds: float = 2.0,
    start: int = 50,
    max_streams: int = 6400,
    tolerance: float = 0.10,
) -> dict[str, Any]:
    """Sweep the number of streams; print each level and return the report."""
    from streamsafe_bench.processes import free_port, http_ok, launched

    port = free_port()
    levels: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    max_tokens = max(10, round(seconds * 1000 / itl_ms))
    cmd = _simulator_command(port, itl_ms, max_tokens)
    ready = http_ok(f"http://127.0.0.1:{port}/health")
    with launched(cmd, name="simulator", ready=ready) as proc:
        measure_level(port, proc.pid, 10, itl_ms, 0.2)  # warm-up: imports, first connections
        streams, failed = start, None
        while streams <= max_streams:
            level = _check(port, proc.pid, streams, itl_ms, seconds, tolerance)
            levels.append(level)
            if not level["within_tolerance"]:
                failed = streams
                break
            best = level
            streams *= 2
        # Two bisection steps between the last level within tolerance and the first past it.
        low = best["streams"] if best else 0
        for _ in range(2 if failed else 0):
            mid = (low + failed) // 2 if failed else 0
            if mid <= low or failed is None:
                break
            level = _check(port, proc.pid, mid, itl_ms, seconds, tolerance)
            levels.append(level)
            if level["within_tolerance"]:
                best, low = level, mid
            else:
                failed = mid
    if best:
        print(
            f"max sustained: {best['measured_tokens_per_s']:.0f} streamed tokens/s "
            f"({best['streams']} streams at {itl_ms} ms) within {tolerance:.0%}"
        )
    else:
        print(f"no level stayed within {tolerance:.0%}")
    return {
        "bench": "simulator",
        "itl_ms": itl_ms,
        "tolerance": tolerance,
        "cpus": os.cpu_count(),
        "levels": levels,
        "max_sustained_tokens_per_s": best["measured_tokens_per_s"] if best else None,
        "max_sustained_streams": best["streams"] if best else None,
    }
