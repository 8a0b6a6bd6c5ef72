"""What sealing the answers in Redis costs per chunk (issue 33, row 7): two gateways, each on a
``redis-server`` of its own (a fleet of one: the two do not share a fleet), in front of one
simulator, ``--redis`` alone and ``--redis --redis-secret``;
the same streaming load (``--streams`` x ``--chunks`` at the simulator's ITL, as ``bench
peers`` sends it) through each, taking turns for ``--rounds`` rounds. Reported: each gateway's
CPU seconds per 100k chunks (its process tree, charged as ``bench peers`` charges it) and, per
round, sealed over clear; the median of those ratios is the figure (both sides of each saw the
same moment of the machine). Then, in this process, what sealing and opening one chunk costs
alone (the simulator's first chunk, sealed as a batch of one, as the relay appends it), set
against the clear gateway's CPU per chunk: the end-to-end ratio is within the machine's noise.

    PYTHONPATH=src python scripts/bench_redis_seal.py [--streams 20] [--chunks 300] [--rounds 5]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import timeit

from streamsafe.gateway.replicas.record_seal import RecordSeal
from streamsafe.server import ServerThread
from streamsafe_bench.measure import measure_phase
from streamsafe_bench.processes import RedisServer, free_port, http_ok, launched
from streamsafe_bench.store_load import load_options, tapped_engine


def main() -> None:
    """Run the comparison and print it (see the module)."""
    args = load_options(__doc__.split("\n\n")[0])
    tap = tapped_engine(args.streams, args.chunks, args.itl_ms)
    gateways = {"clear": (), "sealed": ("--redis-secret", "bench-secret")}
    redis = {name: RedisServer() for name in gateways}
    figures: dict[str, list[float]] = {name: [] for name in gateways}
    try:
        with contextlib.ExitStack() as stack:
            engine = stack.enter_context(ServerThread(tap, loop="uvloop")).url
            running = {}
            for name, extra in gateways.items():
                port = free_port()
                store = redis[name].start().url
                cmd = [sys.executable, "-m", "streamsafe.cli", "serve", "--upstream", engine]
                cmd += ["--redis", store, "--port", str(port), "--log-level", "warning"]
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
        for server in redis.values():
            server.stop()
    ratios = [s / c for s, c in zip(figures["sealed"], figures["clear"], strict=True)]
    for name, values in figures.items():
        print(f"{name:6s} CPU s / 100k chunks: median {statistics.median(values):.2f}")
    spread = f"{min(ratios):.3f} .. {max(ratios):.3f}"
    print(f"sealed / clear, per round: median {statistics.median(ratios):.3f} ({spread})")
    seal_us, open_us = _alone()
    clear_us = statistics.median(figures["clear"]) * 10  # s / 100k chunks -> us / chunk
    share = (seal_us + open_us) / clear_us
    print(
        f"alone: seal {seal_us:.2f} us, open {open_us:.2f} us per chunk; together"
        f" {share:.1%} of the clear gateway's {clear_us:.0f} us per chunk"
    )


def _alone(n: int = 50_000) -> tuple[float, float]:
    """Microseconds to seal one chunk (a batch of one) and to open it, best of three."""
    seal = RecordSeal("bench-secret")
    chunk = (
        b'{"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1,'
        b'"model":"sim-llama-8b","choices":[{"index":0,"delta":{"content":" word"},'
        b'"logprobs":null,"finish_reason":null}]}'
    )
    gen = b"gen-0123456789abcdef01234567"
    sealed = seal.seal_entries(gen, 42, [chunk])[0]
    sealing = min(timeit.repeat(lambda: seal.seal_entries(gen, 42, [chunk]), number=n, repeat=3))
    opening = min(timeit.repeat(lambda: seal.open_entry(gen, 42, sealed), number=n, repeat=3))
    return sealing / n * 1e6, opening / n * 1e6


if __name__ == "__main__":
    main()
