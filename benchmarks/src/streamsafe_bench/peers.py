"""``streamsafe bench peers``: what a proxy costs per chunk and per request, streamsafe's gateway
side by side with nginx and the LiteLLM proxy, on the same upstream and the same load.

One simulator (in this process, behind a tap noting when each event leaves it) is the upstream
of every peer: direct (no proxy), nginx (an SSE reverse proxy, buffering off, one worker), the
leanest relay Python allows (``python-floor``, :mod:`streamsafe_bench.floor_relay`: what any
Python proxy pays per chunk at the least, on this machine, in this run), the LiteLLM proxy (one
worker, no database), streamsafe's gateway with its defaults and with ``--commit first-token``.
``streamsafe-pool`` is the gateway with its defaults in front of that simulator and a second one
alike (``--upstream A --upstream B``, what a user with two engines runs): the same load, about
half the streams on each engine, and its CPU per chunk over the one-engine row's in the same
round (``cpu_vs_one_engine``).
Each peer is its own process; the load is a separate raw-socket load generator
(:mod:`streamsafe_bench.load`). Rounds interleave the peers (the order rotates each round) so
that the machine's noise hits all alike; figures are medians over rounds, with the lowest and
highest round as the spread. In each round and for each peer:

- **a streaming load**: N streams x M chunks at the simulator's ITL. The peer's CPU seconds per
  100,000 chunks (its whole process tree, user + system); the latency it adds per chunk, p50 and
  p99 (each chunk's tap to arrival, less direct's median in the same round: percentiles of what
  was added, not differences of two runs' percentiles); its resident memory per live stream
  (peak during the load minus before, over N); saturated when it used 90 % of a core or more or
  took a quarter longer than direct (then its latencies include queueing for the CPU); and how
  often the kernel preempted it, per 1,000 chunks (in the JSON): each preemption in the middle of
  a tick holds the rest of that tick's chunks, which is where a proxy's p99 comes from on a
  machine with fewer cores than busy processes.
- **a burst**: B one-token requests at once. Time to first token added (p50, p99 over the burst
  of each request's, less direct's median; and p50 minus nginx's, as direct pays for B new
  upstream connections that a proxy with a keep-alive pool does not), and CPU per request: the
  burst's CPU less its chunks at the load's cost per chunk, over B.

The machine is shared and noisy: read the ratios against nginx measured in the same run, not the
absolute figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from streamsafe_bench.load import run_load
from streamsafe_bench.measure import measure_phase
from streamsafe_bench.peer_servers import (
    PEERS,
    Missing,
    Peer,
    default_litellm_python,
    engines_used,
    start_peer,
)
from streamsafe_bench.report import add_output_flags, write_json, write_text
from streamsafe_bench.stats import median, percentile, spread
from streamsafe_bench.tap import Tap, Taps

__all__ = ["markdown_table", "register", "run"]

_MS = 1000.0
_BURST_TOKENS = 1
_SATURATED_CPU = 0.9  # of one core: a one-worker proxy past this is the bottleneck
_SATURATED_SLOWDOWN = 1.25  # wall time against direct's in the same round


def _round(peer: Peer, tap: Taps, streams: int, chunks: int, burst: int, r: int) -> dict[str, Any]:
    load = measure_phase(peer.url, tap, streams, chunks, f"{peer.name}-r{r}", server_pid=peer.pid)
    lat = load.latencies(tap)
    events = load.events_sent_upstream
    chunk_cpu = load.server_cpu_s / max(events, 1)
    fig: dict[str, Any] = {
        "streams_ok": load.streams_ok,
        "events_sent_upstream": load.events_sent_upstream,
        "events_received": load.events_received,
        "wall_s": load.wall_s,
        "loadgen_cpu_s": load.loadgen_cpu_s,
        "cpu_s": load.server_cpu_s,
        "cpu_s_per_100k_chunks": chunk_cpu * 1e5,
        "cpu_share_of_core": load.server_cpu_s / max(load.wall_s, 1e-9),
        "preempted_per_1k_chunks": load.server_preemptions * 1e3 / max(events, 1),
        "latency_ms_p50": _scaled(percentile(lat, 0.5), _MS),
        "latency_ms_p99": _scaled(percentile(lat, 0.99), _MS),
        "rss_per_stream_kib": load.rss_per_stream() / 1024,
        "streams_per_engine": tap.served(s.key for s in load.streams),
        "errors": load.errors,
    }
    if burst:
        b = measure_phase(
            peer.url, tap, burst, _BURST_TOKENS, f"{peer.name}-b{r}", server_pid=peer.pid
        )
        ttft = [s.arrivals[0] - s.started for s in b.streams if s.arrivals]
        setup = b.server_cpu_s - b.events_sent_upstream * chunk_cpu
        fig.update(
            {
                "burst_ttft_ms_p50": _scaled(percentile(ttft, 0.5), _MS),
                "burst_ttft_ms_p99": _scaled(percentile(ttft, 0.99), _MS),
                "cpu_ms_per_request": max(setup, 0.0) / burst * _MS,
                "burst_streams_ok": b.streams_ok,
                "burst_events_sent_upstream": b.events_sent_upstream,
                "burst_events_received": b.events_received,
                "errors": sorted({*load.errors, *b.errors}),
            }
        )
    return fig


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


_LOAD_FIGURES = (
    "cpu_s_per_100k_chunks",
    "latency_ms_p50",
    "latency_ms_p99",
    "burst_ttft_ms_p50",
    "burst_ttft_ms_p99",
    "cpu_ms_per_request",
    "rss_per_stream_kib",
    "cpu_share_of_core",
    "preempted_per_1k_chunks",
    "wall_s",
)
# Added latency (per chunk; to the first token at the burst) is each chunk's or request's own
# latency through the peer less direct's median in the same round, so its quantile q is the
# peer's quantile q less direct's median. (Not the peer's p99 less direct's p99: two tails of
# different chunks, a difference that can come out below the p50's.)
_ADDED = (
    ("latency_ms_p50", "latency_ms_p50"),
    ("latency_ms_p99", "latency_ms_p50"),
    ("burst_ttft_ms_p50", "burst_ttft_ms_p50"),
    ("burst_ttft_ms_p99", "burst_ttft_ms_p50"),
)
# The pool row, and the one-engine row (same gateway, same flags) its CPU per chunk is set
# against in the same round (``cpu_vs_one_engine``).
_POOL_OF_TWO, _ONE_ENGINE = "streamsafe-pool", "streamsafe"


def _against(name: str, fig: dict[str, Any], others: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Peer ``name``'s figures of one round against the other peers' in the same round."""
    out: dict[str, float] = {}
    d = others.get("direct")
    if d is not None:
        for key, base in _ADDED:
            if fig.get(key) is not None and d.get(base) is not None:
                out["added_" + key] = fig[key] - d[base]
        out["slowdown_vs_direct"] = fig["wall_s"] / max(d["wall_s"], 1e-9)
    ng = others.get("nginx")
    if ng is not None and name not in ("direct", "nginx"):
        for key in ("latency_ms_p50", "latency_ms_p99", "burst_ttft_ms_p50"):
            if fig.get(key) is not None and ng.get(key) is not None:
                out[key + "_over_nginx"] = fig[key] - ng[key]
    refs = [("cpu_vs_nginx", "nginx"), ("cpu_vs_floor", "python-floor")]
    if name == _POOL_OF_TWO:
        refs.append(("cpu_vs_one_engine", _ONE_ENGINE))
    for key, ref in refs:
        other = others.get(ref)
        if other is not None and name not in ("direct", ref) and other["cpu_s_per_100k_chunks"]:
            out[key] = fig["cpu_s_per_100k_chunks"] / other["cpu_s_per_100k_chunks"]
    return out


