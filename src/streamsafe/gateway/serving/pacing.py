"""When a streaming subscriber's response commits, when it heartbeats, and what a subscriber
whose generation is still queued is told: the rules, fed the clock's reading, no I/O.

:class:`Pacing` decides for one subscriber from its generation's state and the predicted wait in
the admission queue (see docs/design.md, Commit and Admission);
:func:`~streamsafe.gateway.serving.subscriber.serve_stream` does what it says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamsafe.gateway.admission.fair_queue import QUEUED
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.serving.wait_plan import ANSWER_FRACTION, plan_wait

__all__ = [
    "COMMIT",
    "HEARTBEAT",
    "MIN_CLIENT_HEARTBEAT",
    "SHED",
    "STEP_BACK",
    "UNSTATED_READ_TIMEOUT",
    "WAIT",
    "Pacing",
    "StreamRules",
    "heartbeat_within",
]

#: What :meth:`Pacing.step` asks for before the subscriber waits: nothing, the headers, a
#: heartbeat, refusing the queued generation (429 to all not yet answered), or a 429 to this
#: subscriber only while its generation keeps its place.
WAIT, COMMIT, HEARTBEAT, SHED, STEP_BACK = 0, 1, 2, 3, 4


#: Fewest seconds between heartbeats that a client's stated read timeout can ask for: a client
#: saying it waits 0.0001 s must not make the gateway spin writing heartbeats (the operator's
#: own ``heartbeat`` may still be shorter).
MIN_CLIENT_HEARTBEAT = 0.25

#: The read timeout assumed of a client that states none (ogx-client, curl, an SDK of another
#: make): 3 s, the shortest seen in the report's storms, so its heartbeats come every 1.5 s
#: before the first token. A comment line each: cheap, and only while nothing else flows.
UNSTATED_READ_TIMEOUT = 3.0


def heartbeat_within(heartbeat: float, patience: float | None) -> float:
    """Seconds between heartbeats for a client that waits ``patience`` seconds for a read
    (``None``: it did not say, and :data:`UNSTATED_READ_TIMEOUT` is assumed): ``heartbeat``, or
    less, so that one comes at least twice within its read timeout, but no less than
    :data:`MIN_CLIENT_HEARTBEAT` on the client's word. Stainless clients
    (``x-stainless-read-timeout``) never retry a timeout inside the body, so it must not fire
    there."""
    if patience is None or patience <= 0:
        patience = UNSTATED_READ_TIMEOUT
    return min(heartbeat, max(patience / 2, MIN_CLIENT_HEARTBEAT))


@dataclass(frozen=True, slots=True)
class StreamRules:
    """The gateway-wide settings of every streaming subscriber."""

    #: Commit before the first event (``commit="early"``).
    early: bool
    #: Seconds between heartbeats before the first event (0: none).
    heartbeat: float
    #: Seconds an early commit waits for upstream to accept before committing anyway: one
    #: heartbeat interval, at most 1 s, so the headers and then the heartbeats reach a client
    #: whose request waits in the queue long before its read timeout.
    commit_wait: float
    #: The ``x-stream-resumable`` header value.
    resumable: bytes
    #: Seconds a generation may wait for admission before it is shed, unless committed.
    queue_timeout: float = 20.0
    #: Keep a waiting non-streaming call's connection alive with whitespace (see
    #: :func:`serve_json`).
    json_keepalive: bool = False

    @classmethod
    def from_config(cls, config: GatewayConfig) -> StreamRules:
        """The rules ``config`` sets."""
        heartbeat = config.heartbeat
        return cls(
            early=config.commit == "early",
            heartbeat=heartbeat,
            commit_wait=min(heartbeat, 1.0) if heartbeat > 0 else 1.0,
            resumable=b"true" if config.keep_finished > 0 else b"false",
            queue_timeout=config.queue_timeout,
            json_keepalive=config.json_keepalive,
        )


class Pacing:
    """The commit and heartbeat rules of one streaming subscriber, fed the clock's reading.

    Headers go out with the first event. While the generation waits in the admission queue,
    :func:`~streamsafe.gateway.serving.wait_plan.plan_wait` decides from the predicted wait: commit
    early only when the wait may reach the client's read timeout (or, where the client did not
    say, ``commit_wait`` after it arrived), answer a real 429 before any commit where the wait
    will not fit, and under first-token commit tell a client that would time out to come back
    when its place comes. Once admitted, under early commit, the headers go when upstream
    accepted the request or ``commit_wait`` after admission, so heartbeats cover the first token
    (a slow but healthy request must never trip a client's read timeout). A generation about to
    ask for a place, or being refused, is never committed, so a refusal keeps its real status.
    Heartbeats stop once events flow.
    """

    __slots__ = (
        "_arrived",
        "_beat",
        "_last_attempt",
        "_next_beat",
        "_patience",
        "_rules",
        "committed",
        "flowing",
        "retry_after",
    )

    def __init__(
        self,
        rules: StreamRules,
        flowing: bool,
        arrived: float = 0.0,
        patience: float | None = None,
        last_attempt: bool = False,
    ) -> None:
        self._rules = rules
        self._next_beat = 0.0
        self._arrived = arrived
        self._patience = patience
        self._beat = heartbeat_within(rules.heartbeat, patience)
        self._last_attempt = last_attempt
        #: The response headers went out.
        self.committed = False
        #: Events went out (or the stream resumes past some): no more heartbeats.
        self.flowing = flowing
        #: After :data:`SHED` or :data:`STEP_BACK`: seconds until the client should come back.
        self.retry_after = 0.0

    def step(
        self, gen: Generation, now: float, predicted: float | None = None
    ) -> tuple[int, float | None]:
        """What to do before waiting (:data:`WAIT`: nothing, :data:`COMMIT`: send the headers,
        :data:`HEARTBEAT`, :data:`SHED`, :data:`STEP_BACK`) and the most seconds to wait for
        ``gen`` to change (``None``: no limit). ``predicted``: the predicted seconds until a
        queued ``gen`` is admitted. After :data:`COMMIT`, ask again before waiting."""
        rules = self._rules
        if not self.committed:
            place = gen.waiter
            if place is not None and place.state == QUEUED:
                plan = plan_wait(
                    predicted=predicted,
                    waited=now - self._arrived,
                    hold_left=place.since + rules.queue_timeout - now,
                    patience=self._patience,
                    last_attempt=self._last_attempt,
                    early=rules.early,
                    commit_after=rules.commit_wait,
                    committed=place.committed,
                )
                if plan.action == "commit":
                    return self._commit(now)
                if plan.action == "shed":
                    self.retry_after = plan.retry_after
                    return SHED, None
                if plan.action == "step-back":
                    self.retry_after = plan.retry_after
                    return STEP_BACK, None
                return WAIT, None if plan.until == math.inf else plan.until
            if rules.early and gen.refused and gen.state is State.RUNNING:
                # Waiting at the engine's refusal gate (bounded by the queue timeout): its
                # refusal keeps its status, unless the client's read timeout would fire first.
                if self._patience is None:
                    return WAIT, None
                answer_by = self._arrived + self._patience * ANSWER_FRACTION
                if now >= answer_by:
                    return self._commit(now)
                return WAIT, answer_by - now
            if rules.early and gen.state is State.RUNNING and gen.admitted_at is not None:
                deadline = gen.admitted_at + rules.commit_wait
                if gen.upstream_status == 200 or now >= deadline:
                    return self._commit(now)
                return WAIT, deadline - now
            return WAIT, None
        if not self.flowing and rules.heartbeat > 0:
            if now >= self._next_beat:
                self._next_beat = now + self._beat
                return HEARTBEAT, self._beat
            return WAIT, self._next_beat - now
        return WAIT, None

    def _commit(self, now: float) -> tuple[int, float | None]:
        self.committed = True
        self._next_beat = now + self._beat
        return COMMIT, None
