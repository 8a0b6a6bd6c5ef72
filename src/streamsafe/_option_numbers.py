"""The numbers a command-line option takes: an integer or a finite number within a range.

``float("nan")`` and ``float("inf")`` parse, and NaN passes every range check written as a
comparison (``nan < 0`` is False), so ``--idle-timeout nan`` used to start a gateway whose
every stream then died in the transport. A :class:`Number` is an option's ``type``: argparse
turns its refusal into ``argument --idle-timeout: expected a finite number >= 0, not 'nan'``
and exit code 2 before anything starts, and a settings file's values go through the same
``type`` (:mod:`streamsafe._config_file`). Numbers are never secrets, so the value is echoed.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["Number"]


class Number:
    """An option's ``type``: an ``int`` (``integer``) or a finite ``float``, at least ``least``
    (above it where ``above``) and at most ``most`` where given."""

    def __init__(
        self,
        *,
        integer: bool = False,
        least: float | None = None,
        above: bool = False,
        most: float | None = None,
    ) -> None:
        self.integer = integer
        self.least = least
        self.above = above
        self.most = most
        #: argparse names the type by it in its own messages.
        self.__name__ = "integer" if integer else "number"

    def describe(self) -> str:
        """What the option takes, in words: ``a finite number >= 0``, ``an integer > 0``."""
        what = "an integer" if self.integer else "a finite number"
        if self.least is not None and self.most is not None:
            return f"{what} from {self.least:g} to {self.most:g}"
        if self.least is not None:
            return f"{what} {'>' if self.above else '>='} {self.least:g}"
        return what

    def __call__(self, text: str) -> int | float:
        try:
            value: int | float = int(text) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, not {text!r}") from None
        if (
            not math.isfinite(value)
            or (
                self.least is not None
                and (value <= self.least if self.above else value < self.least)
            )
            or (self.most is not None and value > self.most)
        ):
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, not {text!r}")
        return value

    def __repr__(self) -> str:
        return f"Number({self.describe()})"
