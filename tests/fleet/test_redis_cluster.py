"""The replicas on a Redis Cluster (``--redis redis+cluster://...``): three primaries, real
``redis-server`` processes in cluster mode on loopback, slots in equal ranges.

The store: claims, logs and the blocked reads of followers spread over every node, each script
in one slot; a node that comes back empty is lost state for its buckets and a restart, not for
the others'. Two gateway replicas: a stream resumed on the other replica is exact, keyed retries
on both attach to one engine generation, a killed owner's generation is taken over; and slots
of live generations move from one primary to another while their streams run (the target
importing, the source migrating, keys moved by ``MIGRATE``): every stream whole, every key one
generation.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import pytest
import redis
from fleet_helpers import (
    Process,
    RedisClusterProcesses,
    chat_body,
    claim_name,
    key_names,
    redis_binary,
    sse_events,
    whole_text,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from streamsafe.engine_sim import expected_text
from streamsafe.gateway.replicas.fleet_marker import StateLost
from streamsafe.gateway.replicas.redis_keys import slot
from streamsafe.gateway.replicas.store_redis import RedisStore
from waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(120)

URL = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterProcesses]:
    found = RedisClusterProcesses(redis_binary())
    try:
        yield found.start()
    finally:
        found.stop()


@pytest.fixture
async def stores(cluster: RedisClusterProcesses) -> AsyncIterator[Callable[[], RedisStore]]:
    """stores() -> a RedisStore on the cluster under this test's own prefix (one replica each)."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    made: list[RedisStore] = []

    def _make() -> RedisStore:
        made.append(RedisStore(cluster.url, prefix=prefix))
        return made[-1]

    yield _make
    for store in made:
        await store.close()


def _keys_by_node(cluster: RedisClusterProcesses, prefix: str) -> list[int]:
    counts = []
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as client:
            counts.append(sum(1 for _ in client.scan_iter(f"{prefix}*")))
    return counts


def _blocked_reads(cluster: RedisClusterProcesses) -> int:
    """Clients blocked in a read now, on every node."""
    total = 0
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as client:
            total += sum(1 for c in client.client_list() if "b" in c.get("flags", ""))
    return total


async def test_claims_logs_and_followers_spread_over_every_node(
    cluster: RedisClusterProcesses, stores: Callable[[], RedisStore]
) -> None:
    a, b = stores(), stores()
    keys = [f"key-{i}" for i in range(24)]
    won = await asyncio.gather(*(a.claim(k, f"gen-a{i}") for i, k in enumerate(keys)))
    lost = await asyncio.gather(*(b.claim(k, f"gen-b{i}") for i, k in enumerate(keys)))
    assert won == [None] * len(keys)
    assert lost == [f"gen-a{i}" for i in range(len(keys))]
    # Generations in many buckets: each append is one script on one node, and a follower's
    # blocked reads (one per bucket followed) wake on another replica's appends.
    gens = [f"gen-a{i}" for i in range(len(keys))]
    waits = [asyncio.create_task(b.wait(gen, 0, 0, max_wait=20)) for gen in gens]
    # One blocked read per bucket followed (a cluster refuses one read across slots), not
    # one per generation.
    buckets = {a.keys.gen_bucket(gen) for gen in gens}
    assert 1 < len(buckets) < len(gens)
    await wait_until_async(lambda: _blocked_reads(cluster) == len(buckets), 10)
    for gen in gens:
        await a.log(gen, lease_holder=a.replica_id).append([b"one", b"two"])
    assert all(await asyncio.gather(*waits))
    assert [await b.log(gen).read(1) for gen in gens] == [[b"two"]] * len(gens)
    assert all(count > 0 for count in _keys_by_node(cluster, a.prefix))
    # A bucket's read ends once nobody waits on it.
    await wait_until_async(lambda: _blocked_reads(cluster) == 0, 10)
    # The body index and its bucket's marker are read in one round trip on one node.
    await a.index_fingerprint("tenant", b"\x01" * 32, "gen-a0", 60)
    assert await b.find_fingerprint("tenant", b"\x01" * 32) == "gen-a0"
    assert len((await a.server.run_id() or "").split(",")) == len(cluster.nodes)
    # Three hundred commands in flight to one node (redis-py's cluster client refused the
    # 101st: MaxConnectionsError).
    assert await asyncio.gather(*(b.owner(keys[0]) for _ in range(300))) == ["gen-a0"] * 300


