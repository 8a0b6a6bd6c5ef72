"""Reading a server's ``Retry-After`` (seconds or HTTP date) and ``retry-after-ms``."""

from __future__ import annotations

import email.utils
import math
from collections.abc import Iterable, Mapping

__all__ = ["MAX_RETRY_AFTER", "parse_retry_after", "retry_after_seconds"]

#: The most seconds :func:`retry_after_seconds` reads a ``Retry-After`` as (an hour): an engine
#: may send anything (``inf``, ``1e308``, a date in 2100), and past this a wait is no longer one.
MAX_RETRY_AFTER = 3600.0

Headers = Mapping[str, str] | Iterable[tuple[str, str]]


def _get(headers: Headers, name: str) -> str | None:
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key.lower() == name:
            return value
    return None


def _seconds(value: str) -> float | None:
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if math.isnan(number) or number < 0:
        return None
    return number


def parse_retry_after(headers: Headers | None, now: float) -> float | None:
    """Seconds the server asked to wait, or ``None`` where it asked nothing readable.

    ``retry-after-ms`` (milliseconds, OpenAI's) wins over ``Retry-After``, which is either
    seconds (fractions accepted) or an HTTP date, read relative to ``now`` (Unix time, passed in
    so that this stays a pure function); a date already past gives 0. Negative, NaN and
    malformed values are ignored; an absurdly large one comes back as is (possibly ``inf``) so
    that the caller can refuse it rather than wait.
    """
    if headers is None:
        return None
    ms = _get(headers, "retry-after-ms")
    if ms is not None:
        value = _seconds(ms)
        if value is not None:
            return value / 1000.0
    raw = _get(headers, "retry-after")
    if raw is None:
        return None
    value = _seconds(raw)
    if value is not None:
        return value
    try:
        parsed = email.utils.parsedate_tz(raw)
        if parsed is None:
            return None
        when = email.utils.mktime_tz(parsed)
    except (TypeError, ValueError, OverflowError):
        return None
    return max(0.0, float(when) - now)


def retry_after_seconds(
    value: str | None, now: float, most: float = MAX_RETRY_AFTER
) -> float | None:
    """Seconds one ``Retry-After`` value asks for, read as :func:`parse_retry_after` reads it and
    clamped to ``[0, most]``: every value has a meaning. Seconds (fractions too) are themselves;
    ``inf`` and anything larger than ``most`` (a huge number, a far date) are ``most``; an HTTP
    date is the seconds until it, 0 once past; ``None`` for no value, a negative number, NaN, or
    anything unreadable (the caller's own default applies)."""
    if not value:
        return None
    seconds = parse_retry_after((("retry-after", value),), now)
    return None if seconds is None else min(seconds, most)
