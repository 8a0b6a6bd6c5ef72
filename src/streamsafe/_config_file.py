"""A subcommand's options from a TOML file (``streamsafe serve --config FILE.toml``).

The keys are the subcommand's long option names without the leading dashes (``port``,
``max-memory-tokens``; ``max_memory_tokens`` too), the values what the option takes: a number,
a string, ``true`` for a flag, a list for an option that may be repeated (``upstream``,
``api-key``). An option given on the command line wins over the file (a repeated one replaces
the file's list). Every value goes through the option's own type and choices, so the file
accepts exactly what the command line does; anything else (unreadable TOML, an unknown key, a
value of the wrong kind) is one :class:`ConfigError` naming the file and the key.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamsafe._option_numbers import Number

__all__ = ["ConfigError", "apply"]

#: Options a file cannot set.
_NOT_IN_A_FILE = frozenset({"config", "help"})


class ConfigError(Exception):
    """A configuration file that cannot be used; the message says why in one line."""


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's actions by long option name without dashes."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option[2:] not in _NOT_IN_A_FILE:
                found[option[2:]] = action
    return found


def _scalar(action: argparse.Action, key: str, value: Any) -> Any:
    """``value`` as ``action`` takes one item: through its type and choices."""
    if isinstance(value, bool | dict | list):
        raise ConfigError(f"{key}: expected {_kind(action)}, got {_shown(action, value)}")
    convert: Any = action.type
    try:
        if convert is None:
            if not isinstance(value, str):
                raise ValueError
            result = value
        elif _integer(convert) and isinstance(value, float):
            raise ValueError
        else:
            result = convert(
                value if isinstance(value, str) or convert in (int, float) else str(value)
            )
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        raise ConfigError(f"{key}: expected {_kind(action)}, got {_shown(action, value)}") from None
    if action.choices is not None and result not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise ConfigError(f"{key}: {_shown(action, value)} is not one of {choices}")
    return result


def _integer(convert: Any) -> bool:
    return convert is int or (isinstance(convert, Number) and convert.integer)


def _kind(action: argparse.Action) -> str:
    if isinstance(action.type, Number):
        return action.type.describe()
    names = {int: "an integer", float: "a number", None: "a string"}
    return names.get(action.type, "a value")  # type: ignore[arg-type]


def _shown(action: argparse.Action, value: Any) -> str:
    """``value`` as an error message shows it: itself where the option takes a number or one
    of its choices, else only its kind. A string option may hold a secret (an API key, a
    Redis secret, a URL's password), and a message must never repeat one."""
    if (action.type in (int, float) or isinstance(action.type, Number) or action.choices) and (
        isinstance(value, int | float | str) and not isinstance(value, bool)
    ):
        return repr(value)[:80]
    kinds = {bool: "true or false", str: "a string", int: "an integer", float: "a number"}
    kinds.update({list: "a list", dict: "a table"})
    return next((name for t, name in kinds.items() if isinstance(value, t)), "a value")


def _value(action: argparse.Action, key: str, value: Any) -> Any:
    """What ``args`` would hold had the command line given ``value`` for ``key``."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_shown(action, value)}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(action, argparse._CountAction):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{key}: expected a count, got {_shown(action, value)}")
        return value
    if action.nargs == "?" and value is True:
        return action.const  # the bare flag (``--collapse-identical`` is ``all``)
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_scalar(action, key, item) for item in items]
    return _scalar(action, key, value)


def _load(path: str) -> dict[str, Any]:
    try:
        with Path(path).open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8; the bytes are not shown (a secret?)
        raise ConfigError(f"not valid TOML: not UTF-8 at byte {exc.start}") from None


def apply(
    top: argparse.ArgumentParser,
    sub: argparse.ArgumentParser,
    argv: Sequence[str],
    given: argparse.Namespace,
    path: str,
) -> argparse.Namespace:
    """Parse ``argv`` again with the file at ``path`` as the defaults of ``sub`` (the
    subcommand's parser under ``top``); ``given`` is ``argv`` parsed without the file. Raises
    :class:`ConfigError` (its message names the file)."""
    try:
        values = _load(path)
        options = _options(sub)
        defaults: dict[str, Any] = {}
        repeated: list[argparse.Action] = []
        for key, value in values.items():
            action = options.get(key) or options.get(key.replace("_", "-"))
            if action is None:
                near = difflib.get_close_matches(key.replace("_", "-"), list(options), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ConfigError(f"unknown key {key!r}{hint}")
            defaults[action.dest] = _value(action, key, value)
            if isinstance(action, argparse._AppendAction | argparse._CountAction):
                repeated.append(action)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    # What the command line gave of a repeated option, parsed without the file.
    from_command_line = {a.dest: getattr(given, a.dest, None) for a in repeated}
    original = {a.dest: a.default for a in repeated}
    sub.set_defaults(**defaults)
    args = top.parse_args(argv)
    for dest, value in from_command_line.items():
        if value not in (None, [], 0) and value != original[dest]:
            setattr(args, dest, value)  # the command line's list replaces the file's
    return args
