"""``streamsafe chat``: one prompt to an OpenAI-compatible server, the reply printed as it
streams (through the streamsafe client, so its retry and resume rules apply)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from streamsafe._option_numbers import Number

__all__ = ["main", "register"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url", default=None, help="server URL ending in /v1 (default $OPENAI_BASE_URL)"
    )
    parser.add_argument("--api-key", default=None, help="API key (default $OPENAI_API_KEY)")
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument("--no-stream", action="store_true", help="wait for the whole reply")
    parser.add_argument(
        "--max-tokens",
        type=Number(integer=True, least=1),
        default=None,
        help="most tokens to generate",
    )
    parser.add_argument("--system", default=None, help="a system message")
    parser.add_argument(
        "--timeout",
        type=Number(least=0, above=True),
        default=None,
        help="seconds per phase (default: client defaults)",
    )
    parser.add_argument("prompt", help="the user message")


def register(subparsers: Any) -> None:
    """Add ``chat`` to the ``streamsafe`` command line."""
    parser = subparsers.add_parser("chat", help="send one prompt and print the reply as it streams")
    _add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``streamsafe chat`` with parsed arguments; 0 on success, 1 on an API error."""
    from streamsafe.client import NOT_GIVEN, Client, StreamInterrupted, StreamsafeError

    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": args.prompt})
    params: dict[str, Any] = {}
    if args.max_tokens is not None:
        params["max_tokens"] = args.max_tokens
    timeout = NOT_GIVEN if args.timeout is None else args.timeout
    out = sys.stdout
    try:
        with Client(base_url=args.base_url, api_key=args.api_key, timeout=timeout) as client:
            if args.no_stream:
                result = client.chat.completions.create(
                    model=args.model, messages=messages, **params
                )
                out.write((result.choices[0].message.content or "") + "\n")
                return 0
            stream = client.chat.completions.create(
                model=args.model, messages=messages, stream=True, **params
            )
            with stream:
                for chunk in stream:
                    for choice in chunk.choices or ():
                        piece = choice.delta.content if choice.index == 0 else None
                        if piece:
                            out.write(piece)
                            out.flush()
            out.write("\n")
            return 0
    except StreamInterrupted as exc:
        out.write("\n")
        print(f"streamsafe chat: {exc}", file=sys.stderr)
        return 1
    except StreamsafeError as exc:
        print(f"streamsafe chat: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``streamsafe chat`` as a function (for tests and ``python -m``)."""
    parser = argparse.ArgumentParser(prog="streamsafe chat")
    _add_arguments(parser)
    return run(parser.parse_args(argv))
