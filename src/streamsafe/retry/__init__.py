"""``streamsafe.retry``: the pure retry core.

Settings (:class:`RetryPolicy`, :class:`StreamingConfig`), shared throttling
(:class:`RetryBudget`), what happened (:class:`Outcome`) and the one decision function
(:func:`decide`) that turns them into a :class:`Decision`; :func:`refusal_status` reads an error a
server sent in-band before any token as the refusal it is. No I/O, no sleeping, no clock or
randomness of its own: the caller passes the time and the random draw, so every rule is tested
without a network or a sleep.
"""

from __future__ import annotations

from streamsafe.retry.budget import RetryBudget
from streamsafe.retry.decide import decide, nothing_started
from streamsafe.retry.outcome import TIMEOUT_PHASES, Decision, Outcome
from streamsafe.retry.policy import DEFAULT_RETRY_STATUSES, RetryPolicy, StreamingConfig
from streamsafe.retry.refusal import REFUSAL_STATUSES, refusal_status
from streamsafe.retry.retry_after import MAX_RETRY_AFTER, parse_retry_after, retry_after_seconds

__all__ = [
    "DEFAULT_RETRY_STATUSES",
    "MAX_RETRY_AFTER",
    "REFUSAL_STATUSES",
    "TIMEOUT_PHASES",
    "Decision",
    "Outcome",
    "RetryBudget",
    "RetryPolicy",
    "StreamingConfig",
    "decide",
    "nothing_started",
    "parse_retry_after",
    "refusal_status",
    "retry_after_seconds",
]
