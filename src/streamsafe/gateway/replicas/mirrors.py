"""Mirrors: generations another replica runs, copied here for this replica's subscribers (see
:mod:`streamsafe.gateway.replicas.replicas` and docs/design.md, Replicas).

One follower task per generation copies its log as the owner writes it (woken by ``XREAD BLOCK``
through the store), brings the mirror's state up to the owner's record, and, when the owner's
lease lapses with nobody taking it over, takes the lease (``SET NX``) and with it the generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from streamsafe.gateway.errors import Failure, error_body
from streamsafe.gateway.generations.fleet import Followed
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.response_ids import note_first_event
from streamsafe.gateway.replicas.generation_record import key_of, request_of
from streamsafe.gateway.replicas.record_seal import Unreadable
from streamsafe.gateway.replicas.redis_log import ReplicatedLog
from streamsafe.gateway.replicas.redis_server import REDIS_ERRORS
from streamsafe.gateway.replicas.store_redis import RedisStore
from streamsafe.sse import DONE

__all__ = ["WRITE_BACK_WAIT", "Mirrors"]

log = logging.getLogger("streamsafe.gateway")

#: Least seconds a mirror waits for a generation that vanished from Redis to be written back by
#: its owner (Redis restarted empty) before it ends it with an error; and that a replica which
#: found Redis lost the fleet's state starts no generation a retry may duplicate.
WRITE_BACK_WAIT = 5.0


class Mirrors:
    """The generations this replica copies from their owners (see the module). ``failed`` is
    told of every Redis failure (the replica's failure policy starts there)."""

    def __init__(
        self,
        store: RedisStore,
        *,
        lease: float,
        failed: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.lease = lease
        self._failed = failed
        self._clock = clock
        self._mirrors: dict[str, Generation] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._presence: set[asyncio.Task[None]] = set()

    def __contains__(self, gen: Generation) -> bool:
        """True if another replica runs ``gen`` and this one copies it."""
        return gen.id in self._mirrors

    def followed(self) -> list[str]:
        """Ids of the mirrors that have subscribers here."""
        return [g.id for g in self._mirrors.values() if g.subscribers > 0]

    def followers(self) -> list[asyncio.Task[None]]:
        """The follower tasks now running."""
        return list(self._followers.values())

    def forget(self, gen: Generation) -> None:
        """``gen`` is no mirror any more (this replica runs it now)."""
        self._mirrors.pop(gen.id, None)

    async def find(
        self, gen_id: str, key: str | None, created_at: float, wait: float = 0.0
    ) -> Generation | None:
        """A mirror of another replica's generation ``gen_id`` (not yet followed), or ``None``
        where Redis does not hold it, after waiting up to ``wait`` seconds for its record (a
        little longer between each look);
        :class:`~streamsafe.gateway.replicas.record_seal.Unreadable` where this replica cannot
        read the record (sealed with another secret). A replica claims a key before it writes
        the record of the generation it claimed it for, one round trip later: the loser of a
        claim waits, as taking the key over at once would start the same request a second
        time."""
        delay, waited = 0.005, 0.0
        while True:
            record = await self.store.generation(gen_id)
            if record is not None and "body" in record:
                break
            if waited >= wait:
                return None
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 0.1)
        # Unreadable (another secret, or none) propagates: the generation is there, so taking
        # its key over would run it a second time.
        request = request_of(record, gen_id, self.store.seal)
        stored_key = key_of(record, gen_id, self.store.seal)
        log_ = self.store.replicated_log(gen_id, writer=False, lease=self.lease)
        log_.on_detach = self._failed
        gen = Generation(gen_id, request, log_, key or stored_key, created_at)
        note_first_event(gen, await log_.pull())
        gen.appended(log_.length)
        _apply(gen, record, log_)
        if gen.length:
            gen.upstream_status = 200
        return gen

    def follow(self, gen: Generation) -> Coroutine[Any, Any, Followed]:
        """``gen`` is a mirror from now on: returns its follower, which copies its log as its
        owner writes it, for the caller to run as a task (held here from its first step, and
        cancelled by :meth:`unfollow`). It returns how it ended: the mirror ended (moved to its
        owner's end), or this replica took it over from a dead owner (lease and log), or it
        was unfollowed before it began."""
        self._mirrors[gen.id] = gen
        return self._follow(gen)

    def unfollow(self, gen: Generation) -> None:
        """Stop copying ``gen`` (forgotten here)."""
        self._mirrors.pop(gen.id, None)
        task = self._followers.pop(gen.id, None)
        if task is not None:
            task.cancel()

    def tell_presence(self, gen: Generation) -> None:
        """Tell ``gen``'s owner whether it has subscribers here now, not at the next renewal."""
        coro = (
            self.store.presence.announce([gen.id], self.lease * 2)
            if gen.subscribers > 0
            else self.store.presence.withdraw(gen.id)
        )
        task = asyncio.get_running_loop().create_task(self._quietly(coro))
        self._presence.add(task)
        task.add_done_callback(self._presence.discard)

    async def _quietly(self, coro: Awaitable[object]) -> None:
        try:
            await coro
        except REDIS_ERRORS as exc:
            self._failed(exc)

    async def _follow(self, gen: Generation) -> Followed:
        task = asyncio.current_task()
        assert task is not None
        self._followers[gen.id] = task
        try:
            return await self._copy(gen)
        finally:
            if self._followers.get(gen.id) is task:
                del self._followers[gen.id]

    async def _copy(self, gen: Generation) -> Followed:
        """The follower's loop: copy what the owner appended, bring the state up to its record,
        wait for more, and, quiet for half a lease, ask whether the owner is gone."""
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
                    if log_.length == len(new):  # its first events: a response's id is there
                        note_first_event(gen, new)
                    gen.appended(log_.length)
                    gen.upstream_status = 200
                    if any(b"\n" in p for p in new):
                        gen.multiline = True
                    # To the subscribers that keep up, as the owner's relay writes to its own.
                    gen.publish(new, log_.length - len(new))
                seen = await store.state_changes(gen.id)
                if seen != states or _ends(new) or missing_since is not None:
                    states = seen
                    record = await store.generation(gen.id)
                    if record is None:
                        # Gone from Redis: give its owner time to write it back (a restarted,
                        # empty Redis) before calling it lost.
                        now = self._clock()
                        missing_since = missing_since or now
                        if now - missing_since > max(WRITE_BACK_WAIT, 2 * self.lease):
                            _lost(gen, log_)
                            return Followed.ENDED
                        await asyncio.sleep(self.lease / 4)
                        continue
                    missing_since = None
                    if _apply(gen, record, log_):
                        return Followed.ENDED
                if await store.wait(gen.id, log_.length, states, self.lease / 2):
                    delay = 0.05
                    continue
                # Quiet for half a lease: is the owner still there?
                if await self._took_over(gen, log_):
                    return Followed.TAKEN_OVER
            except REDIS_ERRORS as exc:
                self._failed(exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
            except Unreadable as exc:
                # Its owner seals with another secret (or this replica has none): end it with
                # a refusal that says so, never take it over, never pass sealed bytes on.
                why = f"{exc}; every gateway replica needs the same --redis-secret"
                log.error("%s", why, extra={"fields": {"event": "redis_record_unreadable"}})
                _unreadable(gen, log_, why)
                return Followed.ENDED
        return Followed.UNFOLLOWED

    async def _took_over(self, gen: Generation, log_: ReplicatedLog) -> bool:
        """Take over a live generation whose owner's lease lapsed (SET NX decides which
        replica does); whether this one did."""
        store = self.store
        orphaned = gen.live and await store.lease_holder(gen.id) is None
        # Only with its record there: an empty, restarted Redis is no proof of a dead owner
        # (the owner writes it back).
        orphaned = orphaned and await store.generation(gen.id) is not None
        if not orphaned or not await store.take_lease(gen.id, self.lease):
            return False
        await log_.take_over(store.replica_id)
        gen.appended(log_.length)
        gen.taken_over()
        log.warning("%s: owner replica gone; taking the generation over", gen.id)
        self.forget(gen)
        return True


def _ends(new: list[bytes]) -> bool:
    return bool(new) and new[-1] == DONE


def _apply(gen: Generation, record: dict[str, bytes], log_: ReplicatedLog) -> bool:
    """Bring a mirror's state up to its record; True where that ended it (its subscribers are
    woken by whoever is told)."""
    state = State(record.get("state", b"queued").decode())
    if state is State.RUNNING and gen.state is State.QUEUED:
        gen.admitted()
        gen.wake()
    if state in (State.QUEUED, State.RUNNING):
        return False
    complete = not log_.length or log_.read_nowait(log_.length - 1) == [DONE]
    if state is not State.ABORTED and gen.stream and not complete:
        return False  # the record is ahead of the log copy: pull the rest first
    failure = None
    if "status" in record and not log_.length:
        retry_after = record.get("retry_after")
        failure = Failure(
            int(record["status"]),
            record.get("error", b""),
            int(retry_after) if retry_after is not None else None,
        )
    gen.end(state, failure)
    return True


def _lost(gen: Generation, log_: ReplicatedLog) -> None:
    """Redis no longer holds a mirrored generation (it expired, or Redis restarted empty and
    the owner is gone): end it with an error rather than wait forever."""
    msg = "the generation was lost by the shared store; retry the request"
    _end_with(gen, log_, error_body(msg, "upstream_error", 502), 502)


def _unreadable(gen: Generation, log_: ReplicatedLog, why: str) -> None:
    """This replica cannot read a mirrored generation's log (sealed with another secret): end
    it with a 503 that says why."""
    msg = f"this gateway replica cannot read the generation this request belongs to: {why}"
    _end_with(gen, log_, error_body(msg, "service_unavailable", 503), 503)


def _end_with(gen: Generation, log_: ReplicatedLog, error: bytes, status: int) -> None:
    """End a mirror failed with ``error``: its last event where it streamed, its answer where
    not."""
    if log_.length and gen.stream:
        if log_.read_nowait(log_.length - 1) != [DONE]:
            log_.local.append_nowait([error, DONE])
            gen.appended(log_.length)
        gen.end(State.FAILED)
    else:
        gen.end(State.FAILED, Failure(status, error))
