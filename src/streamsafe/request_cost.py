"""What a completion request costs the engine, read exactly as vLLM reads it.

Admission, the continuation of a cut answer and the engine simulator must agree with the engine on
the numbers a request gives; otherwise a request the engine reads as 5,000 tokens passes a
gateway that read 1,024 (the default) and the engine runs out of memory. vLLM parses its request
models with pydantic in lax mode, so an integer field accepts more than a JSON integer:

- an integral float (``5000.0``, ``-0.0``) within the 64-bit range;
- a string of decimal digits, stripped of Unicode white space, with an optional sign, single
  underscores between digits and an optional fraction of zeros (``" +5_000.00 "`` is 5000;
  ``"5e3"``, ``"5000."``, ``"0x10"`` and non-ASCII digits are refused);
- ``true`` and ``false`` (1 and 0).

:func:`read_int` is that reading, and :class:`InvalidField` what vLLM answers with a 400 instead.
:func:`read_cost` reads the fields that decide the engine memory a request may take (OpenAI's
chat and completions shapes; the gateway maps its other wires onto them): the prompts (a
completions ``prompt`` list runs one generation per prompt, token-id prompts count one token per
id), the completion limit (``max_completion_tokens`` before ``max_tokens``, as vLLM's chat does),
and ``n``. vLLM 0.32 has no ``best_of``: it ignores the field, and so does the reading.

Pure and shared: the gateway imports it, the simulator too (neither imports the other).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamsafe.tokens import completion_prompts, estimate_prompt_tokens

__all__ = [
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "MAX_REQUEST_COST",
    "Cost",
    "InvalidField",
    "is_deterministic",
    "read_cost",
    "read_int",
]

#: The most one request is counted for, in tokens (2**40: beyond any engine's memory, so such a
#: request still cannot fit a memory budget). A request asking for more (``max_tokens`` 2**63-1,
#: or ``"9" * 30``) counts as this, so the sums admission keeps, and ``/stats``, stay within 64
#: bits however many such requests are in flight.
MAX_REQUEST_COST = 2**40

#: ``max_tokens`` of a completions request that gives none (or ``null``): vLLM's and OpenAI's
#: default for ``/v1/completions``. A chat that gives none may take the rest of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# Unicode White_Space, what pydantic-core (Rust's str::trim) strips; Python's str.strip() also
# strips U+001C..U+001F, which pydantic refuses.
_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)
_INT_TEXT = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?", re.ASCII)
# pydantic reads an integral float only within i64.
_FLOAT_LIMIT = 2.0**63
# Digits past which a number is past any engine's memory; int() of a longer string is skipped
# (Python refuses to parse over 4,300 digits, and it would be wasted work).
_HUGE_DIGITS = 30


class InvalidField(ValueError):
    """A field vLLM refuses with a 400: ``field`` names it, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def read_int(body: Mapping[str, Any], name: str) -> int | None:
    """``body[name]`` as vLLM's pydantic model reads an integer field: ``None`` where absent or
    ``null``; raises :class:`InvalidField` where vLLM answers 400. A number of more than 30
    digits reads as :data:`MAX_REQUEST_COST` (or its negative)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return _bounded(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer() or abs(value) >= _FLOAT_LIMIT:
            raise InvalidField(name, f"'{name}' must be an integer, got {value!r}")
        return _bounded(int(value))
    if isinstance(value, str):
        text = value.strip(_SPACE)
        if _INT_TEXT.fullmatch(text) is None:
            raise InvalidField(name, f"'{name}' must be an integer, got {_shown(value)}")
        digits = text.partition(".")[0].replace("_", "")
        if len(digits.lstrip("+-").lstrip("0")) > _HUGE_DIGITS:
            return -MAX_REQUEST_COST if digits.startswith("-") else MAX_REQUEST_COST
        return _bounded(int(digits))
    raise InvalidField(name, f"'{name}' must be an integer, got {type(value).__name__}")


def _bounded(value: int) -> int:
    return max(-MAX_REQUEST_COST, min(MAX_REQUEST_COST, value))


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


@dataclass(frozen=True, slots=True)
class Cost:
    """The engine memory a request may take, as its parts."""

    #: Estimated prompt tokens of every prompt, summed.
    prompt_tokens: int
    #: Generations per choice: the prompts of a completions ``prompt`` list (1 otherwise).
    prompts: int
    #: The completion limit asked for (``max_completion_tokens`` or ``max_tokens``), ``None``
    #: where the request gives none.
    max_tokens: int | None
    #: Choices per prompt (``n``, at least 1).
    n: int

    def tokens(self, default_max_tokens: int) -> int:
        """Tokens the request may hold in the engine: every prompt plus its completion limit
        (``default_max_tokens`` where none is given), times ``n``; at most
        :data:`MAX_REQUEST_COST`."""
        limit = default_max_tokens if self.max_tokens is None else self.max_tokens
        total = (self.prompt_tokens + self.prompts * max(0, limit)) * self.n
        return min(MAX_REQUEST_COST, total)


def read_cost(body: Mapping[str, Any], *, chat: bool) -> Cost:
    """The :class:`Cost` of an OpenAI chat (``chat``: ``messages``) or completions (``prompt``)
    body; raises :class:`InvalidField` where vLLM answers 400 (a limit or ``n`` that is no
    integer, or below what vLLM accepts). A chat reads ``max_completion_tokens`` before
    ``max_tokens``; a completions request has only ``max_tokens`` (16 where it gives none)."""
    name, limit = "max_tokens", read_int(body, "max_tokens")
    if chat:
        completion = read_int(body, "max_completion_tokens")
        if completion is not None:
            name, limit = "max_completion_tokens", completion
    elif limit is None:
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS
    if limit is not None and limit < 0:
        raise InvalidField(name, f"{name} must be at least 1, got {limit}.")
    n = read_int(body, "n")
    if n is not None and n < 1:
        raise InvalidField("n", f"n must be at least 1, got {n}.")
    prompts = 1 if chat else len(completion_prompts(body.get("prompt")))
    return Cost(estimate_prompt_tokens(body), prompts, limit, 1 if n is None else n)


#: vLLM samples greedily below this temperature (its ``_SAMPLING_EPS``).
_GREEDY_BELOW = 1e-5


def is_deterministic(body: Mapping[str, Any]) -> bool:
    """Whether an OpenAI-shaped body has one answer: greedy (``temperature`` 0, read as vLLM
    reads a float: ``"0"`` too) or seeded (a ``seed``, which makes vLLM's sampling of one request
    reproducible). A body that says neither is sampled with the engine's default temperature:
    two calls may rightly want two samples. Unreadable values read as not deterministic (the
    engine refuses them anyway)."""
    try:
        if read_int(body, "seed") is not None:
            return True
    except InvalidField:
        return False
    temperature = body.get("temperature")
    if isinstance(temperature, str):
        temperature = temperature.strip(_SPACE)
    try:
        return temperature is not None and abs(float(temperature)) < _GREEDY_BELOW
    except (TypeError, ValueError):
        return False
