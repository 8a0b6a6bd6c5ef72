"""``streamsafe bench overhead``: what the gateway costs per chunk, per CPU second, per stream.

One run, one simulator, the same load twice: N concurrent streams of M chunks straight to the
simulator, then the same through the gateway. The gateway runs in its own process (as in
production), so its CPU time and memory are its own and it does not share the GIL with the load.

- Added latency per chunk: a thin ASGI wrapper around the simulator notes when each chunk leaves
  it; the client notes when the chunk arrives. (arrival - departure) is compared, p50 and p99,
  direct vs through the gateway.
- Gateway CPU seconds per 100,000 chunks: the gateway process's user+system time over the run.
- Gateway memory per live stream: resident memory while all N streams are live, minus the
  resident memory before, divided by N. It includes each stream's event log so far (the price of
  replay and resume), so it grows with the chunks a stream has produced.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["register", "run", "run_default"]


class _Tap:
    """ASGI wrapper noting when each SSE chunk of each completion leaves the app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: dict[bytes, list[float]] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/completions"):
            await self.app(scope, receive, send)
            return
        times: list[float] | None = None

        async def tapped(message: Any) -> None:
            nonlocal times
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                if body:
                    now = time.perf_counter()
                    if times is None:
                        times = self.sent.setdefault(_completion_id(body) or b"?", [])
                    times.extend([now] * body.count(b"data: "))
            await send(message)

        await self.app(scope, receive, tapped)


def _completion_id(body: bytes) -> bytes | None:
    start = body.find(b'"id":"')
    if start < 0:
        return None
    start += 6
    return body[start : body.index(b'"', start)]


async def _stream_load(
    url: str, streams: int, chunks: int, tag: str
) -> tuple[list[tuple[bytes, list[float]]], float]:
    import httpx2

    from streamsafe.sse import SSEDecoder

    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=streams)
    timeout = httpx2.Timeout(connect=30.0, read=120.0, write=30.0, pool=None)
    async with httpx2.AsyncClient(limits=limits, timeout=timeout) as client:

        async def one(i: int) -> tuple[bytes, list[float]]:
            body = {
                "model": "sim-llama-8b",
                "messages": [{"role": "user", "content": f"{tag} stream {i}"}],
                "max_tokens": chunks,
                "stream": True,
            }
            decoder = SSEDecoder()
            arrivals: list[float] = []
            cid = b"?"
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{tag}: status {r.status_code}: {await r.aread()!r}")
                async for raw in r.aiter_raw():
                    events = decoder.feed(raw)
                    if events:
                        now = time.perf_counter()
                        if cid == b"?":
                            cid = _completion_id(events[0].raw) or b"?"
                        arrivals.extend([now] * len(events))
            return cid, arrivals

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(streams)))
        return list(results), time.perf_counter() - t0


