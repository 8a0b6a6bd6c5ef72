"""The fleet of gateway processes a registry belongs to, as the registry sees it: one interface
whatever its size (see docs/design.md, Replicas).

Several gateways sharing Redis are :class:`~streamsafe.gateway.replicas.replicas.Replicas`; a
process alone is a fleet of one replica (:class:`~streamsafe.gateway.generations.solo.Solo`).
What becomes of one generation (ended, kept, abandoned, forgotten, followed) is asked of its
role (:mod:`~streamsafe.gateway.generations.roles`), chosen when its log is opened, not of the
fleet: the fleet is what the registry and the app ask of it as a whole, in narrow parts.

A request's generation is looked for and a new one published through a :class:`Reach`: the
whole fleet, or this process alone (a fleet of one always; several replicas while Redis is
away, :attr:`Fleet.alone`). The app shows :class:`FleetFigures`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from streamsafe.gateway.errors import FleetUnsafe
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.roles import Followed
from streamsafe.gateway.generations.store import EventLog, Store

__all__ = ["Fleet", "FleetFigures", "Followed", "Reach", "ReplicaCounters"]


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


class FleetFigures(Protocol):
    """What ``/stats``, ``/metrics`` and ``/ready`` show of the fleet."""

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
    def degraded(self) -> bool:
        """True while the shared store is unreachable: new generations are this process's."""
        ...

    @property
    def trouble(self) -> str | None:
        """Why this process is not ready to share generations (``/ready`` answers 503 saying
        so), ``None`` where it is."""
        ...


class Fleet(Reach, FleetFigures, Protocol):
    """The replicas this process is one of, as the registry uses them: where generations are
    opened (:class:`Reach`, and :attr:`alone` while the shared store is away), what it shows
    (:class:`FleetFigures`), and its lifetime."""

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
    def alone(self) -> Reach:
        """This process alone: where generations are opened while :attr:`degraded`."""
        ...

    @property
    def hands_over(self) -> bool:
        """Whether another replica continues what this one runs when it stops (so a drain
        need not wait for it)."""
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