async def test_a_node_back_empty_is_lost_state_for_its_buckets_and_a_restart() -> None:
    # A cluster of its own: one node is killed and started again (its slots kept in its
    # nodes.conf, its data gone).
    own = RedisClusterProcesses(redis_binary()).start()
    try:
        store = RedisStore(own.url, prefix="lost:")
        try:
            keys = [f"key-{i}" for i in range(40)]
            for i, key in enumerate(keys):
                assert await store.claim(key, f"gen-{i}") is None
            run_before = await store.server.run_id()
            victim = own.nodes[1]
            on_victim = [k for k in keys if own.node_of(slot(store.claim_key(k))) is victim]
            elsewhere = [k for k in keys if k not in on_victim]
            assert on_victim and elsewhere
            # In a thread: the loop runs meanwhile, as a replica's does.
            await asyncio.to_thread(victim.restart)
            await asyncio.to_thread(wait_until, own.settled, 20, "the cluster to settle")
            # Claims the other nodes hold are still there, their buckets' markers too.
            assert await store.claim(elsewhere[0], "gen-again") == "gen-" + str(
                keys.index(elsewhere[0])
            )

            # A key of the restarted node looks free: the claim says the state is lost instead.
            # The connections the restart closed are connected anew as they are taken (before,
            # the first command on each failed, and the replica counted an outage).
            async def claim_on_victim() -> str | None:
                try:
                    await store.claim(on_victim[0], "gen-again")
                except StateLost as exc:
                    return str(exc)
                except RedisConnectionError as exc:
                    return f"a connection the restart closed was used: {exc}"
                except RedisError:
                    return None  # the cluster still settling, as the client sees it
                return "claimed"

            said = await wait_until_async(claim_on_victim, 10)
            assert said.startswith("redis lost the fleet's state") and "in bucket" in said
            assert await store.server.run_id() not in (None, run_before)
        finally:
            await store.close()
    finally:
        own.stop()


async def test_commands_on_a_half_moved_slot_are_answered_under_concurrency(
    cluster: RedisClusterProcesses, stores: Callable[[], RedisStore]
) -> None:
    # While a slot moves, a key already on the importing node is reached by ASKING there. The
    # store's client sends ASKING and the command on one connection: redis-py sent them on two
    # of its pool, and among concurrent commands (some for the importing node's own slots)
    # some bounced between the two nodes until they gave up ("TTL exhausted": 1 to 12 of 1800
    # in each of 4 runs).
    store = stores()
    bucket = store.keys.gen_bucket("gen-0")
    gens = [g for g in (f"gen-{i}" for i in range(3000)) if store.keys.gen_bucket(g) == bucket]
    gens = gens[:30]
    n = slot(store.lease_key(gens[0]))
    source = cluster.node_of(n)
    target = cluster.nodes[(cluster.nodes.index(source) + 1) % 3]
    owned = [(first, last) for first, last, node in cluster.layout() if node is target]
    theirs = [
        g
        for g in (f"gen-t{i}" for i in range(3000))
        if any(first <= slot(store.lease_key(g)) <= last for first, last in owned)
    ][:30]
    for gen in gens + theirs:
        assert await store.take_lease(gen, 60)
    with redis.Redis(port=source.port) as origin, redis.Redis(port=target.port) as to:
        to.cluster("SETSLOT", n, "IMPORTING", origin.cluster("MYID"))
        origin.cluster("SETSLOT", n, "MIGRATING", to.cluster("MYID"))
        moved = [store.lease_key(g) for g in gens[::2]]
        origin.migrate("127.0.0.1", target.port, moved, 0, 5000)
    try:
        for _ in range(10):
            holders = await asyncio.gather(*(store.lease_holder(g) for g in (gens + theirs) * 3))
            assert holders == [store.replica_id] * len(holders)
    finally:
        assert cluster.migrate(n, target) >= len(gens) - len(moved)  # the move, finished


# -- two gateway replicas ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "15", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def _serve(sim: Process, cluster: RedisClusterProcesses) -> Process:
    return Process("serve", "--upstream", sim.url, "--redis", cluster.url, "--lease", "1")


