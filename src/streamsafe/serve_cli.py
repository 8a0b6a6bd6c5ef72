"""``streamsafe serve``: the gateway, in front of ``--upstream`` or of an in-process simulator.

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

    p = subparsers.add_parser(
        "serve",
        help="run the gateway (in front of --upstream, or of an in-process simulator)",
        description="Run the streamsafe gateway: one generation per logical request, "
        "resumable streams, admission control, abort of abandoned work.",
    )
    groups = add_arguments(p)
    groups["upstreams"].add_argument(
        "--sim-memory-tokens",
        type=Number(integer=True, least=1),
        default=32768,
        help="simulator KV memory when no --upstream (default 32768)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from streamsafe.gateway.cli import serve

    if args.upstream:
        return serve(args, args.upstream[0])
    from streamsafe.engine_sim import SimConfig, Simulator
    from streamsafe.serving import ServerThread

    with ServerThread(Simulator(SimConfig(memory_tokens=args.sim_memory_tokens))) as sim_server:
        print(
            f"streamsafe: no --upstream given; engine simulator running at {sim_server.url}",
            flush=True,
        )
        return serve(args, sim_server.url)
