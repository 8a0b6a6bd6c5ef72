"""The fleet's marker in Redis (see :mod:`~streamsafe.gateway.replicas.store_redis`, Keys): one
hash per bucket, ``<prefix>{t}fleet``, holding an ``epoch`` (random, written by the first replica
that finds none) and a ``check`` sealed with the replicas' secret (empty without one).

The epoch tells whether Redis still holds the fleet's state: a claim and a look-up by body check
their bucket's epoch in the same round trip, and a Redis that lost the marker (flushed,
restarted empty, a cluster node that came back empty) lost every claim with it, so a key found
free then may be one a replica still holds (:class:`StateLost`). The check tells whether this
replica reads the records the others write (the same ``--redis-secret``, or none on both sides).
Every replica renews the marker's lifetime, so it lapses ``orphan_ttl`` after the last one, as
every other key does.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from streamsafe.gateway.replicas.record_seal import RecordSeal, Unreadable
from streamsafe.gateway.replicas.redis_client import RedisClient
from streamsafe.gateway.replicas.redis_keys import KeyLayout
from streamsafe.gateway.replicas.redis_scripts import Scripts, text

__all__ = ["FleetMarker", "StateLost"]


class StateLost(Exception):
    """Redis no longer holds the fleet's marker this replica knew (flushed, or restarted empty):
    it lost the claims, records and logs of the generations the replicas hold, so nothing it
    says is free may be taken as free until they wrote them back."""


#: What the fleet's check seals (see :meth:`FleetMarker.check`).
_CHECK = b"streamsafe fleet check"


class FleetMarker:
    """The fleet's marker as this replica knows it (see the module), in ``redis`` under the key
    names of ``keys``, its check sealed with ``seal`` (``None``: no secret)."""

    def __init__(
        self, redis: RedisClient, scripts: Scripts, keys: KeyLayout, seal: RecordSeal | None
    ) -> None:
        self.redis = redis
        self._scripts = scripts
        self.keys = keys
        self.seal = seal
        #: The fleet epoch this replica knows, one per bucket (``None`` until it first read the
        #: marker, and after it found one gone).
        self.epochs: tuple[str, ...] | None = None
        #: Seconds the fleet's marker outlives its last renewal (the replicas' ``orphan_ttl``).
        self.ttl = 3600.0
        #: Whether this replica reads the fleet's records, as the marker's check last said
        #: (``None`` until it was read). Where it does not, it does not find the others' keys
        #: either (they are named with another secret's hash).
        self.reads_fleet: bool | None = None

    def check(self) -> bytes:
        """What this replica writes as the fleet's check: a constant sealed with its secret
        (empty without one). A replica whose secret cannot open the check, or that has none
        where the check is sealed, cannot read the records the others write."""
        return b"" if self.seal is None else self.seal.seal("fleet", "check", _CHECK)

    def opens(self, check: bytes) -> bool:
        """Whether this replica reads the records of a fleet whose check is ``check``."""
        if self.seal is None or not check:
            return self.seal is None and not check
        try:
            return self.seal.open("fleet", "check", check) == _CHECK
        except Unreadable:
            return False

    async def read(self) -> tuple[str, ...]:
        """The fleet's epoch in every bucket (one pipeline), its marker written with a new
        epoch and this replica's check where Redis holds none; its lifetime renewed
        (:attr:`ttl`). Whether this replica reads the fleet's records is what every bucket's
        check says (:attr:`reads_fleet`)."""
        epoch = os.urandom(8).hex()
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys.fleet_keys():
                self._scripts.fleet_in(pipe, key, epoch, self.check(), self.ttl)
            markers = await pipe.execute()
        self.reads_fleet = all(self.opens(check or b"") for _, check in markers)
        return tuple(text(epoch) or "" for epoch, _ in markers)

    async def epoch(self, bucket: int) -> str:
        """The fleet's epoch this replica knows in ``bucket``, read (or written) where it knows
        none yet."""
        if not self.epochs:
            self.epochs = await self.read()
        return self.epochs[bucket]

    def lost(self, bucket: int, known: str, now: Any) -> NoReturn:
        """Raise :class:`StateLost`: the marker of ``bucket`` is ``now``, not the ``known``
        epoch. The next claim reads (or writes) the marker anew."""
        self.epochs = None
        found = text(now) or "none"
        where = f" in bucket {bucket}" if self.keys.buckets > 1 else ""
        msg = (
            f"redis lost the fleet's state (fleet marker{where} {found}, this replica knew {known})"
        )
        raise StateLost(msg)
