"""The command-line reference, ``docs/cli.md``, generated from the argparse parsers.

Options are documented once, where they are declared (``add_argument(help=...)``); this module
writes that down as Markdown so the docs can link to it instead of describing flags again.
``make docs`` regenerates the file and a test fails when it is out of date.

The text is built from the parsers' actions rather than from ``format_help()``: argparse wraps
help to the terminal's width and its layout changes between Python versions, and a reference that
changes with the terminal could never be checked.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["main", "render"]

_HEADER = """\
# Command-line reference

Generated from the argparse parsers by `make docs` (`python -m streamsafe._clidoc --write`);
do not edit by hand: `tests/test_docs.py` fails when this file and the parsers differ.
Every option is described here only; the other pages link to this one.
"""

#: Environment variables some defaults are read from; cleared while rendering so the reference
#: shows the built-in defaults, not those of whoever ran ``make docs``.
_ENV_PREFIXES = ("STREAMSAFE_", "OPENAI_")


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return _metavar(action)
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    return f"{names} {_metavar(action)}"


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default is None or default == argparse.SUPPRESS:
        return ""
    if isinstance(default, list | tuple) and not default:
        return ""
    return f"`{default}`"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        params = dict(vars(action), prog=prog)
        if params.get("choices") is not None:
            params["choices"] = ", ".join(str(c) for c in action.choices or ())
        text = text % params
    if action.option_strings and action.required:
        text = f"required; {text}" if text else "required"
    return _cell(text)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name, ""), sub))
    return found


#: argparse's own groups: their options come first, under no heading.
_PLAIN_GROUPS = ("positional arguments", "options", "optional arguments")


def _groups(
    parser: argparse.ArgumentParser, actions: Sequence[argparse.Action]
) -> list[tuple[str, list[argparse.Action]]]:
    """``actions`` by the parser's argument groups, as ``--help`` shows them: (a heading, or
    ``""`` for argparse's own groups, and the group's actions)."""
    shown = set(map(id, actions))
    plain: list[argparse.Action] = []
    named: list[tuple[str, list[argparse.Action]]] = []
    for group in parser._action_groups:
        members = [a for a in group._group_actions if id(a) in shown]
        if not members:
            continue
        if group.title in _PLAIN_GROUPS or group.title is None:
            plain += members
            continue
        about = f": {_cell(group.description)}" if group.description else ""
        named.append((f"*{group.title}*{about}", members))
    return ([("", plain)] if plain else []) + named


def _section(parser: argparse.ArgumentParser, title: str, summary: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{title}`", ""]
    intro = parser.description or summary
    if intro:
        out += [_cell(intro), ""]
    actions = [
        a
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]
    positionals = [a for a in actions if not a.option_strings]
    subs = _subcommands(parser)
    usage = [title]
    if any(a.option_strings for a in actions):
        usage.append("[options]")
    usage += [_metavar(a) for a in positionals]
    if subs:
        usage.append("COMMAND")
    out += [f"    {' '.join(usage)}", ""]
    for heading, grouped in _groups(parser, actions):
        if heading:
            out += [heading, ""]
        out += ["| option | default | meaning |", "|---|---|---|"]
        for action in grouped:
            out.append(
                f"| `{_cell(_invocation(action))}` | {_default(action)} | {_help(action, title)} |"
            )
        out.append("")
    if subs:
        out += ["| command | what it does |", "|---|---|"]
        for name, help_, _sub in subs:
            out.append(f"| `{title} {name}` | {_cell(help_)} |")
        out.append("")
    for name, help_, sub in subs:
        out += _section(sub, f"{title} {name}", help_, min(level + 1, 4))
    return out


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The Markdown reference of ``parser`` (default: the ``streamsafe`` command line, built
    with the ``STREAMSAFE_*`` and ``OPENAI_*`` variables cleared, so the text is the same on
    every machine)."""
    if parser is None:
        from streamsafe.cli import build_parser

        with _clean_environment():
            parser = build_parser()
    lines = [_HEADER, *_section(parser, parser.prog, "", 2)]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m streamsafe._clidoc [--write [PATH]]``: print the reference, or write it
    (default path ``docs/cli.md``)."""
    ap = argparse.ArgumentParser(prog="python -m streamsafe._clidoc", description=main.__doc__)
    ap.add_argument("--write", nargs="?", const="docs/cli.md", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    text = render()
    if args.write is None:
        sys.stdout.write(text)
    else:
        Path(args.write).write_text(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
