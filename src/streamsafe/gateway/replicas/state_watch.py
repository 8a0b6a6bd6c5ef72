"""The watch over the fleet's state in Redis, as one replica keeps it (see
:mod:`~streamsafe.gateway.replicas.replicas`): whether Redis still holds it (the fleet's marker,
:mod:`~streamsafe.gateway.replicas.fleet_marker`, and the server's run id), and whether this
replica can read it (the marker's check: the same ``--redis-secret`` as the others).

Redis that lost the fleet's state (flushed, restarted empty) lost every claim, record and log, so
a key found free may be one a replica still holds: for a while no generation a retry may
duplicate starts here (:meth:`StateWatch.refusal`), while the replicas write back what they hold.
A replica that cannot read the others' records is not ready (:attr:`StateWatch.trouble`) and
refuses the same generations.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from streamsafe.gateway.errors import FleetUnsafe
from streamsafe.gateway.replicas.fleet_marker import StateLost
from streamsafe.gateway.replicas.mirrors import WRITE_BACK_WAIT
from streamsafe.gateway.replicas.store_redis import RedisStore

__all__ = ["RedisRestarted", "StateWatch"]


class RedisRestarted(Exception):
    """Redis answers with a new run id: it restarted, and may have lost everything."""


log = logging.getLogger("streamsafe.gateway")

#: Why a replica whose secret cannot open the fleet's check is not ready, and refuses.
_UNREADABLE = (
    "this replica cannot read the records the other gateway replicas write in redis:"
    " its --redis-secret is not theirs (every replica needs the same one, or none)"
)


class StateWatch:
    """What this replica knows of the fleet's state in ``store`` (see the module); ``lease``
    in seconds, as :class:`Replicas` takes it."""

    def __init__(
        self, store: RedisStore, *, lease: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.lease = lease
        self._clock = clock
        #: Until when (``clock``) no generation a retry may duplicate starts here: Redis lost
        #: the fleet's state, and the replicas write back what they hold meanwhile.
        self._lost_until: float | None = None
        #: Why this replica cannot read the records the others write (another
        #: ``--redis-secret``, or none where theirs are sealed); ``None`` where it can.
        self._unreadable: str | None = None
        self._redis_run: str | None = None  # Redis's run id, as last seen

    def lost(self, exc: StateLost, fleet_replicas: int) -> None:
        """Redis lost the fleet's state (flushed, restarted empty): every claim, record and log
        is gone, so a key found free may be one a replica still holds. This replica writes back
        what it holds (as after an outage), and for :data:`WRITE_BACK_WAIT` (two leases at
        least) the others have done so too, which they do within a third of a lease of seeing
        it: until then no generation a retry may duplicate starts here (:meth:`refusal`). A
        replica alone in the fleet (``fleet_replicas``, as its last heartbeat saw it) waits for
        nobody: what it holds, a retry here finds in its own index."""
        wait = max(WRITE_BACK_WAIT, 2 * self.lease) if fleet_replicas > 1 else 0.0
        if wait:
            self._lost_until = self._clock() + wait
        log.error(
            "%s: the replicas write back what they hold; new generations wait %g s",
            exc,
            wait,
            extra={"fields": {"event": "redis_state_lost"}},
        )

    def refusal(self) -> FleetUnsafe | None:
        """Why a generation that may duplicate one the fleet holds (under a key, a retry, a
        resume) must not start now; ``None`` where it may. A replica that cannot read the
        fleet's records (another ``--redis-secret``) finds neither their keys (named by hashes
        under the secret) nor what they hold: none starts there."""
        if self.store.marker.reads_fleet is False:
            return FleetUnsafe(_UNREADABLE, math.ceil(self.lease))
        if self._lost_until is None:
            return None
        left = self._lost_until - self._clock()
        if left <= 0:
            self._lost_until = None
            return None
        msg = (
            "redis lost the gateway replicas' shared state (flushed or restarted empty); they"
            " are writing back what they hold, and no new generation starts until then, so that"
            f" none runs twice; retry in {math.ceil(left)} s"
        )
        return FleetUnsafe(msg, math.ceil(left))

    @property
    def trouble(self) -> str | None:
        """Why this replica is not ready to share generations (``/ready`` answers 503): it
        cannot read the others' records, or Redis lost the fleet's state moments ago."""
        if self._unreadable is not None:
            return self._unreadable
        refused = self.refusal()
        return None if refused is None else refused.message

    async def check(self) -> StateLost | None:
        """Read the fleet's marker (written where there is none): what Redis lost where it is
        not the one this replica knew (Redis lost the fleet's state), else ``None``. A check
        this replica's secret cannot open says it cannot read the others' records: ``/ready``
        answers 503 (:attr:`trouble`) until it can."""
        marker = self.store.marker
        epochs = await marker.read()
        known, marker.epochs = marker.epochs, epochs
        if marker.reads_fleet:
            if self._unreadable is not None:
                log.info("this replica reads the fleet's records again")
            self._unreadable = None
        elif self._unreadable is None:
            self._unreadable = _UNREADABLE
            log.error("%s", self._unreadable, extra={"fields": {"event": "redis_secret_mismatch"}})
        if known is None or epochs == known:
            return None
        new = ", ".join(sorted({e for e, k in zip(epochs, known, strict=True) if e != k}))
        return StateLost(f"redis lost the fleet's state (its marker is new: {new})")

    def restarted(self, run_id: str | None) -> RedisRestarted | None:
        """How Redis restarted since it was last seen (its run id changed), else ``None``. It
        may have come back empty: the claims, records and logs of what this replica runs and
        keeps for replay are gone, so a retry with the same Idempotency-Key would start its
        generation again. A restart is taken as an outage that just ended: what this replica
        runs, and the finished generations it keeps for replay, are written back (see
        :mod:`~streamsafe.gateway.replicas.outage`)."""
        last, self._redis_run = self._redis_run, run_id or self._redis_run
        if last is None or run_id is None or run_id == last:
            return None
        return RedisRestarted(f"redis restarted (run id {last[:8]} -> {run_id[:8]})")
