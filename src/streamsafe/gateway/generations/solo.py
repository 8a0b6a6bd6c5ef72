"""A process alone: a fleet of one replica, behind the same interface as several
(:class:`~streamsafe.gateway.generations.fleet.Fleet`; see docs/design.md, Replicas).

It runs every generation it starts and shares none: its keys and logs are in its own store, it
finds nothing elsewhere, hands nothing over when it stops (a drain ends what still runs), and
is never degraded. Every generation it opens keeps the role of one of this process's alone
(:data:`~streamsafe.gateway.generations.roles.LOCAL`): no lease, no mirror, nothing to record
elsewhere, so nothing of that is asked of it here. :class:`LocalReach` is the part of
it that opens generations; a replica while Redis is away opens them the same way, with a log of
its own that it writes back later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from streamsafe.gateway.errors import FleetUnsafe
from streamsafe.gateway.generations.fleet import ReplicaCounters
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.store import EventLog, MemoryStore

__all__ = ["LocalReach", "Solo"]


class LocalReach:
    """Generations opened in this process only (a
    :class:`~streamsafe.gateway.generations.fleet.Reach`): keys claimed in ``store`` for as long
    as their generation, nothing found elsewhere. ``new_log`` makes a new generation's log,
    ``own`` is told that it runs here."""

    #: No other replica could take a generation over: a claim lasts as long as it.
    orphan_ttl: float | None = None

    def __init__(
        self,
        store: MemoryStore,
        *,
        new_log: Callable[[str], EventLog],
        own: Callable[[Generation], None],
    ) -> None:
        self.store = store
        self._new_log = new_log
        self._own = own

    async def find_fingerprint(self, tenant: str, fingerprint: bytes) -> str | None:
        """None: no other replica to ask."""
        return None

    async def find(
        self, gen_id: str, key: str | None, created_at: float, wait: float = 0.0
    ) -> Generation | None:
        """None: no other replica runs a generation."""
        return None

    def new_log(self, gen_id: str) -> EventLog:
        """The log of a generation started here."""
        return self._new_log(gen_id)

    async def publish(self, gen: Generation) -> None:
        """Nothing to publish to: ``gen`` runs here."""
        self._own(gen)


def _runs_here(gen: Generation) -> None:
    """A process alone keeps no list of what it runs: the registry's index is all there is."""


class Solo(LocalReach):
    """A process alone, whose keys and logs are in ``store``: a fleet of one replica (see the
    module). No shared store: never degraded, no figures of one."""

    #: Nothing fails under a process alone: its store is in memory.
    errors: tuple[type[BaseException], ...] = ()
    degraded = False
    #: Nobody continues what runs here: a drain waits for it, then ends it.
    hands_over = False
    fleet_replicas = 0
    redis_used_memory = 0
    #: Nothing shared to lose or misread: always ready as far as the fleet goes.
    trouble = None

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store, new_log=store.log, own=_runs_here)
        self.closing = False
        self.held: Iterable[Generation] = ()
        #: Always zero: there are no other replicas' generations.
        self.counters = ReplicaCounters()

    @property
    def alone(self) -> LocalReach:
        """Itself: a fleet of one is always alone."""
        return self

    def failed(self, exc: BaseException) -> None:
        """Never called: nothing fails (:attr:`errors` is empty)."""

    def refusal(self) -> FleetUnsafe | None:
        """None: every generation this process may duplicate is in its own index."""
        return None

    def start(self) -> None:
        """Nothing runs in the background."""

    async def close(self) -> None:
        """Nothing is held in a fleet."""
