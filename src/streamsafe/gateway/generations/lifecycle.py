"""The lifecycle of a generation, pure: its states, the events that move it, the table of moves,
and what must hold of its state, its length and its failure (see docs/design.md, Coalescing).

Like h11's connection state machine, it knows nothing of tasks, logs or sockets: an event goes
in, the next state comes out, and a move the table does not list raises
:class:`IllegalTransition`. :class:`~streamsafe.gateway.generations.generation.Generation` is
the one object that holds a generation's state, length and failure, and changes them only
through :func:`after`, :func:`check_append` and :func:`check_failure` (its per-chunk append
keeps the same rule with a single comparison, see ``Generation.appended``). Every other module
asks the generation to move; none assigns. :class:`Lifecycle` is the same rules as a value, for
the tests that drive random event sequences through both.

===========  ===============  =========
event        from             to
===========  ===============  =========
admitted     queued, running  running
appended     queued, running  unchanged
lease lost   queued, running  unchanged
taken over   queued, running  unchanged
completed    queued, running  done
failed       queued, running  failed
aborted      queued, running  aborted
===========  ===============  =========

Admitted again where running: a replica that took it over admits it anew. Appended where
queued: a mirror copies its owner's log, which may run ahead of the owner's record. Completed
where queued: a mirror found already ended. Failed carries a failure where its callers get a
status and body instead of events; no other end does. Done, failed and aborted are final: no
event moves them, and an append after the end, or one that makes the log shorter, is illegal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

__all__ = [
    "ENDING",
    "FINISHED",
    "LIVE",
    "TRANSITIONS",
    "Event",
    "IllegalTransition",
    "Lifecycle",
    "State",
    "after",
    "check_append",
    "check_failure",
]


class State(enum.Enum):
    """Where a generation is. Queued and running are live; the other three are finished."""

    #: Waiting for admission.
    QUEUED = "queued"
    #: Admitted and sent upstream.
    RUNNING = "running"
    #: Ended with ``[DONE]`` (or the whole non-streaming answer).
    DONE = "done"
    #: Ended with an error: a status before the first event, or an error event after it.
    FAILED = "failed"
    #: Stopped because nobody read it past the grace period, or at shutdown.
    ABORTED = "aborted"


class Event(enum.Enum):
    """What happens to a generation (the causes each stands for are the table's, above)."""

    #: Given its place in admission and sent upstream; again on a replica that took it over;
    #: for a mirror, its owner's record says it runs.
    ADMITTED = "admitted"
    #: Events appended to its log (for a mirror: copied from its owner's).
    APPENDED = "appended"
    #: Another replica took its lease while this one ran it (it paused past the lease).
    LEASE_LOST = "lease lost"
    #: This replica took it over from a dead owner, to run it from its log.
    TAKEN_OVER = "taken over"
    #: Its answer is whole: ``[DONE]``, the whole non-streamed answer, or the end the engine
    #: owed appended by the gateway.
    COMPLETED = "completed"
    #: Ended with an error: the engine's refusal or failure, shed, every engine down, the total
    #: timeout, a drain, a bug; or its owner's record says so.
    FAILED = "failed"
    #: Nobody read it past the grace period, or this process stopped while it ran.
    ABORTED = "aborted"


_Q, _R = State.QUEUED, State.RUNNING
#: The live states: a generation in one still takes events.
LIVE = frozenset({_Q, _R})
#: The final states: no event moves a generation in one.
FINISHED = frozenset({State.DONE, State.FAILED, State.ABORTED})

#: Every move there is, ``(state, event) -> next state``; a pair not here is illegal.
TRANSITIONS: Mapping[tuple[State, Event], State] = MappingProxyType(
    {
        (_Q, Event.ADMITTED): _R,
        # A replica that took it over admits it again (its copy says running already).
        (_R, Event.ADMITTED): _R,
        # A mirror copies its owner's log, which may run ahead of the owner's record.
        (_Q, Event.APPENDED): _Q,
        (_R, Event.APPENDED): _R,
        (_Q, Event.LEASE_LOST): _Q,
        (_R, Event.LEASE_LOST): _R,
        (_Q, Event.TAKEN_OVER): _Q,
        (_R, Event.TAKEN_OVER): _R,
        # Queued to done only for a mirror found ended (its copy starts queued).
        (_Q, Event.COMPLETED): State.DONE,
        (_R, Event.COMPLETED): State.DONE,
        (_Q, Event.FAILED): State.FAILED,
        (_R, Event.FAILED): State.FAILED,
        (_Q, Event.ABORTED): State.ABORTED,
        (_R, Event.ABORTED): State.ABORTED,
    }
)

#: The event that ends a generation in each final state.
ENDING: Mapping[State, Event] = MappingProxyType(
    {State.DONE: Event.COMPLETED, State.FAILED: Event.FAILED, State.ABORTED: Event.ABORTED}
)


class IllegalTransition(RuntimeError):
    """A generation was asked to move where its lifecycle has no such move: a bug in the
    caller (an event after the end, a length that went back, a failure with the wrong end)."""


def after(state: State, event: Event) -> State:
    """The state ``event`` moves a generation in ``state`` to; raises
    :class:`IllegalTransition` where the table has no such move."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise IllegalTransition(f"{event.value} in state {state.value}") from None


def check_append(state: State, length: int, new_length: int) -> None:
    """Raise :class:`IllegalTransition` unless a generation in ``state`` whose log holds
    ``length`` events may hold ``new_length`` now: live, and the log never shorter."""
    after(state, Event.APPENDED)
    if new_length < length:
        raise IllegalTransition(f"length {length} went back to {new_length}")


def check_failure(state: State, failure: object | None) -> None:
    """Raise :class:`IllegalTransition` unless a generation may end in ``state`` with
    ``failure``: a failure (the status and body its callers get) only with a failed end."""
    if failure is not None and state is not State.FAILED:
        raise IllegalTransition(f"a failure with a {state.value} end")


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A generation's lifecycle as an immutable value: each event gives a new one (the same
    rules :class:`~streamsafe.gateway.generations.generation.Generation` keeps in place)."""

    state: State = State.QUEUED
    #: Events in its log.
    length: int = 0
    #: Why it failed, where its callers get a status and body instead of events.
    failure: object | None = None

    @property
    def finished(self) -> bool:
        """Done, failed or aborted."""
        return self.state in FINISHED

    def on(self, event: Event) -> Lifecycle:
        """After ``event`` that changes neither its length nor its failure (admitted, lease
        lost, taken over, completed, aborted; failed without a failure)."""
        return replace(self, state=after(self.state, event))

    def appended(self, length: int) -> Lifecycle:
        """After events were appended: its log holds ``length`` now."""
        check_append(self.state, self.length, length)
        return replace(self, length=length)

    def ended(self, state: State, failure: object | None = None) -> Lifecycle:
        """After it ended in ``state`` (done, failed or aborted), with ``failure`` where its
        callers get a status instead of events."""
        try:
            event = ENDING[state]
        except KeyError:
            raise IllegalTransition(f"{state.value} is no end") from None
        check_failure(state, failure)
        return replace(self, state=after(self.state, event), failure=failure)
