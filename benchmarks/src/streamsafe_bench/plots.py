"""Plots of the demo and the benchmarks (matplotlib, written to PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_demo", "plot_fleet", "plot_overload", "plot_peers"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_demo(rows: list[dict[str, Any]], series: list[list[tuple[float, int]]], path: str) -> None:
    """Engine memory over time per scenario against the capacity line, and amplification per
    scenario: the outage and its absence, readable without a number."""
    plt = _pyplot()
    fig, (ax_mem, ax_amp) = plt.subplots(
        1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]}
    )
    capacity = max((r["memory_capacity_tokens"] for r in rows), default=0)
    for row, points in zip(rows, series, strict=True):
        if not points:
            continue
        xs = [t for t, _ in points]
        ys = [m for _, m in points]
        style = "--" if row["engine_crashes"] else "-"
        label = row["name"] + ("  (engine died)" if row["engine_crashes"] else "")
        (line,) = ax_mem.plot(xs, ys, style, label=label, linewidth=1.6)
        if row["engine_crashes"]:
            peak = max(range(len(ys)), key=ys.__getitem__)
            ax_mem.plot([xs[peak]], [ys[peak]], "X", color=line.get_color(), markersize=12)
    ax_mem.axhline(capacity, color="black", linewidth=2, label="engine memory capacity")
    ax_mem.set_xlabel("seconds since the scenario started")
    ax_mem.set_ylabel("engine memory in use (tokens)")
    ax_mem.set_title("Engine memory in use (X: the engine died)")
    ax_mem.legend(fontsize=7, loc="upper right")
    ax_mem.set_ylim(0, capacity * 1.35 if capacity else None)

    short = {"llama-stack-client": "llama-stack", "openai": "openai", "streamsafe": "streamsafe"}
    names = [
        f"{r['name'].split('.', 1)[0]}\n{short.get(r['client'], r['client'])}\n{r['path']}"
        for r in rows
    ]
    amps = [r["amplification"] for r in rows]
    colors = ["#d62728" if r["engine_crashes"] else "#2ca02c" for r in rows]
    bars = ax_amp.bar(range(len(rows)), amps, color=colors)
    for bar, row in zip(bars, rows, strict=True):
        note = "crash" if row["engine_crashes"] else f"{row['completed']}/{row['logical_requests']}"
        ax_amp.annotate(
            f"{row['amplification']:.2f}x\n{note}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax_amp.axhline(1.0, color="black", linewidth=1, linestyle=":")
    ax_amp.set_xticks(range(len(rows)), names, fontsize=7)
    ax_amp.set_ylabel("engine generations per logical request")
    ax_amp.set_title("Amplification (red: the engine died)")
    ax_amp.set_ylim(0, max([*amps, 1.0]) * 1.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_overload(rows: list[dict[str, Any]], path: str) -> None:
    """Goodput and amplification against offered load, one line per client and path."""
    plt = _pyplot()
    fig, (ax_good, ax_amp) = plt.subplots(1, 2, figsize=(12, 4.5))
    series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(row["scenario"], []).append(row)
    for label, points in series.items():
        points.sort(key=lambda r: r["load"])
        loads = [p["load"] for p in points]
        ax_good.plot(loads, [p["goodput"] for p in points], "o-", label=label)
        ax_amp.plot(loads, [p["amplification"] for p in points], "o-", label=label)
        for p in points:
            if p["engine_crashes"]:
                ax_good.plot([p["load"]], [p["goodput"]], "rx", markersize=12)
    ax_good.axhline(1.0, color="black", linewidth=1, linestyle=":")
    ax_good.set_xlabel("offered load (x engine capacity)")
    ax_good.set_ylabel("goodput (fraction of engine capacity)")
    ax_good.set_title("Goodput (x: the engine died)")
    ax_good.legend(fontsize=7)
    ax_amp.set_xlabel("offered load (x engine capacity)")
    ax_amp.set_ylabel("engine generations per logical request")
    ax_amp.set_title("Amplification")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_peers(report: dict[str, Any], path: str) -> None:
    """CPU per 100k chunks (log scale) and added latency per chunk, per peer, with the spread
    over rounds as whiskers: streamsafe against nginx and LiteLLM at a glance."""
    plt = _pyplot()
    fig, (ax_cpu, ax_lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [n for n in report["peers"] if n != "direct"]
    summaries = [report["peers"][n]["summary"] for n in names]

    def bars(ax: Any, key: str, offset: float, width: float, label: str | None) -> None:
        values, low, high = [], [], []
        for s in summaries:
            v = s.get(key)
            lo, hi = s["spread"].get(key) or (v, v)
            values.append(v or 0.0)
            low.append(max(0.0, (v or 0.0) - (lo or 0.0)))
            high.append(max(0.0, (hi or 0.0) - (v or 0.0)))
        xs = [i + offset for i in range(len(names))]
        ax.bar(xs, values, width, yerr=[low, high], capsize=3, label=label)

    bars(ax_cpu, "cpu_s_per_100k_chunks", 0.0, 0.6, None)
    for i, s in enumerate(summaries):
        ratio = s.get("cpu_vs_nginx")
        note = f"{ratio:.2f}x nginx" if ratio is not None else ""
        if s.get("saturated"):
            note += "\n(saturated)"
        if note:
            ax_cpu.annotate(
                note,
                (i, s.get("cpu_s_per_100k_chunks") or 0.0),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 4),
                textcoords="offset points",
            )
    ax_cpu.set_yscale("log")
    ax_cpu.set_xticks(range(len(names)), names, fontsize=8, rotation=15)
    ax_cpu.set_ylabel("CPU seconds per 100,000 chunks (log)")
    ax_cpu.set_title("Proxy CPU per chunk (whiskers: spread over rounds)")
    bars(ax_lat, "added_latency_ms_p50", -0.2, 0.4, "p50")
    bars(ax_lat, "added_latency_ms_p99", 0.2, 0.4, "p99")
    ax_lat.axhline(0.0, color="black", linewidth=1)
    # A saturated peer adds seconds, the others a few milliseconds: both stay readable.
    ax_lat.set_yscale("symlog", linthresh=1.0)
    ax_lat.set_xticks(range(len(names)), names, fontsize=8, rotation=15)
    ax_lat.set_ylabel("ms added per chunk vs direct (symlog)")
    ax_lat.set_title("Latency added per chunk")
    ax_lat.legend(fontsize=8)
    fig.suptitle(
        f"{report['streams']} streams x {report['chunks_per_stream']} chunks @ "
        f"{report['itl_ms']:g} ms, median of {report['rounds']} rounds",
        fontsize=10,
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fleet(report: dict[str, Any], path: str) -> None:
    """Tokens delivered per 100 ms across every stream, with the engine kill marked, and each
    stream's tokens over time: the dip at the kill and every stream carrying on."""
    plt = _pyplot()
    fig, (ax_rate, ax_streams) = plt.subplots(1, 2, figsize=(13, 4.8))
    series: list[list[float]] = report["series"]
    end = max((t[-1] for t in series if t), default=1.0)
    buckets = [0] * (int(end / 0.1) + 1)
    for times in series:
        for t in times:
            buckets[int(t / 0.1)] += 1
    ax_rate.plot([i * 0.1 for i in range(len(buckets))], [b * 10 for b in buckets])
    for ax in (ax_rate, ax_streams):
        ax.axvline(report["kill_at_s"], color="red", linestyle="--", label="engine killed")
    ax_rate.set_xlabel("seconds")
    ax_rate.set_ylabel("tokens delivered per second (all streams)")
    ax_rate.set_title(
        f"amplification {report['amplification']:g}, {report['completed']}/"
        f"{report['logical_requests']} complete, lost {report['tokens_lost']}, "
        f"repeated {report['tokens_repeated']}",
        fontsize=9,
    )
    ax_rate.legend(fontsize=8)
    for times in series:
        ax_streams.plot(times, range(1, len(times) + 1), linewidth=0.8)
    ax_streams.set_xlabel("seconds")
    ax_streams.set_ylabel("tokens received by the stream")
    failover = report["failover_s_max"]
    ax_streams.set_title(
        f"each stream; {report['streams_migrated']} moved to the other engine, longest wait "
        f"{'-' if failover is None else f'{failover:.2f} s'}",
        fontsize=9,
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
