"""``streamsafe demo``: the project's main job as a newcomer meets it."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, Any

from streamsafe_bench.report import add_output_flags, write_json

if TYPE_CHECKING:
    from streamsafe_bench.vllm_demo import VLLMDemoSettings

__all__ = ["register"]

_COLUMNS = (
    ("scenario", "name"),
    ("attempts", "client_attempts"),
    ("engine gens", "upstream_generations"),
    ("amplif.", "amplification"),
    ("crashes", "engine_crashes"),
    ("done", "completed"),
    ("failed", "failed"),
    ("truncated", "silently_truncated"),
    ("lost", "tokens_lost"),
    ("repeated", "tokens_repeated"),
    ("p50 s", "p50_s"),
    ("p99 s", "p99_s"),
    ("mem peak", "memory_peak_tokens"),
    ("capacity", "memory_capacity_tokens"),
)


def render_table(rows: list[dict[str, Any]], title: str) -> Any:
    """The demo's rows as a rich table."""
    from rich.table import Table

    table = Table(title=title)
    for header, _ in _COLUMNS:
        table.add_column(header, justify="left" if header == "scenario" else "right")
    for row in rows:
        cells = []
        for _, key in _COLUMNS:
            value = row[key]
            if value is None:
                cells.append("-")
            else:
                cells.append(f"{value:g}" if isinstance(value, float) else str(value))
        style = "red" if row["engine_crashes"] else "green"
        table.add_row(*cells, style=style)
    return table


