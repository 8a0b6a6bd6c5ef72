"""``streamsafe simulate``: serve the engine simulator in the foreground."""

from __future__ import annotations

import argparse
from typing import Any

from streamsafe._option_numbers import Number
from streamsafe.server.tls import add_tls_options

__all__ = ["build_config", "register"]

# Refused at start (exit code 2): NaN and infinity included.
_POSITIVE_COUNT = Number(integer=True, least=1)
_NUMBER = Number(least=0)


def register(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand."""
    p = subparsers.add_parser(
        "simulate",
        help="serve a simulated vLLM (OpenAI API) that fails the way the real one does",
        description="An OpenAI-compatible server that behaves like vLLM under load: finite "
        "memory in tokens, a running limit with a waiting queue, batch-dependent timing, death "
        "past capacity, abort on disconnect, injected faults, deterministic text.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=Number(integer=True, least=0, most=65535),
        default=8000,
        help="port (default 8000, as vLLM)",
    )
    add_tls_options(p)
    _add_engine_options(p)
    _add_middle_layer_options(p)
    _add_fault_options(p)
    p.set_defaults(func=_main)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """The engine simulated: its model, memory, batch and speed, its context length."""
    p.add_argument(
        "--model", default="sim-llama-8b", help="the model served (default sim-llama-8b)"
    )
    p.add_argument(
        "--memory-tokens", type=_POSITIVE_COUNT, default=32768, help="KV memory in tokens (32768)"
    )
    p.add_argument(
        "--max-num-seqs", type=_POSITIVE_COUNT, default=64, help="most running requests (64)"
    )
    p.add_argument(
        "--prefill-ms-per-token", type=_NUMBER, default=0.05, help="prefill per prompt token (0.05)"
    )
    p.add_argument("--itl-ms", type=_NUMBER, default=10.0, help="base inter-token delay (10)")
    p.add_argument(
        "--itl-ms-per-seq", type=_NUMBER, default=0.1, help="extra delay per running request (0.1)"
    )
    p.add_argument(
        "--default-max-tokens",
        type=_POSITIVE_COUNT,
        default=256,
        help="max_tokens when none given (256)",
    )
    p.add_argument(
        "--max-model-len",
        type=_POSITIVE_COUNT,
        default=None,
        metavar="TOKENS",
        help="vLLM's context length: prompt + max_tokens past it gets vLLM's 400 (default: "
        "none, memory bounds a request)",
    )


def _add_middle_layer_options(p: argparse.ArgumentParser) -> None:
    """Where it behaves unlike vLLM's defaults, as a layer in front of one or an older one would."""
    p.add_argument(
        "--no-abort-on-disconnect",
        action="store_true",
        help="keep generating after the client is gone (a middle layer that does not pass "
        "disconnects on)",
    )
    p.add_argument(
        "--headers-after-first-token",
        action="store_true",
        help="hold response headers until the first token (a middle layer waiting upstream)",
    )
    p.add_argument(
        "--refuse-prefill",
        action="store_true",
        help="refuse to continue a partial answer (a last assistant message, a prompt of token "
        "ids) with 400 invalid_prefill",
    )
    p.add_argument(
        "--hide-kv-cache",
        action="store_true",
        help="publish no KV cache configuration in /metrics (vLLM publishes it, and a gateway "
        "learns the engine's memory from it): an engine that does not say what it holds",
    )


def _add_fault_options(p: argparse.ArgumentParser) -> None:
    """The failures it injects: per request, as a whole server, and their seed."""
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault, repeatable: status:CODE:P[:RETRY_AFTER], errorevent:CODE:P, "
        "cut:N:P, cut:LO-HI:P, stall:SECONDS:P, pause:N:SECONDS:P, reset:P, hang:N:P, "
        "malformed:N:P, nodone:P, blackhole:P, crash:N:P; each optionally followed "
        "by @fresh or @continuation (which requests) and #TIMES (at most that many)",
    )
    p.add_argument(
        "--black-hole",
        action="store_true",
        help="accept connections and answer nothing, /health included (/stats still answers)",
    )
    p.add_argument(
        "--flap",
        metavar="UP:DOWN[:503|reset]",
        default=None,
        help="healthy for UP seconds, then failing for DOWN (every request 503 with "
        "Retry-After: 1, or reset), and so on from the start (default: never)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of faults and text (default 0)")
    p.add_argument(
        "--no-fault-header", action="store_true", help="ignore x-sim-fault request headers"
    )


def build_config(args: argparse.Namespace) -> Any:
    """The SimConfig the parsed arguments describe (ValueError on a bad --fault or --flap)."""
    from streamsafe.engine_sim import Fault, Flap, SimConfig

    return SimConfig(
        model=args.model,
        memory_tokens=args.memory_tokens,
        max_num_seqs=args.max_num_seqs,
        prefill_ms_per_token=args.prefill_ms_per_token,
        itl_ms=args.itl_ms,
        itl_ms_per_seq=args.itl_ms_per_seq,
        default_max_tokens=args.default_max_tokens,
        abort_on_disconnect=not args.no_abort_on_disconnect,
        headers_after_first_token=args.headers_after_first_token,
        faults=tuple(Fault.parse(s) for s in args.fault),
        seed=args.seed,
        fault_header=not args.no_fault_header,
        max_model_len=args.max_model_len,
        refuse_prefill=args.refuse_prefill,
        black_hole=args.black_hole,
        publish_kv_cache=not args.hide_kv_cache,
        flap=Flap.parse(args.flap) if args.flap else None,
    )


def _main(args: argparse.Namespace) -> int:
    import os
    import sys

    from streamsafe.engine_sim import Simulator
    from streamsafe.server import run_server
    from streamsafe.server.tls import server_context, tls_files

    try:
        config = build_config(args)
        files = tls_files(args, os.environ.get("STREAMSAFE_TLS_KEYFILE_PASSWORD") or None)
        tls = server_context(files) if files is not None else None
    except ValueError as exc:
        print(f"streamsafe simulate: {exc}", file=sys.stderr)
        return 2

    def announce(url: str) -> None:
        print(
            f"simulating {config.model} on {url}/v1 "
            f"(memory {config.memory_tokens} tokens, max {config.max_num_seqs} running)",
            flush=True,
        )

    run_server(
        Simulator(config),
        host=args.host,
        port=args.port,
        announce=announce,
        tls=tls,
    )
    return 0
