"""What sealing the answers in Redis costs per chunk (issue 33, row 7): two gateways on one
``redis-server`` in front of one simulator, ``--redis`` alone and ``--redis --redis-secret``;
the same streaming load (``--streams`` x ``--chunks`` at the simulator's ITL, as ``bench
peers`` sends it) through each, taking turns for ``--rounds`` rounds. Reported: each gateway's
CPU seconds per 100k chunks (its process tree, charged as ``bench peers`` charges it) and, per
round, sealed over clear; the median of those ratios is the figure (both sides of each saw the
same moment of the machine).

    PYTHONPATH=src python scripts/bench_redis_seal.py [--streams 20] [--chunks 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

from streamsafe.bench.measure import measure_phase
from streamsafe.bench.processes import RedisServer, free_port, http_ok, launched
from streamsafe.bench.tap import Tap
from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.serving import ServerThread


def main() -> None:
    """Run the comparison and print it (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=300)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config = SimConfig(
        memory_tokens=max(1_000_000, args.streams * (args.chunks + 64) * 4),
        max_num_seqs=max(args.streams, 1),
        itl_ms=args.itl_ms,
        itl_ms_per_seq=0.0,
        prefill_ms_per_token=0.0,
        default_max_tokens=args.chunks,
    )
    tap = Tap(Simulator(config))
    redis = RedisServer().start()
    gateways = {"clear": (), "sealed": ("--redis-secret", "bench-secret")}
    figures: dict[str, list[float]] = {name: [] for name in gateways}
    try:
        with contextlib.ExitStack() as stack:
            engine = stack.enter_context(ServerThread(tap, loop="uvloop")).url
            running = {}
            for name, extra in gateways.items():
                port = free_port()
                cmd = [sys.executable, "-m", "streamsafe.cli", "serve", "--upstream", engine]
                cmd += ["--redis", redis.url, "--port", str(port), "--log-level", "warning"]
                url = f"http://127.0.0.1:{port}"
                proc = stack.enter_context(
                    launched([*cmd, *extra], name=name, ready=http_ok(url + "/health"))
                )
                running[name] = (url, proc.pid)
                print(f"{name}: {' '.join(cmd)} {' '.join(extra)}", flush=True)
            for name, (url, pid) in running.items():  # warm-up: imports, connections
                measure_phase(url, tap, 4, 8, f"{name}-warmup", server_pid=pid)
            for r in range(args.rounds):
                order = list(running.items())
                for name, (url, pid) in order[r % 2 :] + order[: r % 2]:
                    phase = measure_phase(
                        url, tap, args.streams, args.chunks, f"{name}-r{r}", server_pid=pid
                    )
                    per_100k = phase.server_cpu_s / max(phase.events_sent_upstream, 1) * 1e5
                    figures[name].append(per_100k)
                    ok = phase.streams_ok
                    print(f"  round {r + 1} {name:6s} {per_100k:6.2f} s/100k chunks ({ok} ok)")
    finally:
        redis.stop()
    ratios = [s / c for s, c in zip(figures["sealed"], figures["clear"], strict=True)]
    for name, values in figures.items():
        print(f"{name:6s} CPU s / 100k chunks: median {statistics.median(values):.2f}")
    spread = f"{min(ratios):.3f} .. {max(ratios):.3f}"
    print(f"sealed / clear, per round: median {statistics.median(ratios):.3f} ({spread})")


if __name__ == "__main__":
    main()
