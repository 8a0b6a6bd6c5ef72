"""The gateway's command-line options and running it in the foreground.

``streamsafe serve`` is assembled in :mod:`streamsafe.serve_cli`, which adds the in-process
simulator used when no ``--upstream`` is given; this module knows only the gateway.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_arguments", "build_config", "build_limits", "serve"]


#: The groups of ``streamsafe serve --help``, in order: (title, what they hold).
_GROUPS = (
    ("listening", "where the gateway listens and what one connection may cost"),
    ("upstreams", "the engines behind it"),
    ("admission", "what enters the engine, when streams commit, what is kept for replay"),
    ("timeouts", "upstream attempts, client connections, the drain at shutdown"),
    ("replicas", "several gateways sharing one Redis"),
    ("tenants", "API keys"),
)


def add_arguments(p: argparse.ArgumentParser) -> dict[str, Any]:
    """Add the gateway's options to ``p``, in groups (``--help`` shows them so); the groups,
    by title, for options added after (``streamsafe serve`` adds its simulator's)."""
    p.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help="settings from a TOML file: the keys are the long option names (port = 8000, "
        'upstream = ["http://a:8000"], max-memory-tokens = 30000); an option given on the '
        "command line wins over the file",
    )
    p.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry spans per request, generation and upstream attempt, sent over "
        "OTLP/HTTP to $OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318), traceparent "
        "passed upstream; needs pip install 'streamsafe[otel]'",
    )
    groups = {title: p.add_argument_group(title, about) for title, about in _GROUPS}
    listening, upstreams, admission = groups["listening"], groups["upstreams"], groups["admission"]
    timeouts, replicas, tenants = groups["timeouts"], groups["replicas"], groups["tenants"]
    listening.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    listening.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    listening.add_argument(
        "--max-connections",
        type=int,
        default=4096,
        help="open connections at once; past it 503 (default 4096; 0: no cap)",
    )
    listening.add_argument(
        "--max-header-kb",
        type=int,
        default=64,
        help="largest request header section, KiB; past it 431 (default 64)",
    )
    listening.add_argument(
        "--max-header-line-kb",
        type=int,
        default=16,
        help="largest header line, KiB; past it 431 (default 16)",
    )
    listening.add_argument(
        "--max-body-kb", type=int, default=4096, help="largest request body, KiB (default 4096)"
    )
    listening.add_argument(
        "--admin-key",
        default=None,
        help="bearer key /stats and /metrics require (default $STREAMSAFE_ADMIN_KEY; "
        "none: they are open)",
    )
    upstreams.add_argument(
        "--upstream",
        action="append",
        default=None,
        help="engine base URL, e.g. http://127.0.0.1:8001 (default: start the simulator here); "
        "repeat it for a pool of engines, each optionally with the models it serves and a "
        "weight and the engine memory its generations may hold: "
        '--upstream "http://a:8000 models=llama-8b weight=2 memory=30000"',
    )
    upstreams.add_argument(
        "--upstream-kind",
        choices=("auto", "vllm", "ogx", "llama-stack", "openai"),
        default="auto",
        help="what the upstream is: ogx is today's Llama Stack (OGX, llama-stack >= 0.4), "
        "llama-stack its 0.2 releases (default auto: ask it at start which routes it serves and "
        "log the answer; with a pool, each engine is asked on its own)",
    )
    upstreams.add_argument(
        "--upstream-api-key",
        default=os.environ.get("STREAMSAFE_UPSTREAM_API_KEY"),
        help="key sent upstream (default $STREAMSAFE_UPSTREAM_API_KEY)",
    )
    upstreams.add_argument(
        "--upstream-ca-bundle",
        metavar="PEM",
        help="CAs an https:// upstream's certificate must chain to, e.g. OGX's self-signed one "
        "(default: the system's)",
    )
    upstreams.add_argument(
        "--forward-authorization",
        action="store_true",
        help="send each caller's own Authorization upstream on every route, for an upstream "
        "that authenticates its users (OGX with auth); each credential is then a tenant of its "
        "own unless --api-key names the tenants",
    )
    upstreams.add_argument(
        "--engine-refusals",
        choices=("wait", "answer"),
        default="wait",
        help="an engine's 429/503 before any work: wait for room, asking again after each "
        "Retry-After (default), or answer it at once and answer the caller's retries of it "
        "without asking the engine while it refuses (behind a server whose client retries, "
        "such as OGX)",
    )
    upstreams.add_argument(
        "--fallback-model",
        action="append",
        default=[],
        metavar="MODEL=OTHER",
        help="with a pool: OTHER answers when no engine of MODEL can, and takes MODEL's "
        "context-length 400s (repeatable)",
    )
    upstreams.add_argument(
        "--failover-attempts",
        type=int,
        default=3,
        help="with a pool: attempts of a request before its first token, across engines "
        "(default 3)",
    )
    upstreams.add_argument(
        "--probe-interval",
        type=float,
        default=1.0,
        help="seconds between /health probes of a dead engine (default 1)",
    )
    upstreams.add_argument(
        "--max-continuations",
        type=int,
        default=5,
        help="times a broken upstream attempt is made again: a chat stream continued, a "
        "request dropped before its answer asked again (default 5; 0: never)",
    )
    upstreams.add_argument(
        "--collapse-identical",
        action="store_true",
        help="attach an identical request to a running generation, or one finished within "
        "--grace, even without a retry marker (behind Llama Stack; identical sampled prompts "
        "then share one sample)",
    )
    admission.add_argument(
        "--max-inflight",
        type=int,
        default=256,
        help="generations upstream at once (default 256; 0 for no limit)",
    )
    admission.add_argument(
        "--max-memory-tokens",
        type=int,
        default=0,
        help="engine memory budget in tokens, prompt + max_tokens (default 0: no limit)",
    )
    admission.add_argument(
        "--default-max-tokens",
        type=int,
        default=1024,
        help="max_tokens assumed when a request gives none (default 1024)",
    )
    admission.add_argument(
        "--queue-size", type=int, default=1024, help="requests waiting for admission (default 1024)"
    )
    admission.add_argument(
        "--queue-timeout",
        type=float,
        default=20.0,
        help="seconds a request may wait for admission (default 20)",
    )
    admission.add_argument(
        "--commit",
        choices=("early", "first-token"),
        default="early",
        help="when a stream's headers go out (default early)",
    )
    admission.add_argument(
        "--heartbeat",
        type=float,
        default=5.0,
        help="seconds between keep-alive comments while a stream waits for its first token, "
        "and of silence after which one goes out mid-stream (default 5; 0 for none)",
    )
    admission.add_argument(
        "--json-keepalive",
        action="store_true",
        help="keep waiting non-streaming calls alive with whitespace (a later failure is then "
        "a 200 with an error body)",
    )
    admission.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds before abandoned work is aborted (default 5; 0 allowed)",
    )
    admission.add_argument(
        "--keep-finished",
        type=float,
        default=300.0,
        help="seconds finished generations are kept for replay (default 300)",
    )
    admission.add_argument(
        "--max-kept-mb",
        type=float,
        default=64.0,
        help="memory for finished generations, MiB (default 64)",
    )
    admission.add_argument(
        "--max-kept",
        type=int,
        default=20_000,
        help="finished generations kept for replay, at most (default 20000)",
    )
    admission.add_argument(
        "--on-live-duplicate",
        choices=("attach", "409"),
        default="attach",
        help="answer to a duplicate of a live keyed request (default attach)",
    )
    timeouts.add_argument(
        "--first-token-timeout",
        type=float,
        default=60.0,
        help="seconds from sending upstream to a stream's first event before the attempt is cut "
        "and asked again (default 60; 0: none; non-streamed calls: total timeout only)",
    )
    timeouts.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        help="seconds of upstream silence mid-stream before it is cut and continued "
        "(default 30; 0: none)",
    )
    timeouts.add_argument(
        "--total-timeout",
        type=float,
        default=600.0,
        help="seconds a generation may take upstream in all (default 600; 0: none)",
    )
    timeouts.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds for a request's headers to arrive; past it 408 (default 10)",
    )
    timeouts.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        help="seconds between reads of an unfinished body; past it 408 (default 30)",
    )
    timeouts.add_argument(
        "--send-timeout",
        type=float,
        default=30.0,
        help="seconds a response may wait for a client that stopped reading; past it the "
        "connection is reset (default 30)",
    )
    timeouts.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=5.0,
        help="seconds a kept-alive connection may sit idle before it is closed; above a load "
        "balancer's own idle timeout, so that it, not the gateway, closes (default 5)",
    )
    timeouts.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM or Ctrl-C, seconds running streams get to finish while new work is "
        "refused with 503; then they end with an error event (with --redis: handed to another "
        "replica) and the process exits (default 30)",
    )
    replicas.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="redis:// URL of the store shared by gateway replicas (default: this process only)",
    )
    replicas.add_argument(
        "--redis-secret",
        default=None,
        metavar="SECRET",
        help="a secret every replica is given (also STREAMSAFE_REDIS_SECRET): prompts and "
        "provider data are sealed in Redis with it; without it provider data is kept out of "
        "Redis and prompts are kept in clear",
    )
    replicas.add_argument(
        "--lease",
        type=float,
        default=3.0,
        help="seconds a replica's lease on a generation lasts; a dead replica's generations are "
        "taken over after it (default 3)",
    )
    replicas.add_argument(
        "--orphan-ttl",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="seconds the Redis keys of a running generation outlive their replica's last "
        "renewal: what a dead replica's generation that nobody took over leaves in Redis is "
        "gone after it (default 3600; at least three leases)",
    )
    tenants.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="accepted API key (repeatable; also STREAMSAFE_API_KEYS, comma-separated)",
    )
    tenants.add_argument(
        "--tenant-passthrough",
        choices=("refuse", "shared"),
        default="refuse",
        help="with API keys, what a tenant may pass through to the upstream: refuse (default) "
        "passes only the model list, /v1/health and /v1/version, and answers the rest 403, "
        "as every tenant reaches the upstream under one identity; shared passes every route",
    )
    tenants.add_argument(
        "--tenant-weight",
        action="append",
        default=[],
        metavar="KEY=WEIGHT",
        help="share of admission of an API key's tenant (repeatable; default 1 each)",
    )
    return groups


