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
import tempfile
import time
from collections.abc import Iterator
from typing import Any, cast

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


class _Reader(asyncio.Protocol):
    """One stream of the load generator: an asyncio protocol that counts SSE events as bytes
    arrive, with no HTTP or SSE parsing beyond finding the status and the completion id, so the
    load generator costs far less per chunk than the gateway it measures."""

    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request = request
        self.done = done
        self.head = b""
        self.in_body = False
        self.status = 0
        self.cid = b"?"
        self.prefix = b""  # body bytes kept until the completion id is seen
        self.last_nl = False
        self.arrivals: list[float] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = int(self.head[9:12])
            data = self.head[end + 4 :]
            self.in_body = True
        if self.cid == b"?" and len(self.prefix) < 65536:
            self.prefix += data
            self.cid = _completion_id(self.prefix) or b"?"
        # An event ends with a blank line ("\n\n"); chunked-encoding framing never makes one.
        n = data.count(b"\n\n") - data.count(b"keep-alive\n\n")
        if self.last_nl and data[:1] == b"\n":
            n += 1
        self.last_nl = data[-1:] == b"\n"
        if n > 0:
            self.arrivals.extend([now] * n)

    def eof_received(self) -> bool:
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _load(url: str, streams: int, chunks: int, tag: str) -> dict[str, Any]:
    """N concurrent streams of M chunks against ``url``; one connection each."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    loop = asyncio.get_running_loop()

    async def one(i: int) -> tuple[bytes, list[float]]:
        body = json.dumps(
            {
                "model": "sim-llama-8b",
                "messages": [{"role": "user", "content": f"{tag} stream {i}"}],
                "max_tokens": chunks,
                "stream": True,
            }
        ).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s:%d\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (host.encode(), port, len(body), body)
        )
        done: asyncio.Future[None] = loop.create_future()
        reader = _Reader(request, done)
        transport, _ = await loop.create_connection(lambda: reader, host, port)
        try:
            await done
        finally:
            transport.close()
        if reader.status != 200:
            raise RuntimeError(f"{tag}: status {reader.status}: {reader.prefix[:500]!r}")
        return reader.cid, reader.arrivals

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - t0
    return {"streams": [[cid.decode(), arr] for cid, arr in results], "wall_s": wall}


def _load_worker() -> None:
    """Entry of the load-generator process: argv is URL STREAMS CHUNKS TAG; prints JSON."""
    import resource

    url, streams, chunks, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    before = resource.getrusage(resource.RUSAGE_SELF)
    try:
        import uvloop

        report = uvloop.run(_load(url, streams, chunks, tag))
    except ImportError:  # pragma: no cover - platform without uvloop
        report = asyncio.run(_load(url, streams, chunks, tag))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report["cpu_s"] = (usage.ru_utime - before.ru_utime) + (usage.ru_stime - before.ru_stime)
    sys.stdout.write(json.dumps(report))


def _run_load(
    url: str, streams: int, chunks: int, tag: str, sample: Any = None
) -> tuple[list[tuple[bytes, list[float]]], dict[str, Any]]:
    """Run the load generator in its own process (so it never competes with the simulator or
    the gateway for a GIL) and return per-stream arrivals. ``sample`` is called every 50 ms
    while it runs."""
    code = "from streamsafe.bench.overhead import _load_worker; _load_worker()"
    cmd = [sys.executable, "-c", code, url, str(streams), str(chunks), tag]
    # The report goes through a file: a pipe would fill up while this process samples.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        while proc.poll() is None:
            if sample is not None:
                sample()
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"load generator failed ({tag}): {err.read().decode()[-2000:]}")
        report: dict[str, Any] = json.load(out)
    results = [(cid.encode(), arrivals) for cid, arrivals in report.pop("streams")]
    return results, report


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


def _cpu(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _phase(
    url: str, streams: int, chunks: int, tag: str, sim_proc: Any, gw_proc: Any = None
) -> dict[str, Any]:
    """One load against ``url``: arrivals, wall time, and the CPU each process spent on it."""
    rss_base = gw_proc.memory_info().rss if gw_proc is not None else 0
    peak = [rss_base]

    def sample() -> None:
        if gw_proc is not None:
            peak[0] = max(peak[0], gw_proc.memory_info().rss)

    sim0 = _cpu(sim_proc)
    gw0 = _cpu(gw_proc) if gw_proc is not None else 0.0
    results, load = _run_load(url, streams, chunks, tag, sample)
    return {
        "results": results,
        "chunks": sum(len(a) for _, a in results),
        "wall_s": load["wall_s"],
        "loadgen_cpu_s": load["cpu_s"],
        "sim_cpu_s": _cpu(sim_proc) - sim0,
        "gw_cpu_s": (_cpu(gw_proc) - gw0) if gw_proc is not None else 0.0,
        "rss_base": rss_base,
        "rss_peak": peak[0],
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def run(
    streams: int = 200, chunks: int = 500, itl_ms: float = 5.0, repeat: int = 1
) -> dict[str, Any]:
    """Run the benchmark and return the report. With ``repeat`` > 1 the direct and gateway loads
    alternate that many times and every figure is the median over the rounds."""
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
    me = psutil.Process()  # the simulator's process (the bench itself only waits and samples)
    rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with ServerThread(tap) as sim_server, _gateway_process(sim_server.url) as (gw_url, pid):
        gw = psutil.Process(pid)
        warm = min(streams, 8)
        _run_load(sim_server.url, warm, 8, "warmup-direct")
        _run_load(gw_url, warm, 8, "warmup")
        for r in range(max(1, repeat)):
            direct = _phase(sim_server.url, streams, chunks, f"direct{r}", me)
            via = _phase(gw_url, streams, chunks, f"gateway{r}", me, gw)
            rounds.append((direct, via))
        gw_stats = httpx2_get_json(gw_url + "/stats")
    ms = 1000.0
    per_round = []
    for direct, via in rounds:
        lat_d = _latencies(tap, direct["results"])
        lat_g = _latencies(tap, via["results"])
        n_d, n_g = max(direct["chunks"], 1), max(via["chunks"], 1)
        per_round.append(
            {
                "direct_p50": _pct(lat_d, 0.5) * ms,
                "direct_p99": _pct(lat_d, 0.99) * ms,
                "gw_p50": _pct(lat_g, 0.5) * ms,
                "gw_p99": _pct(lat_g, 0.99) * ms,
                "added_p50": (_pct(lat_g, 0.5) - _pct(lat_d, 0.5)) * ms,
                "added_p99": (_pct(lat_g, 0.99) - _pct(lat_d, 0.99)) * ms,
                "gw_us_per_chunk": via["gw_cpu_s"] / n_g * 1e6,
                "sim_us_per_chunk_direct": direct["sim_cpu_s"] / n_d * 1e6,
                "sim_us_per_chunk_via": via["sim_cpu_s"] / n_g * 1e6,
                "loadgen_us_per_chunk": via["loadgen_cpu_s"] / n_g * 1e6,
                "direct_wall": direct["wall_s"],
                "gw_wall": via["wall_s"],
                "mem_per_stream": (via["rss_peak"] - via["rss_base"]) / max(streams, 1),
            }
        )

    def med(key: str, digits: int = 3) -> float:
        return round(_median([r[key] for r in per_round]), digits)

    last_direct, last_via = rounds[-1]
    gw_us, sim_us = med("gw_us_per_chunk", 2), med("sim_us_per_chunk_via", 2)
    return {
        "bench": "overhead",
        "streams": streams,
        "chunks_per_stream": chunks,
        "itl_ms": itl_ms,
        "repeat": len(rounds),
        "cpus": os.cpu_count(),
        "direct": {
            "chunks": last_direct["chunks"],
            "wall_s": med("direct_wall"),
            "latency_ms_p50": med("direct_p50"),
            "latency_ms_p99": med("direct_p99"),
        },
        "gateway": {
            "chunks": last_via["chunks"],
            "wall_s": med("gw_wall"),
            "latency_ms_p50": med("gw_p50"),
            "latency_ms_p99": med("gw_p99"),
            "generations_started": gw_stats.get("generations_started"),
        },
        "added_latency_ms_p50": med("added_p50"),
        "added_latency_ms_p99": med("added_p99"),
        "gateway_cpu_s": round(last_via["gw_cpu_s"], 3),
        "gateway_cpu_s_per_100k_chunks": round(gw_us / 10, 3),
        "gateway_cpu_us_per_chunk": gw_us,
        "simulator_cpu_us_per_chunk": sim_us,
        "simulator_cpu_us_per_chunk_direct": med("sim_us_per_chunk_direct", 2),
        "gateway_vs_simulator_cpu": round(gw_us / sim_us, 3) if sim_us else None,
        "loadgen_cpu_us_per_chunk": med("loadgen_us_per_chunk", 2),
        # Wall time over the time the load needs at the set ITL: well above 1 means the box (not
        # the gateway alone) was saturated, and latencies then include queueing for a CPU.
        "direct_slowdown": round(med("direct_wall") / (chunks * itl_ms / 1000.0), 3),
        "gateway_slowdown": round(med("gw_wall") / (chunks * itl_ms / 1000.0), 3),
        "nominal_chunks_per_s": round(streams * 1000.0 / itl_ms) if itl_ms > 0 else None,
        "gateway_rss_base_bytes": last_via["rss_base"],
        "gateway_memory_per_live_stream_bytes": int(med("mem_per_stream", 0)),
    }


def httpx2_get_json(url: str) -> dict[str, Any]:
    """GET a JSON document (the gateway's /stats)."""
    import httpx2

    result: dict[str, Any] = httpx2.get(url, timeout=10).json()
    return result


def _print(report: dict[str, Any]) -> None:
    d, g = report["direct"], report["gateway"]
    rounds = f", median of {report['repeat']} rounds" if report["repeat"] > 1 else ""
    print(
        f"overhead: {report['streams']} streams x {report['chunks_per_stream']} chunks, "
        f"itl {report['itl_ms']:g} ms{rounds}\n"
        f"  latency per chunk  direct p50 {d['latency_ms_p50']:.2f} ms  p99 "
        f"{d['latency_ms_p99']:.2f} ms | via gateway p50 {g['latency_ms_p50']:.2f} ms  p99 "
        f"{g['latency_ms_p99']:.2f} ms\n"
        f"  added latency      p50 {report['added_latency_ms_p50']:.2f} ms  p99 "
        f"{report['added_latency_ms_p99']:.2f} ms\n"
        f"  gateway CPU        {report['gateway_cpu_s_per_100k_chunks']:.2f} s per 100,000 chunks "
        f"({report['gateway_cpu_us_per_chunk']:.1f} us/chunk; simulator "
        f"{report['simulator_cpu_us_per_chunk']:.1f} us/chunk, ratio "
        f"{report['gateway_vs_simulator_cpu']}; load generator "
        f"{report['loadgen_cpu_us_per_chunk']:.1f} us/chunk)\n"
        f"  gateway memory     {report['gateway_memory_per_live_stream_bytes'] / 1024:.1f} KiB "
        f"per live stream\n"
        f"  wall / ideal       direct {report['direct_slowdown']:.2f}x  via gateway "
        f"{report['gateway_slowdown']:.2f}x (above ~1.1x the box is saturated: latencies then "
        f"include waiting for a CPU)",
        flush=True,
    )


def _main(args: argparse.Namespace) -> int:
    report = run(streams=args.streams, chunks=args.chunks, itl_ms=args.itl_ms, repeat=args.repeat)
    _print(report)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def run_default(out_dir: str) -> int:
    """``streamsafe bench all`` entry: default sizes, JSON into ``out_dir``."""
    ns = argparse.Namespace(
        streams=200,
        chunks=500,
        itl_ms=5.0,
        repeat=3,
        json=os.path.join(out_dir, "bench-overhead.json"),
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
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="alternate direct and gateway loads this many times; report medians (default 3)",
    )
    p.add_argument("--json", help="also write the report to this JSON file")
    p.set_defaults(func=_main)
