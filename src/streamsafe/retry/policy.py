"""Retry settings as immutable values: :class:`RetryPolicy` for any call, :class:`StreamingConfig`
for streaming calls (the original report's proposal, in full).

Settings only; the rules that use them live in :func:`streamsafe.retry.decide`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_RETRY_STATUSES", "RetryPolicy", "StreamingConfig"]

#: Statuses worth another attempt: request timeout, lock conflict, rate limit, and the transient
#: server errors. Never 501 (the server will never do it) nor any other 4xx (the request is wrong).
DEFAULT_RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times, when and how long to wait before sending a call again.

    An immutable value (urllib3's model): change it with :meth:`replace`.
    """

    max_retries: int = 2
    """Retries after the first attempt (default 2, as Stainless clients): enough to ride out a
    blip, few enough that a failing backend sees at most 3x its load."""
    initial_delay: float = 0.5
    """Backoff cap of the first retry, in seconds (default 0.5)."""
    max_delay: float = 8.0
    """Largest backoff cap, in seconds (default 8): later retries never wait longer."""
    multiplier: float = 2.0
    """Growth of the backoff cap per attempt (default 2: 0.5, 1, 2, 4, 8, 8...)."""
    max_retry_after: float = 60.0
    """Largest server-asked wait (``Retry-After`` / ``retry-after-ms``) honoured, in seconds
    (default 60). A server asking for longer gets no retry: the caller learns now instead of
    hanging for minutes."""
    deadline: float | None = None
    """Seconds from the start of the call that bound every attempt, resume and wait together
    (default ``None``: bounded only by the total timeout). A retry whose wait would end past it
    is not made."""
    retry_statuses: frozenset[int] = DEFAULT_RETRY_STATUSES
    """Statuses retried (default 408, 409, 429, 500, 502, 503, 504)."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if not (self.initial_delay >= 0 and self.max_delay >= 0 and self.max_retry_after >= 0):
            raise ValueError("delays must be >= 0")
        if not self.multiplier >= 1:
            raise ValueError("multiplier must be >= 1")
        if self.deadline is not None and not self.deadline >= 0:
            raise ValueError("deadline must be >= 0 or None")

    def backoff_cap(self, attempt: int) -> float:
        """The most the ``attempt``-th retry (0-based) waits:
        ``min(max_delay, initial_delay * multiplier ** attempt)``."""
        if attempt <= 0:
            return min(self.max_delay, self.initial_delay)
        try:
            grown = self.initial_delay * self.multiplier**attempt
        except OverflowError:
            return self.max_delay
        if math.isnan(grown):  # 0 * inf
            return min(self.max_delay, self.initial_delay)
        return min(self.max_delay, grown)

    def backoff(self, attempt: int, rand: float) -> float:
        """Full-jitter backoff: ``rand * backoff_cap(attempt)``, ``rand`` drawn in ``[0, 1)``.

        Full jitter (rather than Stainless's 0-25 %) spreads clients that failed together, so
        they do not come back together."""
        return min(1.0, max(0.0, rand)) * self.backoff_cap(attempt)

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class StreamingConfig:
    """Retry rules for streaming calls; the original report's proposal, all three options.

    A streaming request may already hold engine memory when it looks failed (headers late, a
    500): sending another copy is how the reported retry storm killed the engine. So by
    default a stream is retried only where nothing can have started, and once committed it is
    resumed, never sent again.
    """

    max_retries: int = 0
    """Retries the caller opts into for failures where work may have started (default 0)."""
    retry_on_timeout: bool = False
    """Whether a timeout before the headers (write, first byte) counts for ``max_retries``
    (default False: the engine may be working on it)."""
    retry_on_server_error: bool = False
    """Whether a retryable status (5xx, 408, 409) or a connection lost before the headers
    counts for ``max_retries`` (default False: the engine may be working on it)."""
    retry_if_nothing_started: bool = True
    """Retry, within ``RetryPolicy.max_retries``, what cannot duplicate work (default True): the
    request never left the client (connection refused or failed, pool timeout, connect timeout),
    or the server answered 429 or 503 (it refused the work), or it said ``x-should-retry: true``."""
    resume: bool = True
    """Resume a committed stream that broke, where the server answered
    ``X-Stream-Resumable: true`` (default True): it re-sends nothing, it only reads on."""
    max_resumes: int = 5
    """Resumes per call (default 5): a stream that breaks more often has a real problem."""

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.max_resumes < 0:
            raise ValueError("max_retries and max_resumes must be >= 0")

    def replace(self, **changes: Any) -> StreamingConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)
