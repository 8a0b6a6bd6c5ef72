"""The groups of ``streamsafe serve``'s options that say what the gateway admits and how long
it waits: what enters the engine and what queues, when a stream commits, how long work outlives
its callers and is kept for replay, the timeouts of upstream attempts and client connections,
the drain, and tenants' keys and shares of admission. What it talks to is
:mod:`streamsafe.gateway.cli_options`'s.

Each option's help states its default; ``docs/cli.md`` is generated from it (``make docs``).
"""

from __future__ import annotations

from streamsafe.gateway.cli_options import COUNT, NUMBER, POSITIVE, POSITIVE_COUNT, Options

__all__ = ["add_admission", "add_tenants", "add_timeouts"]


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
        type=COUNT,
        default=256,
        help="generations upstream at once (default 256; 0 for no limit)",
    )
    group.add_argument(
        "--max-memory-tokens",
        type=COUNT,
        default=0,
        help="engine memory budget in tokens, prompt + max_tokens (default 0: no limit)",
    )
    group.add_argument(
        "--default-max-tokens",
        type=POSITIVE_COUNT,
        default=1024,
        help="max_tokens assumed when a request gives none (default 1024)",
    )
    group.add_argument(
        "--queue-size",
        type=COUNT,
        default=1024,
        help="requests waiting for admission (default 1024)",
    )
    group.add_argument(
        "--queue-timeout",
        type=NUMBER,
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
        type=NUMBER,
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
        type=NUMBER,
        default=5.0,
        help="seconds before abandoned work is aborted (default 5; 0 allowed)",
    )
    group.add_argument(
        "--keep-finished",
        type=NUMBER,
        default=300.0,
        help="seconds finished generations are kept for replay (default 300)",
    )
    group.add_argument(
        "--max-kept-mb",
        type=NUMBER,
        default=64.0,
        help="memory for finished generations, MiB (default 64)",
    )
    group.add_argument(
        "--max-kept",
        type=COUNT,
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
        type=NUMBER,
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
        type=NUMBER,
        default=60.0,
        help="seconds from sending upstream to a stream's first event before the attempt is "
        "closed and asked of another engine of the model (never of the same one again; with "
        "none, 504) (default 60; 0: none; non-streamed calls: total timeout only)",
    )
    group.add_argument(
        "--idle-timeout",
        type=NUMBER,
        default=35.0,
        help="seconds of upstream silence mid-stream before it is cut and continued, on another "
        "engine of the model where there is one (default 35: a 30 s stall is waited out; an "
        "engine that is gone is found sooner by its health check; 0: none)",
    )
    group.add_argument(
        "--stall-timeout",
        type=NUMBER,
        default=45.0,
        help="seconds a caller waits for the next token of an answer that went quiet, through "
        "its cut and continuations, before it ends with a clear error (default 45; 0: none, "
        "each continuation then has the first-token timeout)",
    )
    group.add_argument(
        "--total-timeout",
        type=NUMBER,
        default=600.0,
        help="seconds a generation may take upstream in all (default 600; 0: none)",
    )


def _add_connection_timeouts(group: Options) -> None:
    """How long a client connection may take to send its request, read the response, idle."""
    group.add_argument(
        "--header-timeout",
        type=POSITIVE,
        default=10.0,
        help="seconds for a request's headers to arrive; past it 408 (default 10)",
    )
    group.add_argument(
        "--body-timeout",
        type=POSITIVE,
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
        type=POSITIVE,
        default=30.0,
        help="seconds a response may wait for a client that stopped reading; past it the "
        "connection is reset (default 30)",
    )
    group.add_argument(
        "--keep-alive-timeout",
        type=POSITIVE,
        default=5.0,
        help="seconds a kept-alive connection may sit idle before it is closed; above a load "
        "balancer's own idle timeout, so that it, not the gateway, closes (default 5)",
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
