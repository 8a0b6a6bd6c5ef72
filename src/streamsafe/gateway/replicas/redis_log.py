"""A generation's event log in Redis (a Redis Stream whose entry ``0-(n+1)`` holds the payload
with SSE id ``n``), and the log with a copy in this process that the replicas use.

Appends go through :data:`~streamsafe.gateway.replicas.redis_scripts.APPEND`, which checks the
writer's lease and the expected offset, so a replica that lost its lease (paused, partitioned)
cannot write into a log another replica has taken over.

With the replicas' secret every entry is sealed (field ``s``, see
:mod:`~streamsafe.gateway.replicas.record_seal`) and opened as it is read; without it entries are
in clear (field ``d``). A replica that cannot open an entry (no secret, or another one) gets
:class:`~streamsafe.gateway.replicas.record_seal.Unsealable`, never the sealed bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from redis.exceptions import RedisError

from streamsafe.gateway.generations.store import LeaseLost, MemoryEventLog
from streamsafe.gateway.replicas.record_seal import RecordSeal, Unsealable
from streamsafe.gateway.replicas.redis_client import RedisClient
from streamsafe.gateway.replicas.redis_scripts import Scripts, entry_offset, ms
from streamsafe.sse import DONE

__all__ = ["APPEND_PATIENCE", "LogConflict", "LogLost", "RedisEventLog", "ReplicatedLog"]

log = logging.getLogger("streamsafe.gateway")

#: Field of a log entry that holds the payload in clear, and sealed.
_FIELD = b"d"
_SEALED_FIELD = b"s"
#: How the error event a failed generation ends with begins (its end is recorded as 'failed').
_ERROR_EVENT = (b'{"error"', b'{ "error"')
#: Seconds the writer of a log waits for Redis to take an append before it goes on with its copy
#: alone (detached, as in an outage; written back once Redis answers again). Redis takes one in
#: well under a millisecond; a frozen one (SIGSTOP) held every stream of its owner for the socket
#: timeout (5 s then).
APPEND_PATIENCE = 0.25


class LogConflict(Exception):
    """A log is not at the offset its writer expected (two writers; the log is left as is)."""


class LogLost(Exception):
    """Redis no longer holds what the writer wrote (it restarted empty, or evicted the log):
    the writer's copy is the only one left."""