def _weight(spec: str) -> tuple[str, float]:
    key, sep, weight = spec.rpartition("=")
    try:
        value = float(weight)
    except ValueError:
        value = 0.0
    if not sep or not key or not value > 0:
        raise SystemExit(f"--tenant-weight wants KEY=WEIGHT with a weight > 0, not {spec!r}")
    return key, value


def build_config(args: argparse.Namespace, upstream: str) -> Any:
    """The :class:`GatewayConfig` the parsed arguments describe."""
    from streamsafe.gateway.config import GatewayConfig

    given = list(args.upstream or [])
    # One plain URL keeps the single-upstream gateway; more, or options, make a pool.
    engines = tuple(given) if len(given) > 1 or any(" " in u.strip() for u in given) else ()
    keys = list(args.api_key)
    keys += [k.strip() for k in os.environ.get("STREAMSAFE_API_KEYS", "").split(",") if k.strip()]
    return GatewayConfig(
        upstream=upstream,
        upstream_kind=args.upstream_kind,
        collapse_identical=args.collapse_identical,
        grace=args.grace,
        commit=args.commit,
        heartbeat=args.heartbeat,
        json_keepalive=args.json_keepalive,
        max_inflight=args.max_inflight or None,
        max_memory_tokens=args.max_memory_tokens or None,
        default_max_tokens=args.default_max_tokens,
        queue_size=args.queue_size,
        queue_timeout=args.queue_timeout,
        keep_finished=args.keep_finished,
        max_kept_bytes=int(args.max_kept_mb * 1024 * 1024),
        max_kept_generations=args.max_kept,
        api_keys=tuple(keys),
        tenant_passthrough=args.tenant_passthrough,
        tenant_weights=tuple(_weight(spec) for spec in args.tenant_weight),
        max_body_bytes=args.max_body_kb * 1024,
        on_live_duplicate=args.on_live_duplicate,
        upstream_api_key=args.upstream_api_key,
        upstream_ca_bundle=args.upstream_ca_bundle,
        forward_authorization=args.forward_authorization,
        engine_refusals=args.engine_refusals,
        probe_interval=args.probe_interval,
        max_continuations=args.max_continuations,
        redis_url=args.redis,
        redis_secret=args.redis_secret or os.environ.get("STREAMSAFE_REDIS_SECRET") or None,
        lease=args.lease,
        orphan_ttl=args.orphan_ttl,
        engines=engines,
        fallback_models=tuple(args.fallback_model),
        failover_attempts=args.failover_attempts,
        first_token_timeout=args.first_token_timeout or None,
        idle_timeout=args.idle_timeout or None,
        total_timeout=args.total_timeout or None,
        admin_key=args.admin_key or os.environ.get("STREAMSAFE_ADMIN_KEY") or None,
        tracing=args.otel,
    )


