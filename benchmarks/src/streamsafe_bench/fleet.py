"""``streamsafe bench fleet``: gateway replicas sharing Redis in front of an engine pool, with
one engine killed mid-run.

Real processes: ``redis-server``, ``engines`` simulators and ``replicas`` gateways (``streamsafe
serve --redis ... --upstream ... --upstream ...``). The streamsafe client sends an open-loop
arrival of streaming chats; a load balancer in the client process sends each attempt and each
resume to the next replica (round robin). Halfway through, one engine is killed (SIGKILL). We
record:

- amplification: engine generations per logical request (continuations are not new ones);
- completed requests, goodput (completed reply tokens per second) and p99 completion time;
- streams migrated (continued on the other engine) and attempts failed over before their first
  token; time to fail over: the longest wait, among the streams in flight at the kill, from the
  kill to their next token;
- tokens lost and repeated, against the simulator's deterministic text.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamsafe_bench.report import add_output_flags, write_json

if TYPE_CHECKING:
    from streamsafe.client import AsyncClient
    from streamsafe_bench.harness import Workload

__all__ = ["FleetSettings", "register", "run"]


@dataclass(frozen=True)
class FleetSettings:
    """Sizes of one run (defaults: 3 replicas x 2 engines, 60 requests over 6 s)."""

    replicas: int = 3
    engines: int = 2
    requests: int = 60
    window_s: float = 6.0
    max_tokens: int = 50
    itl_ms: float = 20.0
    #: When the engine dies, as a fraction of the arrival window (moved to midway between the
    #: two arrivals around it).
    kill_at: float = 0.5


@dataclass
class _Trace:
    """One logical request as its caller saw it."""

    ok: bool = False
    text: str = ""
    started: float = 0.0
    ended: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    resumes: int = 0
    error: str = ""


def _balancer(urls: list[str]) -> Any:
    """An httpx2 transport that sends each request to the next of ``urls``."""
    import httpx2

    class RoundRobin(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=None))
            self._targets = [httpx2.URL(u) for u in urls]
            self._n = 0

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            target = self._targets[self._n % len(self._targets)]
            self._n += 1
            request.url = request.url.copy_with(host=target.host, port=target.port)
            return await self._inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self._inner.aclose()

    return RoundRobin()


async def _one(client: Any, body: dict[str, Any], t0: float) -> _Trace:
    trace = _Trace(started=time.monotonic() - t0)
    parts: list[str] = []
    try:
        stream = await client.chat.completions.create(**body)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                trace.chunk_times.append(time.monotonic() - t0)
        trace.resumes = stream.resumes
        trace.ok = True
    except Exception as exc:
        trace.error = type(exc).__name__
    trace.text = "".join(parts)
    trace.ended = time.monotonic() - t0
    return trace


def _stats(url: str) -> dict[str, Any]:
    import httpx2

    return dict(httpx2.get(url + "/stats", timeout=10).json())


async def run_async(s: FleetSettings) -> dict[str, Any]:
    """Start the fleet, drive it, kill an engine halfway, and report."""
    from streamsafe_bench.harness import Workload
    from streamsafe_bench.processes import RedisServer, ServerProcess

    redis = RedisServer().start()
    started: list[ServerProcess] = []
    try:
        sims = [
            ServerProcess("simulate", "--itl-ms", f"{s.itl_ms:g}", "--itl-ms-per-seq", "0")
            for _ in range(s.engines)
        ]
        started += sims
        pool = [arg for sim in sims for arg in ("--upstream", sim.url)]
        gateways = [
            ServerProcess("serve", *pool, "--redis", redis.url, "--lease", "1")
            for _ in range(s.replicas)
        ]
        started += gateways
        workload = Workload(requests=s.requests, prompt_tokens=50, max_tokens=s.max_tokens)
        client = _client([g.url for g in gateways])
        rate = s.requests / s.window_s
        victim = sims[0]
        victim_stats: dict[str, Any] = {}
        # Midway between two arrivals: the kill meets streams in flight, never a request in the
        # instant it starts (whose first attempt the victim's last counters might or might not
        # include, then counted again where it failed over).
        kill_t = (int(s.window_s * s.kill_at * rate) + 0.5) / rate
        t0 = time.monotonic()

        async def arrive(i: int) -> _Trace:
            await asyncio.sleep(i / rate)
            return await _one(client, workload.body(i), t0)

        async def kill() -> None:
            await asyncio.sleep(kill_t)
            victim_stats.update(await asyncio.to_thread(_stats, victim.url))
            victim.kill()

        traces_and_kill = await asyncio.gather(*(arrive(i) for i in range(s.requests)), kill())
        traces: list[_Trace] = [t for t in traces_and_kill if isinstance(t, _Trace)]
        elapsed = max(t.ended for t in traces)
        await client.close()
        survivors = [await asyncio.to_thread(_stats, sim.url) for sim in sims[1:]]
        replica_stats = [await asyncio.to_thread(_stats, g.url) for g in gateways]
    finally:
        for proc in reversed(started):
            proc.stop()
        redis.stop()

    engine_stats = [victim_stats, *survivors]
    return _report(s, workload, traces, kill_t, elapsed, engine_stats, replica_stats)


#: What the report shows of each replica's counters.
_REPLICA_COUNTS = (
    "requests_received",
    "generations_started",
    "generations_mirrored",
    "resumed",
    "engine_failovers",
    "engine_migrations",
    "continued",
)


def _client(gateways: list[str]) -> AsyncClient:
    """The streamsafe client the load goes through, spread over the replicas by ``_balancer``."""
    import httpx2

    from streamsafe.client import AsyncClient, Timeouts

    return AsyncClient(
        base_url=gateways[0] + "/v1",
        api_key="bench",
        timeout=Timeouts(connect=10, first_byte=None, idle=30),
        http_client=httpx2.AsyncClient(transport=_balancer(gateways), timeout=None),
    )


def _failover_waits(traces: list[_Trace], kill_t: float) -> list[float]:
    """For each stream in flight at the kill, the wait from it to the stream's next token,
    sorted: it bounds the time to fail over (the dead engine's streams continue on the other
    engine within it)."""
    return sorted(
        next(c for c in t.chunk_times if c > kill_t) - kill_t
        for t in traces
        if t.chunk_times and t.chunk_times[0] <= kill_t < t.chunk_times[-1]
    )


def _report(
    s: FleetSettings,
    workload: Workload,
    traces: list[_Trace],
    kill_t: float,
    elapsed: float,
    engine_stats: list[dict[str, Any]],
    replica_stats: list[dict[str, Any]],
) -> dict[str, Any]:
    """The run's figures: answers exact, goodput, tail latency, the failover after the kill
    at ``kill_t`` (seconds into the run), and what each engine and replica counted."""
    from streamsafe_bench.harness import compare_tokens, expected_reply

    generations = sum(e["generations_started"] - e["continuations"] for e in engine_stats)
    lost = repeated = 0
    for i, trace in enumerate(traces):
        missing, extra = compare_tokens(expected_reply(workload, i, 0), trace.text)
        lost += missing
        repeated += extra
    completed = [t for t in traces if t.ok and len(t.text.split()) == s.max_tokens]
    latencies = sorted(t.ended - t.started for t in completed)
    waits = _failover_waits(traces, kill_t)
    return {
        "bench": "fleet",
        "settings": s.__dict__,
        "logical_requests": len(traces),
        "completed": len(completed),
        "amplification": round(generations / len(traces), 3),
        "goodput_tokens_per_s": round(len(completed) * s.max_tokens / elapsed, 1),
        "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3)
        if latencies
        else None,
        "streams_in_flight_at_kill": len(waits),
        "streams_migrated": sum(r.get("engine_migrations", 0) for r in replica_stats),
        "attempts_failed_over": sum(r.get("engine_failovers", 0) for r in replica_stats),
        "failover_s_max": round(waits[-1], 3) if waits else None,
        "tokens_lost": lost,
        "tokens_repeated": repeated,
        "client_resumes": sum(t.resumes for t in traces),
        "engine_generations": generations,
        "engine_continuations": sum(e["continuations"] for e in engine_stats),
        "replicas": [{k: r.get(k, 0) for k in _REPLICA_COUNTS} for r in replica_stats],
        "errors": sorted({t.error for t in traces if t.error}),
        "kill_at_s": kill_t,
        "series": [[round(c, 3) for c in t.chunk_times] for t in traces],
    }


def run(settings: FleetSettings | None = None) -> dict[str, Any]:
    """One run with ``settings`` (default :class:`FleetSettings`); the report."""
    return asyncio.run(run_async(settings or FleetSettings()))


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = report["settings"]
    table = Table(
        title=f"Fleet: {s['replicas']} replicas x {s['engines']} engines, "
        f"{report['logical_requests']} streams over {s['window_s']:g} s, "
        f"engine 1 killed at {report['kill_at_s']:g} s"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in (
        "completed",
        "amplification",
        "goodput_tokens_per_s",
        "p99_s",
        "streams_in_flight_at_kill",
        "streams_migrated",
        "attempts_failed_over",
        "failover_s_max",
        "tokens_lost",
        "tokens_repeated",
        "client_resumes",
    ):
        table.add_row(key, str(report[key]))
    Console().print(table)


def _main(args: argparse.Namespace) -> int:
    settings = FleetSettings(
        replicas=args.replicas,
        engines=args.engines,
        requests=args.requests,
        window_s=args.window,
        max_tokens=args.max_tokens,
    )
    if settings.engines < 2:
        print("streamsafe bench fleet: at least 2 engines (one of them is killed)")
        return 2
    report = run(settings)
    _print(report)
    write_json(args.json, report)
    if args.plot:
        from streamsafe_bench.plots import plot_fleet

        plot_fleet(report, args.plot)
    ok = report["completed"] == report["logical_requests"]
    return 0 if ok and report["tokens_lost"] == report["tokens_repeated"] == 0 else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fleet",
        help="replicas sharing Redis x an engine pool, one engine killed mid-run "
        "(needs redis-server)",
    )
    p.add_argument("--replicas", type=int, default=3, help="gateway replicas (default 3)")
    p.add_argument("--engines", type=int, default=2, help="engines, one is killed (default 2)")
    p.add_argument("--requests", type=int, default=60, help="streams sent (default 60)")
    p.add_argument("--window", type=float, default=6.0, help="seconds of arrivals (default 6)")
    p.add_argument("--max-tokens", type=int, default=50, help="tokens per answer (default 50)")
    add_output_flags(p, plot=True)
    p.set_defaults(func=_main)
