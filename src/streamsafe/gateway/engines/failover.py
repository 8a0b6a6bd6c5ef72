"""Failover before the first token: what to do when an attempt on an engine of the pool fails.

Sans-I/O, like :mod:`streamsafe.gateway.engines.pool`. Before the first token, a failed attempt
cannot have produced anything a subscriber saw, so the gateway may retry it: once on the same
engine where the status says "try again" (a 500, or a 429/503 with a short ``Retry-After``),
otherwise on another engine (a 429 or 503 that says nothing is a full engine), and a 400 that says
the context is too long on the configured larger model. Other 4xx are the caller's answer and are
passed through.

An engine may also refuse in-band: vLLM's load shedding (``--max-num-queued-reqs``) answers a
stream either 503 or 200 with a first event that is an error carrying 503.
:func:`refusal_status` tells such an event from a failure, so it is taken as the status it carries.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import orjson

from streamsafe.retry.refusal import REFUSAL_STATUSES
from streamsafe.retry.refusal import refusal_status as error_refusal

__all__ = [
    "REFUSAL_STATUSES",
    "RETRYABLE_STATUSES",
    "SAME_ENGINE_STATUSES",
    "Failover",
    "FailoverStep",
    "failover_step",
    "refusal_status",
]

#: Statuses that say "this engine cannot take it now" before any token: another engine may.
RETRYABLE_STATUSES = frozenset((429, 500, 502, 503, 504))
#: Statuses worth one more attempt on the same engine (transient by their meaning): a 500, and a
#: 429 or 503 that says when (a short ``Retry-After``). One that says nothing (vLLM's load
#: shedding) is a full engine: another is asked, and where there is none the relay waits the
#: refusal out within the queue timeout.
SAME_ENGINE_STATUSES = frozenset((429, 500, 503))
#: Markers of vLLM's and OpenAI's "prompt plus max_tokens exceed the context" 400s.
_CONTEXT_MARKERS = (b"context length", b"context_length", b"maximum context", b"too long")


class Failover(enum.Enum):
    """What to do with a request whose attempt failed before its first token."""

    SAME_ENGINE = "same-engine"
    OTHER_ENGINE = "other-engine"
    LARGER_MODEL = "larger-model"
    PASS_THROUGH = "pass-through"


@dataclasses.dataclass(frozen=True, slots=True)
class FailoverStep:
    """The decision and, for :attr:`Failover.SAME_ENGINE`, the seconds to wait first."""

    action: Failover
    delay: float = 0.0


def failover_step(
    status: int | None,
    body: bytes,
    *,
    retry_after: float | None,
    same_engine_tries: int,
    attempts: int,
    max_attempts: int,
    now: float,
    deadline: float | None,
    budget_allows: bool,
    larger_model: bool,
    sheds_answered: bool = False,
    max_same_engine_wait: float = 2.0,
    same_engine_retries: int = 1,
) -> FailoverStep:
    """The next step for an attempt that failed before any token reached the log.

    ``status`` is the upstream status, ``None`` for a transport failure (connect error, reset
    before the headers, first-token timeout). ``same_engine_tries`` counts retries already spent
    on this engine, ``attempts`` the attempts so far (``max_attempts`` bounds them, and
    ``budget_allows`` is the gateway's retry budget). ``larger_model`` says whether a fallback
    is configured for a context-length 400. ``sheds_answered`` (``--engine-refusals answer``):
    a shed (429, 503) is its caller's answer, never asked again of the same engine, even where
    it said when. ``max_same_engine_wait`` (default 2 s) is the longest
    ``Retry-After`` honoured on the same engine; a longer one sends the retry elsewhere.
    ``same_engine_retries`` (default 1) bounds the retries on the same engine. The caller is
    :class:`~streamsafe.gateway.engines.attempt_plan.AttemptPlan`, which keeps the counts.
    """
    if status is not None and 400 <= status < 500 and status != 429:
        too_long = status == 400 and larger_model and _says_context_too_long(body)
        if too_long and attempts < max_attempts:
            return FailoverStep(Failover.LARGER_MODEL)
        return FailoverStep(Failover.PASS_THROUGH)
    if status is not None and status not in RETRYABLE_STATUSES:
        return FailoverStep(Failover.PASS_THROUGH)
    if attempts >= max_attempts or not budget_allows:
        return FailoverStep(Failover.PASS_THROUGH)
    remaining = math.inf if deadline is None else deadline - now
    if remaining <= 0:
        return FailoverStep(Failover.PASS_THROUGH)
    says_when = status == 500 or (retry_after is not None and not sheds_answered)
    if status in SAME_ENGINE_STATUSES and same_engine_tries < same_engine_retries and says_when:
        delay = 0.0 if retry_after is None else retry_after
        if delay <= max_same_engine_wait and delay < remaining:
            return FailoverStep(Failover.SAME_ENGINE, delay)
    return FailoverStep(Failover.OTHER_ENGINE)


def refusal_status(payload: bytes, status: int) -> int | None:
    """The refusal an error event sent before the first token stands for: 503 or 429 where it
    carries one (``status``, as the upstream's kind read it: Llama Stack puts it in the
    message), else what :func:`streamsafe.retry.refusal_status` (the client's rule too) reads in
    its ``error``; ``None`` for any other error (a failure). Parsed once per attempt, never per
    chunk."""
    if status in REFUSAL_STATUSES:
        return status
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return error_refusal(body.get("error")) if isinstance(body, dict) else None


def _says_context_too_long(body: bytes) -> bool:
    lowered = body[:4096].lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)
