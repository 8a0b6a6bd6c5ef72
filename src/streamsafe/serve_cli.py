"""``streamsafe serve``: the gateway, in front of ``--upstream`` or of an in-process simulator.

With ``--workers N`` above 1 this process supervises N gateway processes on one port
(:mod:`streamsafe.workers`); each of them is this command again, told so by its environment.

Without ``--upstream`` the engine simulator is started in this process (on its own loopback
server thread) and used as the upstream, so any OpenAI client can be pointed at the gateway at
once. The composition lives here, with the command line, so that the gateway never imports the
simulator.
"""

from __future__ import annotations

import argparse
from typing import Any

from streamsafe._option_numbers import Number

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``serve`` to the ``streamsafe`` command line."""
    from streamsafe.gateway.cli import add_arguments
    from streamsafe.workers.cli import worker_count

    p = subparsers.add_parser(
        "serve",
        help="run the gateway (in front of --upstream, or of an in-process simulator)",
        description="Run the streamsafe gateway: one generation per logical request, "
        "resumable streams, admission control, abort of abandoned work.",
    )
    groups = add_arguments(p)
    groups["listening"].add_argument(
        "--workers",
        type=worker_count,
        default=1,
        metavar="N",
        help="gateway processes accepting on the one port, supervised by this process: a dead "
        "one is replaced (waits growing while they keep dying), SIGTERM or Ctrl-C drains them "
        "all; a number, or auto for the machine's cores (default 1: this process serves "
        "alone). Above 1 they share their generations as replicas do: through --redis, or "
        "else a redis-server of their own (on a unix socket, no persistence; none installed: "
        "refused)",
    )
    groups["upstreams"].add_argument(
        "--sim-memory-tokens",
        type=Number(integer=True, least=1),
        default=32768,
        help="simulator KV memory when no --upstream (default 32768)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from streamsafe.gateway.cli import serve
    from streamsafe.workers.worker import this_worker

    worker = this_worker()
    if worker is not None:
        # A worker of --workers N: the supervisor's socket, and what it started for all of them.
        if worker.redis is not None:
            args.redis = worker.redis
        upstream = worker.upstream or (args.upstream or [""])[0]
        return serve(args, upstream, sock=worker.sock, worker=worker.index)
    if args.workers > 1:
        from streamsafe.workers.cli import supervise

        return supervise(args)
    if args.upstream:
        return serve(args, args.upstream[0])
    from streamsafe.engine_sim import SimConfig, Simulator
    from streamsafe.server import ServerThread

    with ServerThread(Simulator(SimConfig(memory_tokens=args.sim_memory_tokens))) as sim_server:
        print(
            f"streamsafe: no --upstream given; engine simulator running at {sim_server.url}",
            flush=True,
        )
        return serve(args, sim_server.url)
