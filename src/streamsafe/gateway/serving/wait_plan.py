"""What a subscriber whose generation is still queued does now, before its response is
committed: wait, commit, shed the generation, or step back (see docs/design.md, Admission).

Pure, like :mod:`streamsafe.gateway.admission.fair_queue`: every input is a reading, and nothing
here waits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

__all__ = ["ANSWER_FRACTION", "Plan", "plan_wait"]


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What a subscriber whose generation is still queued does now (see :func:`plan_wait`).

    ``action``: ``wait`` (until ``until`` seconds from now, then plan again), ``commit`` (send
    the headers; the generation is then never shed), ``shed`` (refuse the generation: 429 to
    every subscriber not yet answered) or ``step-back`` (429 to this subscriber only; the
    generation keeps its place, dormant, for its return after ``retry_after``).
    """

    action: Literal["wait", "commit", "shed", "step-back"]
    retry_after: float = 0.0
    until: float = 0.0


#: Part of the client's read timeout within which the gateway answers a queued request (commit
#: or 429): the rest is left for the first token after admission and for the network.
ANSWER_FRACTION = 0.5


def plan_wait(
    *,
    predicted: float | None,
    waited: float,
    hold_left: float,
    patience: float | None,
    early: bool,
    commit_after: float,
    committed: bool,
    last_attempt: bool = False,
) -> Plan:
    """The decision for a subscriber whose generation is queued, before its response is
    committed. Pure: every input is a reading.

    - ``predicted``: predicted seconds until admission (``None``: unknown yet);
    - ``waited``: seconds this subscriber has waited;
    - ``hold_left``: seconds the gateway still holds the generation uncommitted (the queue
      timeout minus its wait so far);
    - ``patience``: the client's read timeout, where it said (``x-stainless-read-timeout``);
    - ``early``: the gateway commits early (else only on the first token);
    - ``commit_after``: seconds after which an early commit goes when the patience is unknown;
    - ``committed``: the generation was already committed (for another subscriber);
    - ``last_attempt``: the client said this is its last attempt (its retry count reached the
      Stainless default of 2 retries): told to come back, it would give up, so it is committed
      instead and heartbeats carry it to its place.

    Rules: a generation that will not be admitted within what the gateway holds is shed now,
    with a real 429, never after a commit. With early commit, the headers go only when the wait
    may reach the client's read timeout (or, where it or the wait is unknown, after
    ``commit_after``); with
    first-token commit a subscriber that would time out first is told to come back when its
    place comes (``step-back``), and its place is kept.
    """
    answer_by = None if patience is None else patience * ANSWER_FRACTION
    if committed:
        if early:
            return Plan("commit")
        if answer_by is None or (predicted is not None and waited + predicted < answer_by):
            return Plan("wait", until=math.inf if answer_by is None else answer_by - waited)
        return _step_back(predicted, patience, last_attempt)
    if hold_left <= 0 or (predicted is not None and predicted > hold_left):
        return Plan("shed", retry_after=predicted if predicted is not None else 1.0)
    if early:
        return _early_commit(predicted, waited, hold_left, answer_by, commit_after)
    if answer_by is None:
        return Plan("wait", until=hold_left)
    if waited >= answer_by:
        return _step_back(predicted, patience, last_attempt)
    if predicted is not None and waited + predicted >= answer_by and predicted >= answer_by / 2:
        # Not near (else stepping back would cost the client an attempt for nothing).
        return _step_back(predicted, patience, last_attempt)
    return Plan("wait", until=min(answer_by - waited, hold_left))


def _early_commit(
    predicted: float | None,
    waited: float,
    hold_left: float,
    answer_by: float | None,
    commit_after: float,
) -> Plan:
    """Early commit, the generation held: commit once the wait may reach ``answer_by`` (or,
    where that or the wait is unknown, after ``commit_after``); until then wait."""
    if answer_by is None:
        limit = commit_after
    elif predicted is None:  # no estimate yet (nothing finished): hold the client as before
        limit = min(commit_after, answer_by)
    else:
        limit = answer_by
    if waited >= limit or (
        answer_by is not None and predicted is not None and waited + predicted >= answer_by
    ):
        return Plan("commit")
    return Plan("wait", until=min(limit - waited, hold_left))


def _step_back(predicted: float | None, patience: float | None, last_attempt: bool) -> Plan:
    if last_attempt:
        return Plan("commit")
    return Plan("step-back", retry_after=_come_back(predicted, patience))


def _come_back(predicted: float | None, patience: float | None) -> float:
    # Back a little after the place is expected: a client back early times out or is sent back
    # again (an attempt each), while a place that comes early waits for it, or runs ahead if
    # the engine would idle and is replayed to it.
    if predicted is None:
        return 1.0
    lag = 0.0 if patience is None else patience * ANSWER_FRACTION / 2
    return predicted + lag
