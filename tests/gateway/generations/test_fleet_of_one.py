"""A process alone is a fleet of one replica (Solo), behind the interface the registry uses for
several (Fleet): it runs what it starts, in its own store, and shares nothing."""

from __future__ import annotations

import pytest

from streamsafe.gateway.generations.fleet import Fleet
from streamsafe.gateway.generations.generation import Generation, GenerationRequest, State
from streamsafe.gateway.generations.solo import Solo
from streamsafe.gateway.generations.store import MemoryStore
from streamsafe.gateway.upstream.kinds import KINDS

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

pytestmark = pytest.mark.unit


def _request() -> GenerationRequest:
    return GenerationRequest(
        tenant="t",
        path="/v1/chat/completions",
        body=b"{}",
        fingerprint=b"f",
        cost=1,
        stream=True,
        route=CHAT,
    )


async def _started(fleet: Fleet) -> Generation:
    """A generation opened through ``fleet`` as the registry opens one."""
    gen = Generation("gen-1", _request(), fleet.new_log("gen-1"), None, 0.0)
    await fleet.publish(gen)
    return gen


async def test_a_process_alone_opens_in_its_own_store_and_finds_nothing_elsewhere() -> None:
    store = MemoryStore()
    fleet: Fleet = Solo(store)
    assert fleet.alone is fleet and fleet.store is store
    assert not fleet.degraded and fleet.errors == ()
    assert fleet.orphan_ttl is None  # a claim lasts as long as its generation
    gen = await _started(fleet)
    assert store.log_count == 1  # the log is the store's, in this process
    assert await gen.log.append([b"a"]) == 1
    assert await fleet.find("gen-2", None, 0.0) is None
    assert await fleet.find_fingerprint("t", b"f") is None


async def test_a_process_alone_owns_no_lease_mirrors_nothing_and_hands_nothing_over() -> None:
    store = MemoryStore()
    fleet: Fleet = Solo(store)
    fleet.start()
    gen = await _started(fleet)
    assert not fleet.owns(gen) and not fleet.shares(gen) and not fleet.is_mirror(gen)
    assert not await fleet.followed_elsewhere(gen)  # abandoned means abandoned
    assert not fleet.hands_over  # a drain waits for what runs here, then ends it
    fleet.subscribers_changed(gen)
    gen.end(State.DONE)
    await fleet.finished(gen)
    await fleet.let_go(gen)
    fleet.closing = True
    await fleet.hand_over(gen)
    await fleet.close()
    assert store.log_count == 1  # what is kept or forgotten is the registry's to say
    counters = fleet.counters
    assert (counters.mirrored, counters.taken_over, counters.leases_lost) == (0, 0, 0)
    assert (fleet.fleet_replicas, fleet.redis_used_memory, counters.redis_errors) == (0, 0, 0)


async def test_nothing_is_ever_followed_or_taken_from_a_process_alone() -> None:
    fleet = Solo(MemoryStore())
    gen = await _started(fleet)
    with pytest.raises(AssertionError, match="no other replica"):
        fleet.follow(gen)
    with pytest.raises(AssertionError, match="no lease"):
        fleet.lost_lease(gen)
