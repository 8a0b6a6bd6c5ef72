"""The roles a generation has among replicas (see
:mod:`streamsafe.gateway.generations.roles`), each the answer of one place it can be in:

- :class:`Shared`: its log is in Redis, and this replica neither runs it nor copies it (found
  there, or kept for replay after it ran here);
- :class:`SharedOwner`: this replica runs it, under a lease the others see;
- :class:`Mirror`: another replica runs it, and this one copies it.

:class:`~streamsafe.gateway.replicas.replicas.Replicas` moves a generation from one to another
where it takes or loses its lease, follows or forgets it, so its role is where it is. The
roles ask it through :class:`Sharing`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol

from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.roles import MIRROR_KEPT, Followed
from streamsafe.gateway.generations.store import Store
from streamsafe.gateway.replicas.mirrors import Mirrors

__all__ = ["Mirror", "Shared", "SharedOwner", "Sharing"]


class Sharing(Protocol):
    """What the roles ask of the replicas that moves generations between them
    (:class:`~streamsafe.gateway.replicas.replicas.Replicas`, which this module sits below)."""

    closing: bool
    lease: float
    mirrors: Mirrors

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable."""
        ...

    @property
    def store(self) -> Store:
        """Where the fleet's keys are claimed."""
        ...

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """The failures of Redis."""
        ...

    def failed(self, exc: BaseException) -> None:
        """Redis failed under an operation."""
        ...

    async def finished(self, gen: Generation) -> None:
        """``gen``, run here, ended: record how."""
        ...

    async def hand_over(self, gen: Generation) -> None:
        """This replica stops while ``gen`` runs: another continues it."""
        ...

    async def let_go(self, gen: Generation) -> None:
        """``gen``, kept for replay here, is kept no more: its keys lapse soon."""
        ...

    async def followed_elsewhere(self, gen: Generation) -> bool:
        """True if another replica has subscribers of ``gen``."""
        ...

    def follow(self, gen: Generation) -> Awaitable[Followed]:
        """Copy ``gen`` as its owner writes it."""
        ...

    def lost_lease(self, gen: Generation) -> Awaitable[Followed]:
        """Another replica took ``gen``'s lease while this one ran it: follow it."""
        ...

    def unfollow(self, gen: Generation) -> None:
        """Stop copying ``gen``."""
        ...


class Shared:
    """A generation whose log is in Redis, neither run nor copied here (see the module)."""

    read_by_fleet = False
    forget_unread: float | None = None

    def __init__(self, replicas: Sharing) -> None:
        self._replicas = replicas

    def ended(self, gen: Generation, state: State) -> Coroutine[Any, Any, None] | None:
        """``None``: whoever runs it records its end."""
        return None

    def kept(self, gen: Generation, own: Store, keep: float) -> Coroutine[Any, Any, None] | None:
        """``None``: the owner's record of the end expires the key with the rest of the
        generation's keys (:meth:`Replicas.finished`)."""
        return None

    async def forgotten(self, gen: Generation, own: Store) -> None:
        """The key goes now where a retry must start over (failed, aborted, or evicted). An
        answer this replica let go of (evicted for --max-kept-mb, or past its time) goes from
        Redis too, so Redis holds what the replicas keep, not --keep-finished of everything.
        Nothing while Redis is away or this replica closes."""
        replicas = self._replicas
        if replicas.degraded or replicas.closing:
            return
        try:
            if gen.state is State.DONE:
                await replicas.let_go(gen)
            if gen.key is not None:
                await replicas.store.release(gen.key, gen.id)
        except replicas.errors as exc:
            replicas.failed(exc)

    def subscribers_changed(self, gen: Generation) -> None:
        """Nobody elsewhere needs to know."""

    async def read_elsewhere(self, gen: Generation) -> float | None:
        """``None``: not run here, so never abandoned here."""
        return None

    def follow(self, gen: Generation) -> Awaitable[Followed]:
        """Copy it as its owner writes it (:meth:`Replicas.follow`)."""
        return self._replicas.follow(gen)


class SharedOwner(Shared):
    """A generation this replica runs under a lease the others see."""

    read_by_fleet = True

    def ended(self, gen: Generation, state: State) -> Coroutine[Any, Any, None] | None:
        """Record its end; where a shutdown stopped it (not abandoned), hand it over instead:
        another replica continues it."""
        replicas = self._replicas
        if replicas.closing and state is State.ABORTED:
            return replicas.hand_over(gen)
        return replicas.finished(gen)

    async def read_elsewhere(self, gen: Generation) -> float | None:
        """A lease where another replica's subscribers read it (asked again after that)."""
        replicas = self._replicas
        return replicas.lease if await replicas.followed_elsewhere(gen) else None

    def follow(self, gen: Generation) -> Awaitable[Followed]:
        """Another replica took its lease while this one ran it (it paused past the lease):
        follow the new owner (:meth:`Replicas.lost_lease`)."""
        return self._replicas.lost_lease(gen)


class Mirror(Shared):
    """A generation another replica runs, copied here."""

    forget_unread: float | None = MIRROR_KEPT

    async def forgotten(self, gen: Generation, own: Store) -> None:
        """Stop copying it: the owner decides what Redis keeps."""
        self._replicas.unfollow(gen)

    def subscribers_changed(self, gen: Generation) -> None:
        """Tell its owner now, not at the next renewal (not while Redis is away)."""
        replicas = self._replicas
        if not replicas.degraded:
            replicas.mirrors.tell_presence(gen)
