"""RedisStore against a real redis-server: claims, logs, leases, the retry index, TTLs, and
wake-ups across connections (each RedisStore is one replica with connections of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from fleet_helpers import RedisProcess
from redis.exceptions import RedisError

from streamsafe.gateway.generations.fleet import Followed
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import LeaseLost
from streamsafe.gateway.replicas.fleet_marker import StateLost
from streamsafe.gateway.replicas.record_seal import Unsealable
from streamsafe.gateway.replicas.redis_log import LogConflict, LogLost
from streamsafe.gateway.replicas.replicas import Replicas
from streamsafe.gateway.replicas.store_redis import RedisStore
from streamsafe.gateway.upstream.kinds import KINDS
from waiting import wait_until_async

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

pytestmark = pytest.mark.timeout(30)

MakeStore = Callable[..., RedisStore]


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 5.0) -> Any:
    """The first truthy result of ``check()``, polled for ``within`` seconds."""
    return await wait_until_async(check, within, every=0.01)


async def test_racing_claims_have_exactly_one_winner(make_store: MakeStore) -> None:
    replicas = [make_store() for _ in range(8)]
    results = await asyncio.gather(
        *(store.claim("tenant\x00key", f"gen-{i}") for i, store in enumerate(replicas))
    )
    winners = [i for i, owner in enumerate(results) if owner is None]
    assert len(winners) == 1
    winner = f"gen-{winners[0]}"
    assert all(owner == winner for owner in results if owner is not None)
    assert await replicas[3].owner("tenant\x00key") == winner


async def test_release_and_expire_only_touch_the_owners_claim(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    assert await a.claim("k", "gen-a") is None
    await b.release("k", "gen-b")  # not the owner: nothing happens
    await b.expire("k", "gen-b", 0.001)
    assert await b.owner("k") == "gen-a"
    assert await a.redis.pttl(a.claim_key("k")) == -1  # no TTL was set by the non-owner
    await a.release("k", "gen-a")
    assert await b.owner("k") is None
    assert await b.claim("k", "gen-b") is None


async def test_claim_lapses_after_its_ttl(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    assert await a.claim("k", "gen-a", ttl=0.05) is None
    assert await b.claim("k", "gen-b") == "gen-a"

    async def lapsed() -> bool:
        return await b.owner("k") is None

    await eventually(lapsed)
    assert await b.claim("k", "gen-b") is None


async def test_expire_sets_the_owners_ttl(make_store: MakeStore) -> None:
    a = make_store()
    await a.claim("k", "gen-a")
    await a.expire("k", "gen-a", 30.0)
    assert 0 < await a.redis.pttl(a.claim_key("k")) <= 30_000


async def test_log_entry_ids_are_the_sse_offsets(make_store: MakeStore) -> None:
    writer, reader = make_store(), make_store()
    log = writer.log("gen-1")
    assert await log.append([b"a", b"b"]) == 2
    assert await log.append([b"c"]) == 3
    entries = await writer.redis.xrange(writer.log_key("gen-1"))
    assert [e[0] for e in entries] == [b"0-1", b"0-2", b"0-3"]
    other = reader.log("gen-1")
    assert other.length == 0
    assert await other.read(0) == [b"a", b"b", b"c"]
    assert other.length == 3
    assert await other.read(1) == [b"b", b"c"]
    assert await other.read(3) == []
    assert await other.read(10) == []


async def test_append_is_fenced_by_the_lease(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    assert await a.take_lease("gen-1", ttl=30)
    assert not await b.take_lease("gen-1", ttl=30)
    assert await a.lease_holder("gen-1") == a.replica_id
    owned = a.log("gen-1", lease_holder=a.replica_id)
    assert await owned.append([b"x"]) == 1
    stale = b.log("gen-1", lease_holder=b.replica_id)
    with pytest.raises(LeaseLost):
        await stale.append([b"y"])
    assert await b.log("gen-1").read(0) == [b"x"]


async def test_a_shared_owners_events_are_readable_here_only_once_redis_took_them(
    make_store: MakeStore,
) -> None:
    # The relay hands the log each read's events in the read callback, as to a log of this
    # process's alone; its subscribers here read the copy, which gets them behind Redis.
    a, b = make_store(), make_store()
    assert await a.take_lease("gen-1", ttl=30)
    log = a.replicated_log("gen-1", writer=True, lease=30)
    assert log.append_nowait([b"one", b"two"]) == 0  # held: nothing new to read here yet
    assert log.append_one(b"three") == 0  # never the one-chunk path: it would skip Redis
    assert log.length == 0 and log.read_nowait(0) == []
    reading = asyncio.get_running_loop().create_future()
    written: list[list[bytes]] = []

    async def write() -> None:
        async for batch in log.write_behind(reading):
            assert await b.log("gen-1").read(0) == log.read_nowait(0)  # Redis has what the copy has
            written.append(batch)

    writer = asyncio.create_task(write())
    await eventually(lambda: asyncio.sleep(0, len(written) == 1))
    log.append_nowait([b"three"])  # a later read, while the stream goes on
    await eventually(lambda: asyncio.sleep(0, len(written) == 2))
    reading.set_result(None)  # the stream's read ended: nothing held, the writer returns
    await writer
    assert written == [[b"one", b"two"], [b"three"]]
    assert await b.log("gen-1").read(0) == log.read_nowait(0) == [b"one", b"two", b"three"]


async def test_events_held_by_a_writer_stopped_short_are_not_written_by_the_next(
    make_store: MakeStore,
) -> None:
    a = make_store()
    assert await a.take_lease("gen-1", ttl=30)
    log = a.replicated_log("gen-1", writer=True, lease=30)
    log.append_nowait([b"one"])
    reading = asyncio.get_running_loop().create_future()
    behind = log.write_behind(reading)
    assert await anext(behind) == [b"one"]
    log.append_nowait([b"cut"])  # the attempt is cancelled before its writer took this
    await behind.aclose()
    reading.set_result(None)
    assert [batch async for batch in log.write_behind(reading)] == []
    assert await a.log("gen-1").read(0) == [b"one"]


async def test_takeover_after_the_lease_lapses_continues_at_the_log_end(
    make_store: MakeStore,
) -> None:
    a, b = make_store(), make_store()
    assert await a.take_lease("gen-1", ttl=0.05)
    old = a.log("gen-1", lease_holder=a.replica_id)
    await old.append([b"one", b"two"])

    async def taken() -> bool:
        return await b.take_lease("gen-1", ttl=30)

    await eventually(taken)
    new = b.log("gen-1", lease_holder=b.replica_id)
    assert await new.sync() == 2
    assert await new.append([b"three"]) == 3
    with pytest.raises(LeaseLost):  # the old owner woke up: it cannot write any more
        await old.append([b"late"])
    assert await b.log("gen-1").read(0) == [b"one", b"two", b"three"]


async def test_writer_takes_back_a_lapsed_lease_nobody_took(make_store: MakeStore) -> None:
    a = make_store()
    assert await a.take_lease("gen-1", ttl=0.05)
    log = a.log("gen-1", lease_holder=a.replica_id, lease=30)
    await log.append([b"one"])

    async def lapsed() -> bool:
        return await a.lease_holder("gen-1") is None

    await eventually(lapsed)
    assert await log.append([b"two"]) == 2  # only slow: the lease is its own again
    assert await a.lease_holder("gen-1") == a.replica_id


async def test_append_after_redis_lost_the_log_says_so(make_store: MakeStore) -> None:
    a = make_store()
    assert await a.take_lease("gen-1", ttl=30)
    log = a.log("gen-1", lease_holder=a.replica_id)
    await log.append([b"one", b"two"])
    await a.redis.delete(a.log_key("gen-1"), a.lease_key("gen-1"))  # as a restarted Redis
    with pytest.raises(LogLost):
        await log.append([b"three"])


async def test_append_after_redis_evicted_the_log_under_the_lease_says_so(
    make_store: MakeStore,
) -> None:
    a = make_store()
    assert await a.take_lease("gen-1", ttl=30)
    log = a.log("gen-1", lease_holder=a.replica_id)
    await log.append([b"one", b"two"])
    await a.redis.delete(a.log_key("gen-1"))  # evicted (maxmemory) while the lease lives
    with pytest.raises(LogLost):
        await log.append([b"three"])


async def test_append_at_a_stale_offset_is_refused(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    first, second = a.log("gen-1"), b.log("gen-1")
    await first.append([b"a"])
    with pytest.raises(LogConflict):
        await second.append([b"b"])
    assert await a.log("gen-1").read(0) == [b"a"]


async def test_renew_reports_leases_this_replica_lost(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    assert await a.take_lease("gen-1", ttl=30)
    assert await a.take_lease("gen-2", ttl=0.05)

    async def lapsed() -> bool:
        return await a.lease_holder("gen-2") is None

    await eventually(lapsed)
    assert await b.take_lease("gen-2", ttl=30)
    assert await a.renew_leases(["gen-1", "gen-2"], ttl=60) == ["gen-2"]
    assert 30_000 < await a.redis.pttl(a.lease_key("gen-1")) <= 60_000
    assert await a.renew_leases([], ttl=60) == []
    await a.release_lease("gen-2")  # not a's any more: b keeps it
    assert await b.lease_holder("gen-2") == b.replica_id


async def test_fingerprint_index_names_the_newest_and_deletes_only_its_own(
    make_store: MakeStore,
) -> None:
    a, b = make_store(), make_store()
    fp = bytes(range(16))
    assert await b.find_fingerprint("t1", fp) is None
    await a.index_fingerprint("t1", fp, "gen-1", ttl=30)
    await b.index_fingerprint("t1", fp, "gen-2", ttl=30)
    assert await a.find_fingerprint("t1", fp) == "gen-2"
    assert await a.find_fingerprint("t2", fp) is None  # tenants never share an entry
    await a.unindex_fingerprint("t1", fp, "gen-1")
    assert await a.find_fingerprint("t1", fp) == "gen-2"
    await b.expire_fingerprint("t1", fp, "gen-2", ttl=0.05)

    async def lapsed() -> bool:
        return await a.find_fingerprint("t1", fp) is None

    await eventually(lapsed)


async def test_generation_record_and_state_changes(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    assert await b.generation("gen-1") is None
    await a.put_generation("gen-1", {"state": "queued", "body": b'{"x":1}', "cost": 12}, ttl=30)
    assert await a.set_state("gen-1", "running") == 1
    assert await a.set_state("gen-1", "failed", {"status": 503}) == 2
    meta = await b.generation("gen-1")
    assert meta == {"state": b"failed", "body": b'{"x":1}', "cost": b"12", "status": b"503"}
    assert await b.state_changes("gen-1") == 2


@pytest.mark.parametrize(
    ("batches", "state"),
    [
        ([[b'{"a":1}', b"[DONE]"]], b"done"),
        ([[b'{"a":1}'], [b"[DONE]"]], b"done"),
        ([[b'{"a":1}', b'{"error":{"code":502}}', b"[DONE]"]], b"failed"),
        ([[b'{"a":1}', b'{"error":{"code":502}}'], [b"[DONE]"]], b"failed"),
    ],
)
async def test_the_append_that_ends_a_log_records_the_end_with_it(
    make_store: MakeStore, batches: list[list[bytes]], state: bytes
) -> None:
    """[DONE] never reaches Redis (nor so a subscriber) before the end is on the record: a
    replica that dies right after it leaves a finished generation, not a running one."""
    a, b = make_store(), make_store()
    await a.put_generation("gen-1", {"state": "running"}, ttl=30)
    assert await a.take_lease("gen-1", ttl=30)
    log = a.log("gen-1", lease_holder=a.replica_id)
    for batch in batches[:-1]:
        await log.append(batch)
    assert (await b.generation("gen-1") or {})["state"] == b"running"
    changes = await b.state_changes("gen-1")
    await log.append(batches[-1])
    assert (await b.generation("gen-1") or {})["state"] == state
    assert await b.state_changes("gen-1") == changes + 1  # followers are woken
    assert 0 < await a.redis.pttl(a.state_key("gen-1")) <= 30_000  # lapses with its record


async def test_finished_generation_lapses_after_its_ttl(make_store: MakeStore) -> None:
    a = make_store()
    await a.put_generation("gen-1", {"state": "running"}, ttl=30)
    await a.log("gen-1").append([b"x"])
    await a.set_state("gen-1", "done")
    await a.expire_generation("gen-1", 0.05)

    async def gone() -> bool:
        return (
            await a.generation("gen-1") is None
            and await a.redis.exists(a.log_key("gen-1"), a.state_key("gen-1")) == 0
        )

    await eventually(gone)


async def test_a_running_generations_keys_lapse_unless_renewed(make_store: MakeStore) -> None:
    owner, other = make_store(), make_store()
    claim, fingerprint = owner.claim_key("k"), owner.fingerprint_key("t", b"fp")
    assert await owner.claim("k", "gen-1", ttl=60) is None
    await owner.put_generation("gen-1", {"state": "running"}, ttl=60)
    await owner.index_fingerprint("t", b"fp", "gen-1", ttl=60)
    log = owner.log("gen-1", owner.replica_id, keep=60)
    await log.append([b"a"])
    await log.append([b"b"])  # only the append that creates the log sets its lifetime
    names = [claim, fingerprint, owner.log_key("gen-1"), owner.meta_key("gen-1")]
    for name in names:
        assert 0 < await owner.redis.pttl(name) <= 60_000, name
    # Renewal sets every key's lifetime again, the claim and the index entry only while they
    # still name the generation.
    await other.index_fingerprint("t", b"fp", "gen-2", ttl=5)
    await owner.keep_generations([("gen-1", claim, fingerprint)], 600)
    for name in names[::2] + names[3:]:
        assert 60_000 < await owner.redis.pttl(name) <= 600_000, name
    assert await owner.redis.pttl(fingerprint) <= 5_000
    await owner.keep_generations([("gen-1", claim, fingerprint)], 0.05)

    async def gone() -> bool:
        return await owner.redis.exists(*names[::2], *names[3:]) == 0

    await eventually(gone)
    assert await other.owner("k") is None


async def test_drop_log_deletes_every_key_of_the_generation(make_store: MakeStore) -> None:
    a = make_store()
    await a.put_generation("gen-1", {"state": "running"}, ttl=30)
    await a.take_lease("gen-1", ttl=30)
    await a.log("gen-1").append([b"x"])
    await a.set_state("gen-1", "done")
    await a.drop_log("gen-1")
    keys = [a.log_key("gen-1"), a.state_key("gen-1"), a.meta_key("gen-1"), a.lease_key("gen-1")]
    assert await a.redis.exists(*keys) == 0


async def test_follower_wakes_when_another_replica_appends(make_store: MakeStore) -> None:
    writer, follower = make_store(), make_store()
    log = writer.log("gen-1")
    await log.append([b"a"])
    # Already past the cursor: no wait at all.
    assert await follower.wait("gen-1", 0, 0, max_wait=5)
    waiting = asyncio.create_task(follower.wait("gen-1", 1, 0, max_wait=10))
    await asyncio.sleep(0)
    assert not waiting.done()
    await log.append([b"b"])
    assert await waiting
    assert await follower.log("gen-1").read(1) == [b"b"]


async def test_follower_wakes_on_a_state_change(make_store: MakeStore) -> None:
    writer, follower = make_store(), make_store()
    waiting = asyncio.create_task(follower.wait("gen-1", 0, 0, max_wait=10))
    await asyncio.sleep(0)
    await writer.set_state("gen-1", "failed", {"status": 429})
    assert await waiting


async def test_one_tail_follows_many_generations(make_store: MakeStore) -> None:
    writer, follower = make_store(), make_store()
    waits = [asyncio.create_task(follower.wait(f"gen-{i}", 0, 0, max_wait=10)) for i in range(20)]
    await asyncio.sleep(0)
    for i in reversed(range(20)):
        await writer.log(f"gen-{i}").append([b"x"])
    assert all(await asyncio.gather(*waits))
    # One blocking connection for all of them, plus the follower's command connection.
    clients = await writer.redis.client_list()
    assert sum(1 for c in clients if c.get("cmd") == "xread") == 1


async def test_the_nudge_stream_of_a_replica_expires(make_store: MakeStore) -> None:
    # Each replica process wakes its blocked read through a stream of its own; a replica that is
    # gone (each restart is a new one) must not leave it in Redis for ever.
    writer, follower = make_store(), make_store()
    first = asyncio.create_task(follower.wait("gen-a", 0, 0, max_wait=10))  # starts the read
    await asyncio.sleep(0)
    second = asyncio.create_task(follower.wait("gen-b", 0, 0, max_wait=10))  # nudges it
    await asyncio.sleep(0)
    await writer.log("gen-a").append([b"x"])
    await writer.log("gen-b").append([b"y"])
    assert await first and await second
    assert 0 < await follower.redis.pttl(follower.nudge_key()) <= 60_000


async def test_wait_times_out_when_nothing_happens(make_store: MakeStore) -> None:
    follower = make_store()
    assert not await follower.wait("gen-quiet", 0, 0, max_wait=0.1)


def _blocked(server: RedisProcess) -> bool:
    """Whether a client of ``server`` is blocked: the store's tail in its ``XREAD BLOCK``, a
    waiter parked on it."""
    with redis.Redis.from_url(server.url) as client:
        return int(client.info("clients")["blocked_clients"]) >= 1


async def test_redis_restart_surfaces_errors_then_recovers(own_redis: RedisProcess) -> None:
    store = RedisStore(own_redis.url, prefix="r:", socket_timeout=2)
    try:
        assert await store.claim("k", "gen-1") is None
        waiting = asyncio.create_task(store.wait("gen-1", 0, 0, max_wait=10))
        await wait_until_async(lambda: _blocked(own_redis), 5, "the tail's read blocked")
        own_redis.kill()
        assert await waiting  # followers are woken to re-read and meet the error themselves
        with pytest.raises((RedisError, OSError)):
            await store.claim("k", "gen-2")
        assert not await store.server.ping()
        own_redis.start()

        async def back() -> bool:
            return await store.server.ping()

        await eventually(back, within=20)
        assert await store.owner("k") is None  # a restarted Redis without persistence is empty
        with pytest.raises(StateLost):  # not taken for free: a replica may still hold it
            await store.claim("k", "gen-2")
        assert await store.claim("k", "gen-2") is None  # told once; the new fleet marker then
        writer = RedisStore(own_redis.url, prefix="r:")
        try:
            waiting = asyncio.create_task(store.wait("gen-2", 0, 0, max_wait=10))
            await wait_until_async(lambda: _blocked(own_redis), 5, "the tail's read blocked")
            await writer.log("gen-2").append([b"x"])
            assert await waiting
        finally:
            await writer.close()
    finally:
        await store.close()


async def test_a_redis_restarted_between_two_commands_is_lost_state_on_every_connection(
    own_redis: RedisProcess,
) -> None:
    # Redis restarts (empty) while nothing is in flight: the connections in the pool were
    # closed by the server, and the next command on each goes on a fresh one. Before, each
    # failed once (redis-py skipped its check with RESP3's maintenance notifications on), the
    # replica counted an outage and served alone, and a keyed retry then ran twice.
    store = RedisStore(own_redis.url, prefix="r:")
    try:
        keys = [f"k{i}" for i in range(8)]
        assert await asyncio.gather(*(store.claim(k, f"gen-{k}") for k in keys)) == [None] * 8
        await asyncio.to_thread(own_redis.restart)  # the loop runs meanwhile, as a replica's
        told = await asyncio.gather(
            *(store.claim(k, f"gen-{k}") for k in keys), return_exceptions=True
        )
        assert all(isinstance(exc, StateLost) for exc in told), told
        assert await asyncio.gather(*(store.claim(k, f"gen-{k}") for k in keys)) == [None] * 8
    finally:
        await store.close()


def _replica(store: RedisStore) -> Replicas:
    """A replica on ``store`` keeping finished generations 60 s, running ones an hour."""
    return Replicas(store, lease=1.0, keep_finished=60.0, orphan_ttl=3600.0)


def _generation(replicas: Replicas, i: int, key: str | None, detached: bool = False) -> Generation:
    """Generation ``gen-<i>`` of ``replicas`` (a streamed chat, body fingerprint ``fp<i>``)."""
    req = GenerationRequest(
        "t", "/v1/chat/completions", b"{}", b"fp%d" % i, 1, True, key, route=CHAT
    )
    return Generation(f"gen-{i}", req, replicas.new_log(f"gen-{i}", detached=detached), key)


async def test_a_renewal_in_flight_never_gives_an_ended_generation_its_running_lifetime(
    make_store: MakeStore,
) -> None:
    store = make_store()
    replicas = _replica(store)
    gen = _generation(replicas, 1, "k")
    assert await store.claim("k", "gen-1", ttl=3600.0) is None
    await replicas.publish(gen)
    await gen.log.append([b"{}"])
    entered, go_on = asyncio.Event(), asyncio.Event()
    renew = store.keep_generations

    async def slow_renewal(running: Any, ttl: float) -> None:
        entered.set()  # what it renews is decided: the generation still ran
        await go_on.wait()
        await renew(running, ttl)

    store.keep_generations = slow_renewal  # type: ignore[method-assign]
    renewal = asyncio.create_task(replicas._keep_owned())
    await entered.wait()
    gen.end(State.DONE)
    ending = asyncio.create_task(replicas.finished(gen))
    await asyncio.sleep(0)  # the end runs up to the renewal's hold
    go_on.set()
    await asyncio.gather(renewal, ending)
    for name in (store.log_key("gen-1"), store.meta_key("gen-1"), store.claim_key("k")):
        assert 0 < await store.redis.pttl(name) <= 60_000, name
    await replicas.close()


async def test_a_generation_that_ends_while_the_write_back_runs_has_its_end_recorded(
    make_store: MakeStore,
) -> None:
    store = make_store()
    replicas = _replica(store)
    replicas.outage.degraded = True  # Redis was away: both started then, their logs detached
    gens = []
    for i in range(2):
        gen = _generation(replicas, i, None, detached=True)
        replicas.own(gen)
        await gen.log.append([b"{}"])
        gens.append(gen)
    outage = replicas.outage
    one = outage._write_back_one

    async def then_the_first_ends(gen: Generation) -> None:
        await one(gen)
        if gen is gens[0] and gen.live:  # written back, Redis still counts as away: it ends
            gen.end(State.DONE)
            await replicas.finished(gen)

    outage._write_back_one = then_the_first_ends  # type: ignore[method-assign]
    await outage._write_back()
    record = await store.generation("gen-0")
    assert record is not None and record["state"] == b"done"
    assert 0 < await store.redis.pttl(store.log_key("gen-0")) <= 60_000
    assert await store.state_changes("gen-0") == 1
    await replicas.close()


# -- sealed with the replicas' secret (issue 33, row 7) ---------------------------------------


async def _everything(store: RedisStore) -> bytes:
    """Every key name under the store's prefix and every value Redis holds under it."""
    out: list[bytes] = []
    async for name in store.redis.scan_iter(match=store.prefix + "*"):
        out.append(name)
        kind = await store.redis.type(name)
        if kind == b"string":
            out.append(await store.redis.get(name) or b"")
        elif kind == b"hash":
            out += [k + v for k, v in (await store.redis.hgetall(name)).items()]
        elif kind == b"stream":
            for _, fields in await store.redis.xrange(name):
                out += [k + v for k, v in fields.items()]
    return b"\n".join(out)


