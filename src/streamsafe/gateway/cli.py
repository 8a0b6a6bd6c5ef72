"""The gateway's command line: its options on a parser, in the groups of :data:`GROUPS` (what
it talks to in :mod:`streamsafe.gateway.cli_options`, what it admits and how long it waits in
:mod:`streamsafe.gateway.cli_bounds`), the configuration and limits they describe, and running
the gateway in the foreground.

``streamsafe serve`` is assembled in :mod:`streamsafe.serve_cli`, which adds the in-process
simulator used when no ``--upstream`` is given; this module knows only the gateway.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamsafe.gateway.cli_bounds import add_admission, add_tenants, add_timeouts
from streamsafe.gateway.cli_options import (
    Options,
    add_general,
    add_listening,
    add_replicas,
    add_upstreams,
)

if TYPE_CHECKING:
    from streamsafe.gateway.app import Gateway

__all__ = ["GROUPS", "add_arguments", "build_config", "build_limits", "serve"]


#: The groups of ``streamsafe serve --help``, in order: (title, what they hold, their options).
GROUPS: tuple[tuple[str, str, Callable[[Options], None]], ...] = (
    ("listening", "where the gateway listens and what one connection may cost", add_listening),
    ("upstreams", "the engines behind it", add_upstreams),
    (
        "admission",
        "what enters the engine, when streams commit, what is kept for replay",
        add_admission,
    ),
    ("timeouts", "upstream attempts, client connections, the drain at shutdown", add_timeouts),
    ("replicas", "several gateways sharing one Redis", add_replicas),
    ("tenants", "API keys", add_tenants),
)


def add_arguments(p: argparse.ArgumentParser) -> dict[str, Any]:
    """Add the gateway's options to ``p``, in groups (``--help`` shows them so, see
    :data:`GROUPS`); the groups, by title, for options added after
    (``streamsafe serve`` adds its simulator's)."""
    add_general(p)
    groups = {}
    for title, about, add in GROUPS:
        groups[title] = group = p.add_argument_group(title, about)
        add(group)
    return groups


def _weight(spec: str) -> tuple[str, float]:
    key, sep, weight = spec.rpartition("=")
    try:
        value = float(weight)
    except ValueError:
        value = 0.0
    if not sep or not key or not (value > 0 and math.isfinite(value)):
        # The key is a tenant's secret: the message names the weight only.
        raise ValueError(
            f"--tenant-weight wants KEY=WEIGHT with a finite weight > 0, not KEY={weight!r}"
            if sep
            else "--tenant-weight wants KEY=WEIGHT with a finite weight > 0"
        )
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
        redis_ca_certs=args.redis_ca_certs,
        redis_secret=args.redis_secret or os.environ.get("STREAMSAFE_REDIS_SECRET") or None,
        lease=args.lease,
        orphan_ttl=args.orphan_ttl,
        engines=engines,
        fallback_models=tuple(args.fallback_model),
        failover_attempts=args.failover_attempts,
        first_token_timeout=args.first_token_timeout or None,
        idle_timeout=args.idle_timeout or None,
        stall_timeout=args.stall_timeout or None,
        total_timeout=args.total_timeout or None,
        admin_key=args.admin_key or os.environ.get("STREAMSAFE_ADMIN_KEY") or None,
        tracing=args.otel,
    )


def build_limits(args: argparse.Namespace) -> Any:
    """The :class:`~streamsafe.server.ServerLimits` the parsed arguments describe."""
    from streamsafe.server import ServerLimits

    return ServerLimits(
        max_header_bytes=args.max_header_kb * 1024,
        max_header_line_bytes=args.max_header_line_kb * 1024,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        min_body_rate=args.min_body_rate,
        send_timeout=args.send_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections or None,
        unfinished_share=args.unfinished_share,
    )


def serve(
    args: argparse.Namespace,
    upstream: str,
    *,
    sock: socket.socket | None = None,
    worker: int | None = None,
) -> int:
    """Run the gateway the parsed arguments describe in front of ``upstream`` until interrupted
    (``args`` as ``streamsafe serve`` parses them); the exit code. ``sock``: accept from this
    listening socket instead of binding ``--host``/``--port`` (worker ``worker`` of
    ``--workers N``, whose supervisor announced the address)."""
    from streamsafe.gateway.app import Gateway
    from streamsafe.gateway.engines.pool import parse_engine
    from streamsafe.server import run_server
    from streamsafe.server.tls import TlsError, server_context, tls_files

    try:
        parse_engine(upstream)  # the first of a pool may carry options
    except ValueError as exc:
        print(f"streamsafe serve: {exc}")
        return 2
    upstream = upstream.split()[0].rstrip("/")  # with its credentials, if any: they are used
    if args.otel:
        from streamsafe.gateway.tracing import TracingUnavailable, setup_otlp

        try:
            setup_otlp()
        except TracingUnavailable as exc:
            print(f"streamsafe serve: {exc}")
            return 2
    try:
        files = tls_files(args, os.environ.get("STREAMSAFE_TLS_KEYFILE_PASSWORD") or None)
        tls = server_context(files) if files is not None else None
        gateway = Gateway(build_config(args, upstream))
        limits = build_limits(args)
    except (TlsError, ValueError) as exc:
        print(f"streamsafe serve: {exc}")
        return 2
    run_server(
        gateway,
        host=args.host,
        port=args.port,
        announce=_announcement(args, gateway, upstream, worker),
        limits=limits,
        drain=lambda: gateway.drain(args.drain_timeout),
        sock=sock,
        tls=tls,
    )
    return 0


def _announcement(
    args: argparse.Namespace, gateway: Gateway, upstream: str, worker: int | None
) -> Callable[[str], None]:
    """What the gateway prints once it listens: where, in front of what (credentials
    redacted), and the settings an operator checks first."""
    from streamsafe._url_userinfo import redact

    keys = len(gateway.config.api_keys)
    pool = [str(e.spec) for e in gateway.engines.pool.engines] if gateway.config.engines else []
    target = f"{len(pool)} engines ({', '.join(pool)})" if pool else redact(upstream)

    def announce(url: str) -> None:
        who = "streamsafe gateway" if worker is None else f"worker {worker} (pid {os.getpid()})"
        print(
            f"{who} on {url} -> {target} ({args.upstream_kind}) "
            f"(commit {args.commit}, grace {args.grace:g} s, {keys} API key(s))",
            flush=True,
        )

    return announce