def _summarise(per_peer: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Medians and spreads over rounds; differences against direct and ratios against nginx
    (and the pool's against one engine) are taken within each round first, so both sides of each
    saw the same moment of the machine."""
    out: dict[str, dict[str, Any]] = {}
    for name, rounds in per_peer.items():
        series: dict[str, list[float]] = {}
        for i, fig in enumerate(rounds):
            same_round = {other: figs[i] for other, figs in per_peer.items()}
            values = {key: fig.get(key) for key in _LOAD_FIGURES}
            values.update(_against(name, fig, same_round))
            for key, value in values.items():
                if value is not None:
                    series.setdefault(key, []).append(value)
        summary: dict[str, Any] = {key: median(vals) for key, vals in series.items()}
        summary["spread"] = {key: spread(vals) for key, vals in series.items()}
        if name != "direct":
            summary["saturated"] = (summary.get("cpu_share_of_core") or 0) >= _SATURATED_CPU or (
                summary.get("slowdown_vs_direct") or 0
            ) >= _SATURATED_SLOWDOWN
        out[name] = summary
    return out


def _start_peers(
    stack: contextlib.ExitStack[bool | None],
    peers: tuple[str, ...],
    engines: list[str],
    litellm_python: str | None,
    missing: dict[str, str],
) -> list[Peer]:
    """Start each of ``peers`` in front of ``engines`` (stopped when ``stack`` closes); those
    that cannot start are noted in ``missing`` with why, and the run goes on without them."""
    python = litellm_python or default_litellm_python()
    running: list[Peer] = []
    for name in peers:
        try:
            running.append(stack.enter_context(start_peer(name, engines, litellm_python=python)))
        except (Missing, RuntimeError, OSError) as exc:
            missing[name] = str(exc)
            print(f"peer {name} missing: {exc}", flush=True)
    return running


def run(
    *,
    streams: int = 50,
    chunks: int = 500,
    itl_ms: float = 10.0,
    rounds: int = 5,
    burst: int = 100,
    peers: tuple[str, ...] = PEERS,
    litellm_python: str | None = None,
) -> dict[str, Any]:
    """Run the comparison and return the report (see the module docstring)."""
    from streamsafe.engine_sim import SimConfig, Simulator
    from streamsafe.server import ServerThread

    config = SimConfig(
        memory_tokens=max(1_000_000, (streams + burst) * (chunks + 64) * 4),
        max_num_seqs=max(streams, burst, 1),
        itl_ms=itl_ms,
        itl_ms_per_seq=0.0,
        prefill_ms_per_token=0.0,
        default_max_tokens=chunks,
    )
    # As many engines as the most any peer uses (two for the pool), alike; each peer but the pool
    # uses the first. They run in this process, which otherwise only waits: the machine carries
    # the same processes whether one engine or two serve the load.
    taps = Taps([Tap(Simulator(config)) for _ in range(max(map(engines_used, peers), default=1))])
    missing: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(ServerThread(t, loop="uvloop")).url for t in taps.taps]
        running = _start_peers(stack, peers, engines, litellm_python, missing)
        for peer in running:  # warm-up: imports, first connections, pools
            run_load(peer.url, min(streams, 8), 8, f"{peer.name}-warmup")
        per_peer: dict[str, list[dict[str, Any]]] = {p.name: [] for p in running}
        for r in range(max(1, rounds)):
            shift = r % max(len(running), 1)
            for peer in running[shift:] + running[:shift]:
                fig = _round(peer, taps, streams, chunks, burst, r)
                per_peer[peer.name].append(fig)
                print(f"  round {r + 1}: {_round_line(peer.name, fig)}", flush=True)
    summary = _summarise(per_peer)
    return {
        "bench": "peers",
        "streams": streams,
        "chunks_per_stream": chunks,
        "itl_ms": itl_ms,
        "rounds": max(1, rounds),
        "burst": burst,
        "engines": len(taps.taps),
        "cpus": os.cpu_count(),
        "peers": {
            p.name: {
                "version": p.version,
                "command": p.command,
                "summary": summary[p.name],
                "rounds": per_peer[p.name],
            }
            for p in running
        },
        "missing": missing,
    }


def _round_line(name: str, fig: dict[str, Any]) -> str:
    line = (
        f"{name:24s} CPU {fig['cpu_s_per_100k_chunks']:7.2f} s/100k chunks, latency p50 "
        f"{_fmt(fig['latency_ms_p50'])} ms p99 {_fmt(fig['latency_ms_p99'])} ms, "
        f"preempted {fig['preempted_per_1k_chunks']:.0f} / 1k chunks"
    )
    if engines_used(name) > 1:
        line += f", streams per engine {' / '.join(map(str, fig['streams_per_engine']))}"
    return line


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(report: dict[str, Any]) -> str:
    """The report as the Markdown table the docs show."""
    head = (
        f"{report['streams']} streams x {report['chunks_per_stream']} chunks @ "
        f"{report['itl_ms']:g} ms, burst of {report['burst']}, median of {report['rounds']} "
        f"interleaved rounds"
    )
    lines = [
        head,
        "",
        "| peer | CPU s / 100k chunks | vs nginx | vs python-floor | added p50 / p99 ms per chunk "
        "| TTFT added at burst p50 / p99 ms | TTFT over nginx p50 ms | CPU ms / request "
        "| RSS KiB / stream | saturated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, peer in report["peers"].items():
        s = peer["summary"]
        if name == "direct":
            lines.append(
                f"| direct | - | - | ({_fmt(s.get('latency_ms_p50'))} / "
                f"{_fmt(s.get('latency_ms_p99'))} absolute) | ({_fmt(s.get('burst_ttft_ms_p50'))}"
                f" / {_fmt(s.get('burst_ttft_ms_p99'))} absolute) | - | - | - | - | - |"
            )
            continue
        ratio = "1.00x" if name == "nginx" else _fmt(s.get("cpu_vs_nginx")) + "x"
        to_floor = "1.00x" if name == "python-floor" else _fmt(s.get("cpu_vs_floor")) + "x"
        lines.append(
            f"| {name} {peer['version']} | {_fmt(s.get('cpu_s_per_100k_chunks'))} | {ratio} "
            f"| {to_floor} "
            f"| {_fmt(s.get('added_latency_ms_p50'))} / {_fmt(s.get('added_latency_ms_p99'))} "
            f"| {_fmt(s.get('added_burst_ttft_ms_p50'), 1)} / "
            f"{_fmt(s.get('added_burst_ttft_ms_p99'), 1)} "
            f"| {'-' if name == 'nginx' else _fmt(s.get('burst_ttft_ms_p50_over_nginx'), 1)} "
            f"| {_fmt(s.get('cpu_ms_per_request'))} | {_fmt(s.get('rss_per_stream_kib'), 0)} "
            f"| {'yes' if s.get('saturated') else 'no'} |"
        )
    for name, reason in report["missing"].items():
        first = reason.strip().splitlines()[0][:120] if reason.strip() else "unknown"
        lines.append(f"| {name} | missing: {first} | | | | | | | | |")
    return "\n".join(lines + _pool_lines(report)) + "\n"


def _pool_lines(report: dict[str, Any]) -> list[str]:
    """Under the table: the pool's gateway CPU per chunk over one engine's, and how the pool's
    engines shared the streams."""
    pool = report["peers"].get(_POOL_OF_TWO)
    if pool is None or _ONE_ENGINE not in report["peers"]:
        return []
    ratio = pool["summary"].get("cpu_vs_one_engine")
    low, high = pool["summary"]["spread"].get("cpu_vs_one_engine") or (None, None)
    shares = [fig["streams_per_engine"] for fig in pool["rounds"]]
    split = " / ".join(str(sum(col)) for col in zip(*shares, strict=True))
    return [
        "",
        f"{_POOL_OF_TWO} / {_ONE_ENGINE}, gateway CPU per chunk in the same round: "
        f"{_fmt(ratio)}x (rounds {_fmt(low)}x to {_fmt(high)}x; goal at most 1.15x); "
        f"the pool's streams per engine over the rounds: {split}",
    ]


def _main(args: argparse.Namespace) -> int:
    peers = tuple(args.peers.split(",")) if args.peers else PEERS
    report = run(
        streams=args.streams,
        chunks=args.chunks,
        itl_ms=args.itl_ms,
        rounds=args.rounds,
        burst=args.burst,
        peers=peers,
        litellm_python=args.litellm_python,
    )
    table = markdown_table(report)
    print(table, flush=True)
    write_json(args.json, report)
    write_text(args.markdown, table)
    if args.plot:
        from streamsafe_bench.plots import plot_peers

        plot_peers(report, args.plot)
    return 0


def register(subparsers: Any) -> None:
    """Add ``bench peers``."""
    p = subparsers.add_parser(
        "peers", help="streamsafe's gateway vs nginx and the LiteLLM proxy, per chunk and request"
    )
    p.add_argument("--streams", type=int, default=50, help="concurrent streams (default 50)")
    p.add_argument("--chunks", type=int, default=500, help="chunks per stream (default 500)")
    p.add_argument("--itl-ms", type=float, default=10.0, help="simulator ms per token (default 10)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--burst", type=int, default=100, help="requests at once in the burst (100)")
    p.add_argument("--peers", help=f"comma-separated subset of {','.join(PEERS)} (default all)")
    p.add_argument(
        "--litellm-python",
        help="interpreter of the LiteLLM virtualenv (default $STREAMSAFE_LITELLM_PYTHON or "
        ".venv-litellm/bin/python)",
    )
    add_output_flags(p, plot=True, markdown=True)
    p.set_defaults(func=_main)