async def test_a_sealed_log_holds_no_payload_in_clear_and_opens_only_with_the_secret(
    make_store: MakeStore,
) -> None:
    writer = make_store(secret="fleet-secret")
    log = writer.log("gen-1")
    payloads = [b'{"text":"the answer, part one"}', b'{"text":"part two"}', b"[DONE]"]
    assert await log.append(payloads[:2]) == 2
    assert await log.append(payloads[2:]) == 3
    held = await _everything(writer)
    assert all(p not in held for p in payloads), held
    entries = await writer.redis.xrange(writer.log_key("gen-1"))
    assert [e[0] for e in entries] == [b"0-1", b"0-2", b"0-3"]  # still the SSE offsets
    same = make_store(secret="fleet-secret").log("gen-1")
    assert await same.read(0) == payloads
    assert await same.read(2) == [b"[DONE]"]
    assert same.length == 3
    for stranger in (make_store(secret="another-secret"), make_store()):
        with pytest.raises(Unsealable, match="gen-1"):
            await stranger.log("gen-1").read(0)


async def test_a_sealed_entry_moved_to_another_offset_or_log_does_not_open(
    make_store: MakeStore,
) -> None:
    store = make_store(secret="fleet-secret")
    await store.log("gen-1").append([b"one", b"two"])
    (_, first), (_, second) = await store.redis.xrange(store.log_key("gen-1"))
    await store.redis.xadd(store.log_key("gen-2"), second, id="0-1")  # another log
    await store.redis.xadd(store.log_key("gen-3"), first, id="0-1")
    await store.redis.xadd(store.log_key("gen-3"), first, id="0-2")  # another offset
    with pytest.raises(Unsealable):
        await store.log("gen-2").read(0)
    with pytest.raises(Unsealable):
        await store.log("gen-3").read(1)


