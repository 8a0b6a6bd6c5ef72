"""What the shared state costs per chunk on a Redis Cluster against one Redis (issue 32, item 2):
two gateways in front of one simulator, one with ``--redis redis://`` on a ``redis-server`` of
its own, one with ``--redis redis+cluster://`` on three primaries (a fleet of one each: the two
do not share a fleet); the same streaming load (``--streams`` x ``--chunks`` at the simulator's
ITL, as ``bench peers`` sends it) through each, taking turns for ``--rounds`` rounds. Reported,
per 100k chunks: each gateway's CPU seconds (its process tree, charged as ``bench peers``
charges it) and its Redis's (the one server, or the three nodes together); per round, cluster
over one Redis; the median of those ratios is the figure (both sides of each saw the same
moment of the machine).

    PYTHONPATH=src python scripts/bench_redis_cluster.py [--streams 20] [--chunks 300] [--rounds 5]
"""

from __future__ import annotations

import contextlib
import statistics
import sys

from streamsafe.server import ServerThread
from streamsafe_bench.measure import measure_phase
from streamsafe_bench.processes import (
    RedisClusterServers,
    RedisServer,
    free_port,
    http_ok,
    launched,
)
from streamsafe_bench.store_load import load_options, tapped_engine


def main() -> None:
    """Run the comparison and print it (see the module)."""
    args = load_options(__doc__.split("\n\n")[0])
    tap = tapped_engine(args.streams, args.chunks, args.itl_ms)
    one, cluster = RedisServer(), RedisClusterServers()
    gateway = {"one": 0.0, "cluster": 0.0}
    figures: dict[str, list[float]] = {name: [] for name in gateway}
    redis_figures: dict[str, list[float]] = {name: [] for name in gateway}
    try:
        with contextlib.ExitStack() as stack:
            engine = stack.enter_context(ServerThread(tap, loop="uvloop")).url
            one.start()
            cluster.start()
            stores = {"one": (one.url, [one]), "cluster": (cluster.url, cluster.nodes)}
            running = {}
            for name, (store, nodes) in stores.items():
                port = free_port()
                cmd = [sys.executable, "-m", "streamsafe.cli", "serve", "--upstream", engine]
                cmd += ["--redis", store, "--port", str(port), "--log-level", "warning"]
                url = f"http://127.0.0.1:{port}"
                proc = stack.enter_context(launched(cmd, name=name, ready=http_ok(url + "/health")))
                pids = [n.proc.pid for n in nodes if n.proc is not None]
                running[name] = (url, proc.pid, pids)
                print(f"{name}: {' '.join(cmd)}", flush=True)
            for name, (url, pid, pids) in running.items():  # warm-up: imports, connections
                measure_phase(url, tap, 4, 8, f"{name}-warmup", server_pid=pid, upstream_pids=pids)
            for r in range(args.rounds):
                order = list(running.items())
                for name, (url, pid, pids) in order[r % 2 :] + order[: r % 2]:
                    phase = measure_phase(
                        url,
                        tap,
                        args.streams,
                        args.chunks,
                        f"{name}-r{r}",
                        server_pid=pid,
                        upstream_pids=pids,
                    )
                    chunks = max(phase.events_sent_upstream, 1)
                    per_100k = phase.server_cpu_s / chunks * 1e5
                    redis_100k = phase.upstream_cpu_s / chunks * 1e5
                    figures[name].append(per_100k)
                    redis_figures[name].append(redis_100k)
                    ok = phase.streams_ok
                    print(
                        f"  round {r + 1} {name:7s} gateway {per_100k:6.2f}, redis"
                        f" {redis_100k:5.2f} s/100k chunks ({ok} ok)"
                    )
    finally:
        one.stop()
        cluster.stop()
    for name in gateway:
        print(
            f"{name:7s} CPU s / 100k chunks: gateway median {statistics.median(figures[name]):.2f},"
            f" redis median {statistics.median(redis_figures[name]):.2f}"
        )
    ratios = [c / o for c, o in zip(figures["cluster"], figures["one"], strict=True)]
    spread = f"{min(ratios):.3f} .. {max(ratios):.3f}"
    median = statistics.median(ratios)
    print(f"gateway, cluster / one Redis, per round: median {median:.3f} ({spread})")
    both = [
        (gc + rc) / (go + ro)
        for gc, rc, go, ro in zip(
            figures["cluster"],
            redis_figures["cluster"],
            figures["one"],
            redis_figures["one"],
            strict=True,
        )
    ]
    print(f"gateway + redis, cluster / one Redis, per round: median {statistics.median(both):.3f}")


if __name__ == "__main__":
    main()
