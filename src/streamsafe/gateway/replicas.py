"""Replicas: gateway processes that share their generations through Redis (see docs/design.md,
Replicas).

The replica that starts a generation *owns* it: it runs it upstream, writes its log to Redis
(:class:`~.store_redis.ReplicatedLog`) and holds a lease on it that it renews every third of the
lease. Any other replica that gets a request for it (a retry, a ``Last-Event-ID`` resume, a
replay) *mirrors* it: one follower task per generation copies the log as it grows (woken by
``XREAD BLOCK``) and its subscribers read the copy. Mirrors say in Redis that they have
subscribers, so the owner does not abort a generation nobody reads *on the owner*.

When an owner dies (kill -9, a lost host), its lease lapses; the first follower that notices
takes the lease (``SET NX``), and with it the generation: it continues it upstream from the log,
like a broken stream (see docs/design.md, Continuation), and its subscribers, wherever they
reconnect, see every token once. A replica whose lease was taken while it still ran (a long
pause) cannot write any more (appends are fenced by the lease) and becomes a mirror itself.

Redis failure policy: a replica that cannot reach Redis goes on with per-replica state. Live
generations go on in this process (their logs detach from Redis, nothing their subscribers here
were sent is lost); new requests get generations of this replica only, so during the outage a
retry that lands on another replica is not recognised. Every failure is counted
(``redis_errors``) and ``redis_degraded`` is 1 while Redis is away; a probe brings the replica
back to Redis when it answers, and the generations it still runs are written back to Redis
(record, lease and the whole log), so a mirror elsewhere that lost them can go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from redis.exceptions import RedisError

from streamsafe.gateway.errors import Failure, error_body
from streamsafe.gateway.generation import Generation, GenerationRequest, State
from streamsafe.gateway.store import LeaseLost
from streamsafe.gateway.store_redis import RedisStore, ReplicatedLog
from streamsafe.gateway.upstream_kinds import CompletionRoute, Wire
from streamsafe.sse import DONE

__all__ = ["REDIS_ERRORS", "ReplicaCounters", "Replicas"]

log = logging.getLogger("streamsafe.gateway")

#: What a lost Redis raises (connection errors are RedisError; a closed socket may be OSError).
REDIS_ERRORS = (RedisError, OSError)
#: Seconds a generation's record lives in Redis while it runs (renewed with the lease): bounds
#: what a fleet that lost every replica leaves behind.
_RECORD_TTL = 3600.0
#: Least seconds a mirror waits for a generation that vanished from Redis to be written back by
#: its owner (Redis restarted empty) before it ends it with an error.
_WRITE_BACK_WAIT = 5.0


@dataclass(slots=True)
class ReplicaCounters:
    """What the replica did with other replicas' generations (``/stats``, ``/metrics``)."""

    mirrored: int = 0
    taken_over: int = 0
    leases_lost: int = 0
    redis_errors: int = 0


#: Told that a mirrored generation ended (state as recorded by its owner).
OnEnd = Callable[[Generation, State], None]
#: Told that this replica took a generation over; starts running it.
OnTakeover = Callable[[Generation], Awaitable[None]]


