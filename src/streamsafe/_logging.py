"""One logging setup for every ``streamsafe`` command.

Every command gets the same options (:func:`add_options`): ``--log-format text|json``,
``--log-level``, and ``-v`` (before or after the subcommand). streamsafe's own loggers
(``streamsafe.*``) log at the level asked for; other libraries' (uvicorn, httpx2, redis, ...)
stay at WARNING, so their chatter never drowns the lines an operator reads, unless ``-vvv``
asks for everything.

A record may carry ``fields`` (``logger.info(msg, extra={"fields": {...}})``): named values an
operator filters on (``request_id``, ``engine``, ``event``). In ``json`` they become keys of the
line's object, one object per line; in ``text`` they follow the message as ``key=value``.

A text line holds what callers sent (a refused request's decoded path, a header): every control
and line-separating character in it (C0, DEL, C1, U+2028, U+2029) is written as an escape
(``\\n``, ``\\x1b``, ``\\u2028``), in one place (:func:`escape`), so no request can forge a line
or move a terminal's cursor. A traceback keeps its line breaks, each of its lines indented, so
only a record starts a line at its first column.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import re
import sys
from typing import Any, TextIO

import orjson

__all__ = [
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "TextFormatter",
    "add_options",
    "chosen",
    "escape",
    "setup",
]

#: Level names ``--log-level`` accepts.
LEVELS = ("debug", "info", "warning", "error")
#: ``--log-format`` choices.
FORMATS = ("text", "json")
#: ``-v`` count from which other libraries log at DEBUG too (below it: WARNING).
_ALL_LOGGERS_AT = 3


def add_options(parser: argparse.ArgumentParser, default_level: str, depth: int = 1) -> None:
    """Add the logging options to a subcommand's ``parser``. ``-v`` there adds to the count
    given before the subcommand (each level keeps its own count, ``depth`` apart); the
    options' defaults stay off the namespace (:data:`argparse.SUPPRESS`), so a nested
    subcommand's parse never resets what its parent's read (see :func:`chosen`)."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-format",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        help="text (the default), or json: one JSON object per line",
    )
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default=argparse.SUPPRESS,
        help=f"level of streamsafe's own loggers (default {default_level}); other libraries "
        "log at warning",
    )
    group.add_argument(
        "-v",
        "--verbose",
        dest=f"_verbose{depth}",
        action="count",
        default=argparse.SUPPRESS,
        help="one level more per -v (-vvv: other libraries' debug lines too)",
    )


def chosen(args: argparse.Namespace, default_level: str) -> tuple[str, int, str]:
    """The level, the ``-v`` count (before and after subcommands) and the format ``args``
    ask for."""
    found = vars(args)
    verbose = int(found.get("verbose", 0) or 0)
    verbose += sum(int(v) for k, v in found.items() if k.startswith("_verbose"))
    return found.get("log_level", default_level), verbose, found.get("log_format", "text")


#: What a text line never holds raw: C0 controls (newline, escape), DEL, C1 controls (U+009B is
#: a one-character CSI to a terminal, U+0085 a line break to some readers), the Unicode line and
#: paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape(text: str) -> str:
    """``text`` with every control and line-separating character written as an escape
    (``\\n``, ``\\x1b``, ``\\u2028``): safe to put on one line of a text log."""
    # Every character escaped is one isprintable() refuses: the common line costs one C scan.
    return text if text.isprintable() else _UNSAFE.sub(_escaped, text)


def _utc(created: float) -> str:
    return (
        datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat(timespec="milliseconds")[
            :-6
        ]
        + "Z"
    )


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = record.__dict__.get("fields")
    return fields if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC), ``level``, ``logger``, ``msg``, the record's
    fields, and ``exc`` (the traceback as one string) where there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    """``TS LEVEL LOGGER message key=value ...`` (values with spaces quoted), one line whatever
    the message and the values hold (see :func:`escape`); a traceback follows, indented."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_utc(record.created), record.levelname, record.name, record.getMessage()]
        for key, value in _fields(record).items():
            if value is None:
                continue
            text = str(value)
            if not text or " " in text or '"' in text:
                text = orjson.dumps(text).decode()
            parts.append(f"{key}={text}")
        line = escape(" ".join(parts))
        trace = None
        if record.exc_info:
            trace = self.formatException(record.exc_info)
        elif record.exc_text:
            trace = record.exc_text
        if trace:
            line += "".join("\n  " + escape(part) for part in trace.splitlines())
        return line


def setup(
    level: str = "warning",
    verbose: int = 0,
    fmt: str = "text",
    stream: TextIO | None = None,
) -> None:
    """Configure logging for the process: streamsafe's loggers at ``level`` lowered one step per
    ``verbose``, everything else at WARNING (DEBUG from ``-vvv``), one handler on ``stream``
    (default stderr) in ``fmt``. Replaces any handler set before."""
    base = logging.getLevelNamesMapping()[level.upper()]
    own = max(logging.DEBUG, base - 10 * verbose)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose >= _ALL_LOGGERS_AT else logging.WARNING)
    logging.getLogger("streamsafe").setLevel(own)
    # uvicorn configures its own loggers only when asked to (streamsafe's servers do not ask):
    # left at no level, they follow the root's.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.NOTSET)
        logging.getLogger(name).propagate = True
