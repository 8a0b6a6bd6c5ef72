"""One logical call: its Idempotency-Key, attempts, resumes and deadline, its requests' headers
and timeouts, and turning decisions into log lines, hook calls and errors (what went wrong, as
an :class:`~streamsafe.retry.Outcome` and an error, is :mod:`streamsafe.client._call_failures`).
No I/O here; ``_async`` (and the ``_sync`` generated from it) do the sending."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import httpx2
import orjson

from streamsafe._version import __version__
from streamsafe.client._call_failures import MAX_ERROR_BODY, CallFailures
from streamsafe.client._settings import RetryEvent, Settings
from streamsafe.client.errors import RetryBudgetExhausted, StreamsafeError
from streamsafe.retry import Decision, Outcome, RetryBudget, decide

__all__ = ["MAX_ERROR_BODY", "Call"]

log = logging.getLogger("streamsafe.client")


class Call(CallFailures):
    """One logical call: its Idempotency-Key, attempts, resumes, deadline and the last event id
    seen. Every attempt and resume of the call goes through :meth:`decide`."""

    __slots__ = (
        "attempts",
        "body",
        "deadline_at",
        "idempotency_key",
        "last_event_id",
        "method",
        "path",
        "policy",
        "read_bound_by_total",
        "resumable",
        "resumes",
        "settings",
        "started_at",
        "stream",
        "throttled",
        "url",
        "user_headers",
    )

    def __init__(
        self,
        settings: Settings,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        stream: bool,
        idempotency_key: str | None = None,
    ) -> None:
        self.settings = settings
        self.method = method
        self.path = path
        self.url = settings.base_url + path
        self.body = None if body is None else orjson.dumps(body)
        self.stream = stream
        # Header names are matched case-insensitively: a caller's own "idempotency-key" header
        # is the call's key (not a second, different one next to ours).
        self.user_headers = {k.lower(): v for k, v in settings.headers.items()}
        given = idempotency_key or self.user_headers.pop("idempotency-key", None)
        self.idempotency_key = (given or str(uuid.uuid4())) if method == "POST" else None
        self.attempts = 0  # requests sent (first attempt, retries and resumes)
        self.resumes = 0
        self.last_event_id: str | None = None
        self.resumable = False
        self.read_bound_by_total = False
        self.started_at = settings.clock()
        policy = settings.retry
        total = settings.timeouts.total
        if total is not None and (policy.deadline is None or total < policy.deadline):
            policy = policy.replace(deadline=total)
        self.policy = policy
        self.deadline_at = None if policy.deadline is None else self.started_at + policy.deadline
        self.throttled = False  # given up because the budget refused a retry
        if settings.budget is not None:
            settings.budget.record_request()  # the retries of every call are a share of these

    # -- building a request --------------------------------------------------------------

    def headers(self, *, resume: bool) -> dict[str, str]:
        """The headers of the next request (lower-case names, so a caller's header replaces
        ours instead of travelling beside it; the call's own are set last)."""
        s = self.settings
        h = {
            "accept": "text/event-stream" if self.stream else "application/json",
            "user-agent": f"streamsafe/{__version__}",
            **self.user_headers,
        }
        if s.api_key:
            h["authorization"] = f"Bearer {s.api_key}"
        if self.body is not None:
            h["content-type"] = "application/json"
        if self.idempotency_key is not None:
            h["idempotency-key"] = self.idempotency_key
        h["x-retry-count"] = str(self.attempts)
        if self.stream:
            h["x-llamastack-streaming"] = "true"
        if resume and self.last_event_id is not None:
            h["last-event-id"] = self.last_event_id
        return h

    def _remaining(self) -> float | None:
        if self.deadline_at is None:
            return None
        return max(0.001, self.deadline_at - self.settings.clock())

    def _bounded(self, limit: float | None) -> float | None:
        left = self._remaining()
        self.read_bound_by_total = left is not None and (limit is None or left < limit)
        return left if self.read_bound_by_total else limit

    def timeout_extension(self) -> dict[str, float | None]:
        """Per-request timeouts for httpx2: ``read`` is the first-byte limit until the headers
        arrive, then :meth:`committed` turns it into the idle limit for the body (httpcore reads
        this dict when the body starts)."""
        t = self.settings.timeouts
        return {
            "connect": self._bounded(t.connect),
            "write": self._bounded(t.write),
            "pool": self._bounded(t.pool),
            "read": self._bounded(t.first_byte),
        }

    def committed(self, response: httpx2.Response, ext: dict[str, float | None]) -> None:
        """The headers arrived: from now on the read timeout is the idle one."""
        ext["read"] = self._bounded(self.settings.timeouts.idle)
        self.resumable = response.headers.get("x-stream-resumable", "").lower() == "true"

    def past_deadline(self) -> bool:
        return self.deadline_at is not None and self.settings.clock() >= self.deadline_at

    # -- deciding ------------------------------------------------------------------------

    def decide(self, outcome: Outcome) -> Decision:
        """Ask the retry core what follows ``outcome``, log one line, call the hook; a retry is
        withdrawn from the budget here, when it is decided (resumes are not retries: they
        replay what the server already did and never reach the budget)."""
        s = self.settings
        rand = s.random()
        decision = self._decide(outcome, s.budget, rand)
        if decision.give_up:
            # Where only the budget stood in the way, the caller is told so.
            self.throttled = s.budget is not None and self._decide(outcome, None, rand).retry
            log.info("giving up on %s %s: %s", self.method, self.path, decision.reason)
            return decision
        if decision.retry and s.budget is not None:
            s.budget.record_retry()
        verb = "retrying" if decision.retry else "resuming"
        log.info("%s in %.2f s, %s", verb, decision.delay, decision.reason)
        hook = s.on_retry if decision.retry else s.on_resume
        if hook is not None:
            hook(
                RetryEvent(
                    decision.action,
                    decision.delay,
                    decision.reason,
                    outcome,
                    self.attempts,
                    self.resumes,
                    self.idempotency_key,
                )
            )
        return decision

    def _decide(self, outcome: Outcome, budget: RetryBudget | None, rand: float) -> Decision:
        s = self.settings
        return decide(
            self.policy,
            s.streaming if self.stream else None,
            outcome,
            attempt=self.attempts - 1 - self.resumes,
            resumes=self.resumes,
            budget=budget,
            now=s.clock(),
            started_at=self.started_at,
            rand=rand,
        )

    def give_up_error(self, err: StreamsafeError) -> StreamsafeError:
        """The error to raise when a pre-commit failure is given up: the attempt's own error,
        or :class:`RetryBudgetExhausted` where only the budget stood in the way."""
        budget = self.settings.budget
        if not self.throttled or budget is None:
            return err
        return RetryBudgetExhausted(
            f"retry budget exhausted ({budget.balance:.2f} retries left): {err}",
            last_error=err,
            **self.kw(),
        )
