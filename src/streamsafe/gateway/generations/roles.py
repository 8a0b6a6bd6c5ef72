"""What a generation is to the fleet, chosen when its log is opened (see docs/design.md,
Replicas): this process's alone (:data:`LOCAL`), or, with replicas, the shared owner's or a
mirror's (:mod:`streamsafe.gateway.replicas.roles`).

What becomes of a generation when it ends, is abandoned, kept or forgotten asks its role, never
which role it is: one path whatever the fleet's size. A process alone has one role only, so it
implements nothing it never does (a fleet of one replica, whose generations are all its own).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol, TypeVar

from streamsafe.gateway.generations.lifecycle import State
from streamsafe.gateway.generations.store import Store

#: The generation a role is asked about (a Generation: this module sits below it, which holds
#: its role).
G_contra = TypeVar("G_contra", contravariant=True)

__all__ = ["LOCAL", "MIRROR_KEPT", "Followed", "Held", "Local", "Role"]

#: Seconds a finished mirror stays here after its last subscriber (a reconnect within it reads
#: the copy; later ones read Redis again).
MIRROR_KEPT = 5.0


class Followed(enum.Enum):
    """How a mirror's follower (:meth:`Role.follow`) ended: what its caller does next."""

    #: The mirror ended, moved to the end its owner recorded (or failed, lost or unreadable):
    #: its subscribers here finish from the copy, kept a moment.
    ENDED = "ended"
    #: This replica took it over from a dead owner (its lease and its log are this replica's
    #: now): it is run here from its log.
    TAKEN_OVER = "taken over"
    #: It is followed no more (forgotten here): nothing to do.
    UNFOLLOWED = "unfollowed"


class Role(Protocol[G_contra]):
    """What the parts that keep, abandon and forget generations ask of one generation's place in
    the fleet. ``own`` is the store of this process's own keys and logs."""

    #: Another replica may read it while nobody here does (it runs here under a lease the
    #: others see): abandoned here, :meth:`read_elsewhere` is asked before it is aborted.
    read_by_fleet: bool
    #: Seconds the copy stays after its last subscriber here left, where it is forgotten rather
    #: than aborted (a mirror: its owner decides about the upstream request); ``None``: the
    #: grace period, then the abort.
    forget_unread: float | None

    def ended(self, gen: G_contra, state: State) -> Coroutine[Any, Any, None] | None:
        """``gen``, run here, ended in ``state``: what records that in the fleet, to run in the
        background (``None``: nothing to record)."""
        ...

    def kept(self, gen: G_contra, own: Store, keep: float) -> Coroutine[Any, Any, None] | None:
        """``gen`` is kept ``keep`` seconds for replay: what lets its key lapse then, to run in
        the background (``None``: the fleet's record of its end does)."""
        ...

    async def forgotten(self, gen: G_contra, own: Store) -> None:
        """``gen`` is forgotten here (its key in ``own`` released already): let go of its log."""
        ...

    def subscribers_changed(self, gen: G_contra) -> None:
        """``gen``'s subscribers here went from none to some, or back."""
        ...

    async def read_elsewhere(self, gen: G_contra) -> float | None:
        """Seconds to wait before asking again where subscribers on another replica read
        ``gen`` (so it is not abandoned); ``None`` where nobody does."""
        ...

    def follow(self, gen: G_contra) -> Awaitable[Followed]:
        """Copy ``gen`` as the replica that runs it writes it: a generation another replica
        runs, found there, or one whose lease another replica took while this one ran it. A
        mirror from then on; returns its follower, for the caller to run as a task (the fleet
        holds it, and cancels it where ``gen`` is forgotten or the fleet closes); it returns how
        it ended, and the caller acts on that (no callback)."""
        ...


class Held(Protocol):
    """What the role of a generation of this process's own needs of it."""

    id: str
    key: str | None


class Local:
    """A generation of this process's alone: its key and log in the process's own store, nothing
    of it elsewhere (a process alone's, a fleet of one replica; see the module)."""

    read_by_fleet = False
    forget_unread: float | None = None

    def ended(self, gen: Held, state: State) -> Coroutine[Any, Any, None] | None:
        """``None``: no other replica to tell."""
        return None

    def kept(self, gen: Held, own: Store, keep: float) -> Coroutine[Any, Any, None] | None:
        """Its key (where it has one) lapses with its retention."""
        return None if gen.key is None else own.expire(gen.key, gen.id, keep)

    async def forgotten(self, gen: Held, own: Store) -> None:
        """Its log goes from the process's store."""
        await own.drop_log(gen.id)

    def subscribers_changed(self, gen: Held) -> None:
        """Nobody elsewhere reads it."""

    async def read_elsewhere(self, gen: Held) -> float | None:
        """``None``: there is no elsewhere."""
        return None

    def follow(self, gen: Held) -> Awaitable[Followed]:
        """Never called: nothing of this process's alone is found elsewhere or loses a lease."""
        raise AssertionError(f"{gen.id}: a generation of this process alone is followed nowhere")


#: The role of every generation this process opens alone (it holds no state: one for all).
LOCAL = Local()
