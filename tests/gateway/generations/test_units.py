"""The pure parts: the memory store, SSE framing, generation ids. (Admission:
admission/test_admission.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.gateway.generations.generation import new_generation_id
from streamsafe.gateway.generations.store import MemoryStore
from streamsafe.sse import SSEDecoder, encode_events

pytestmark = pytest.mark.unit


async def test_memory_store_claim_is_set_nx_and_release_is_compare_and_delete() -> None:
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    assert await store.claim("k", "g1") is None
    assert await store.claim("k", "g2") == "g1"
    await store.release("k", "g2")  # not the owner: no effect
    assert await store.owner("k") == "g1"
    await store.expire("k", "g1", 5.0)
    now[0] = 6.0
    assert await store.owner("k") is None
    assert await store.claim("k", "g2") is None
    log = store.log("g2")
    assert await log.append([b"a", b"bc"]) == 2
    assert await log.read(1) == [b"bc"]
    assert log.nbytes > 3
    await store.drop_log("g2")
    assert store.log_count == 0


@given(st.lists(st.binary(min_size=1, max_size=30).filter(lambda b: b"\r" not in b), max_size=20))
def test_frames_decode_back_to_the_same_payloads_and_ids(payloads: list[bytes]) -> None:
    multiline = any(b"\n" in p for p in payloads)
    framed = encode_events(payloads, 5, multiline)
    events = SSEDecoder().feed(framed)
    assert [e.raw for e in events] == payloads
    assert [e.id for e in events] == [str(i) for i in range(5, 5 + len(payloads))]


def test_generation_ids_are_random_and_tell_nothing_of_the_volume() -> None:
    # They were a per-process counter behind a fixed prefix: a tenant could read the gateway's
    # volume (every tenant's) off the X-Streamsafe-Generation of two of its own answers.
    ids = [new_generation_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == len("gen-") + 24 and i.startswith("gen-") for i in ids)
    assert len({i[:8] for i in ids}) > 1000  # no shared prefix
    values = [int(i[4:], 16) for i in ids]
    assert values != sorted(values)  # no order
