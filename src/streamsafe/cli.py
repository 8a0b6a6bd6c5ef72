"""``streamsafe``: the command line.

Each subcommand lives with the part it drives; this module only assembles them. A part exposes
``register(subparsers)``, which adds its parser and sets ``func`` (called with the parsed
arguments, returning an exit code). Heavy imports happen inside ``func``, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from streamsafe._version import __version__

# (subcommand, module that registers it), in the order --help lists them.
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("demo", "streamsafe.bench.demo_cli"),
    ("serve", "streamsafe.serve_cli"),
    ("simulate", "streamsafe.engine_sim.cli"),
    ("chat", "streamsafe.client.cli"),
    ("bench", "streamsafe.bench.cli"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamsafe",
        description="Retry-safe, resumable streaming for OpenAI-compatible LLM inference.",
    )
    parser.add_argument("--version", action="version", version=f"streamsafe {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _name, module in _COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue  # a part not built yet
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
