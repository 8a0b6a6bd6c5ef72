"""A process alone is a fleet of one replica (Solo), behind the interface the registry uses for
several (Fleet): it runs what it starts, in its own store, and shares nothing; every generation
it opens has the role of one of this process's alone (LOCAL)."""

from __future__ import annotations

import pytest

from streamsafe.gateway.generations.fleet import Fleet
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.roles import LOCAL
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


async def test_what_a_process_alone_opens_is_its_own_and_nothing_of_it_is_elsewhere() -> None:
    store = MemoryStore()
    fleet: Fleet = Solo(store)
    fleet.start()
    gen = await _started(fleet)
    assert gen.role is LOCAL  # no lease, no mirror: nothing to tell another replica
    assert not gen.role.read_by_fleet and gen.role.forget_unread is None
    assert await gen.role.read_elsewhere(gen) is None  # abandoned means abandoned
    assert not fleet.hands_over  # a drain waits for what runs here, then ends it
    gen.role.subscribers_changed(gen)
    gen.end(State.DONE)
    assert gen.role.ended(gen, State.DONE) is None  # nothing to record elsewhere
    fleet.closing = True
    await fleet.close()
    assert store.log_count == 1  # what is kept or forgotten is the registry's to say
    counters = fleet.counters
    assert (counters.mirrored, counters.taken_over, counters.leases_lost) == (0, 0, 0)
    assert (fleet.fleet_replicas, fleet.redis_used_memory, counters.redis_errors) == (0, 0, 0)


async def test_a_kept_generation_of_a_process_alone_lapses_and_goes_from_its_own_store() -> None:
    store = MemoryStore()
    fleet = Solo(store)
    gen = Generation("gen-1", _request(), fleet.new_log("gen-1"), "k", 0.0)
    await fleet.publish(gen)
    assert await store.claim("k", gen.id) is None
    lapse = gen.role.kept(gen, store, 0.0)
    assert lapse is not None
    await lapse
    assert await store.owner("k") is None  # its key lapsed with its retention
    await gen.role.forgotten(gen, store)
    assert store.log_count == 0


async def test_nothing_is_ever_followed_or_taken_from_a_process_alone() -> None:
    fleet = Solo(MemoryStore())
    gen = await _started(fleet)
    with pytest.raises(AssertionError, match="followed nowhere"):
        gen.role.follow(gen)
