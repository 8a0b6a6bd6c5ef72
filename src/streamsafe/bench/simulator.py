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
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["measure_level", "register", "run", "run_default"]

_PATTERN = b'"delta":{"content":"'


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
    p.add_argument("--out", default="reports", help="folder for simulator.json (reports)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    return run(
        out_dir=args.out,
        itl_ms=args.itl_ms,
        seconds=args.seconds,
        start=args.start,
        max_streams=args.max_streams,
        tolerance=args.tolerance,
    )


def run_default(out_dir: str) -> int:
    """The benchmark with its defaults (used by ``streamsafe bench all``)."""
    return run(out_dir=out_dir)


def _free_port() -> int:
    from streamsafe.serving import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    port: int = sock.getsockname()[1]
    sock.close()
    return port


@contextlib.contextmanager
def _simulator(port: int, itl_ms: float, max_tokens: int) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [
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
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        import httpx2

        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the simulator did not start")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


async def _stream(port: int, body: bytes) -> tuple[int, int, float, float]:
    """(tokens, tokens in the first read, time of first token, time of last token)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    writer.write(head + body)
    count = first_batch = 0
    first = last = 0.0
    keep = len(_PATTERN) - 1
    try:
        await reader.readuntil(b"\r\n\r\n")
        carry = b""
        while True:
            data = await reader.read(262144)
            if not data:
                break
            now = time.perf_counter()
            buf = carry + data
            k = buf.count(_PATTERN)
            if k:
                if not count:
                    first, first_batch = now, k
                count += k
                last = now
            if b"data: [DONE]" in buf:
                break
            carry = buf[-keep:]
    finally:
        writer.close()
    return count, first_batch, first, last


async def _level(port: int, streams: int, max_tokens: int) -> list[tuple[int, int, float, float]]:
    bodies = [
        json.dumps(
            {
                "model": "sim-llama-8b",
                "messages": [{"role": "user", "content": f"bench stream {i}"}],
                "max_tokens": max_tokens,
                "stream": True,
            }
        ).encode()
        for i in range(streams)
    ]
    return list(await asyncio.gather(*(_stream(port, b) for b in bodies)))


def measure_level(
    port: int, pid: int, streams: int, itl_ms: float, seconds: float
) -> dict[str, Any]:
    """Run ``streams`` concurrent streams of ``seconds`` each; return the level's figures."""
    max_tokens = max(10, round(seconds * 1000 / itl_ms))
    cpu0, load0, t0 = _cpu_seconds(pid), time.process_time(), time.perf_counter()
    results = asyncio.run(_level(port, streams, max_tokens))
    wall = time.perf_counter() - t0
    cpu1, load1 = _cpu_seconds(pid), time.process_time()
    ratios = []
    tokens = 0
    sustained = 0.0  # sum of per-stream rates: the rate while all streams are in flight
    for count, first_batch, first, last in results:
        tokens += count
        if count - first_batch >= 1 and last > first:
            interval = (last - first) / (count - first_batch)
            ratios.append(interval * 1000 / itl_ms)
            sustained += 1 / interval
    complete = sum(1 for r in results if r[0] == max_tokens)
    first_t = min(r[2] for r in results if r[0])
    last_t = max(r[3] for r in results if r[0])
    ratios.sort()
    return {
        "streams": streams,
        "max_tokens": max_tokens,
        "complete_streams": complete,
        "configured_tokens_per_s": round(streams * 1000 / itl_ms, 1),
        "measured_tokens_per_s": round(sustained, 1),
        "aggregate_tokens_per_s": round(tokens / max(1e-9, last_t - first_t), 1),
        "itl_ratio_mean": round(statistics.fmean(ratios), 4) if ratios else None,
        "itl_ratio_p90": round(ratios[int(0.9 * (len(ratios) - 1))], 4) if ratios else None,
        "itl_ratio_max": round(ratios[-1], 4) if ratios else None,
        "simulator_cpu_pct": (
            round(100 * (cpu1 - cpu0) / wall, 1) if cpu0 is not None and cpu1 is not None else None
        ),
        "load_cpu_pct": round(100 * (load1 - load0) / wall, 1),
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
    out_dir: str = "reports",
    *,
    itl_ms: float = 10.0,
    seconds: float = 2.0,
    start: int = 50,
    max_streams: int = 6400,
    tolerance: float = 0.10,
) -> int:
    """Sweep the number of streams; print and write ``simulator.json``; 0 on success."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - the load still runs on asyncio
        pass
    port = _free_port()
    levels: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    max_tokens = max(10, round(seconds * 1000 / itl_ms))
    with _simulator(port, itl_ms, max_tokens) as proc:
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
    report = {
        "bench": "simulator",
        "itl_ms": itl_ms,
        "tolerance": tolerance,
        "cpus": os.cpu_count(),
        "levels": levels,
        "max_sustained_tokens_per_s": best["measured_tokens_per_s"] if best else None,
        "max_sustained_streams": best["streams"] if best else None,
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(out_dir) / "simulator.json"
    path.write_text(json.dumps(report, indent=2))
    if best:
        print(
            f"max sustained: {best['measured_tokens_per_s']:.0f} streamed tokens/s "
            f"({best['streams']} streams at {itl_ms} ms) within {tolerance:.0%}; report {path}"
        )
    else:
        print(f"no level stayed within {tolerance:.0%}; report {path}")
    return 0
