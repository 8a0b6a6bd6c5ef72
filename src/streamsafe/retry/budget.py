"""Retry throttling shared by every call of a client: retries may add a fixed share to the
recent requests, plus a small floor per second (Finagle's ``RetryBudget``, Envoy's retry
budget)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["RetryBudget"]

# Balances are kept in integer milli-retries, so that five deposits of 0.2 make exactly one
# retry (floats would leave 0.9999...). Only the floor's refill, a product of time, is a float.
_UNIT = 1000
# The window is kept as this many slices; a deposit leaves the window with its slice.
_SLICES = 10


class RetryBudget:
    """Allows retries up to ``ratio`` of the requests of the last ``window`` seconds, or
    ``min_per_second`` retries per second however few the requests: whichever is more, never
    the sum.

    Two balances, each charged for every retry: every request deposits ``ratio`` of a retry,
    kept for ``window`` seconds; a reserve starts full and refills at ``min_per_second`` up to
    ``min_per_second * window``. A retry is allowed while either holds one whole retry, and
    withdraws one from each (the oldest deposits first; each as far as it goes). So a backend
    that fails everything sees each request plus about ``ratio`` of them again (1.2x its load,
    not the 3x of two retries each): 100 calls to an engine refusing everything cost it at most
    125 requests, where a reserve added to the share (as this budget had it) let 134-140
    through. A backend that refuses a few requests before any work (10 % with the default
    20 %) costs no call, however the requests are spread in time: where the window's deposits
    fall short, time has refilled the reserve. The gRPC A6 token bucket this replaced spent a
    token on every failure and earned a tenth of one per success, so 10 % of 503s kept it at
    its threshold and calls a healthy backend would have served failed with
    ``RetryBudgetExhausted``.

    The client deposits once per call and withdraws once per retry it sends; resumes of a
    committed stream are not retries (they replay what the server already did) and are bounded
    by ``StreamingConfig.max_resumes`` instead.

    Defaults, and why:

    - ``ratio=0.2``: Envoy's ``budget_percent`` and Finagle's ``percentCanRetry`` both default
      to 20 %. A storm adds a fifth to the load; a backend refusing 10 % of requests is
      covered twice over, so a refused retry may itself be retried.
    - ``window=10.0`` seconds: Finagle's TTL. Long enough to pool the deposits of a bursty
      client; short enough that requests from a minute ago do not pay for a storm now.
    - ``min_per_second=0.5``: a client sending one request a minute still gets its retries
      (5 banked, one more every 2 s), as Envoy's ``min_retry_concurrency`` and Finagle's
      ``minRetriesPerSec`` allow (theirs are 3 concurrent and 10/s for a whole server; one
      client process needs less). The reserve is what a storm gets beyond the share, at its
      start: 10 (at 1/s) let 100 failing calls make 130 requests.

    Pure: no I/O; the time comes from ``clock`` (``time.monotonic`` unless given; a client
    given ``clock=`` builds its default budget on that clock), so the same clock readings always
    give the same answers. Thread-safe and asyncio-safe: one short lock, taken per call and per
    retry, never per chunk, never held across an ``await``.
    """

    __slots__ = (
        "_clock",
        "_deposits",
        "_lock",
        "_refilled_at",
        "_reserve",
        "_slice",
        "min_per_second",
        "ratio",
        "window",
    )

    def __init__(
        self,
        ratio: float = 0.2,
        *,
        min_per_second: float = 0.5,
        window: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ratio >= 0.0:
            raise ValueError(f"ratio must be >= 0, got {ratio}")
        if not min_per_second >= 0.0:
            raise ValueError(f"min_per_second must be >= 0, got {min_per_second}")
        if not window > 0.0:
            raise ValueError(f"window must be > 0, got {window}")
        self.ratio = float(ratio)
        self.min_per_second = float(min_per_second)
        self.window = float(window)
        self._clock = clock
        self._slice = self.window / _SLICES
        # (slice number, milli-retries deposited in it and not yet withdrawn), oldest first.
        self._deposits: deque[list[int]] = deque()
        self._reserve = self._reserve_cap
        self._refilled_at: float | None = None
        self._lock = threading.Lock()

    @property
    def _reserve_cap(self) -> float:
        return self.min_per_second * self.window * _UNIT

    def _advance(self, now: float) -> int:
        """Refill the reserve and drop deposits older than the window; the slice of ``now``."""
        last = self._refilled_at
        if last is None or now > last:  # a clock that steps back refills nothing
            if last is not None:
                refill = (now - last) * self.min_per_second * _UNIT
                self._reserve = min(self._reserve_cap, self._reserve + refill)
            self._refilled_at = now
        current = int(now // self._slice)
        deposits = self._deposits
        while deposits and deposits[0][0] <= current - _SLICES:
            deposits.popleft()
        return current

    def _balance(self) -> float:
        # The floor is a floor, not an addition: retries may reach the share of the requests
        # or the floor, whichever is more (see the class docstring).
        return max(self._reserve, sum(amount for _, amount in self._deposits))

    def record_request(self) -> None:
        """A request was sent (a call's first attempt): deposit ``ratio`` of a retry."""
        with self._lock:
            current = self._advance(self._clock())
            amount = round(self.ratio * _UNIT)
            deposits = self._deposits
            if amount == 0:
                return
            if deposits and deposits[-1][0] >= current:
                deposits[-1][1] += amount
            else:
                deposits.append([current, amount])

    def allow_retry(self) -> bool:
        """Whether a retry may be sent now: one whole retry is in the budget."""
        with self._lock:
            self._advance(self._clock())
            return self._balance() >= _UNIT - 1e-6

    def record_retry(self) -> None:
        """A retry was sent: withdraw one retry from the deposits (oldest first) and one from
        the reserve, each as far as it goes (never below zero: a caller that retries without
        asking :meth:`allow_retry` takes what is there)."""
        with self._lock:
            self._advance(self._clock())
            due = _UNIT
            deposits = self._deposits
            while due and deposits:
                taken = min(due, deposits[0][1])
                deposits[0][1] -= taken
                due -= taken
                if deposits[0][1] == 0:
                    deposits.popleft()
            self._reserve = max(0.0, self._reserve - _UNIT)

    def record_success(self) -> None:
        """gRPC-style accounting for a caller that only sees outcomes: an attempt that got an
        answer counts as a request (:meth:`record_request`)."""
        self.record_request()

    def record_failure(self) -> None:
        """gRPC-style accounting for a caller that only sees outcomes: a failed attempt is
        paid for as the retry it may lead to (:meth:`record_retry`), so a backend that fails
        everything leaves only the floor's retries."""
        self.record_retry()

    @property
    def balance(self) -> float:
        """Retries the budget holds now (1.0 or more: a retry is allowed)."""
        with self._lock:
            self._advance(self._clock())
            return self._balance() / _UNIT

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self.ratio:g}, min_per_second={self.min_per_second:g}, "
            f"window={self.window:g}, balance={self.balance:.2f})"
        )
