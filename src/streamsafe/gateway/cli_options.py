"""The options of ``streamsafe serve`` outside every group, and the groups that say what the
gateway talks to: where it listens, the engines behind it (and what is done when one refuses
or fails), the replicas it shares generations with. What it admits and how long it waits are
:mod:`streamsafe.gateway.cli_bounds`'s; :data:`streamsafe.gateway.cli.GROUPS` orders the groups
of ``--help`` and :func:`streamsafe.gateway.cli.add_arguments` puts them on a parser. Here too:
what a number option takes, for both.

Each option's help states its default; ``docs/cli.md`` is generated from it (``make docs``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Protocol

from streamsafe._option_numbers import Number
from streamsafe.server.tls import add_tls_options

__all__ = [
    "COUNT",
    "NUMBER",
    "PORT",
    "POSITIVE",
    "POSITIVE_COUNT",
    "Options",
    "add_general",
    "add_listening",
    "add_replicas",
    "add_upstreams",
]

# What each number option takes; refused at start, before anything runs (exit code 2).
PORT = Number(integer=True, least=0, most=65535)
COUNT = Number(integer=True, least=0)
POSITIVE_COUNT = Number(integer=True, least=1)
NUMBER = Number(least=0)
POSITIVE = Number(least=0, above=True)


class Options(Protocol):
    """Where options are added: a parser, or one of its groups."""

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action: ...


def add_general(p: Options) -> None:
    """The options outside every group: a settings file, tracing."""
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


def add_listening(group: Options) -> None:
    """Where the gateway listens and what one connection may cost; the admin key."""
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    group.add_argument("--port", type=PORT, default=8000, help="port (default 8000)")
    add_tls_options(group)
    group.add_argument(
        "--max-connections",
        type=COUNT,
        default=4096,
        help="open connections at once; past it 503 (default 4096; 0: no cap)",
    )
    group.add_argument(
        "--unfinished-share",
        type=float,
        default=0.25,
        help="share of --max-connections one client address may hold with requests still "
        "arriving (headers or body); past it 503 (default 0.25; 1: no bound under the cap; "
        "behind a proxy that connects from one address for all its clients, 1)",
    )
    group.add_argument(
        "--max-header-kb",
        type=POSITIVE_COUNT,
        default=64,
        help="largest request header section, KiB; past it 431 (default 64)",
    )
    group.add_argument(
        "--max-header-line-kb",
        type=POSITIVE_COUNT,
        default=16,
        help="largest header line, KiB; past it 431 (default 16)",
    )
    group.add_argument(
        "--max-body-kb",
        type=POSITIVE_COUNT,
        default=4096,
        help="largest request body, KiB (default 4096)",
    )
    group.add_argument(
        "--admin-key",
        default=None,
        help="bearer key /stats and /metrics require (default $STREAMSAFE_ADMIN_KEY; "
        "none: they are open)",
    )


def add_upstreams(group: Options) -> None:
    """The engines behind the gateway: where they are and what they are, then what is done
    when one refuses or fails; identical requests collapsed."""
    _add_engines(group)
    _add_engine_failures(group)
    group.add_argument(
        "--collapse-identical",
        nargs="?",
        const="all",
        default="auto",
        choices=("auto", "deterministic", "all", "off"),
        help="attach an identical request of one tenant to a running generation, or one "
        "finished within --grace, even without a retry marker (behind a server a client's retry "
        "comes as a fresh call): auto (default) for greedy or seeded requests, whose answer "
        "sharing changes nothing, and plain calls, which a server runs on after its client left; "
        "deterministic for greedy or seeded ones only; all (the bare flag) sampled streams too; "
        "off",
    )


def _add_engines(group: Options) -> None:
    """Where the engines are, what kind, and the credentials sent to them."""
    group.add_argument(
        "--upstream",
        action="append",
        default=None,
        help="engine base URL, e.g. http://127.0.0.1:8001 (default: start the simulator here); "
        "repeat it for a pool of engines, each optionally with the models it serves and a "
        "weight and the engine memory its generations may hold: "
        '--upstream "http://a:8000 models=llama-8b weight=2 memory=30000"',
    )
    group.add_argument(
        "--upstream-kind",
        choices=("auto", "vllm", "ogx", "llama-stack", "openai"),
        default="auto",
        help="what the upstream is: ogx is today's Llama Stack (OGX, llama-stack >= 0.4), "
        "llama-stack its 0.2 releases (default auto: ask it at start which routes it serves and "
        "log the answer; with a pool, each engine is asked on its own)",
    )
    group.add_argument(
        "--upstream-api-key",
        default=os.environ.get("STREAMSAFE_UPSTREAM_API_KEY"),
        help="key sent upstream (default $STREAMSAFE_UPSTREAM_API_KEY)",
    )
    group.add_argument(
        "--upstream-ca-bundle",
        metavar="PEM",
        help="CAs an https:// upstream's certificate must chain to, e.g. OGX's self-signed one "
        "(default: the system's)",
    )
    group.add_argument(
        "--forward-authorization",
        action="store_true",
        help="send each caller's own Authorization upstream on every route, for an upstream "
        "that authenticates its users (OGX with auth); each credential is then a tenant of its "
        "own unless --api-key names the tenants",
    )


def _add_engine_failures(group: Options) -> None:
    """An engine's refusals, a pool's fallbacks and failover, dead engines' probes, broken
    attempts made again."""
    group.add_argument(
        "--engine-refusals",
        choices=("wait", "answer"),
        default="wait",
        help="an engine's 429/503 before any work: wait for room with the engine's other "
        "refused calls, one probe asking again with backoff (at most 6 engine requests a call; "
        "default), or answer it at once; either way the same body is answered from the "
        "refusal without asking the engine while it refuses",
    )
    group.add_argument(
        "--fallback-model",
        action="append",
        default=[],
        metavar="MODEL=OTHER",
        help="with a pool: OTHER answers when no engine of MODEL can, and takes MODEL's "
        "context-length 400s (repeatable)",
    )
    group.add_argument(
        "--failover-attempts",
        type=POSITIVE_COUNT,
        default=3,
        help="with a pool: attempts of a request before its first token, across engines "
        "(default 3)",
    )
    group.add_argument(
        "--probe-interval",
        type=POSITIVE,
        default=1.0,
        help="seconds between /health probes of a dead engine (default 1)",
    )
    group.add_argument(
        "--max-continuations",
        type=COUNT,
        default=5,
        help="times a broken upstream attempt is made again: a chat stream continued, a "
        "request dropped before its answer asked again (default 5; 0: never)",
    )


def add_replicas(group: Options) -> None:
    """Several gateways sharing one Redis: where, its secret, the lease, orphans' lifetime."""
    group.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="URL of the Redis shared by gateway replicas (default: this process only): "
        "redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://... (TLS), unix:///PATH.sock[?db=N], "
        "redis+sentinel://HOST:PORT[,HOST:PORT]/SERVICE[/DB] (the primary a Sentinel group names, "
        "found again after a failover), or redis+cluster://HOST:PORT[,HOST:PORT] (a Redis "
        "Cluster; rediss+cluster:// over TLS)",
    )
    group.add_argument(
        "--redis-ca-certs",
        default=None,
        metavar="FILE",
        help="CA certificates (PEM) a rediss:// server is verified against (default: the "
        "system's, or the URL's ?ssl_ca_certs=)",
    )
    group.add_argument(
        "--redis-secret",
        default=None,
        metavar="SECRET",
        help="a secret every replica is given (also STREAMSAFE_REDIS_SECRET): prompts, "
        "provider data, answers and idempotency keys are sealed in Redis with it; without it "
        "provider data is kept out of Redis and prompts and answers are kept in clear",
    )
    group.add_argument(
        "--lease",
        type=POSITIVE,
        default=3.0,
        help="seconds a replica's lease on a generation lasts; a dead replica's generations are "
        "taken over after it (default 3)",
    )
    group.add_argument(
        "--orphan-ttl",
        type=POSITIVE,
        default=3600.0,
        metavar="SECONDS",
        help="seconds the Redis keys of a running generation outlive their replica's last "
        "renewal: what a dead replica's generation that nobody took over leaves in Redis is "
        "gone after it (default 3600; at least three leases)",
    )
