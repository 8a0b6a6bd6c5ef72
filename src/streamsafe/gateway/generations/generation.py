"""A generation: one upstream request, its event log, its state, and its wake-up.

A :class:`Generation` is what every request with the same ``(tenant, Idempotency-Key)`` (or, for
an unkeyed retry, the same body) shares: the upstream reader appends to its log and calls
:meth:`Generation.publish` (new events) or :meth:`Generation.wake` (anything else); each
subscriber keeps its own cursor and waits on :meth:`Generation.next_change`, so a slow one never
holds up the reader or another subscriber. Subscribers that keep up are written to directly
instead (its :class:`~streamsafe.gateway.generations.fanout.Fanout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from streamsafe.gateway.admission.fair_queue import Waiter
from streamsafe.gateway.errors import Failure
from streamsafe.gateway.generations.fanout import Fanout
from streamsafe.gateway.generations.framing import framing_for
from streamsafe.gateway.generations.lifecycle import (
    ENDING,
    Event,
    IllegalTransition,
    State,
    after,
    check_append,
    check_failure,
)
from streamsafe.gateway.generations.request import AskHistory, Continuation, GenerationRequest
from streamsafe.gateway.generations.roles import LOCAL, Role
from streamsafe.gateway.generations.store import EventLog
from streamsafe.gateway.tracing import GenerationTrace

__all__ = [
    "GENERATION_OVERHEAD_BYTES",
    "Generation",
    "IllegalTransition",
    "State",
    "new_generation_id",
]

#: Memory a finished generation holds besides its log and its key, measured on CPython 3.11 (the
#: RSS of a gateway keeping thousands of tiny generations, about 2.2 KiB each with their logs):
#: the generation and its request, the index entries that find it (by id, key and
#: fingerprint), its retention entry and the store's key entry. Kept as measured before the
#: retention timer per generation gave way to one for all (a little less now: counted high).
GENERATION_OVERHEAD_BYTES = 2048

#: What a finished generation's next length would have to reach: more than any log holds, so
#: the one comparison of :meth:`Generation.appended` refuses every append after the end.
_SEALED = sys.maxsize


class Generation:
    """One upstream request and everything that follows from it.

    It owns its ``state``, ``length`` and ``failure``: they are read as plain attributes, and
    changed only by its methods (:meth:`admitted`, :meth:`appended`, :meth:`appended_one`,
    :meth:`lease_lost`, :meth:`taken_over`, :meth:`end`), each a move of its
    :mod:`~streamsafe.gateway.generations.lifecycle`; a move the lifecycle has not raises
    :class:`~streamsafe.gateway.generations.lifecycle.IllegalTransition`.

    Every change (events appended, state changed) bumps ``version`` and resolves the futures of
    the subscribers waiting for it. A subscriber notes ``version``, checks, and waits on
    :meth:`next_change` only if ``version`` has not moved meanwhile, so no change is missed and a
    change costs one integer increment plus one ``set_result`` per waiting subscriber (no new
    ``asyncio.Event`` per batch).
    """

    __slots__ = (
        "_least",
        "_waiters",
        "admitted_at",
        "attempts",
        "completion_tokens",
        "continuation",
        "continuations",
        "cost",
        "created_at",
        "duplicated",
        "engine",
        "failure",
        "fanout",
        "fingerprint",
        "finished_at",
        "first_event_at",
        "id",
        "key",
        "length",
        "log",
        "multiline",
        "plan",
        "refused",
        "request",
        "response_id",
        "role",
        "state",
        "stream",
        "subscribers",
        "task",
        "tenant",
        "timer",
        "trace",
        "upstream_status",
        "version",
        "waiter",
    )

    def __init__(
        self,
        gen_id: str,
        request: GenerationRequest,
        log_: EventLog,
        key: str | None,
        created_at: float = 0.0,
    ) -> None:
        # Long because it declares every attribute of this slotted object, each with why it is
        # kept: one place to read them all, as ``__slots__`` lists them.
        self.id = gen_id
        self.request = request
        self.tenant = request.tenant
        self.fingerprint = request.fingerprint
        self.stream = request.stream
        self.cost = request.cost
        #: The store key that finds it (``None`` for an unkeyed request).
        self.key = key
        self.log = log_
        #: What it is to the fleet (see :mod:`~streamsafe.gateway.generations.roles`): this
        #: process's alone until the fleet that publishes it says otherwise.
        self.role: Role[Generation] = LOCAL
        #: Events in the log (as known to this process); never shorter, and fixed at the end.
        self.length = 0
        #: What the next length must reach: the length while live, past any once finished
        #: (:data:`_SEALED`), so one comparison per append keeps both rules.
        self._least = 0
        self.state = State.QUEUED
        #: Why it failed before its first event (a status and body to answer with); only with
        #: a failed end.
        self.failure: Failure | None = None
        self.upstream_status: int | None = None
        self.subscribers = 0
        #: An identical request without a marker joined it while it ran (see finding.py).
        self.duplicated = False
        self.version = 0
        # A list only while someone waits: a generation kept for replay holds no container the
        # garbage collector walks but what it needs (see docs/benchmarks.md).
        self._waiters: list[asyncio.Future[None]] | tuple[()] = ()
        #: Subscribers that keep up, written to as events are published.
        framing = framing_for(request.route)
        self.fanout = Fanout(framing.encode, framing.heartbeat)
        #: The upstream reader.
        self.task: asyncio.Task[None] | None = None
        #: While live: the grace timer that aborts it; once finished: its retention timer.
        self.timer: asyncio.TimerHandle | None = None
        #: When it was created (the registry's clock); early commit counts its wait from here.
        self.created_at = created_at
        self.admitted_at: float | None = None
        #: The engine refused it and it has not admitted it since: it waits at the engine's
        #: refusal gate (or is its probe), and an early commit waits too, so that its caller
        #: gets the refusal's real status where it comes to that.
        self.refused = False
        #: When it finished (the registry's clock).
        self.finished_at: float | None = None
        #: Upstream attempts after the first (continuations and requests asked again).
        self.continuations = 0
        #: Requests sent upstream for it (failovers included), for the access log.
        self.attempts = 0
        #: Every request sent upstream for it, with the bounds they kept (an
        #: :class:`~streamsafe.gateway.engines.attempt_plan.AttemptPlan`; ``None`` before any, or
        #: where another replica ran it): the access line prints it.
        self.plan: AskHistory | None = None
        #: The engine of its latest attempt, where a pool chose one (``None``: the one
        #: upstream).
        self.engine: str | None = None
        #: When its first event came (``time.monotonic()``), for time to first token.
        self.first_event_at: float | None = None
        #: Completion tokens its answer's usage says, once read (see
        # :mod:`streamsafe.gateway.serving.access`).
        self.completion_tokens: int | None = None
        #: Its span and its attempt's ``traceparent``, where tracing is on.
        self.trace: GenerationTrace | None = None
        #: What the latest attempt asks instead of the request, where it continues a broken
        #: stream (``None``: the request as it came).
        self.continuation: Continuation | None = None
        #: Some payload holds a newline, so framing takes the slow path.
        self.multiline = False
        #: Its place in admission, from when it asks for one until it gives it back.
        self.waiter: Waiter | None = None
        #: A Responses stream: the response id its first event names, noted as that event is
        #: appended (how a resume or cancel by that id finds it, see
        #: :mod:`streamsafe.gateway.generations.response_ids`).
        self.response_id: str | None = None

    @property
    def finished(self) -> bool:
        """Done, failed or aborted: no event will be appended any more."""
        # Identity tests: an Enum member's hash is a Python-level call, and this runs per read.
        state = self.state
        return state is not State.RUNNING and state is not State.QUEUED

    @property
    def live(self) -> bool:
        """Queued or running."""
        state = self.state
        return state is State.QUEUED or state is State.RUNNING

    @property
    def kept_nbytes(self) -> int:
        """Memory it holds once finished and kept for replay: its log, its key (in the
        generation and in the store) and :data:`GENERATION_OVERHEAD_BYTES`."""
        key = 2 * len(self.key) if self.key is not None else 0
        return self.log.nbytes + GENERATION_OVERHEAD_BYTES + key

    def wake(self) -> None:
        """Wake every subscriber waiting on this generation, and hand the fan-out's members
        back to their own loops: something besides new events happened."""
        self.fanout.release_all()
        self._wake_waiters()

    def publish(self, payloads: Sequence[bytes], first: int) -> None:
        """Events ``first, first + 1, ...`` were appended: write them to the fan-out's members,
        wake the subscribers waiting."""
        self.fanout.publish(payloads, first, self.multiline)
        if self._waiters:
            self._wake_waiters()
        else:  # the usual case once its subscribers are in the fan-out
            self.version += 1

    # -- its lifecycle (see lifecycle.py: the only writes of state, length and failure) ----------

    def admitted(self) -> None:
        """It was given its place and sent upstream (again, where this replica took it over);
        for a mirror, its owner's record says it runs."""
        self.state = after(self.state, Event.ADMITTED)

    def appended(self, length: int) -> None:
        """Its log holds ``length`` events now (for a mirror: as copied from its owner's).
        Raises :class:`IllegalTransition` where the log went back or it has ended."""
        # Once per upstream read: one comparison (see _least), no table look-up.
        if length < self._least:
            self._refuse_append(length)
        self.length = self._least = length

    def appended_one(self, payload: bytes, length: int) -> None:
        """:meth:`appended` of one event, ``payload``, a single-line payload that does not end
        the stream, then :meth:`publish` of it (the relay's per-read short path: one call)."""
        if length < self._least:
            self._refuse_append(length)
        self.length = self._least = length
        self.fanout.publish_one(payload, length - 1)
        if self._waiters:
            self._wake_waiters()
        else:
            self.version += 1

    def _refuse_append(self, length: int) -> NoReturn:
        check_append(self.state, self.length, length)  # raises: why the append is refused
        raise IllegalTransition(f"{self.id}: append to {length} refused")

    def lease_lost(self) -> None:
        """Another replica took its lease while this one ran it: it is followed from now on."""
        self.state = after(self.state, Event.LEASE_LOST)

    def taken_over(self) -> None:
        """This replica took it over from a dead owner, to run it from its log."""
        self.state = after(self.state, Event.TAKEN_OVER)

    def end(self, state: State, failure: Failure | None = None) -> None:
        """It ended in ``state`` (done, failed or aborted), with ``failure`` (the status and
        body its callers get instead of events) only where it failed. Nothing moves it after;
        its subscribers are woken by whoever ended it (:meth:`wake`)."""
        try:
            event = ENDING[state]
        except KeyError:
            raise IllegalTransition(f"{self.id}: {state.value} is no end") from None
        check_failure(state, failure)
        self.state = after(self.state, event)
        self.failure = failure
        self._least = _SEALED

    def _wake_waiters(self) -> None:
        self.version += 1
        waiters = self._waiters
        if waiters:
            self._waiters = ()
            for waiter in waiters:
                if not waiter.done():  # cancelled by its subscriber's timeout
                    waiter.set_result(None)

    def next_change(self) -> asyncio.Future[None]:
        """A future the next :meth:`wake` resolves. Check ``version`` first (see the class)."""
        waiter = asyncio.get_running_loop().create_future()
        waiters = self._waiters
        if waiters:
            waiters.append(waiter)  # a non-empty one is a list
        else:
            self._waiters = [waiter]
        return waiter

    def forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        """Drop a waiter that stopped waiting (timed out), so idle generations do not collect
        them."""
        waiters = self._waiters
        if waiters:
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)

    def __repr__(self) -> str:
        return (
            f"Generation({self.id}, {self.state.value}, events={self.length}, "
            f"subs={self.subscribers})"
        )


def new_generation_id() -> str:
    """A random id (96 bits): unique across replicas and restarts, and telling nothing. A
    per-process counter, as it was, let a tenant read other tenants' volume off the ids of its
    own answers (``X-Streamsafe-Generation``)."""
    return "gen-" + os.urandom(12).hex()