def _latencies(tap: _Tap, results: list[tuple[bytes, list[float]]]) -> list[float]:
    out: list[float] = []
    for cid, arrivals in results:
        sent = tap.sent.get(cid, [])
        # The gateway may end a Llama Stack alias without [DONE]; pair what both sides saw.
        out.extend(a - s for s, a in zip(sent, arrivals, strict=False))
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def _gateway_process(upstream: str) -> Iterator[tuple[str, int]]:
    import httpx2

    from streamsafe.serving import bind_socket

    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    cmd = [
        sys.executable,
        "-m",
        "streamsafe.cli",
        "serve",
        "--upstream",
        upstream,
        "--port",
        str(port),
        "--max-inflight",
        "0",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx2.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"gateway did not start: {err[-2000:]}")
            time.sleep(0.05)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(streams: int = 200, chunks: int = 500, itl_ms: float = 5.0) -> dict[str, Any]:
    """Run the benchmark and return the report."""
    import psutil  # type: ignore[import-untyped]

    from streamsafe.engine_sim import SimConfig, Simulator
    from streamsafe.serving import ServerThread

    sim = Simulator(
        SimConfig(
            memory_tokens=max(1_000_000, streams * (chunks + 64) * 2),
            max_num_seqs=max(streams, 1),
            itl_ms=itl_ms,
            itl_ms_per_seq=0.0,
            prefill_ms_per_token=0.0,
            default_max_tokens=chunks,
        )
    )
    tap = _Tap(sim)
    with ServerThread(tap) as sim_server:
        direct, direct_wall = asyncio.run(_stream_load(sim_server.url, streams, chunks, "direct"))
        with _gateway_process(sim_server.url) as (gw_url, pid):
            gw = psutil.Process(pid)
            asyncio.run(_stream_load(gw_url, min(streams, 8), 8, "warmup"))
            rss_base = gw.memory_info().rss
            cpu0 = gw.cpu_times()
            peak = [rss_base]

            async def sampled() -> tuple[list[tuple[bytes, list[float]]], float]:
                task = asyncio.ensure_future(_stream_load(gw_url, streams, chunks, "gateway"))
                while not task.done():
                    peak[0] = max(peak[0], gw.memory_info().rss)
                    await asyncio.sleep(0.05)
                return await task

            via, via_wall = asyncio.run(sampled())
            cpu1 = gw.cpu_times()
            gw_stats = httpx2_get_json(gw_url + "/stats")
    lat_direct = _latencies(tap, direct)
    lat_gw = _latencies(tap, via)
    chunks_via = sum(len(a) for _, a in via)
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    ms = 1000.0
    return {
        "bench": "overhead",
        "streams": streams,
        "chunks_per_stream": chunks,
        "itl_ms": itl_ms,
        "cpus": os.cpu_count(),
        "direct": {
            "chunks": sum(len(a) for _, a in direct),
            "wall_s": round(direct_wall, 3),
            "latency_ms_p50": round(_pct(lat_direct, 0.5) * ms, 3),
            "latency_ms_p99": round(_pct(lat_direct, 0.99) * ms, 3),
        },
        "gateway": {
            "chunks": chunks_via,
            "wall_s": round(via_wall, 3),
            "latency_ms_p50": round(_pct(lat_gw, 0.5) * ms, 3),
            "latency_ms_p99": round(_pct(lat_gw, 0.99) * ms, 3),
            "generations_started": gw_stats.get("generations_started"),
        },
        "added_latency_ms_p50": round((_pct(lat_gw, 0.5) - _pct(lat_direct, 0.5)) * ms, 3),
        "added_latency_ms_p99": round((_pct(lat_gw, 0.99) - _pct(lat_direct, 0.99)) * ms, 3),
        "gateway_cpu_s": round(cpu, 3),
        "gateway_cpu_s_per_100k_chunks": round(cpu / max(chunks_via, 1) * 100_000, 3),
        "gateway_rss_base_bytes": rss_base,
        "gateway_memory_per_live_stream_bytes": int((peak[0] - rss_base) / max(streams, 1)),
    }


def httpx2_get_json(url: str) -> dict[str, Any]:
    """GET a JSON document (the gateway's /stats)."""
    import httpx2

    result: dict[str, Any] = httpx2.get(url, timeout=10).json()
    return result


def _print(report: dict[str, Any]) -> None:
    d, g = report["direct"], report["gateway"]
    print(
        f"overhead: {report['streams']} streams x {report['chunks_per_stream']} chunks\n"
        f"  latency per chunk  direct p50 {d['latency_ms_p50']:.2f} ms  p99 "
        f"{d['latency_ms_p99']:.2f} ms | via gateway p50 {g['latency_ms_p50']:.2f} ms  p99 "
        f"{g['latency_ms_p99']:.2f} ms\n"
        f"  added latency      p50 {report['added_latency_ms_p50']:.2f} ms  p99 "
        f"{report['added_latency_ms_p99']:.2f} ms\n"
        f"  gateway CPU        {report['gateway_cpu_s_per_100k_chunks']:.2f} s per 100,000 chunks\n"
        f"  gateway memory     {report['gateway_memory_per_live_stream_bytes'] / 1024:.1f} KiB "
        f"per live stream",
        flush=True,
    )


def _main(args: argparse.Namespace) -> int:
    report = run(streams=args.streams, chunks=args.chunks, itl_ms=args.itl_ms)
    _print(report)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def run_default(out_dir: str) -> int:
    """``streamsafe bench all`` entry: default sizes, JSON into ``out_dir``."""
    ns = argparse.Namespace(
        streams=200, chunks=500, itl_ms=5.0, json=os.path.join(out_dir, "bench-overhead.json")
    )
    return _main(ns)


def register(subparsers: Any) -> None:
    """Add ``bench overhead``."""
    p = subparsers.add_parser(
        "overhead", help="gateway cost: added latency per chunk, CPU per chunk, memory per stream"
    )
    p.add_argument("--streams", type=int, default=200, help="concurrent streams (default 200)")
    p.add_argument("--chunks", type=int, default=500, help="chunks per stream (default 500)")
    p.add_argument("--itl-ms", type=float, default=5.0, help="simulator ms per token (default 5)")
    p.add_argument("--json", help="also write the report to this JSON file")
    p.set_defaults(func=_main)
