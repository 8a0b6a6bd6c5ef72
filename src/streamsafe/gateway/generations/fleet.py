"""The fleet of gateway processes a registry belongs to, as the registry sees it: one interface
whatever its size (see docs/design.md, Replicas).

Several gateways sharing Redis are :class:`~streamsafe.gateway.replicas.replicas.Replicas`; a
process alone is a fleet of one replica (:class:`~streamsafe.gateway.generations.solo.Solo`).
The registry, what becomes of an ended generation and the grace periods ask the fleet the same
questions either way, so each behaviour has one path; a fleet of one answers that it shares
nothing.

A request's generation is looked for and a new one published through a :class:`Reach`: the
whole fleet, or this process alone (a fleet of one always; several replicas while Redis is
away, :attr:`Fleet.alone`).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Protocol

from streamsafe.gateway.errors import FleetUnsafe
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.store import EventLog, Store

__all__ = ["Fleet", "Followed", "Reach", "ReplicaCounters"]


class Followed(enum.Enum):
    """How a mirror's follower (:meth:`Fleet.follow`) ended: what its caller does next."""

    #: The mirror ended, moved to the end its owner recorded (or failed, lost or unreadable):
    #: its subscribers here finish from the copy, kept a moment.
    ENDED = "ended"
    #: This replica took it over from a dead owner (its lease and its log are this replica's
    #: now): it is run here from its log.
    TAKEN_OVER = "taken over"
    #: It is followed no more (forgotten here): nothing to do.
    UNFOLLOWED = "unfollowed"


@dataclass(slots=True)
class ReplicaCounters:
    """What the replica did with other replicas' generations (``/stats``, ``/metrics``)."""

    mirrored: int = 0
    taken_over: int = 0
    leases_lost: int = 0
    redis_errors: int = 0


class Reach(Protocol):
    """Where a request's generation is looked for, and a new one published: the fleet, or this
    process alone."""

    @property
    def store(self) -> Store:
        """Where keys are claimed."""
        ...

    @property
    def orphan_ttl(self) -> float | None:
        """Seconds a claim outlives a replica that died with nobody taking its generation over
        (``None``: as long as the generation, where no other replica could take it)."""
        ...

    async def find_fingerprint(self, tenant: str, fingerprint: bytes) -> str | None:
        """The id of the newest generation of ``tenant`` with this body elsewhere, if any."""
        ...

    async def find(
        self, gen_id: str, key: str | None, created_at: float, wait: float = 0.0
    ) -> Generation | None:
        """A copy of another replica's generation ``gen_id`` (not yet followed), its record
        waited for up to ``wait`` seconds; ``None`` where there is none."""
        ...

    def new_log(self, gen_id: str) -> EventLog:
        """The log of a generation this process starts."""
        ...

    async def publish(self, gen: Generation) -> None:
        """Make ``gen``, just started here, findable where this reaches."""
        ...


class Fleet(Reach, Protocol):
    """The replicas this process is one of, as the registry uses them."""

    #: True once this process shuts down: what it runs is handed over (where the fleet
    #: :attr:`hands_over`), not ended.
    closing: bool
    #: The generations this process holds (the registry's index, read, never called): what it
    #: writes back after the shared store lost them.
    held: Iterable[Generation]

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """The failures of the shared store, which leave this process alone until it answers
        again (:meth:`failed`)."""
        ...

    @property
    def degraded(self) -> bool:
        """True while the shared store is unreachable: new generations are this process's."""
        ...

    @property
    def alone(self) -> Reach:
        """This process alone: where generations are opened while :attr:`degraded`."""
        ...

    @property
    def hands_over(self) -> bool:
        """Whether another replica continues what this one runs when it stops (so a drain
        need not wait for it)."""
        ...

    @property
    def lease(self) -> float:
        """Seconds an owner's lease on a generation lasts."""
        ...

    @property
    def counters(self) -> ReplicaCounters:
        """What this replica did with other replicas' generations."""
        ...

    @property
    def fleet_replicas(self) -> int:
        """Replicas with a live heartbeat in the shared store, as last seen."""
        ...

    @property
    def redis_used_memory(self) -> int:
        """Bytes the shared store used, as last seen."""
        ...

    @property
    def trouble(self) -> str | None:
        """Why this process is not ready to share generations (``/ready`` answers 503 saying
        so), ``None`` where it is."""
        ...

    def failed(self, exc: BaseException) -> None:
        """The shared store failed under an operation (one of :attr:`errors`)."""
        ...

    def refusal(self) -> FleetUnsafe | None:
        """Why a generation that may duplicate one the fleet holds (under a key, a retry, a
        resume) must not start now (the shared store lost what the replicas hold); ``None``
        where it may."""
        ...

    def start(self) -> None:
        """Start the fleet's background work (leases, heartbeat)."""
        ...

    async def close(self) -> None:
        """Stop it, and let go of what this process holds in the fleet."""
        ...

    def owns(self, gen: Generation) -> bool:
        """True if this process runs ``gen`` under a lease the other replicas see."""
        ...

    def shares(self, gen: Generation) -> bool:
        """True if ``gen``'s log is in the shared store (run here or mirrored)."""
        ...

    def is_mirror(self, gen: Generation) -> bool:
        """True if another replica runs ``gen`` and this one copies it."""
        ...

    def follow(self, gen: Generation) -> Awaitable[Followed]:
        """Copy ``gen``, found by :meth:`find`, as its owner writes it: a mirror from now on
        (:meth:`is_mirror`). Returns its follower, for the caller to run as a task (the fleet
        holds it, and cancels it on :meth:`unfollow` and :meth:`close`); it returns how it
        ended, and the caller acts on that (no callback)."""
        ...

    def unfollow(self, gen: Generation) -> None:
        """Stop copying ``gen`` (forgotten here)."""
        ...

    def lost_lease(self, gen: Generation) -> Awaitable[Followed]:
        """Another replica took ``gen`` over while this one ran it: follow it (see
        :meth:`follow`, whose follower this returns)."""
        ...

    def subscribers_changed(self, gen: Generation) -> None:
        """``gen``'s subscribers here went from none to some, or back."""
        ...

    async def followed_elsewhere(self, gen: Generation) -> bool:
        """True if another replica has subscribers of ``gen`` (so it is not abandoned)."""
        ...

    async def finished(self, gen: Generation) -> None:
        """``gen``, which this process owns, ended: record how in the fleet."""
        ...

    async def hand_over(self, gen: Generation) -> None:
        """This process stops while ``gen``, which it owns, runs: another replica continues
        it."""
        ...

    async def let_go(self, gen: Generation) -> None:
        """``gen``, which this process ran and kept for replay, is kept no more: the fleet
        lets it go too."""
        ...