@pytest.mark.parametrize(
    ("batches", "state"),
    [
        ([[b'{"a":1}'], [b"[DONE]"]], b"done"),
        ([[b'{"a":1}', b'{"error":{"code":502}}'], [b"[DONE]"]], b"failed"),
        ([[b'{"error":{"code":502}}', b"[DONE]"]], b"failed"),
    ],
)
async def test_a_sealed_append_that_ends_the_log_records_the_end_with_it(
    make_store: MakeStore, batches: list[list[bytes]], state: bytes
) -> None:
    a = make_store(secret="fleet-secret")
    await a.put_generation("gen-1", {"state": "running"}, ttl=30)
    assert await a.take_lease("gen-1", ttl=30)
    log = a.log("gen-1", lease_holder=a.replica_id)
    for batch in batches:
        await log.append(batch)
    assert (await a.generation("gen-1") or {})["state"] == state
    held = await _everything(a)
    assert b"[DONE]" not in held and b'"error"' not in held  # told apart, yet sealed


async def test_key_names_hold_no_caller_string(make_store: MakeStore) -> None:
    """An idempotency key, a tenant and a body's fingerprint name their keys by a hash: keyed
    with the secret where there is one (other secrets, other names), plain SHA-256 without."""
    plain, sealed, other = make_store(), make_store(secret="s1"), make_store(secret="s2")
    key, tenant, fp = "k\x00tenant-7\x00my-idempotency-key", "tenant-7", b"\x01\x02fp"
    for store in (plain, sealed, other):
        for name in (store.claim_key(key), store.fingerprint_key(tenant, fp)):
            assert "idempotency" not in name and tenant not in name and fp.hex() not in name
        assert store.claim_key(key) == store.claim_key(key)
    assert len({s.claim_key(key) for s in (plain, sealed, other)}) == 3
    assert len({s.fingerprint_key(tenant, fp) for s in (plain, sealed, other)}) == 3
    assert await sealed.claim(key, "gen-1") is None
    assert await sealed.owner(key) == "gen-1"
    assert await sealed.claim(key, "gen-2") == "gen-1"
    assert await plain.owner(key) is None  # another name: no secret is no key
    assert b"my-idempotency-key" not in await _everything(sealed)


