"""Retry throttling shared by every call of a client (gRPC A6's ``retryThrottling``)."""

from __future__ import annotations

import threading

__all__ = ["RetryBudget"]


class RetryBudget:
    """A token bucket that stops retries while a backend keeps failing.

    Starts full at ``max_tokens``. A failure spends one token (never below zero), a success
    earns ``token_ratio`` (never above ``max_tokens``). Retries are allowed only while tokens
    are above ``max_tokens / 2``: with the defaults (10, 0.1) about five straight failures stop
    retries, and it takes ten successes per failure to win them back, so when a whole backend is
    down the clients send each request once instead of three times.

    Thread-safe and asyncio-safe: one short lock around a float (taken per attempt, not per
    chunk, and never across an ``await``).
    """

    __slots__ = ("_lock", "_tokens", "max_tokens", "token_ratio")

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        if not max_tokens > 0:
            raise ValueError("max_tokens must be > 0")
        if not token_ratio > 0:
            raise ValueError("token_ratio must be > 0")
        self.max_tokens = float(max_tokens)
        self.token_ratio = float(token_ratio)
        self._tokens = self.max_tokens
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        """Tokens left now."""
        return self._tokens

    @property
    def threshold(self) -> float:
        """Retries are throttled while ``tokens <= threshold`` (``max_tokens / 2``)."""
        return self.max_tokens / 2

    def allow_retry(self) -> bool:
        """True while tokens are above half of ``max_tokens``."""
        return self._tokens > self.max_tokens / 2

    def record_failure(self) -> None:
        """An attempt failed: spend one token (floor 0)."""
        with self._lock:
            self._tokens = max(0.0, self._tokens - 1.0)

    def record_success(self) -> None:
        """An attempt succeeded: earn ``token_ratio`` (cap ``max_tokens``)."""
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def __repr__(self) -> str:
        return (
            f"RetryBudget(tokens={self._tokens:.2f}, max_tokens={self.max_tokens}, "
            f"token_ratio={self.token_ratio})"
        )
