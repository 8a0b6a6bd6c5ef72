"""The replicas' key names (:mod:`streamsafe.gateway.replicas.redis_keys`): every key a script or a
blocking read touches with another is in its hash slot, as a Redis Cluster requires; the buckets'
slots are spread evenly; no caller-chosen string is part of a name. Pure: no Redis."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.gateway.replicas.record_seal import RecordSeal
from streamsafe.gateway.replicas.redis_keys import (
    CLUSTER_BUCKETS,
    KeyLayout,
    bucket_tags,
    slot,
)

pytestmark = pytest.mark.unit

_SEAL = RecordSeal("a secret")
_LAYOUTS = st.builds(
    KeyLayout,
    prefix=st.sampled_from(["ss:", "t0:", ""]),
    seal=st.sampled_from([None, _SEAL]),
    buckets=st.sampled_from([1, 3, CLUSTER_BUCKETS]),
)


@given(layout=_LAYOUTS, gen_id=st.text(min_size=1, max_size=40))
def test_a_generations_keys_share_one_slot_and_its_bucket(layout: KeyLayout, gen_id: str) -> None:
    # The append script touches log, lease, state and record; a follower's one blocking read
    # covers the log and state streams of every generation of a bucket, and its nudge stream.
    names = [
        layout.log_key(gen_id),
        layout.state_key(gen_id),
        layout.meta_key(gen_id),
        layout.lease_key(gen_id),
        layout.presence_key(gen_id),
    ]
    bucket = layout.gen_bucket(gen_id)
    nudge = layout.nudge_key("replica", bucket)
    assert len({slot(name) for name in [*names, nudge]}) == 1
    assert {layout.bucket_of(name) for name in names} == {bucket}


@given(layout=_LAYOUTS, key=st.text(max_size=60), tenant=st.text(max_size=20))
def test_a_claim_and_an_index_entry_sit_with_their_buckets_marker(
    layout: KeyLayout, key: str, tenant: str
) -> None:
    # The claim script reads its bucket's marker; a look-up by body reads it in the same round
    # trip, on one node.
    claim = layout.claim_key(key)
    assert slot(claim) == slot(layout.fleet_key(layout.bucket_of(claim)))
    entry = layout.fingerprint_key(tenant, key.encode())
    assert slot(entry) == slot(layout.fleet_key(layout.bucket_of(entry)))


@given(key=st.text(min_size=8, max_size=60).filter(lambda k: k.isprintable()))
def test_no_caller_string_is_part_of_a_name(key: str) -> None:
    layout = KeyLayout("ss:", _SEAL, CLUSTER_BUCKETS)
    assert key not in layout.claim_key(key)
    assert key not in layout.fingerprint_key(key, b"body")
    # With a secret the name is its HMAC, not its plain hash: another secret, another name.
    assert layout.claim_key(key) != KeyLayout("ss:", None, CLUSTER_BUCKETS).claim_key(key)


@pytest.mark.parametrize("buckets", [1, 2, 3, 16, CLUSTER_BUCKETS, 1000])
def test_each_buckets_slot_is_in_its_share_of_the_slots(buckets: int) -> None:
    slots = [slot("{" + tag + "}") for tag in bucket_tags(buckets)]
    width = 16384 / buckets
    assert [int(s // width) for s in slots] == list(range(buckets))


def test_a_cluster_of_three_primaries_holds_as_many_buckets_each() -> None:
    # Primaries hold equal ranges of slots (as redis-cli --cluster create gives them).
    layout = KeyLayout("ss:", None, CLUSTER_BUCKETS)
    per_node = Counter(slot(layout.fleet_key(b)) * 3 // 16384 for b in range(CLUSTER_BUCKETS))
    assert sorted(per_node.values()) == [21, 21, 22]
    # And generations spread over every bucket.
    gens = Counter(layout.gen_bucket(f"gen-{i:024x}") for i in range(6400))
    assert len(gens) == CLUSTER_BUCKETS and min(gens.values()) > 50


def test_one_redis_has_one_bucket_and_a_prefix_holds_no_hash_tag() -> None:
    layout = KeyLayout("ss:", None)
    assert layout.log_key("gen-1") == "ss:{0}gen-1:log"
    assert layout.fleet_keys() == ("ss:{0}fleet",)
    assert layout.claim_key("k").startswith("ss:{0}k:")
    with pytest.raises(ValueError, match=r"no \{ or \}"):
        KeyLayout("ss{x}:", None)