async def test_a_sealed_record_holds_no_key_nor_fingerprint_and_opens_with_the_secret(
    make_store: MakeStore,
) -> None:
    store = make_store(secret="fleet-secret")
    replicas = _replica(store)
    req = GenerationRequest(
        "t",
        "/v1/chat/completions",
        b'{"prompt":"my question"}',
        b"fp-of-my-question",
        1,
        True,
        route=CHAT,
    )
    gen = Generation("gen-1", req, replicas.new_log("gen-1"), "k\x00t\x00idem-key-1")
    await replicas.publish(gen)
    await gen.log.append([b'{"text":"my answer"}'])
    held = await _everything(store)
    for clear in (b"my question", b"fp-of-my-question", b"idem-key-1", b"my answer"):
        assert clear not in held, clear
    reader = _replica(make_store(secret="fleet-secret"))
    mirror = await reader.find("gen-1", None, 0.0)
    assert mirror is not None
    assert mirror.key == "k\x00t\x00idem-key-1"
    assert mirror.request.fingerprint == b"fp-of-my-question"
    assert await mirror.log.read(0) == [b'{"text":"my answer"}']
    await reader.close()
    await replicas.close()


async def test_a_mirror_whose_log_it_cannot_open_ends_with_a_503_never_sealed_bytes(
    make_store: MakeStore,
) -> None:
    owner_store = make_store(secret="fleet-secret")
    owner = _replica(owner_store)
    req = GenerationRequest("t", "/v1/chat/completions", b"{}", b"fp", 1, True, route=CHAT)
    gen = Generation("gen-1", req, owner.new_log("gen-1"), None)
    await owner.publish(gen)
    await gen.log.append([b'{"n":1}'])
    follower = _replica(make_store(secret="fleet-secret"))
    mirror = await follower.find("gen-1", None, 0.0)
    assert mirror is not None
    followed = asyncio.ensure_future(follower.follow(mirror))
    # An entry sealed with another secret, under the owner's lease.
    odd = make_store(secret="another-secret").log("gen-1", lease_holder=owner_store.replica_id)
    await odd.sync()
    await odd.append([b'{"n":2}'])

    assert await followed is Followed.ENDED  # not taken over
    assert mirror.state is State.FAILED
    events = await mirror.log.read(0)
    assert events[0] == b'{"n":1}' and events[-1] == b"[DONE]" and len(events) == 3
    error = events[1]
    assert b'"code":503' in error and b"--redis-secret" in error
    await follower.close()
    await owner.close()