def _main(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return _vllm_main(args)
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from streamsafe_bench.demo import DemoSettings, ScenarioResult, run_demo, scenarios

    settings = DemoSettings.quick() if args.quick else DemoSettings.full()
    console = Console()
    if not console.is_terminal:  # a log or a pipe: do not squeeze the table to 80 columns
        console = Console(width=160)
    w = settings.workload
    console.print(
        f"[bold]streamsafe demo[/]: {w.requests} concurrent streaming chats of ~{w.prompt_tokens}"
        f" prompt + {w.max_tokens} reply tokens; engine memory {settings.memory_tokens} tokens,"
        f" {settings.max_num_seqs} running at most; client timeout {settings.timeout_s:g} s"
        f" (the 60 s default, time-compressed)."
    )
    only = [int(x) for x in args.only.split(",")] if args.only else None
    total = len(only) if only else len(scenarios())
    results: list[ScenarioResult] = []
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("scenarios", total=total)

        def done(result: ScenarioResult) -> None:
            row = result.row
            verdict = "engine died" if row["engine_crashes"] else "engine lived"
            progress.console.print(
                f"  {row['name']}: amplification {row['amplification']:g}, {verdict}, "
                f"{row['completed']}/{row['logical_requests']} completed"
            )
            progress.advance(task)

        results = asyncio.run(run_demo(settings, only=only, on_done=done))
    rows = [r.row for r in results]
    console.print(render_table(rows, "streamsafe demo: the same workload, six ways"))
    if args.middle_tier == "llama-stack-0.2":
        tier_rows = _llama_stack_rows(console, args.quick, only)
    else:
        tier_rows = _today_rows(console, args.quick, args.middle_tier)
    if args.json:
        write_json(args.json, {"scenarios": rows, "llama_stack": tier_rows})
        console.print(f"wrote {args.json}")
    if args.plot:
        from streamsafe_bench.plots import plot_demo

        plot_demo(rows, [r.memory_series for r in results], args.plot)
        console.print(f"wrote {args.plot}")
    return 0


_TIER_COLUMNS = (
    ("scenario", "name"),
    ("calls", "calls"),
    ("engine reqs", "engine_requests"),
    ("engine gens", "engine_generations"),
    ("crashes", "engine_crashes"),
    ("exact", "exact"),
    ("errors", "errors"),
    ("seconds", "seconds"),
)


def _llama_stack_rows(console: Any, quick: bool, only: list[int] | None) -> list[dict[str, Any]]:
    """The middle-tier rows: the report's deployment with the real Llama Stack server, without
    and with streamsafe in front of it (see streamsafe_bench.middle_tier_demo)."""
    from rich.table import Table

    from streamsafe_bench.middle_tier_demo import demo_load, run_demo_rows

    load = demo_load(quick)
    console.print(
        f"[bold]the real middle tier[/]: llama-stack-client {load.calls} concurrent chats "
        f"(timeout {load.timeout_s:g} s, 2 retries) -> Llama Stack 0.2.12 (remote::vllm) -> "
        "engine with room for each call once"
    )

    def done(row: dict[str, Any]) -> None:
        verdict = "engine died" if row["engine_crashes"] else "engine lived"
        console.print(
            f"  {row['name']}: {row['engine_generations']} engine generations, {verdict}, "
            f"{row['exact']}/{row['calls']} exact"
        )

    rows = asyncio.run(run_demo_rows(quick, only=only, on_done=done))
    if rows:
        table = Table(title="the report's deployment: without and with streamsafe")
        for header, _ in _TIER_COLUMNS:
            table.add_column(header, justify="left" if header == "scenario" else "right")
        for row in rows:
            cells = [
                ", ".join(f"{k} {v}" for k, v in row[key].items()) or "-"
                if key == "errors"
                else str(row[key])
                for _, key in _TIER_COLUMNS
            ]
            table.add_row(*cells, style="red" if row["engine_crashes"] else "green")
        console.print(table)
    return rows


def _today_rows(console: Any, quick: bool, flavor_name: str) -> list[dict[str, Any]]:
    """The middle-tier rows with today's server (see streamsafe_bench.today_positions)."""
    from rich.table import Table

    from streamsafe_bench.ogx_server import FLAVORS, ServerUnavailable
    from streamsafe_bench.today_positions import demo_rows

    flavor = FLAVORS[flavor_name]
    calls = 16 if quick else 32
    console.print(
        f"[bold]the real middle tier today[/]: {calls} concurrent calls (timeout 3 s, 2 "
        f"retries) -> {flavor.name} {flavor.version} (remote::vllm) -> engine with room for "
        "each call once"
    )

    def done(row: dict[str, Any]) -> None:
        verdict = "engine died" if row["engine_dead"] else "engine lived"
        console.print(
            f"  {row['name']}: {row['engine_requests']} engine requests, {verdict}, "
            f"{row['exact']}/{row['calls']} exact"
        )

    try:
        rows = demo_rows(flavor, quick, on_done=done)
    except ServerUnavailable as exc:
        console.print(f"  [yellow]skipped[/]: {exc}")
        return []
    table = Table(
        title=f"the report's deployment today ({flavor.name}): without and with streamsafe"
    )
    for header in ("scenario", "calls", "engine reqs", "engine gens", "exact", "errors", "seconds"):
        table.add_column(header, justify="left" if header == "scenario" else "right")
    for row in rows:
        errors = ", ".join(f"{k} {v}" for k, v in row["errors"].items()) or "-"
        cells = [row["name"], row["calls"], row["engine_requests"], row["engine_generations"]]
        cells += [row["exact"], errors, row["seconds"]]
        table.add_row(*map(str, cells), style="red" if row["engine_dead"] else "green")
    console.print(table)
    return rows


def _vllm_main(args: argparse.Namespace) -> int:
    """The demo against the real vLLM (see streamsafe_bench.vllm_demo)."""
    from rich.console import Console

    from streamsafe_bench.vllm_demo import VLLMDemoSettings, run_vllm_demo
    from streamsafe_bench.vllm_engine import VLLMUnavailable

    settings = VLLMDemoSettings.quick() if args.quick else VLLMDemoSettings()
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(
        f"[bold]streamsafe demo --engine vllm[/]: the real vLLM 0.32 (CPU) serving the tiny "
        f"model; {settings.calls} concurrent plain chats (timeout {settings.timeout_s:g} s, 2 "
        f"retries) while the engine is busy {settings.stall_s:g} s on every path; then "
        f"{settings.cuts} greedy streams of {settings.cut_tokens} tokens cut at random points "
        "between the gateway and vLLM. Starting vLLM (30-60 s)..."
    )

    def on_row(kind: str, row: dict[str, Any]) -> None:
        if kind == "storm":
            console.print(
                f"  {row['name']}: {row['vllm_requests']} vLLM requests for {row['calls']} "
                f"calls, {row['exact']}/{row['calls']} answered exactly"
            )
        else:
            console.print(f"  continued {row['name']}: {row['exact']}/{row['streams_cut']} exact")

    try:
        result = run_vllm_demo(settings, on_row=on_row)
    except VLLMUnavailable as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    console.print(_storm_table(result, settings))
    console.print(_cut_table(result, settings))
    if args.json:
        write_json(args.json, result)
        console.print(f"wrote {args.json}")
    return 0


def _storm_table(result: dict[str, Any], settings: VLLMDemoSettings) -> Any:
    """The storm against the real vLLM: per path, the vLLM requests its calls cost."""
    from rich.table import Table

    storm = Table(
        title=f"the report's storm against the real vLLM (client timeout "
        f"{result['client_timeout_s']:g} s, 2 retries; the engine busy "
        f"{settings.stall_s:g} s on every path)"
    )
    for header in ("path", "calls", "vLLM requests", "per call", "exact", "errors", "seconds"):
        storm.add_column(header, justify="left" if header in ("path", "errors") else "right")
    for row in result["storm"]:
        storm.add_row(
            row["name"],
            str(row["calls"]),
            str(row["vllm_requests"]),
            f"{row['per_call']:g}",
            str(row["exact"]),
            ", ".join(row["errors"]) or "-",
            f"{row['seconds']:g}",
        )
    return storm


def _cut_table(result: dict[str, Any], settings: VLLMDemoSettings) -> Any:
    """The streams cut between the gateway and the real vLLM: how exactly each was continued."""
    from rich.table import Table

    cut = Table(
        title=f"streams cut between the gateway and the real vLLM, continued "
        f"(greedy, max_tokens {settings.cut_tokens})"
    )
    for header in (
        "continued",
        "streams cut",
        "exact",
        "usage exact",
        "most extra tokens",
        "longest wait (ms)",
        "straight (ms)",
    ):
        cut.add_column(header, justify="left" if header == "continued" else "right")
    for row in result["continuation"]:
        cut.add_row(
            row["name"],
            str(row["streams_cut"]),
            str(row["exact"]),
            str(row["usage_exact"]),
            str(row["max_extra_tokens"]),
            str(row["recover_ms"]),
            str(row["straight_gap_ms"]),
        )
    return cut


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="the reported outage reproduced and prevented, side by side (about a minute)"
    )
    p.add_argument("--quick", action="store_true", help="a smaller workload (the test suite's)")
    add_output_flags(p, plot=True)
    p.add_argument("--only", help="comma-separated scenario numbers to run (default: all)")
    p.add_argument(
        "--engine",
        choices=("simulator", "vllm"),
        default="simulator",
        help="simulator: the fast, embedded default; vllm: the report's storm and cut streams "
        "against the real vLLM (`make vllm` builds it; a few minutes)",
    )
    p.add_argument(
        "--middle-tier",
        choices=("llama-stack-0.2", "ogx", "llama-stack-0.7"),
        default="llama-stack-0.2",
        help="the Llama Stack server of the middle-tier rows: 0.2.12 (default, in this "
        "environment), or today's OGX 1.5.0 or llama-stack 0.7.3 (`make llama-servers`)",
    )
    p.set_defaults(func=_main)