class RedisEventLog:
    """One generation's event log in a Redis Stream. ``length`` is what this process last saw
    (it grows by appends and reads), so a follower learns the length by reading."""

    __slots__ = (
        "_gen",
        "_key",
        "_last",
        "_lease_key",
        "_length",
        "_meta_key",
        "_nbytes",
        "_redis",
        "_scripts",
        "_seal",
        "_state_key",
        "keep_ms",
        "lease_holder",
        "lease_ms",
    )

    def __init__(
        self,
        redis: RedisClient,
        scripts: Scripts,
        key: str,
        lease_key: str,
        lease_holder: str = "",
        lease: float = 3.0,
        keep: float | None = None,
        *,
        state_key: str,
        meta_key: str,
        gen_id: str = "",
        seal: RecordSeal | None = None,
    ) -> None:
        self._redis = redis
        self._scripts = scripts
        self._key = key
        self._lease_key = lease_key
        # Where an append that ends the log records the end (see redis_scripts.APPEND).
        self._state_key = state_key
        self._meta_key = meta_key
        self._length = 0
        self._nbytes = 0
        # Seals the entries (None: in clear); the generation id is their associated data.
        self._seal = seal
        self._gen = gen_id.encode()
        # The last payload this process appended or read: an append of [DONE] alone records
        # 'failed' where it is an error event.
        self._last = b""
        #: Appends are fenced by this lease value ('' for none): see the module.
        self.lease_holder = lease_holder
        #: The lease an append takes back where it lapsed with nobody taking it over.
        self.lease_ms = ms(lease)
        #: The lifetime the append that creates the log gives it (0: none).
        self.keep_ms = 0 if keep is None else ms(keep)

    async def append(self, payloads: Sequence[bytes], before: bytes | None = None) -> int:
        """Append payloads at the offset this writer last saw; return the new length (payloads
        that end with ``[DONE]`` record the generation's end with them; ``before``: the payload
        just before them, where the caller knows better than what this process last appended
        or read). Raises
        :class:`LeaseLost` if another replica holds the lease, :class:`LogLost` if Redis lost
        (part of) the log, and :class:`LogConflict` if the log moved under the writer."""
        if not payloads:
            return self._length
        end = ""
        if payloads[-1] == DONE:
            if len(payloads) > 1:
                before = payloads[-2]
            elif before is None:
                before = self._last
            end = "failed" if before.startswith(_ERROR_EVENT) else "done"
        seal = self._seal
        n = await self._scripts.append(
            self._key,
            self._lease_key,
            self._state_key,
            self._meta_key,
            self._length,
            self.lease_holder,
            self.lease_ms,
            self.keep_ms,
            end,
            _FIELD if seal is None else _SEALED_FIELD,
            payloads if seal is None else seal.seal_entries(self._gen, self._length, payloads),
        )
        if n == -1:
            raise LeaseLost(self._key)
        if n == -2:
            raise LogLost(self._key)
        if n < 0:
            held = -100 - n
            if self.lease_holder and held < self._length:
                # Under this writer's own lease, a shorter log is one Redis lost (evicted under
                # maxmemory, flushed, a failover to a lagging replica): nobody else wrote it.
                raise LogLost(f"{self._key} holds {held} events, its writer wrote {self._length}")
            raise LogConflict(f"{self._key} holds {held} events, writer expected {self._length}")
        self._length = n
        self._nbytes += sum(map(len, payloads))
        self._last = payloads[-1]
        return n

    async def read(self, start: int) -> list[bytes]:
        """Payloads from offset ``start`` on (one ``XRANGE``), opened where they are sealed.
        Raises :class:`~streamsafe.gateway.replicas.record_seal.Unsealable` for an entry this
        replica cannot open (sealed, and no secret or another one)."""
        entries: Any = await self._redis.xrange(self._key, min=f"0-{start + 1}", max="+")
        if not entries:
            return []
        payloads = [self._payload(entry_id, fields) for entry_id, fields in entries]
        self._length = max(self._length, entry_offset(entries[-1][0]))
        self._last = payloads[-1]
        return payloads

    def _payload(self, entry_id: bytes, fields: dict[bytes, bytes]) -> bytes:
        """An entry's payload (see the module)."""
        clear = fields.get(_FIELD)
        if clear is not None:
            return clear
        if self._seal is None:
            gen = self._gen.decode(errors="replace")
            raise Unsealable(f"{gen}: its event log is sealed, and no Redis secret is set")
        return self._seal.open_entry(self._gen, entry_offset(entry_id) - 1, fields[_SEALED_FIELD])

    async def sync(self) -> int:
        """Learn the log's length from Redis (a writer that takes a log over starts here)."""
        self._length = int(await self._redis.xlen(self._key))
        return self._length

    @property
    def length(self) -> int:
        """Events appended or read so far, as known to this process."""
        return self._length

    @property
    def nbytes(self) -> int:
        """Payload bytes this process appended (what its share of the kept memory is)."""
        return self._nbytes


