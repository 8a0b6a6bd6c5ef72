"""``streamsafe bench overload``: offered load as a multiple of the engine's capacity, against
each client and path of the demo.

Capacity is measured first, in the same run: ``max_num_seqs`` streams kept in flight straight to
a healthy engine for the window, completed reply tokens per second. Then each scenario of the
demo gets an open-loop arrival of requests at ``load x capacity`` for the same window (arrivals
do not wait for earlier requests, as real users do not), and we record:

- goodput: completed reply tokens per second, from the first arrival until every request has
  ended, as a fraction of the measured capacity;
- amplification: engine generations per logical request;
- crashes of the engine, and p99 completion time of the completed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the benchmark's heavy imports wait until it runs, so --help stays fast
    from streamsafe_bench.demo import DemoSettings, Scenario
    from streamsafe_bench.harness import Driver, Outcome, Workload

from streamsafe_bench.report import add_output_flags, write_json
from streamsafe_bench.stats import percentile

__all__ = ["measure_capacity", "register", "run"]


async def measure_capacity(settings: DemoSettings, window_s: float) -> float:
    """Reply tokens per second of a saturated, healthy engine (closed loop, no retries)."""
    from streamsafe_bench.demo import healthy_engine
    from streamsafe_bench.harness import make_driver, run_stack

    w = settings.workload
    with run_stack(healthy_engine(settings), None) as stack:
        async with make_driver("streamsafe", stack.url, settings.timeout_s * 30) as driver:
            done_tokens = 0
            stop_at = time.monotonic() + window_s
            counter = iter(range(10**9))

            async def worker() -> None:
                nonlocal done_tokens
                while time.monotonic() < stop_at:
                    out = await driver(w.body(next(counter)))
                    if out.ok:
                        done_tokens += w.max_tokens

            t0 = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(settings.max_num_seqs)))
            return done_tokens / (time.monotonic() - t0)


async def _open_loop(
    driver: Driver, workload: Workload, rate: float, window_s: float
) -> list[Outcome]:
    n = max(1, round(rate * window_s))

    async def one(i: int) -> Outcome:
        await asyncio.sleep(i / rate)
        return await driver(workload.body(i))

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def run_point(
    sc: Scenario, settings: DemoSettings, load: float, capacity_tps: float, window_s: float
) -> dict[str, Any]:
    """One scenario at one offered load."""
    from streamsafe_bench.harness import make_driver, run_stack

    w = settings.workload
    rate = load * capacity_tps / w.max_tokens  # requests per second
    gw_cfg = sc.gateway(settings) if sc.gateway else None
    with run_stack(sc.sim(settings), gw_cfg) as stack:
        async with make_driver(sc.client, stack.url, settings.timeout_s) as driver:
            t0 = time.monotonic()
            outcomes = await _open_loop(driver, w, rate, window_s)
            elapsed = time.monotonic() - t0
        sim = stack.simulator.stats()
    # Completed means the whole answer arrived: a call that ended quietly but short (as
    # llama-stack-client 0.2.x does on an in-stream error event) does not count.
    completed = [o for o in outcomes if o.ok and len(o.text.split()) == w.max_tokens]
    p99 = percentile([o.seconds for o in completed], 0.99)
    n = len(outcomes)
    generations = sim["generations_started"] - sim["continuations"]
    return {
        "scenario": sc.name,
        "client": sc.client,
        "path": sc.path,
        "load": load,
        "logical_requests": n,
        "completed": len(completed),
        "goodput": round(len(completed) * w.max_tokens / elapsed / capacity_tps, 3),
        "amplification": round(generations / n, 3),
        "engine_crashes": sim["crashes"],
        "p99_s": None if p99 is None else round(p99, 3),
    }


async def run_async(
    loads: list[float], settings: DemoSettings, window_s: float, only: list[int] | None = None
) -> dict[str, Any]:
    from streamsafe_bench.demo import scenarios

    capacity = await measure_capacity(settings, window_s)
    rows = []
    for i, sc in enumerate(scenarios(), 1):
        if only and i not in only:
            continue
        for load in loads:
            row = await run_point(sc, settings, load, capacity, window_s)
            print(
                f"  {sc.name} @ {load:g}x: goodput {row['goodput']:.2f}, "
                f"amplification {row['amplification']:g}, crashes {row['engine_crashes']}",
                flush=True,
            )
            rows.append(row)
    return {
        "bench": "overload",
        "capacity_tokens_per_s": round(capacity, 1),
        "window_s": window_s,
        "rows": rows,
    }


def run(
    loads: list[float], *, quick: bool = False, window_s: float = 6.0, only: list[int] | None = None
) -> dict[str, Any]:
    """Measure capacity, then every scenario at every load; return the report."""
    from streamsafe_bench.demo import DemoSettings

    settings = DemoSettings.quick() if quick else DemoSettings.full()
    return asyncio.run(run_async(loads, settings, window_s, only))


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Overload: capacity {report['capacity_tokens_per_s']:,.0f} reply tokens/s, "
        f"{report['window_s']:g} s of arrivals per point"
    )
    for col in ("scenario", "load", "goodput", "amplif.", "crashes", "done", "p99 s"):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for r in report["rows"]:
        table.add_row(
            r["scenario"],
            f"{r['load']:g}x",
            f"{r['goodput']:.2f}",
            f"{r['amplification']:g}",
            str(r["engine_crashes"]),
            f"{r['completed']}/{r['logical_requests']}",
            "-" if r["p99_s"] is None else f"{r['p99_s']:.2f}",
            style="red" if r["engine_crashes"] else None,
        )
    Console().print(table)


def _main(args: argparse.Namespace) -> int:
    loads = [float(x) for x in args.loads.split(",")]
    only = [int(x) for x in args.only.split(",")] if args.only else None
    report = run(loads, quick=args.quick, window_s=args.window, only=only)
    _print(report)
    write_json(args.json, report)
    if args.plot:
        from streamsafe_bench.plots import plot_overload

        plot_overload(report["rows"], args.plot)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "overload", help="goodput, amplification and crashes vs offered load, per client and path"
    )
    p.add_argument("--loads", default="0.5,1,2,4", help="loads as multiples of capacity")
    p.add_argument("--window", type=float, default=6.0, help="seconds of arrivals per point")
    p.add_argument("--quick", action="store_true", help="the demo's quick sizes")
    p.add_argument("--only", help="comma-separated demo scenario numbers (default: all)")
    add_output_flags(p, plot=True)
    p.set_defaults(func=_main)
