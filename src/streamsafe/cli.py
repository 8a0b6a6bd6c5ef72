"""``streamsafe``: the command line.

Each subcommand lives with the part it drives; this module only assembles them. A part exposes
``register(subparsers)``, which adds its parser and sets ``func`` (called with the parsed
arguments, returning an exit code). Heavy imports happen inside ``func``, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from streamsafe import _logging
from streamsafe._version import __version__

# (subcommand, module that registers it), in the order --help lists them.
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("demo", "streamsafe_bench.demo_cli"),
    ("serve", "streamsafe.serve_cli"),
    ("simulate", "streamsafe.engine_sim.cli"),
    ("chat", "streamsafe.client.cli"),
    ("bench", "streamsafe_bench.cli"),
)
#: Level of streamsafe's own loggers where ``--log-level`` is not given: the servers say what
#: an operator must see (engine down, shedding, one access line per request); the tools whose
#: output is their report (demo, chat, bench) stay quiet.
_DEFAULT_LEVEL = {"serve": "info", "simulate": "info"}
#: The demo and the benchmarks are a distribution of their own, streamsafe-bench, kept in the
#: repository's benchmarks/ folder and not in streamsafe's wheel: ``demo`` and ``bench`` import
#: it only when named, and say how to install it where it is missing.
_BENCH = "streamsafe_bench"
#: Packages some commands import only when they run, and what installs each: an extra of
#: streamsafe (``pip install 'streamsafe[EXTRA]'``) or of streamsafe-bench, installed from a
#: clone (``pip install './benchmarks[EXTRA]'``; ``make demo`` and ``make test`` install all).
_EXTRAS: dict[str, tuple[str, str]] = {
    "uvicorn": ("streamsafe", "gateway"),
    "uvloop": ("streamsafe", "gateway"),
    "httptools": ("streamsafe", "gateway"),
    "prometheus_client": ("streamsafe", "gateway"),
    "redis": ("streamsafe", "gateway"),
    "cryptography": ("streamsafe", "gateway"),
    "opentelemetry": ("streamsafe", "otel"),
    _BENCH: ("./benchmarks", ""),
    "rich": ("./benchmarks", ""),
    "openai": ("./benchmarks", "peers"),
    "llama_stack_client": ("./benchmarks", "peers"),
    "fire": ("./benchmarks", "peers"),
    "requests": ("./benchmarks", "peers"),
    "matplotlib": ("./benchmarks", "plot"),
    "llama_stack": ("./benchmarks", "llamastack"),
    "aiosqlite": ("./benchmarks", "llamastack"),
    "sqlalchemy": ("./benchmarks", "llamastack"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``only``: register that subcommand alone (a run of one command
    does not import every other: ``streamsafe simulate`` no longer loads the gateway, half of a
    simulator's start)."""
    parser = argparse.ArgumentParser(
        prog="streamsafe",
        description="Retry-safe, resumable streaming for OpenAI-compatible LLM inference.",
    )
    parser.add_argument("--version", action="version", version=f"streamsafe {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="one logging level more per -v, here or after the command (-vvv: other "
        "libraries' debug lines too)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _COMMANDS:
        if only is not None and name != only:
            continue
        try:
            # A part's register() may import its server packages (serve: the gateway's options).
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue  # a part not built yet
            top = (exc.name or "").split(".")[0]
            if top not in _EXTRAS:
                raise
            _register_missing(sub, name, top)
    for name, command in sub.choices.items():
        _add_logging(command, _DEFAULT_LEVEL.get(name, "warning"), 1)
    return parser


def _register_missing(sub: Any, name: str, package: str) -> None:
    """``name`` as a command whose part cannot load here (``pip install streamsafe`` holds the
    client alone; ``serve`` imports the gateway to add its options): ``--help`` lists it with
    the extra to install, and :func:`main` answers it with that before parsing its options."""
    p = sub.add_parser(name, help=f"(needs pip install {_install(package)})")
    p.set_defaults(missing=package)


def _install(package: str) -> str:
    """The pip argument that brings ``package``: ``'streamsafe[gateway]'``, ``./benchmarks``."""
    where, extra = _EXTRAS[package]
    return f"'{where}[{extra}]'" if extra else where


def _needs(command: str, package: str) -> int:
    where, extra = _EXTRAS[package]
    if where == "streamsafe":
        what = f"which the {extra!r} extra installs: pip install {_install(package)}"
    else:
        # Not on the package index: it is installed from a clone of the repository.
        dist = f"streamsafe-bench's {extra!r} extra" if extra else "streamsafe-bench"
        what = f"which {dist} installs, from a clone of streamsafe: pip install {_install(package)}"
    print(
        f"streamsafe {command}: needs {package}, {what} (or make demo, which installs everything)",
        file=sys.stderr,
    )
    return 2


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: dict[str, argparse.ArgumentParser] = action.choices
            return found
    return {}


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return _subcommands(parser)[name]


def _add_logging(parser: argparse.ArgumentParser, default_level: str, depth: int) -> None:
    """The logging options on ``parser`` and on every subcommand under it."""
    _logging.add_options(parser, default_level, depth)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_logging(child, default_level, depth + 1)


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs, where its first word names one (``--help`` and options
    before it need the whole parser)."""
    first = argv[0] if argv else ""
    return first if first in dict(_COMMANDS) else None


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_in(words))
    named = next((w for w in words if w in dict(_COMMANDS)), None)
    if named is not None:
        missing = _subcommands(parser).get(named)
        if missing is not None and missing.get_default("missing"):
            return _needs(named, missing.get_default("missing"))
    args = parser.parse_args(words)
    config = getattr(args, "config", None)
    if config:
        from streamsafe._config_file import ConfigError, apply

        sub = _subcommand(parser, args.command)
        try:
            args = apply(parser, sub, words, args, config)
        except ConfigError as exc:
            print(f"streamsafe {args.command}: {exc}", file=sys.stderr)
            return 2
    # What the command was started with: ``serve --workers N`` starts its workers with it.
    args.command_line = tuple(words)
    _logging.setup(*_logging.chosen(args, _DEFAULT_LEVEL.get(args.command, "warning")))
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(func(args) or 0)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in _EXTRAS:
            raise
        return _needs(args.command, top)
    except OSError as exc:
        from streamsafe.server import CannotListen  # loaded by whatever raised it

        if not isinstance(exc, CannotListen):
            raise
        print(f"streamsafe {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
