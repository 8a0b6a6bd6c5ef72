"""The names of the replicas' keys in Redis, and the hash slot each shares with the keys a script
or a blocking read touches with it (docs/design.md, Replicas).

A Redis Cluster runs a script, a transaction or a multi-key read only where every key it names
is in one hash slot, and a key whose name holds ``{tag}`` is in the tag's slot. So every key
carries one of ``buckets`` tags, each in a slot of its own, the slots spaced evenly over the
16384 (a cluster's primaries hold ranges of slots: each holds about as many buckets):

- a generation's keys (log, state, record, lease, subscribers) are in the bucket of its id:
  an append, a state change, and one blocking read of the streams of several generations each
  stay in one slot;
- a claim and an unkeyed-retry index entry are in the bucket of their name (a hash), next to
  that bucket's copy of the fleet's marker, which a claim checks in the same script and a
  look-up by body in the same round trip;
- a replica's nudge stream (what wakes its blocked read) is one per bucket it follows.

One Redis (or a Sentinel group) has one bucket: every key carries the same tag, which means
nothing there. No caller-chosen string is part of a name: an idempotency key and a body's
fingerprint are named by a hash (:func:`~streamsafe.gateway.replicas.record_seal.key_name`, an
HMAC under the replicas' secret where they share one).
"""

from __future__ import annotations

import zlib
from functools import cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from streamsafe.gateway.replicas.record_seal import RecordSeal, key_name

__all__ = ["CLUSTER_BUCKETS", "KeyLayout", "bucket_tags", "slot"]

#: Buckets on a Redis Cluster: 64 slots, 21 or 22 on each of 3 primaries, and a share of a
#: sixty-fourth of the load for a migration to move at a time. Every replica of a fleet must
#: use the same count (a claim is looked for in its bucket).
CLUSTER_BUCKETS = 64


def slot(key: str) -> int:
    """The hash slot of ``key`` in a Redis Cluster (its ``{tag}``'s where it has one)."""
    return int(key_slot(key.encode()))


@cache
def bucket_tags(buckets: int) -> tuple[str, ...]:
    """The hash tag of each of ``buckets`` buckets: the smallest number (as text) whose slot lies
    in the bucket's ``1/buckets`` of the slots, so the buckets' slots are spaced evenly."""
    if not 0 < buckets <= REDIS_CLUSTER_HASH_SLOTS:
        raise ValueError(f"buckets must be from 1 to {REDIS_CLUSTER_HASH_SLOTS}")
    width = REDIS_CLUSTER_HASH_SLOTS / buckets
    tags: list[str | None] = [None] * buckets
    left, n = buckets, 0
    while left:
        bucket = int(slot(str(n)) // width)
        if tags[bucket] is None:
            tags[bucket] = str(n)
            left -= 1
        n += 1
    return tuple(t for t in tags if t is not None)


class KeyLayout:
    """The key names of one fleet: under ``prefix``, named with ``seal``'s hashes (``None``: plain
    SHA-256), spread over ``buckets`` hash tags (see the module)."""

    __slots__ = ("_tags", "buckets", "prefix", "seal")

    def __init__(self, prefix: str, seal: RecordSeal | None, buckets: int = 1) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("a key prefix holds no { or }: they would make its hash tag")
        self.prefix = prefix
        self.seal = seal
        self.buckets = buckets
        self._tags = tuple(f"{prefix}{{{tag}}}" for tag in bucket_tags(buckets))

    # -- buckets --------------------------------------------------------------------------------

    def gen_bucket(self, gen_id: str) -> int:
        """The bucket of generation ``gen_id``'s keys."""
        return zlib.crc32(gen_id.encode()) % self.buckets if self.buckets > 1 else 0

    def _named(self, kind: str, text: str) -> str:
        """``kind:<hash of text>`` in the bucket the hash picks."""
        name = key_name(text, self.seal)
        return f"{self._tags[int(name[:8], 16) % self.buckets]}{kind}:{name}"

    def bucket_of(self, key: str) -> int:
        """The bucket of a key this layout named."""
        tag = key[: key.index("}") + 1]
        return self._tags.index(tag)

    # -- a generation's keys --------------------------------------------------------------------

    def log_key(self, gen_id: str) -> str:
        """A generation's event log (a stream)."""
        return f"{self._tags[self.gen_bucket(gen_id)]}{gen_id}:log"

    def state_key(self, gen_id: str) -> str:
        """A generation's state changes (a stream)."""
        return f"{self._tags[self.gen_bucket(gen_id)]}{gen_id}:state"

    def meta_key(self, gen_id: str) -> str:
        """A generation's record (a hash)."""
        return f"{self._tags[self.gen_bucket(gen_id)]}{gen_id}:meta"

    def lease_key(self, gen_id: str) -> str:
        """Which replica runs a generation."""
        return f"{self._tags[self.gen_bucket(gen_id)]}{gen_id}:lease"

    def presence_key(self, gen_id: str) -> str:
        """The replicas that have subscribers of a generation (a sorted set)."""
        return f"{self._tags[self.gen_bucket(gen_id)]}{gen_id}:subs"

    # -- claims, the index, the marker ----------------------------------------------------------

    def claim_key(self, key: str) -> str:
        """The claim of idempotency key ``key`` (named by a hash of it)."""
        return self._named("k", key)

    def fingerprint_key(self, tenant: str, fingerprint: bytes) -> str:
        """The unkeyed-retry index entry of ``(tenant, fingerprint)`` (named by a hash of
        both)."""
        return self._named("fp", f"{tenant}:{fingerprint.hex()}")

    def fleet_key(self, bucket: int) -> str:
        """Bucket ``bucket``'s copy of the fleet's marker."""
        return f"{self._tags[bucket]}fleet"

    def fleet_keys(self) -> tuple[str, ...]:
        """Every bucket's copy of the fleet's marker, by bucket."""
        return tuple(f"{tag}fleet" for tag in self._tags)

    # -- a replica's keys -----------------------------------------------------------------------

    def nudge_key(self, replica_id: str, bucket: int) -> str:
        """Replica ``replica_id``'s nudge stream in ``bucket``."""
        return f"{self._tags[bucket]}nudge:{replica_id}"

    def heartbeat_key(self) -> str:
        """The replicas' heartbeats (a sorted set)."""
        return f"{self._tags[0]}replicas"
