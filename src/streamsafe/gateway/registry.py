"""The generation registry: one upstream request per logical request.

The :class:`Registry` opens the generation a request belongs to: found (by ``(tenant,
Idempotency-Key)``, or for an unkeyed retry or a resume by ``(tenant, body fingerprint)``, see
:mod:`streamsafe.gateway.generations.finder`) and attached, or started when there is none. It
counts subscribers, mirrors other replicas' generations and aborts what nobody reads after a grace
period (:mod:`streamsafe.gateway.abandonment`). The task that reads each generation held here
is :class:`~streamsafe.gateway.readers.Readers`'; reading upstream is
:class:`~streamsafe.gateway.relay.relay.Relay`'s job, and it tells the generation's owner,
:class:`~streamsafe.gateway.generations.running.Running`, how it ended; what is then kept for
replay and resume, and what is forgotten, is :mod:`streamsafe.gateway.ended_generations`'s (see
docs/design.md, Replay and resume, and Abandonment and grace). The calls go one way: none of
these calls the registry back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from streamsafe.gateway.abandonment import Abandonment
from streamsafe.gateway.admission.admission import Admission, Shed
from streamsafe.gateway.admission.body_budget import BodyBudget
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.ended_generations import EndedGenerations
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.errors import (
    Draining,
    Failure,
    NotResumable,
    ResumePastEnd,
    error_body,
)
from streamsafe.gateway.generations.finder import GenerationFinder, claim_key
from streamsafe.gateway.generations.fleet import Fleet, Reach
from streamsafe.gateway.generations.generation import Generation, State, new_generation_id
from streamsafe.gateway.generations.generation_index import GenerationIndex
from streamsafe.gateway.generations.refusals import EngineRefusals, EngineRefused
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.running import Running
from streamsafe.gateway.generations.store import Store
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.readers import Readers
from streamsafe.gateway.relay.relay import Relay
from streamsafe.sse import DONE

__all__ = ["Registry"]

log = logging.getLogger("streamsafe.gateway")

#: Seconds shutdown waits for what it stopped before it goes on without it: a process told to
#: stop must stop, and the warning names what did not (a replica of a rolling restart once sat
#: drained and idle for an hour, its fleet's heartbeat still running).
CLOSE_WAIT_S = 5.0


async def _stopped(tasks: Sequence[asyncio.Future[Any]], what: str) -> None:
    """Wait at most :data:`CLOSE_WAIT_S` for ``tasks``; name those still running in a warning
    (with where each one waits), and go on."""
    _, pending = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
    if pending:
        where = [
            f"{task!r} at {frame.f_code.co_filename}:{frame.f_lineno}"
            for task in pending
            if isinstance(task, asyncio.Task)
            for frame in task.get_stack(limit=1)
        ]
        log.warning(
            "shutdown: %d %s still running after %.0f s, left behind: %s",
            len(pending),
            what,
            CLOSE_WAIT_S,
            "; ".join(where) or "?",
            extra={"fields": {"event": "shutdown_stuck"}},
        )


class Registry:
    """Finds or starts, aborts and ends generations (what ended is kept or forgotten by its
    :class:`~streamsafe.gateway.ended_generations.EndedGenerations`). ``clock`` is injectable for
    tests.

    ``fleet`` is the replicas this process is one of
    (:class:`~streamsafe.gateway.generations.fleet.Fleet`): several gateways sharing Redis (see
    :mod:`streamsafe.gateway.replicas.replicas`), whose generations are mirrored here and which
    the registry leaves for a store of its own while Redis is unreachable; or this process alone,
    a fleet of one (:class:`~streamsafe.gateway.generations.solo.Solo`).
    """

    def __init__(
        self,
        config: GatewayConfig,
        fleet: Fleet,
        admission: Admission,
        engines: Engines,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.counters = Counters()
        self._clock = clock
        self._admission = admission
        #: The engine's refusals a request of the same body is answered from while it refuses.
        self.refusals = EngineRefusals()
        #: The generations this process holds (the key index is what a retry finds while
        #: Redis is away).
        self.generations = GenerationIndex()
        fleet.held = self.generations  # what it writes back after Redis restarted
        self._keeping = keeping = EndedGenerations(
            config, self.generations, self.counters, clock, fleet.alone
        )
        #: Finished generations kept for replay, and when each goes.
        self.kept = keeping.kept
        #: The generations this process runs while live, and where each one ends.
        self._running = running = Running(config, self.counters, keeping, self.refusals, clock)
        relay = Relay(config, admission, engines, self.counters, running, clock)
        self._abandonment = Abandonment(config, admission, self.counters, running, keeping)
        #: The task that reads each generation held here: upstream, or another replica's log.
        self._readers = readers = Readers(
            self.generations, relay, running, self._abandonment, keeping, clock
        )
        self._finder = GenerationFinder(
            config, self.generations, self.counters, clock, readers, keeping
        )
        #: Subscribers connected to any generation.
        self.subscribers = 0
        #: Shutting down: no new generation starts (a retry, a resume or a replay of one held
        #: here is still served).
        self.draining = False

    @property
    def live_generations(self) -> int:
        """Generations queued or running here."""
        return self._running.count

    @property
    def bodies(self) -> BodyBudget:
        """The request bodies the live generations hold, bounded in all
        (max_live_body_bytes)."""
        return self._running.bodies

    # -- opening a generation -------------------------------------------------------------------

    async def open(self, req: GenerationRequest) -> tuple[Generation, int]:
        """The generation ``req`` belongs to (attached, replayed, resumed or new) and the offset
        its subscriber starts reading from. The caller must :meth:`leave` it when done.

        Raises :class:`~streamsafe.gateway.errors.KeyReused`,
        :class:`~streamsafe.gateway.errors.LiveDuplicate` or
        :class:`~streamsafe.gateway.errors.NotResumable`."""
        fleet = self.fleet
        if not fleet.degraded:
            try:
                return await self._open(req, fleet)
            except fleet.errors as exc:
                fleet.failed(exc)
        return await self._open(req, fleet.alone)

    async def _open(self, req: GenerationRequest, reach: Reach) -> tuple[Generation, int]:
        """Open ``req``'s generation as far as ``reach`` goes: the fleet, or this process."""
        new_id = new_generation_id()
        key = claim_key(req)
        if key is not None:
            gen = await self._finder.by_key(req, key, new_id, reach)
        else:
            gen = await self._finder.by_body(req, reach)
        if gen is not None:
            return gen, self._attach(gen, req)
        await self._refuse_start(req, key, new_id, reach.store)
        return await self._start(req, key, new_id, reach), 0

    def _attach(self, gen: Generation, req: GenerationRequest) -> int:
        """``req``'s subscriber joins ``gen``, found (counted as a resume, a replay or an
        attach); returns the offset it reads from."""
        resume = req.last_event_id is not None
        start = 0 if req.last_event_id is None else req.last_event_id + 1
        if resume and gen.finished and start > gen.length:
            raise ResumePastEnd(start - 1, gen.length)
        counters = self.counters
        if resume:
            counters.resumed += 1
        elif gen.finished:
            counters.replayed += 1
        else:
            counters.attached += 1
        self._join(gen)
        return min(start, gen.length) if gen.finished else start

    async def _refuse_start(
        self, req: GenerationRequest, key: str | None, new_id: str, store: Store
    ) -> None:
        """Raise where no generation may start for ``req``, after letting go of the ``key`` it
        claimed for ``new_id``: the fleet cannot tell whether it would run twice, the engine
        refuses it still, there is nothing to resume, the gateway drains, or the request bodies
        waiting here are over their budget."""
        resume = req.last_event_id is not None
        unsafe = self.fleet.refusal() if resume or req.retry or key is not None else None
        if unsafe is not None:
            # It may be a generation the fleet holds but cannot find now: started again, it
            # would run twice.
            if key is not None:
                await store.release(key, new_id)
            raise unsafe
        if not resume:
            # Marked or not: behind a server, a client's retry arrives as a fresh call with the
            # same body, and one more round of asking an engine that refuses it helps nobody.
            refused = self.refusals.answer(req.tenant, req.fingerprint, self._clock())
            if refused is not None:  # the engine refuses still: it is not asked again
                if key is not None:
                    await store.release(key, new_id)
                raise EngineRefused(refused)
        if resume or self.draining:
            if key is not None:
                await store.release(key, new_id)
            raise NotResumable if resume else Draining
        if not self.bodies.fits(req.tenant, len(req.body)):
            if key is not None:
                await store.release(key, new_id)
            retry_after = self._admission.retry_after(tenant=req.tenant)
            raise Shed("the request bodies waiting here are over their memory budget", retry_after)

    async def _start(
        self, req: GenerationRequest, key: str | None, new_id: str, reach: Reach
    ) -> Generation:
        """A new generation for ``req`` (under ``key``, claimed), published as far as ``reach``
        goes, its first subscriber joined and its reader task started."""
        gen = Generation(new_id, req, reach.new_log(new_id), key, self._clock())
        await reach.publish(gen)
        self.generations.add(gen)
        self._running.started(gen)
        self._join(gen)
        self._readers.run(gen)
        return gen

    def rejoin(self, gen: Generation, start: int) -> int:
        r"""A subscriber resuming ``gen`` from offset ``start``, found by other means than
        :meth:`open` (a Responses-API resume by the response's id); it :meth:`leave`\ s it when
        done. Returns the offset to read from."""
        self.counters.resumed += 1
        self._join(gen)
        return min(start, gen.length) if gen.finished else start

    def _join(self, gen: Generation) -> None:
        gen.subscribers += 1
        self.subscribers += 1
        if gen.subscribers == 1:
            gen.role.subscribers_changed(gen)
        if gen.subscribers == 1 and gen.waiter is not None:
            self._admission.set_active(gen.waiter, True)  # back within grace: its place holds
        # On a finished mirror the timer is its retention, which a replay keeps.
        if gen.timer is not None and not gen.finished:
            gen.timer.cancel()
            gen.timer = None

    # -- abandonment ----------------------------------------------------------------------------

    def leave(self, gen: Generation, hold: float = 0.0) -> None:
        """A subscriber is gone (finished or disconnected). When the last one leaves a live
        generation, the grace period starts, ``hold`` seconds later where the subscriber was
        told to come back then; past it the upstream request is closed. A queued generation
        nobody waits for keeps its place but is passed over (docs/design.md, Admission)."""
        gen.subscribers -= 1
        self.subscribers -= 1
        if gen.subscribers == 0 and not gen.finished:
            self._abandonment.left(gen, hold)

    # -- lifecycle ------------------------------------------------------------------------------

    async def end_live(self, message: str) -> int:
        """End every generation this process runs (the end of a drain): where the fleet hands
        over, their leases are given up and another replica continues each from its log; else
        each ends with an error event saying ``message`` (a 503 where nothing was sent yet).
        Returns how many were ended."""
        live = [g for g in self.generations if g.live and g.task is not None]
        if self.fleet.hands_over:
            self.fleet.closing = True
            for gen in live:
                assert gen.task is not None
                gen.task.cancel()  # the relay ends it aborted; EndedGenerations.ended hands it over
            return len(live)
        for gen in live:
            await self.end(gen, error_body(message, "service_unavailable", 503), 503)
        return len(live)

    async def end(self, gen: Generation, error: bytes, status: int) -> None:
        """End ``gen``, which this process runs, now: every subscriber gets ``error`` (an error
        object) as the stream's last event, or as the answer with ``status`` where nothing was
        sent yet; its upstream request is closed, so the engine aborts it."""
        task = gen.task
        if not gen.finished and gen.stream and gen.length:
            length = await gen.log.append((error, DONE))
            if not gen.finished:  # its reader may have ended it meanwhile: that end stands
                gen.appended(length)
                self._running.end(gen, State.FAILED)
        elif not gen.finished:
            self._running.end(gen, State.FAILED, Failure(status, error, 1))
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        """Cancel every reader (shutdown). Where the fleet hands over, what this one runs is
        handed over: its leases are given up, so another replica continues it from the log."""
        self.fleet.closing = True
        self.kept.close()
        tasks = [g.task for g in self.generations if g.task is not None and not g.task.done()]
        for gen in self.generations:
            if gen.timer is not None:
                gen.timer.cancel()
        for task in tasks:
            task.cancel()
        if tasks:
            await _stopped(tasks, "generation task(s) cancelled")
        await _stopped([asyncio.ensure_future(self._keeping.settle())], "store bookkeeping")
        await self.fleet.close()
