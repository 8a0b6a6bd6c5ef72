"""The options of ``streamsafe serve``, one function per group of its ``--help``, in the order
:data:`GROUPS` gives; :func:`streamsafe.gateway.cli.add_arguments` puts them on a parser.

Each option's help states its default; ``docs/cli.md`` is generated from it (``make docs``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, Protocol

from streamsafe._option_numbers import Number
from streamsafe.server.tls import add_tls_options

__all__ = ["GROUPS", "Options", "add_general"]

# What each number option takes; refused at start, before anything runs (exit code 2).
_PORT = Number(integer=True, least=0, most=65535)
_COUNT = Number(integer=True, least=0)
_POSITIVE_COUNT = Number(integer=True, least=1)
_NUMBER = Number(least=0)
_POSITIVE = Number(least=0, above=True)


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
    group.add_argument("--port", type=_PORT, default=8000, help="port (default 8000)")
    add_tls_options(group)
    group.add_argument(
        "--max-connections",
        type=_COUNT,
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
        type=_POSITIVE_COUNT,
        default=64,
        help="largest request header section, KiB; past it 431 (default 64)",
    )
    group.add_argument(
        "--max-header-line-kb",
        type=_POSITIVE_COUNT,
        default=16,
        help="largest header line, KiB; past it 431 (default 16)",
    )
    group.add_argument(
        "--max-body-kb",
        type=_POSITIVE_COUNT,
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
        type=_POSITIVE_COUNT,
        default=3,
        help="with a pool: attempts of a request before its first token, across engines "
        "(default 3)",
    )
    group.add_argument(
        "--probe-interval",
        type=_POSITIVE,
        default=1.0,
        help="seconds between /health probes of a dead engine (default 1)",
    )
    group.add_argument(
        "--max-continuations",
        type=_COUNT,
        default=5,
        help="times a broken upstream attempt is made again: a chat stream continued, a "
        "request dropped before its answer asked again (default 5; 0: never)",
    )


def add_admission(group: Options) -> None:
    """What enters the engine and what waits, when streams commit, and how long work
    outlives its callers."""
    _add_limits(group)
    _add_commit(group)
    _add_keeping(group)


def _add_limits(group: Options) -> None:
    """What the engine is given at once, and the queue in front of it."""
    group.add_argument(
        "--max-inflight",
        type=_COUNT,
        default=256,
        help="generations upstream at once (default 256; 0 for no limit)",
    )
    group.add_argument(
        "--max-memory-tokens",
        type=_COUNT,
        default=0,
        help="engine memory budget in tokens, prompt + max_tokens (default 0: no limit)",
    )
    group.add_argument(
        "--default-max-tokens",
        type=_POSITIVE_COUNT,
        default=1024,
        help="max_tokens assumed when a request gives none (default 1024)",
    )
    group.add_argument(
        "--queue-size",
        type=_COUNT,
        default=1024,
        help="requests waiting for admission (default 1024)",
    )
    group.add_argument(
        "--queue-timeout",
        type=_NUMBER,
        default=20.0,
        help="seconds a request may wait for admission (default 20)",
    )


def _add_commit(group: Options) -> None:
    """When a response commits (its headers go out), and what keeps a waiting one alive."""
    group.add_argument(
        "--commit",
        choices=("early", "first-token"),
        default="early",
        help="when a stream's headers go out (default early)",
    )
    group.add_argument(
        "--heartbeat",
        type=_NUMBER,
        default=5.0,
        help="seconds between keep-alive comments while a stream waits for its first token, "
        "and of silence after which one goes out mid-stream (default 5; 0 for none)",
    )
    group.add_argument(
        "--json-keepalive",
        action="store_true",
        help="keep waiting non-streaming calls alive with whitespace (a later failure is then "
        "a 200 with an error body)",
    )


def _add_keeping(group: Options) -> None:
    """How long work outlives its callers: the grace before abandoned work is aborted, what
    is kept for replay, a duplicate of live work."""
    group.add_argument(
        "--grace",
        type=_NUMBER,
        default=5.0,
        help="seconds before abandoned work is aborted (default 5; 0 allowed)",
    )
    group.add_argument(
        "--keep-finished",
        type=_NUMBER,
        default=300.0,
        help="seconds finished generations are kept for replay (default 300)",
    )
    group.add_argument(
        "--max-kept-mb",
        type=_NUMBER,
        default=64.0,
        help="memory for finished generations, MiB (default 64)",
    )
    group.add_argument(
        "--max-kept",
        type=_COUNT,
        default=20_000,
        help="finished generations kept for replay, at most (default 20000)",
    )
    group.add_argument(
        "--on-live-duplicate",
        choices=("attach", "409"),
        default="attach",
        help="answer to a duplicate of a live keyed request (default attach)",
    )


def add_timeouts(group: Options) -> None:
    """An upstream attempt's deadlines, a client connection's, the drain at shutdown."""
    _add_upstream_timeouts(group)
    _add_connection_timeouts(group)
    group.add_argument(
        "--drain-timeout",
        type=_NUMBER,
        default=30.0,
        help="on SIGTERM or Ctrl-C, seconds running streams get to finish while new work is "
        "refused with 503; then they end with an error event (with --redis: handed to another "
        "replica) and the process exits (default 30)",
    )


def _add_upstream_timeouts(group: Options) -> None:
    """How long an attempt upstream, a caller's wait for the next token and a generation may
    take."""
    group.add_argument(
        "--first-token-timeout",
        type=_NUMBER,
        default=60.0,
        help="seconds from sending upstream to a stream's first event before the attempt is "
        "closed and asked of another engine of the model (never of the same one again; with "
        "none, 504) (default 60; 0: none; non-streamed calls: total timeout only)",
    )
    group.add_argument(
        "--idle-timeout",
        type=_NUMBER,
        default=35.0,
        help="seconds of upstream silence mid-stream before it is cut and continued, on another "
        "engine of the model where there is one (default 35: a 30 s stall is waited out; an "
        "engine that is gone is found sooner by its health check; 0: none)",
    )
    group.add_argument(
        "--stall-timeout",
        type=_NUMBER,
        default=45.0,
        help="seconds a caller waits for the next token of an answer that went quiet, through "
        "its cut and continuations, before it ends with a clear error (default 45; 0: none, "
        "each continuation then has the first-token timeout)",
    )
    group.add_argument(
        "--total-timeout",
        type=_NUMBER,
        default=600.0,
        help="seconds a generation may take upstream in all (default 600; 0: none)",
    )


def _add_connection_timeouts(group: Options) -> None:
    """How long a client connection may take to send its request, read the response, idle."""
    group.add_argument(
        "--header-timeout",
        type=_POSITIVE,
        default=10.0,
        help="seconds for a request's headers to arrive; past it 408 (default 10)",
    )
    group.add_argument(
        "--body-timeout",
        type=_POSITIVE,
        default=10.0,
        help="seconds between reads of an unfinished body; past it 408 (default 10)",
    )
    group.add_argument(
        "--min-body-rate",
        type=float,
        default=1024.0,
        help="bytes a second a request body must keep up after its first --body-timeout "
        "seconds (its deadline moves on 1 s per this many bytes); past it 408 (default 1024; "
        "0: none)",
    )
    group.add_argument(
        "--send-timeout",
        type=_POSITIVE,
        default=30.0,
        help="seconds a response may wait for a client that stopped reading; past it the "
        "connection is reset (default 30)",
    )
    group.add_argument(
        "--keep-alive-timeout",
        type=_POSITIVE,
        default=5.0,
        help="seconds a kept-alive connection may sit idle before it is closed; above a load "
        "balancer's own idle timeout, so that it, not the gateway, closes (default 5)",
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
        type=_POSITIVE,
        default=3.0,
        help="seconds a replica's lease on a generation lasts; a dead replica's generations are "
        "taken over after it (default 3)",
    )
    group.add_argument(
        "--orphan-ttl",
        type=_POSITIVE,
        default=3600.0,
        metavar="SECONDS",
        help="seconds the Redis keys of a running generation outlive their replica's last "
        "renewal: what a dead replica's generation that nobody took over leaves in Redis is "
        "gone after it (default 3600; at least three leases)",
    )


def add_tenants(group: Options) -> None:
    """API keys, what a tenant may pass through, each tenant's share of admission."""
    group.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="accepted API key (repeatable; also STREAMSAFE_API_KEYS, comma-separated)",
    )
    group.add_argument(
        "--tenant-passthrough",
        choices=("refuse", "shared"),
        default="refuse",
        help="with API keys, what a tenant may pass through to the upstream: refuse (default) "
        "passes only the model list, /v1/health and /v1/version, and answers the rest 403, "
        "as every tenant reaches the upstream under one identity; shared passes every route",
    )
    group.add_argument(
        "--tenant-weight",
        action="append",
        default=[],
        metavar="KEY=WEIGHT",
        help="share of admission of an API key's tenant (repeatable; default 1 each)",
    )


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
