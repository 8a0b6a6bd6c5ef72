"""Which continuation a broken stream gets, decided from its request alone, before the first token
(see docs/design.md, Continuation): one rule, a continuation is exact or it is not made.

- **By token ids** (``ids``): the engine's state is the prompt plus the tokens generated, nothing
  more, so a completion whose prompt is those ids resumes exactly where the answer broke (greedy,
  or an unseeded sample, which goes on as another draw from the same distribution would).
- **Replay and verify** (``replay``): the engine's state is more than its tokens, or the text
  the caller saw is not all the tokens say. Stop strings (vLLM holds back text that may begin
  one while the ids go out), frequency and presence penalties (they count the answer's tokens,
  which a continuation would take as prompt), structured outputs and tools (the grammar would
  restart at the cut), logprobs (a completion by ids has no chat logprobs), a seeded sample
  (its random stream restarts at the cut), a caller that declined token ids. The gateway asks
  the engine for the whole answer again (the prompt is in its prefix cache), checks that it
  begins with what was delivered, token for token, and relays only what follows; an answer that
  differs ends the stream with an error, never a stitched answer.
- **None** (``none``): several choices at once (``n`` > 1, ``best_of``): refused with the reason.

Pure: a function of the request body and path, tested exhaustively.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ContinuationPlan", "plan_continuation"]

Way = Literal["ids", "replay", "none"]


@dataclass(frozen=True, slots=True)
class ContinuationPlan:
    """How a broken stream of one request is continued, and why (the request feature that
    decided it; empty for a continuation by ids)."""

    way: Way
    why: str = ""


#: Request fields whose effect a continuation by ids cannot carry on, with why (the first one a
#: request sets decides; the order is the table's in docs/design.md).
_STATEFUL: tuple[tuple[str, str], ...] = (
    ("stop", "stop strings (vLLM holds back text that may begin one)"),
    ("frequency_penalty", "a frequency penalty (it counts the answer's own tokens)"),
    ("presence_penalty", "a presence penalty (it counts the answer's own tokens)"),
    ("response_format", "a response format (its grammar would restart at the cut)"),
    ("structured_outputs", "structured outputs (their grammar would restart at the cut)"),
    ("guided_json", "guided decoding (its grammar would restart at the cut)"),
    ("guided_regex", "guided decoding (its grammar would restart at the cut)"),
    ("guided_choice", "guided decoding (its grammar would restart at the cut)"),
    ("guided_grammar", "guided decoding (its grammar would restart at the cut)"),
    ("tools", "tools (a tool call's parser and grammar would restart at the cut)"),
    ("functions", "functions (a call's parser would restart at the cut)"),
    ("logprobs", "logprobs (a completion by ids has no place for them)"),
    ("top_logprobs", "logprobs (a completion by ids has no place for them)"),
    ("prompt_logprobs", "prompt logprobs"),
    ("echo", "echo (the prompt is part of the answer)"),
)


def _set(name: str, value: Any) -> bool:
    """Whether ``value`` of request field ``name`` changes anything (``stop: []``,
    ``frequency_penalty: 0``, ``response_format: {"type": "text"}``, ``logprobs: false`` do
    not)."""
    if value is None or value is False:
        return False
    if name.endswith("penalty"):
        return isinstance(value, int | float) and not isinstance(value, bool) and value != 0
    if name == "response_format":
        return not (isinstance(value, Mapping) and value.get("type") == "text")
    if isinstance(value, str | list | tuple | Mapping):
        return len(value) > 0
    return True


def _several(body: Mapping[str, Any]) -> bool:
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and value != 1:
            return True
    return False


def plan_continuation(path: str, body: Mapping[str, Any]) -> ContinuationPlan:
    """The continuation a stream of ``body`` (to ``path``) gets if it breaks. ``path`` tells a
    chat from a completion: a completion's ``logprobs`` is a count, ``0`` asks for none."""
    if _several(body):
        return ContinuationPlan("none", "several choices (n > 1) are generated together")
    for name, why in _STATEFUL:
        value = body.get(name)
        if name == "logprobs" and not path.endswith("/chat/completions") and value == 0:
            continue
        if _set(name, value):
            return ContinuationPlan("replay", why)
    if body.get("return_token_ids") is False:
        return ContinuationPlan("replay", "the caller declined token ids")
    if body.get("seed") is not None and body.get("temperature") != 0:
        return ContinuationPlan("replay", "a seeded sample (its random stream would restart)")
    return ContinuationPlan("ids")