def build_limits(args: argparse.Namespace) -> Any:
    """The :class:`~streamsafe.serving.ServerLimits` the parsed arguments describe."""
    from streamsafe.serving import ServerLimits

    return ServerLimits(
        max_header_bytes=args.max_header_kb * 1024,
        max_header_line_bytes=args.max_header_line_kb * 1024,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        send_timeout=args.send_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections or None,
    )


def serve(args: argparse.Namespace, upstream: str) -> int:
    """Run the gateway the parsed arguments describe in front of ``upstream`` until interrupted
    (``args`` as ``streamsafe serve`` parses them); the exit code."""
    from streamsafe.gateway.app import Gateway
    from streamsafe.gateway.engines.pool import parse_engine
    from streamsafe.serving import run_server

    try:
        upstream = parse_engine(upstream).url  # the first of a pool may carry options
    except ValueError as exc:
        print(f"streamsafe serve: {exc}")
        return 2
    if args.otel:
        from streamsafe.gateway.tracing import TracingUnavailable, setup_otlp

        try:
            setup_otlp()
        except TracingUnavailable as exc:
            print(f"streamsafe serve: {exc}")
            return 2
    try:
        gateway = Gateway(build_config(args, upstream))
        limits = build_limits(args)
    except ValueError as exc:
        print(f"streamsafe serve: {exc}")
        return 2
    keys = len(gateway.config.api_keys)
    pool = gateway.config.engines
    target = f"{len(pool)} engines ({', '.join(pool)})" if pool else upstream

    def announce(url: str) -> None:
        print(
            f"streamsafe gateway on {url} -> {target} ({args.upstream_kind}) "
            f"(commit {args.commit}, grace {args.grace:g} s, {keys} API key(s))",
            flush=True,
        )

    run_server(
        gateway,
        host=args.host,
        port=args.port,
        announce=announce,
        limits=limits,
        drain=lambda: gateway.drain(args.drain_timeout),
    )
    return 0