@pytest.fixture(scope="module")
def replicas(sim: Process, cluster: RedisClusterProcesses) -> Iterator[list[Process]]:
    procs = [_serve(sim, cluster) for _ in range(2)]
    yield procs
    for proc in procs:
        proc.stop()


def _stats(proc: Process) -> dict[str, Any]:
    return dict(httpx2.get(proc.url + "/stats", timeout=10).json())


def _warnings(procs: list[Process]) -> str:
    """What the gateway processes warned of, for a failure's message."""
    return "".join(
        line for p in procs for line in p.output if " WARNING " in line or " ERROR " in line
    )


def _generations(sim: Process) -> int:
    return int(_stats(sim)["generations_started"])


def test_resume_and_keyed_retries_across_replicas_are_one_generation(
    sim: Process, replicas: list[Process]
) -> None:
    a, b = replicas
    before = _generations(sim)
    body = chat_body("resumed on a cluster", 30)
    key = {"Idempotency-Key": "cluster-resume"}
    got: list[tuple[int, bytes]] = []
    with httpx2.stream("POST", a.url + URL, json=body, headers=key) as r:
        assert r.status_code == 200
        for event in sse_events(r):
            got.append(event)
            if len(got) == 5:
                break
    resume = {**key, "Last-Event-ID": str(got[-1][0])}
    with httpx2.stream("POST", b.url + URL, json=body, headers=resume, timeout=30) as r:
        assert r.status_code == 200
        got += list(sse_events(r))
    assert [i for i, _ in got] == list(range(len(got)))
    assert whole_text(got) == expected_text(body, 30, 0)
    # One key sent to both replicas at once, twelve times: one generation each.
    start = threading.Barrier(2)

    def send(proc: Process, key: str) -> tuple[str, str]:
        start.wait(timeout=20)
        r = httpx2.post(
            proc.url + URL,
            json=chat_body(f"at once {key}", 4, stream=False),
            headers={"Idempotency-Key": key},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return r.headers["x-streamsafe-generation"], r.json()["choices"][0]["message"]["content"]

    keys = [f"cluster-at-once-{i}" for i in range(12)]
    with ThreadPoolExecutor(2) as pool:
        for k in keys:
            answers = list(pool.map(lambda p, k=k: send(p, k), replicas))
            assert len(set(answers)) == 1, answers
    assert _generations(sim) == before + 1 + len(keys)
    assert _stats(b)["generations_mirrored"] >= 1
    assert not any(_stats(p)["redis_degraded"] for p in replicas)


def test_a_killed_owners_generation_is_taken_over_exactly(
    sim: Process, cluster: RedisClusterProcesses, replicas: list[Process]
) -> None:
    owner, other = _serve(sim, cluster), replicas[0]
    try:
        body = chat_body("the owner dies on a cluster", 60)
        key = {"Idempotency-Key": "cluster-owner-killed"}
        before = _stats(sim)["continuations"]
        got: list[tuple[int, bytes]] = []
        with (
            pytest.raises(httpx2.HTTPError),
            httpx2.stream("POST", owner.url + URL, json=body, headers=key) as r,
        ):
            for event in sse_events(r):
                got.append(event)
                if len(got) == 5:
                    owner.kill()
        resume = {**key, "Last-Event-ID": str(got[-1][0])}
        with httpx2.stream("POST", other.url + URL, json=body, headers=resume, timeout=30) as r:
            assert r.status_code == 200
            got += list(sse_events(r))
        assert [i for i, _ in got] == list(range(len(got)))
        assert whole_text(got) == expected_text(body, 60, 0)
        assert _stats(sim)["continuations"] == before + 1
        assert _stats(other)["generations_taken_over"] >= 1
    finally:
        owner.kill()


class _Stream:
    """One keyed stream read to its end in a thread: its events, its generation, and an event
    set once it has three."""

    def __init__(self, proc: Process, body: dict[str, Any], key: str) -> None:
        self.flowing = threading.Event()
        self.ended = threading.Event()
        self.got: list[tuple[int, bytes]] = []
        self.gen_id = ""
        self._args = (proc, body, key)

    def __call__(self) -> None:
        proc, body, key = self._args
        headers = {"Idempotency-Key": key}
        try:
            with httpx2.stream("POST", proc.url + URL, json=body, headers=headers, timeout=60) as r:
                assert r.status_code == 200, r.read()
                self.gen_id = r.headers["x-streamsafe-generation"]
                for event in sse_events(r):
                    self.got.append(event)
                    if len(self.got) == 3:
                        self.flowing.set()
        finally:
            self.flowing.set()
            self.ended.set()


def test_slots_of_live_generations_move_between_primaries_and_no_stream_breaks(
    sim: Process, cluster: RedisClusterProcesses, replicas: list[Process]
) -> None:
    before = _generations(sim)
    # Long enough (12 s at the simulator's 15 ms) that every slot is moved while they run,
    # even on a loaded machine: with 300 tokens, all six ended before the last slot moved in
    # runs beside other jobs.
    tokens = 800
    bodies = [chat_body(f"through a slot migration {i}", tokens) for i in range(6)]
    keys = [f"cluster-migrated-{i}" for i in range(len(bodies))]
    # Each stream starts on one replica, and the same key attaches on the other (a mirror,
    # whose blocked read follows the log on the node that holds its slot).
    owners = [_Stream(replicas[i % 2], bodies[i], keys[i]) for i in range(len(bodies))]
    mirrors = [_Stream(replicas[1 - i % 2], bodies[i], keys[i]) for i in range(len(bodies))]
    threads = [threading.Thread(target=s) for s in owners]
    for t in threads:
        t.start()
    for s in owners:
        assert s.flowing.wait(30)
    for s, proc in zip(mirrors, [replicas[1 - i % 2] for i in range(len(mirrors))], strict=True):
        # A keyed retry that lands on a replica which took Redis for away a moment ago (a CPU
        # stall past the 0.25 s an append may take, on a loaded machine) is, by the failure
        # policy, a generation of its own: not what this test is about.
        wait_until(lambda p=proc: not _stats(p)["redis_degraded"], 20)
        threads.append(threading.Thread(target=s))
        threads[-1].start()
    for s in mirrors:
        assert s.flowing.wait(30)
    # Every slot the live generations use (their keys, their claims, the markers next to the
    # claims) moves to the next primary while they stream.
    names = key_names(cluster=True)
    slots = {slot(names.log_key(s.gen_id)) for s in owners}
    slots |= {slot(claim_name(k, cluster=True)) for k in keys}
    moved, targets = 0, {}

    def streams_go_on() -> None:
        # Half the slot's keys moved: scripts on the others wait (TRYAGAIN) meanwhile, as in
        # a slot of many keys; the owners' subscribers get ten more events in the meantime.
        counts = [len(s.got) for s in owners]
        wait_until(
            lambda: all(
                len(s.got) >= c + 10 or s.ended.is_set()
                for s, c in zip(owners, counts, strict=True)
            ),
            30,
        )

    for n in sorted(slots):
        targets[n] = cluster.nodes[(cluster.nodes.index(cluster.node_of(n)) + 1) % 3]
        moved += cluster.migrate(n, targets[n], batch=2, midway=streams_go_on)
    still_running = sum(1 for s in owners if not s.ended.is_set())
    for t in threads:
        t.join(60)
    assert moved >= len(owners) and still_running > 0  # keys moved under live streams
    for i, (owner, mirror) in enumerate(zip(owners, mirrors, strict=True)):
        # One generation per key, on either replica.
        assert owner.gen_id == mirror.gen_id, _warnings(replicas)
        assert [n for n, _ in owner.got] == list(range(len(owner.got))), i
        assert whole_text(owner.got) == expected_text(bodies[i], tokens, 0), i
        assert mirror.got == owner.got, i
    assert _generations(sim) == before + len(bodies)
    # After the move, a keyed retry on the replica that did not run it replays the answer,
    # read from the nodes the keys moved to.
    for i, key in enumerate(keys):
        other = replicas[1 - i % 2]
        wait_until(lambda p=other: not _stats(p)["redis_degraded"], 20)
        headers = {"Idempotency-Key": key}
        with httpx2.stream("POST", other.url + URL, json=bodies[i], headers=headers) as r:
            assert list(sse_events(r)) == owners[i].got
    assert _generations(sim) == before + len(bodies)
    assert all(cluster.node_of(n) is to for n, to in targets.items())