class ReplicatedLog:
    """A log in Redis with a copy in this process: subscribers here read the copy without a
    round trip, other replicas read Redis. Its role is chosen when it is opened: the *shared
    owner*'s (``writer``: its appends are fenced by this replica's lease), or a *mirror*'s (it
    copies what another replica wrote, :meth:`pull`, until it takes the log over).

    The relay hands the owner's events over as it reads them (:meth:`append_nowait`, in the
    read callback, as to a log of this process's alone); :meth:`write_behind` writes them to
    Redis first and then to the copy, so nothing reaches a subscriber here that the other
    replicas cannot read. If Redis fails under the writer, the log is *detached*: it goes on in
    this process alone (its subscribers here lose nothing) and ``detached`` says so.
    """

    __slots__ = ("_held", "_ready", "detached", "local", "on_detach", "remote")

    def __init__(self, remote: RedisEventLog) -> None:
        self.remote = remote
        self.local = MemoryEventLog()
        #: Redis failed under an append; the log goes on in this process only.
        self.detached = False
        #: Told why the log detached (the replica's Redis failure policy starts there).
        self.on_detach: Callable[[BaseException], None] | None = None
        # What the relay handed over and write_behind has not written yet, and the future
        # write_behind waits on for more.
        self._held: list[bytes] = []
        self._ready: asyncio.Future[None] | None = None

    def append_nowait(self, payloads: Sequence[bytes]) -> int:
        """Hold ``payloads`` for :meth:`write_behind` (no round trip in the read callback) and
        return 0: none is readable here before Redis took it."""
        self._held.extend(payloads)
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.set_result(None)
        return 0

    def append_one(self, payload: bytes) -> int:
        """0: every payload goes through :meth:`append_nowait` (held for Redis)."""
        return 0

    async def write_behind(self, reading: asyncio.Future[Any]) -> AsyncGenerator[list[bytes]]:
        """Write what :meth:`append_nowait` held with :meth:`append` (several reads at once
        where Redis is slower than the engine), yielding each batch once the copy has it, until
        ``reading`` is done and nothing is held (see
        :meth:`~streamsafe.gateway.generations.store.EventLog.write_behind`)."""
        try:
            while True:
                if self._held:
                    payloads, self._held = self._held, []
                    await self.append(payloads)
                    yield payloads
                elif reading.done():
                    return
                else:
                    self._ready = ready = asyncio.get_running_loop().create_future()
                    await asyncio.wait((reading, ready), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Stopped short (the lease lost, the attempt cancelled): what the attempt handed
            # over goes with it, never into a later attempt's writes.
            self._held.clear()

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append to Redis, then to the copy; return the new length. :class:`LeaseLost`
        propagates (another replica writes this log now); a Redis failure detaches the log, and
        so does a Redis that has not answered within :data:`APPEND_PATIENCE` (frozen, or
        unreachable without a reset): the subscribers here, who read the copy, never wait on
        Redis for longer than that."""
        if not self.detached:
            try:
                async with asyncio.timeout(APPEND_PATIENCE):
                    await self.remote.append(payloads)
            except (RedisError, OSError, LogLost, TimeoutError) as exc:
                log.warning("redis failed under a log append (%r); going on locally", exc)
                self.detached = True
                if self.on_detach is not None:
                    self.on_detach(exc)
        return self.local.append_nowait(payloads)

    async def read(self, start: int) -> list[bytes]:
        """Payloads from ``start`` on, from the copy."""
        return self.local.read_nowait(start)

    def read_nowait(self, start: int) -> list[bytes]:
        """Payloads from ``start`` on, from the copy, without a coroutine."""
        return self.local.read_nowait(start)

    async def pull(self) -> list[bytes]:
        """Copy what Redis holds past the copy's end; return the new payloads."""
        new = await self.remote.read(self.local.length)
        if new:
            self.local.append_nowait(new)
        return new

    async def take_over(self, lease_holder: str) -> int:
        """Become the writer (after winning the lease): copy the whole log, fence appends
        with ``lease_holder``, and return the length."""
        await self.pull()
        self.remote.lease_holder = lease_holder
        return await self.remote.sync()

    @property
    def length(self) -> int:
        """Events in the copy."""
        return self.local.length

    @property
    def nbytes(self) -> int:
        """Bytes the copy holds."""
        return self.local.nbytes
