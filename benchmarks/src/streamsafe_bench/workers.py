"""``streamsafe bench workers``: the gateway's throughput at saturation with 1 and N worker
processes (``streamsafe serve --workers N``), and its CPU per chunk.

One simulator process with no inter-token delay to speak of (``--itl-ms``, default 1) and room
for every stream, so that the engine answers as fast as the gateway relays: each load of S
concurrent streams of C chunks runs through a gateway of each worker count in turn (rounds
interleaved, medians reported). The load generator is its own process
(:mod:`streamsafe_bench.load`). Reported per worker count: chunks/s and streams/s over the
load's wall time, the gateway's CPU per chunk (its whole process tree: the supervisor, the
workers and, above one worker, the ``redis-server`` they share, whose share is also given
alone), and the simulator's CPU per chunk, the peer in the same run.

The machine's cores are shared by the simulator, the load generator, the gateway's processes
and whatever else runs: with as many workers as cores the figures say what the workers gain on
this machine, not what they would on one of their own.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from streamsafe_bench.report import add_output_flags, write_json

__all__ = ["register", "run"]


def _gateway(sim_url: str, workers: int, redis: str | None) -> Any:
    """``streamsafe serve --workers N`` in front of ``sim_url`` (``--redis``, where given),
    every worker ready."""
    import httpx2

    from streamsafe_bench.processes import ServerProcess

    shared = ("--redis", redis) if redis else ()
    proc = ServerProcess("serve", "--upstream", sim_url, "--workers", str(workers), *shared)
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    with httpx2.Client(timeout=10) as client:
        while time.monotonic() < deadline:  # a worker still starting answers nothing yet
            seen.add(client.get(proc.url + "/stats", headers={"connection": "close"}).json()["pid"])
            if len(seen) == workers:
                return proc
    proc.stop()
    raise RuntimeError(f"{len(seen)} of {workers} workers answered")


def _redis_pids(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "redis-server":
                    found.append(pid)
        except OSError:
            continue
    return found


def _phase(
    url: str,
    pid: int,
    redis_pids: list[int],
    sim_pids: list[int],
    streams: int,
    chunks: int,
    tag: str,
) -> Any:
    """One load of ``streams`` x ``chunks``; its figures. The gateway is ``pid``'s process tree
    and ``redis_pids`` (a ``redis-server`` it was given)."""
    from streamsafe_bench.load import run_load
    from streamsafe_bench.processes import cpu_seconds, process_tree

    pids = process_tree(pid) + redis_pids
    redis = _redis_pids(pids)
    cpu0, redis0, sim0 = cpu_seconds(pids), cpu_seconds(redis), cpu_seconds(sim_pids)
    load = run_load(url, streams, chunks, tag)
    chunks_got = max(load.events, 1)
    cpu = cpu_seconds(pids) - cpu0
    return {
        "wall_s": load.wall_s,
        "chunks": load.events,
        "streams_ok": sum(1 for s in load.streams if s.complete and s.status == 200),
        "chunks_per_s": load.events / load.wall_s,
        "streams_per_s": streams / load.wall_s,
        "gateway_cpu_us_per_chunk": cpu / chunks_got * 1e6,
        "redis_cpu_us_per_chunk": (cpu_seconds(redis) - redis0) / chunks_got * 1e6,
        "simulator_cpu_us_per_chunk": (cpu_seconds(sim_pids) - sim0) / chunks_got * 1e6,
        "gateway_cpu_cores": cpu / load.wall_s,
    }


def parse_case(text: str) -> tuple[int, bool]:
    """A case of ``--workers``: ``N`` workers, or ``N+redis`` (given a ``redis-server`` of the
    bench's own with ``--redis``: one worker as a replica, what the workers' state costs alone)."""
    count, plus, what = text.strip().partition("+")
    if (plus and what != "redis") or not count.isdigit() or int(count) < 1:
        raise ValueError(f"a case is N or N+redis, not {text!r}")
    return int(count), bool(plus)


def _cases(rounds: dict[tuple[int, bool], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each case (its workers, and how they share their generations) with the median of every
    figure over its rounds, and its throughput against the first case's."""
    from streamsafe_bench.stats import median

    cases = []
    for (n, own), phases in rounds.items():
        shared = "--redis" if own else ("own" if n > 1 else None)
        case: dict[str, Any] = {"workers": n, "redis": shared}
        for key in phases[0]:
            value = median([p[key] for p in phases]) or 0.0
            case[key] = round(value, 2) if isinstance(value, float) else value
        cases.append(case)
    base = cases[0]["chunks_per_s"] or 1.0
    for case in cases:
        case["throughput_vs_first"] = round(case["chunks_per_s"] / base, 3)
    return cases


