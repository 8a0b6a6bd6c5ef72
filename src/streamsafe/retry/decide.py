"""The one retry decision: every rule of docs/design.md, Client retries and budget, in one place.

Pure (sans-I/O, like h11): the caller passes the time, the random draw and the budget; nothing
here sleeps, reads a clock or draws a number. The same inputs always give the same decision.
"""

from __future__ import annotations

from streamsafe.retry.budget import RetryBudget
from streamsafe.retry.outcome import Decision, Outcome
from streamsafe.retry.policy import RetryPolicy, StreamingConfig
from streamsafe.retry.refusal import REFUSAL_STATUSES
from streamsafe.retry.retry_after import parse_retry_after

__all__ = ["decide", "nothing_started"]


def _give_up(reason: str) -> Decision:
    return Decision("give_up", 0.0, reason)


def nothing_started(outcome: Outcome) -> bool:
    """Whether the outcome proves that no work can have started upstream.

    True where the request never left the client (no connection, connect or pool timeout: what
    gRPC retries transparently) and where the server answered 429 or 503 (it refused the work)
    or said ``x-should-retry: true``.
    """
    if outcome.committed:
        return False
    if outcome.kind == "connect_error":
        return True
    if outcome.kind == "timeout":
        return outcome.phase in ("connect", "pool")
    if outcome.kind == "status":
        return outcome.status_code in REFUSAL_STATUSES or outcome.should_retry_header is True
    return False


def _retryable_by_policy(policy: RetryPolicy, outcome: Outcome) -> bool:
    if outcome.kind in ("connect_error", "timeout", "disconnected"):
        return True
    if outcome.kind == "status":
        return outcome.should_retry_header is True or outcome.status_code in policy.retry_statuses
    return False


def decide(
    policy: RetryPolicy,
    streaming: StreamingConfig | None,
    outcome: Outcome,
    *,
    attempt: int,
    resumes: int,
    budget: RetryBudget | None,
    now: float,
    started_at: float,
    rand: float,
) -> Decision:
    """Decide what follows ``outcome``.

    - ``policy``: the call's :class:`RetryPolicy`; ``streaming``: its :class:`StreamingConfig`
      for a streaming call, ``None`` for a plain one.
    - ``attempt``: attempts already made before this outcome's, 0-based (0 after the first
      attempt failed); ``resumes``: resumes already made.
    - ``budget``: asked, never changed (it reads the clock it was built with; the caller
      records the retry this decision allows).
    - ``now``, ``started_at``: Unix time now and when the call began (for the deadline and an
      HTTP-date ``Retry-After``); ``rand``: a draw in ``[0, 1)`` for the jitter.

    Rules, in order: a total timeout or a passed deadline ends the call. A committed outcome
    (headers arrived) is never retried: a stream is resumed where the server is resumable,
    resume is on and resumes are left. Before commit, ``x-should-retry: false`` forbids a retry.
    A plain call retries connect errors, timeouts, lost connections and the policy's statuses,
    ``policy.max_retries`` times. A stream retries only what cannot duplicate work
    (:func:`nothing_started`, within ``policy.max_retries``) unless the caller opted in through
    ``StreamingConfig`` (``retry_on_timeout`` / ``retry_on_server_error``, within
    ``streaming.max_retries``). Then the budget must allow it; the wait is the server's
    ``Retry-After`` (refused above ``max_retry_after``) or full jitter
    ``rand * min(max_delay, initial_delay * multiplier ** attempt)``; a wait ending past the
    deadline gives up.
    """
    if outcome.kind == "success":
        return _give_up("succeeded: nothing to retry")
    what = outcome.describe()
    if outcome.kind == "timeout" and outcome.phase == "total":
        return _give_up(f"total timeout: {what}")
    deadline_at = None if policy.deadline is None else started_at + policy.deadline
    if deadline_at is not None and now >= deadline_at:
        return _give_up(f"deadline of {policy.deadline:g} s passed: {what}")

    if outcome.committed:
        return _resume(policy, streaming, outcome, resumes, now, deadline_at, rand)
    return _retry(policy, streaming, outcome, attempt, budget, now, deadline_at, rand)


