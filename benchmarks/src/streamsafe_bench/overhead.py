"""``streamsafe bench overhead``: what the gateway costs per chunk, per CPU second, per stream.

One run, one simulator, the same load twice: N concurrent streams of M chunks straight to the
simulator, then the same through the gateway. The gateway runs in its own process (as in
production), so its CPU time and memory are its own and it does not share the GIL with the load.

- Added latency per chunk: a thin ASGI wrapper around the simulator notes when each chunk leaves
  it; the client notes when the chunk arrives. What the gateway added to a chunk is its
  (arrival - departure) through the gateway less the direct run's median: its p50 and p99 are
  percentiles of that added latency (a difference of the two runs' p99s, as reported before,
  could be smaller than the difference of their p50s).
- Gateway CPU seconds per 100,000 chunks: the gateway process's user+system time over the run.
- Gateway memory per live stream: resident memory while all N streams are live, minus the
  resident memory before, divided by N. It includes each stream's event log so far (the price of
  replay and resume), so it grows with the chunks a stream has produced.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from streamsafe_bench.report import add_output_flags, write_json

if TYPE_CHECKING:
    from streamsafe_bench.measure import Phase
    from streamsafe_bench.tap import Tap

__all__ = ["register", "run"]


def run(
    streams: int = 200, chunks: int = 500, itl_ms: float = 5.0, repeat: int = 1
) -> dict[str, Any]:
    """Run the benchmark and return the report. With ``repeat`` > 1 the direct and gateway loads
    alternate that many times and every figure is the median over the rounds."""
    import httpx2

    from streamsafe.engine_sim import SimConfig, Simulator
    from streamsafe.server import ServerThread
    from streamsafe_bench.load import run_load
    from streamsafe_bench.measure import measure_phase
    from streamsafe_bench.peer_servers import start_peer
    from streamsafe_bench.tap import Tap

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
    tap = Tap(sim)
    me = [os.getpid()]  # the simulator's process (the bench itself only waits and samples)
    rounds: list[tuple[Phase, Phase]] = []
    with (
        ServerThread(tap) as sim_server,
        start_peer("streamsafe", [sim_server.url], litellm_python="") as gw,
    ):
        warm = min(streams, 8)
        run_load(sim_server.url, warm, 8, "warmup-direct")
        run_load(gw.url, warm, 8, "warmup")
        for r in range(max(1, repeat)):
            direct = measure_phase(
                sim_server.url, tap, streams, chunks, f"direct{r}", upstream_pids=me
            )
            via = measure_phase(
                gw.url, tap, streams, chunks, f"gateway{r}", server_pid=gw.pid, upstream_pids=me
            )
            rounds.append((direct, via))
        gw_stats: dict[str, Any] = httpx2.get(gw.url + "/stats", timeout=10).json()

    per_round = [_round_figures(direct, via, tap) for direct, via in rounds]
    return _report(streams, chunks, itl_ms, rounds, per_round, gw_stats)


def _round_figures(direct: Phase, via: Phase, tap: Tap) -> dict[str, float]:
    """One round's figures: latencies direct and through the gateway (ms), CPU per chunk (µs),
    walls and memory per stream."""
    from streamsafe_bench.stats import median, percentile

    def pct(values: list[float], q: float) -> float:
        return (percentile(values, q) or 0.0) * 1000.0

    lat_d, lat_g = direct.latencies(tap), via.latencies(tap)
    n_d, n_g = max(direct.events_received, 1), max(via.events_received, 1)
    base = median(lat_d) or 0.0
    added = [x - base for x in lat_g]
    return {
        "direct_p50": pct(lat_d, 0.5),
        "direct_p99": pct(lat_d, 0.99),
        "gw_p50": pct(lat_g, 0.5),
        "gw_p99": pct(lat_g, 0.99),
        "added_p50": pct(added, 0.5),
        "added_p99": pct(added, 0.99),
        "gw_us_per_chunk": via.server_cpu_s / n_g * 1e6,
        "sim_us_per_chunk_direct": direct.upstream_cpu_s / n_d * 1e6,
        "sim_us_per_chunk_via": via.upstream_cpu_s / n_g * 1e6,
        "loadgen_us_per_chunk": via.loadgen_cpu_s / n_g * 1e6,
        "direct_wall": direct.wall_s,
        "gw_wall": via.wall_s,
        "mem_per_stream": via.rss_per_stream(),
    }


def _report(
    streams: int,
    chunks: int,
    itl_ms: float,
    rounds: list[tuple[Phase, Phase]],
    per_round: list[dict[str, float]],
    gw_stats: dict[str, Any],
) -> dict[str, Any]:
    """The report: each figure the median over the rounds (counts from the last one)."""
    from streamsafe_bench.stats import median

    def med(key: str, digits: int = 3) -> float:
        return round(median([r[key] for r in per_round]) or 0.0, digits)

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
            "chunks": last_direct.events_received,
            "wall_s": med("direct_wall"),
            "latency_ms_p50": med("direct_p50"),
            "latency_ms_p99": med("direct_p99"),
        },
        "gateway": {
            "chunks": last_via.events_received,
            "wall_s": med("gw_wall"),
            "latency_ms_p50": med("gw_p50"),
            "latency_ms_p99": med("gw_p99"),
            "generations_started": gw_stats.get("generations_started"),
        },
        "added_latency_ms_p50": med("added_p50"),
        "added_latency_ms_p99": med("added_p99"),
        "gateway_cpu_s": round(last_via.server_cpu_s, 3),
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
        "gateway_rss_base_bytes": last_via.rss_base,
        "gateway_memory_per_live_stream_bytes": int(med("mem_per_stream", 0)),
    }


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
    write_json(args.json, report)
    return 0


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
    add_output_flags(p)
    p.set_defaults(func=_main)