class Replicas:
    """This replica's link to the others (see the module). ``lease`` is the owner lease in
    seconds (default 3: a dead owner's generations move within about 3 s, and a renewal every
    second survives a slow Redis round trip)."""

    def __init__(
        self,
        store: RedisStore,
        *,
        lease: float = 3.0,
        keep_finished: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease <= 0:
            raise ValueError("lease must be > 0")
        self.store = store
        self.lease = lease
        self.keep_finished = keep_finished
        self.counters = ReplicaCounters()
        #: True while Redis is unreachable: new generations are this replica's only.
        self.degraded = False
        #: True once this replica shuts down: what it runs is handed over, not ended.
        self.closing = False
        #: Replicas whose heartbeat is live in Redis (this one included), as last seen.
        self.fleet_replicas = 0
        #: Bytes Redis used, as last seen (``INFO memory``).
        self.redis_used_memory = 0
        self._clock = clock
        self._owned: dict[str, Generation] = {}
        self._mirrors: dict[str, Generation] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._presence: set[asyncio.Task[None]] = set()
        #: Generations that ended while Redis was away, to record once it is back.
        self._unsynced: dict[str, Generation] = {}

    @property
    def replica_id(self) -> str:
        """This replica's lease value."""
        return self.store.replica_id

    # -- Redis failures -------------------------------------------------------------------------

    def failed(self, exc: BaseException) -> None:
        """Redis failed under an operation: count it, go on with per-replica state, and probe
        until it answers again."""
        self.counters.redis_errors += 1
        if not self.degraded:
            log.warning("redis unreachable (%s); serving with per-replica state", exc)
            self.degraded = True
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_back())

    async def _probe_until_back(self) -> None:
        delay = 0.05
        while not await self.store.ping():
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)
        try:
            await self._write_back()
        except REDIS_ERRORS as exc:
            self.counters.redis_errors += 1
            log.warning("redis failed again while generations were written back: %s", exc)
            self._probe = None
            self.failed(exc)
            return
        self.degraded = False
        log.warning("redis reachable again; generations are shared again")

    async def _write_back(self) -> None:
        """Put the generations this replica runs, or finished while Redis was away, back into
        Redis (record, lease, key, whole log, final state), for a Redis that restarted empty or
        lost writes meanwhile; mirrors elsewhere then go on from where their copy ends."""
        store = self.store
        for gen in [*self._owned.values(), *self._unsynced.values()]:
            log_ = gen.log
            if not isinstance(log_, ReplicatedLog):
                continue
            lease_key = store.lease_key(gen.id)
            await store.redis.set(lease_key, self.replica_id, nx=True, px=int(self.lease * 1000))
            if await store.lease_holder(gen.id) != self.replica_id:
                log_.detached = False  # its next append meets the lease taken meanwhile
                self._unsynced.pop(gen.id, None)
                continue  # another replica took it over while Redis was away: it writes now
            await store.put_generation(gen.id, _record(gen), _RECORD_TTL)
            if gen.key is not None:
                await store.redis.set(store.claim_key(gen.key), gen.id, nx=True)
            await store.index_fingerprint(gen.tenant, gen.fingerprint, gen.id, _RECORD_TTL)
            await log_.remote.sync()
            # The relay goes on appending to the copy meanwhile: write until Redis has it all,
            # then (with no await in between) let appends go to Redis again.
            while missing := log_.local.read_nowait(log_.remote.length):
                await log_.remote.append(missing)
            log_.detached = False
            if self._unsynced.pop(gen.id, None) is not None:
                await self._record_end(gen)

    # -- owning ---------------------------------------------------------------------------------

    def new_log(self, gen_id: str) -> ReplicatedLog:
        """The log of a generation this replica starts."""
        log_ = self.store.replicated_log(gen_id, writer=True, lease=self.lease)
        log_.on_detach = self.failed
        return log_

    async def publish(self, gen: Generation) -> None:
        """Make ``gen`` findable by every replica and take its lease (one round trip each)."""
        store = self.store
        await store.put_generation(gen.id, _record(gen), _RECORD_TTL)
        if not await store.take_lease(gen.id, self.lease):
            raise LeaseLost(gen.id)  # ids are unique per process: only a bug gets here
        await store.index_fingerprint(gen.tenant, gen.fingerprint, gen.id, _RECORD_TTL)
        self.own(gen)

    def own(self, gen: Generation) -> None:
        """This replica runs ``gen`` now: renew its lease until it ends."""
        self._owned[gen.id] = gen
        self._mirrors.pop(gen.id, None)
        self.start()

    def disown(self, gen: Generation) -> None:
        """This replica no longer runs ``gen`` (its lease went to another)."""
        self._owned.pop(gen.id, None)

    def owns(self, gen: Generation) -> bool:
        """True if this replica runs ``gen``."""
        return gen.id in self._owned

    async def finished(self, gen: Generation) -> None:
        """``gen``, which this replica ran, ended: record how, keep it for replay
        ``keep_finished`` seconds (or drop what a retry must not find), give up the lease.
        While Redis is away this waits for the write-back."""
        self._owned.pop(gen.id, None)
        if self.degraded:
            self._unsynced[gen.id] = gen
            return
        try:
            await self._record_end(gen)
        except REDIS_ERRORS as exc:
            self._unsynced[gen.id] = gen
            self.failed(exc)

    async def _record_end(self, gen: Generation) -> None:
        store = self.store
        fields: dict[str, bytes | str | int] = {}
        failure = gen.failure
        if failure is not None:
            fields = {"status": failure.status, "error": failure.body}
            if failure.retry_after is not None:
                fields["retry_after"] = failure.retry_after
        await store.set_state(gen.id, gen.state.value, fields)
        if gen.state is State.DONE and self.keep_finished > 0:
            await store.expire_generation(gen.id, self.keep_finished)
            await store.expire_fingerprint(gen.tenant, gen.fingerprint, gen.id, self.keep_finished)
        else:
            await store.unindex_fingerprint(gen.tenant, gen.fingerprint, gen.id)
            await store.expire_generation(gen.id, max(self.lease * 2, 1.0))
        await store.release_lease(gen.id)

    async def hand_over(self, gen: Generation) -> None:
        """This replica stops (a graceful shutdown) while ``gen`` runs: give up its lease and
        leave its record live, so a replica that follows it, or the next request for it, takes it
        over and continues it from the log."""
        self._owned.pop(gen.id, None)
        if self.degraded:
            return
        try:
            await self.store.release_lease(gen.id)
        except REDIS_ERRORS as exc:
            self.failed(exc)

    async def followed_elsewhere(self, gen: Generation) -> bool:
        """True if another replica has subscribers of ``gen`` (so it is not abandoned)."""
        if self.degraded:
            return False
        try:
            return await self.store.remote_subscribers(gen.id) > 0
        except REDIS_ERRORS as exc:
            self.failed(exc)
            return False

    def start(self) -> None:
        """Start renewing (leases, presence, this replica's heartbeat); otherwise the first
        generation owned or mirrored starts it."""
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Every third of the lease: renew the leases of generations this replica runs, the
        presence of its mirrors' subscribers, and its heartbeat (which gives the fleet's
        figures); until :meth:`close`."""
        period = self.lease / 3
        while True:
            await asyncio.sleep(period)
            if self.degraded:
                continue
            try:
                lost = await self.store.renew_leases(list(self._owned), self.lease)
                followed = [g.id for g in self._mirrors.values() if g.subscribers > 0]
                await self.store.set_presence(followed, self.lease * 2)
                self.fleet_replicas = await self.store.heartbeat(self.lease * 2)
                self.redis_used_memory = await self.store.used_memory() or 0
            except REDIS_ERRORS as exc:
                self.failed(exc)
                continue
            for gen_id in lost:
                if gen_id in self._owned:
                    self.counters.leases_lost += 1
                    log.warning("%s: lease lost to another replica", gen_id)

    # -- mirroring ------------------------------------------------------------------------------

    async def find(self, gen_id: str, key: str | None, created_at: float) -> Generation | None:
        """A mirror of another replica's generation ``gen_id`` (not yet followed), or ``None``
        where Redis no longer holds it."""
        record = await self.store.generation(gen_id)
        if record is None or "body" not in record:
            return None
        request = GenerationRequest(
            tenant=record["tenant"].decode(),
            path=record["path"].decode(),
            body=record["body"],
            fingerprint=record["fingerprint"],
            cost=int(record["cost"]),
            stream=record["stream"] == b"1",
            route=_route(record.get("route", b"")),
        )
        log_ = self.store.replicated_log(gen_id, writer=False, lease=self.lease)
        log_.on_detach = self.failed
        stored_key = record.get("key", b"").decode() or None
        gen = Generation(gen_id, request, log_, key or stored_key, created_at)
        await log_.pull()
        gen.length = log_.length
        ended = _apply(gen, record, log_)
        if ended is not None:
            gen.state = ended
        if gen.length:
            gen.upstream_status = 200
        return gen

    async def find_fingerprint(self, tenant: str, fingerprint: bytes) -> str | None:
        """The newest generation with this body for ``tenant``, on any replica."""
        return await self.store.find_fingerprint(tenant, fingerprint)

    def follow(self, gen: Generation, on_end: OnEnd, on_takeover: OnTakeover) -> None:
        """Start copying ``gen``'s log as its owner writes it; ``on_end`` is told when it ends,
        ``on_takeover`` when this replica takes it over from a dead owner."""
        self.counters.mirrored += 1
        self._mirrors[gen.id] = gen
        task = asyncio.get_running_loop().create_task(
            self._follow(gen, on_end, on_takeover), name=f"follow-{gen.id}"
        )
        self._followers[gen.id] = task
        task.add_done_callback(lambda _: self._followers.pop(gen.id, None))
        self.start()

    def is_mirror(self, gen: Generation) -> bool:
        """True if another replica runs ``gen`` and this one copies it."""
        return gen.id in self._mirrors

    def subscribers_changed(self, gen: Generation) -> None:
        """A mirror's subscriber count changed: tell its owner now, not at the next renewal."""
        if self.degraded or gen.id not in self._mirrors:
            return
        coro = (
            self.store.set_presence([gen.id], self.lease * 2)
            if gen.subscribers > 0
            else self.store.clear_presence(gen.id)
        )
        task = asyncio.get_running_loop().create_task(_quietly(coro, self))
        self._presence.add(task)
        task.add_done_callback(self._presence.discard)

    def unfollow(self, gen: Generation) -> None:
        """Stop copying ``gen`` (forgotten here)."""
        self._mirrors.pop(gen.id, None)
        task = self._followers.pop(gen.id, None)
        if task is not None:
            task.cancel()

    async def _follow(self, gen: Generation, on_end: OnEnd, on_takeover: OnTakeover) -> None:
        log_ = gen.log
        assert isinstance(log_, ReplicatedLog)
        store = self.store
        states = 0
        delay = 0.05
        missing_since: float | None = None
        while gen.id in self._mirrors:
            try:
                new = await log_.pull()
                if new:
                    gen.length = log_.length
                    gen.upstream_status = 200
                    if any(b"\n" in p for p in new):
                        gen.multiline = True
                    gen.wake()
                seen = await store.state_changes(gen.id)
                if seen != states or _ends(new) or missing_since is not None:
                    states = seen
                    record = await store.generation(gen.id)
                    if record is None:
                        # Gone from Redis: give its owner time to write it back (a restarted,
                        # empty Redis) before calling it lost.
                        now = self._clock()
                        missing_since = missing_since or now
                        if now - missing_since > max(_WRITE_BACK_WAIT, 2 * self.lease):
                            on_end(gen, _lost(gen, log_))
                            return
                        await asyncio.sleep(self.lease / 4)
                        continue
                    missing_since = None
                    ended = _apply(gen, record, log_)
                    if ended is not None:
                        on_end(gen, ended)
                        return
                if await store.wait(gen.id, log_.length, states, self.lease / 2):
                    delay = 0.05
                    continue
                # Quiet for half a lease: is the owner still there? SET NX decides who takes
                # over when it is not.
                orphaned = gen.live and await store.lease_holder(gen.id) is None
                # Only with its record there: an empty, restarted Redis is no proof of a
                # dead owner (the owner writes it back).
                orphaned = orphaned and await store.generation(gen.id) is not None
                if orphaned and await store.take_lease(gen.id, self.lease):
                    await log_.take_over(self.replica_id)
                    gen.length = log_.length
                    self.counters.taken_over += 1
                    log.warning("%s: owner replica gone; taking the generation over", gen.id)
                    self.own(gen)
                    await on_takeover(gen)
                    return
            except REDIS_ERRORS as exc:
                self.failed(exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop following and renewing; give up the leases this replica holds."""
        tasks = [t for t in (self._renewer, self._probe, *self._followers.values()) if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, *REDIS_ERRORS):
                await task
        for gen_id in list(self._owned):
            with contextlib.suppress(*REDIS_ERRORS):
                await self.store.release_lease(gen_id)
        await self.store.close()


def _record(gen: Generation) -> dict[str, bytes | str | int]:
    """What another replica needs to mirror ``gen`` or take it over."""
    req = gen.request
    route = req.route
    return {
        "route": b""
        if route is None
        else orjson.dumps(
            [
                route.path,
                route.upstream_path,
                route.wire.value,
                route.upstream_done,
                route.client_done,
                route.preamble,
            ]
        ),
        "tenant": gen.tenant,
        "path": req.path,
        "body": req.body,
        "fingerprint": gen.fingerprint,
        "cost": gen.cost,
        "stream": "1" if gen.stream else "0",
        "key": gen.key or "",
        "state": gen.state.value,
    }


def _route(raw: bytes) -> CompletionRoute | None:
    """The route a record names (see :func:`_record`); ``None`` for vLLM's own."""
    if not raw:
        return None
    path, upstream_path, wire, upstream_done, client_done, preamble = orjson.loads(raw)
    return CompletionRoute(path, upstream_path, Wire(wire), upstream_done, client_done, preamble)


def _ends(new: list[bytes]) -> bool:
    return bool(new) and new[-1] == DONE


def _apply(gen: Generation, record: dict[str, bytes], log_: ReplicatedLog) -> State | None:
    """Bring a mirror's state up to its record; the final state once it has ended."""
    state = State(record.get("state", b"queued").decode())
    if state is State.RUNNING and gen.state is State.QUEUED:
        gen.state = State.RUNNING
        gen.wake()
    if state in (State.QUEUED, State.RUNNING):
        return None
    if "status" in record and not log_.length:
        retry_after = record.get("retry_after")
        gen.failure = Failure(
            int(record["status"]),
            record.get("error", b""),
            int(retry_after) if retry_after is not None else None,
        )
    complete = not log_.length or log_.read_nowait(log_.length - 1) == [DONE]
    if state is not State.ABORTED and gen.stream and not complete:
        return None  # the record is ahead of the log copy: pull the rest first
    return state


def _lost(gen: Generation, log_: ReplicatedLog) -> State:
    """Redis no longer holds a mirrored generation (it expired, or Redis restarted empty and
    the owner is gone): end it with an error rather than wait forever."""
    msg = "the generation was lost by the shared store; retry the request"
    if log_.length and gen.stream:
        if log_.read_nowait(log_.length - 1) != [DONE]:
            log_.local.append_nowait([error_body(msg, "upstream_error", 502), DONE])
            gen.length = log_.length
    else:
        gen.failure = Failure(502, error_body(msg, "upstream_error", 502))
    return State.FAILED


async def _quietly(coro: Awaitable[object], replicas: Replicas) -> None:
    try:
        await coro
    except REDIS_ERRORS as exc:
        replicas.failed(exc)