def _retry(
    policy: RetryPolicy,
    streaming: StreamingConfig | None,
    outcome: Outcome,
    attempt: int,
    budget: RetryBudget | None,
    now: float,
    deadline_at: float | None,
    rand: float,
) -> Decision:
    """An uncommitted outcome: retry where the call's kind allows it, retries and the budget
    are left, and the wait (the server's or the backoff) ends within the deadline."""
    what = outcome.describe()
    if outcome.should_retry_header is False:
        return _give_up(f"{what}: the server said x-should-retry: false")
    limit = _retry_limit(policy, streaming, outcome)
    if limit is None:
        return _give_up(
            f"{what}: not retryable"
            if streaming is None
            else f"{what}: a stream is not retried once the server may have started it "
            "(opt in with StreamingConfig)"
        )
    if attempt >= limit:
        return _give_up(f"{what}: {attempt + 1} attempts made, retries exhausted")
    if budget is not None and not budget.allow_retry():
        return _give_up(f"{what}: retry budget exhausted ({budget.balance:.2f} retries left)")
    server_wait = parse_retry_after(outcome.headers, now) if outcome.kind == "status" else None
    if server_wait is not None and server_wait > policy.max_retry_after:
        return _give_up(
            f"{what}: the server asked to wait {server_wait:g} s, more than "
            f"max_retry_after={policy.max_retry_after:g} s"
        )
    delay = policy.backoff(attempt, rand) if server_wait is None else server_wait
    if deadline_at is not None and now + delay > deadline_at:
        return _give_up(f"{what}: a retry in {delay:.2f} s would end past the deadline")
    return Decision("retry", delay, f"attempt {attempt + 2}/{limit + 1}: {what}")


def _resume(
    policy: RetryPolicy,
    streaming: StreamingConfig | None,
    outcome: Outcome,
    resumes: int,
    now: float,
    deadline_at: float | None,
    rand: float,
) -> Decision:
    """A committed outcome: never re-sent; a stream is resumed where the server can, resume is
    on and resumes are left (within the deadline)."""
    what = outcome.describe()
    if streaming is None:
        return _give_up(f"{what}: the response had started, a call is never re-sent then")
    if not outcome.resumable:
        return _give_up(f"{what}: the server cannot resume this stream")
    if not streaming.resume:
        return _give_up(f"{what}: resume is off")
    if resumes >= streaming.max_resumes:
        return _give_up(f"{what}: all {streaming.max_resumes} resumes used")
    # The first resume is immediate (a reset is usually one bad connection); later ones back
    # off like retries so a flapping server is not hammered.
    delay = 0.0 if resumes == 0 else policy.backoff(resumes - 1, rand)
    if deadline_at is not None and now + delay > deadline_at:
        return _give_up(f"{what}: a resume would end past the deadline")
    return Decision("resume", delay, f"resume {resumes + 1}/{streaming.max_resumes}: {what}")


def _retry_limit(
    policy: RetryPolicy, streaming: StreamingConfig | None, outcome: Outcome
) -> int | None:
    """How many retries an uncommitted outcome allows in all, ``None`` where it is not retried:
    a plain call by the policy; a stream only what cannot duplicate work, unless opted in."""
    if streaming is None:
        return policy.max_retries if _retryable_by_policy(policy, outcome) else None
    if streaming.retry_if_nothing_started and nothing_started(outcome):
        return policy.max_retries
    if (outcome.kind == "timeout" and streaming.retry_on_timeout) or (
        outcome.kind != "timeout"
        and streaming.retry_on_server_error
        and _retryable_by_policy(policy, outcome)
    ):
        return streaming.max_retries
    return None