def run(
    workers: tuple[tuple[int, bool], ...] = ((1, False), (1, True), (2, False)),
    streams: int = 200,
    chunks: int = 500,
    itl_ms: float = 1.0,
    repeat: int = 1,
) -> dict[str, Any]:
    """Run the benchmark; the report."""
    from streamsafe_bench.processes import RedisServer, ServerProcess

    sim = ServerProcess(
        "simulate",
        "--itl-ms",
        str(itl_ms),
        "--itl-ms-per-seq",
        "0",
        "--prefill-ms-per-token",
        "0",
        "--memory-tokens",
        str(max(1_000_000, streams * (chunks + 64) * 2)),
        "--max-num-seqs",
        str(max(streams, 1)),
    )
    rounds: dict[tuple[int, bool], list[dict[str, Any]]] = {case: [] for case in workers}
    redis = RedisServer().start() if any(own for _, own in workers) else None
    try:
        for r in range(max(1, repeat)):
            for n, own in workers:
                given = redis if own else None
                gateway = _gateway(sim.url, n, given.url if given else None)
                # A redis-server given with --redis is the gateway's cost too.
                redis_pids = [given.proc.pid] if given and given.proc else []
                tag = f"w{n}{'r' if own else ''}-{r}"
                try:
                    warm = (16, 16, tag + "-warm")
                    _phase(gateway.url, gateway.proc.pid, redis_pids, [sim.proc.pid], *warm)
                    load = (streams, chunks, tag)
                    rounds[(n, own)].append(
                        _phase(gateway.url, gateway.proc.pid, redis_pids, [sim.proc.pid], *load)
                    )
                finally:
                    gateway.stop()
    finally:
        sim.stop()
        if redis is not None:
            redis.stop()
    cases = _cases(rounds)
    return {
        "bench": "workers",
        "streams": streams,
        "chunks_per_stream": chunks,
        "itl_ms": itl_ms,
        "repeat": max(1, repeat),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cases": cases,
    }


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Gateway workers at saturation: {report['streams']} streams x "
        f"{report['chunks_per_stream']} chunks, engine {report['itl_ms']:g} ms/token, "
        f"{report['cpus']} cores, median of {report['repeat']}"
    )
    columns = ("workers", "chunks/s", "streams/s", "vs 1st", "gw us/chunk")
    for col in (*columns, "redis us", "sim us", "complete"):
        table.add_column(col, justify="right")
    for c in report["cases"]:
        table.add_row(
            f"{c['workers']}+redis" if c["redis"] == "--redis" else str(c["workers"]),
            f"{c['chunks_per_s']:,.0f}",
            f"{c['streams_per_s']:,.1f}",
            f"{c['throughput_vs_first']:.2f}x",
            f"{c['gateway_cpu_us_per_chunk']:.1f}",
            f"{c['redis_cpu_us_per_chunk']:.1f}",
            f"{c['simulator_cpu_us_per_chunk']:.1f}",
            f"{c['streams_ok']}/{report['streams']}",
        )
    Console(width=max(Console().width, 100)).print(table)


def _main(args: argparse.Namespace) -> int:
    try:
        workers = tuple(parse_case(text) for text in args.workers.split(","))
    except ValueError as exc:
        print(f"streamsafe bench workers: {exc}")
        return 2
    report = run(workers, args.streams, args.chunks, args.itl_ms, args.repeat)
    _print(report)
    write_json(args.json, report)
    return 0 if all(c["streams_ok"] == args.streams for c in report["cases"]) else 1


def register(subparsers: Any) -> None:
    """Add ``bench workers``."""
    p = subparsers.add_parser(
        "workers", help="gateway throughput at saturation and CPU per chunk, 1 vs N workers"
    )
    p.add_argument(
        "--workers",
        default="1,1+redis,2",
        help="cases, comma-separated: N workers, or N+redis (N workers given a redis-server of "
        "the bench's own with --redis: one worker's cost of sharing its state) "
        "(default 1,1+redis,2)",
    )
    p.add_argument("--streams", type=int, default=200, help="concurrent streams (default 200)")
    p.add_argument("--chunks", type=int, default=500, help="chunks per stream (default 500)")
    p.add_argument(
        "--itl-ms", type=float, default=1.0, help="the engine's ms per token (default 1)"
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds, interleaved (default 1)")
    add_output_flags(p)
    p.set_defaults(func=_main)
