"""Which generation a request belongs to: the one that claimed its ``(tenant, Idempotency-Key)``
in the store, the newest with its body for an unkeyed retry or a resume, or, with
``collapse_identical``, the one an identical request joins (see docs/design.md, Replay and
resume).

The finder starts nothing: where it finds none, the registry starts a generation (under the
key claimed here). It looks in this process first, then as far as the
:class:`~streamsafe.gateway.generations.fleet.Reach` it is given goes: another replica's
generation is copied here by a :class:`Mirroring` (the registry's readers, which follow it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from streamsafe.gateway.config import CollapseSetting, GatewayConfig
from streamsafe.gateway.errors import KeyReused, LiveDuplicate
from streamsafe.gateway.generations.fleet import Reach
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.generation_index import GenerationIndex
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.metrics.counters import Counters

__all__ = ["Forgetting", "GenerationFinder", "Mirroring", "claim_key"]

#: Rounds of claim and release that settle a race on one Idempotency-Key.
_CLAIM_ROUNDS = 3
#: Seconds a replica waits for the record of a generation another replica claimed a key for
#: (see Mirrors.find) before it takes the key over.
_RECORD_WAIT_S = 2.0


def claim_key(req: GenerationRequest) -> str | None:
    """The store key ``req`` claims: its tenant and Idempotency-Key; ``None`` without a key."""
    if req.idempotency_key is None:
        return None
    return f"k\x00{req.tenant}\x00{req.idempotency_key}"


def collapses(setting: CollapseSetting, req: GenerationRequest) -> bool:
    """Whether an unmarked request without a key may join an identical one (see
    ``GatewayConfig.collapse_identical``): ``auto`` (default) where its answer is determined
    (greedy or seeded: sharing it changes no answer) or it is a plain call (behind a server a
    client's retry of a plain call comes as a fresh call while the server still runs the first
    one; a sampled stream's copy the server cancelled, so a duplicate stream is a new wish for a
    sample); ``deterministic`` the determined ones only; ``all`` every one; ``off`` none."""
    if setting == "all":
        return True
    if setting == "off":
        return False
    return req.deterministic or (setting == "auto" and not req.stream)


class Mirroring(Protocol):
    """What copies another replica's generation here (the registry's
    :class:`~streamsafe.gateway.readers.Readers`)."""

    async def mirror(
        self, reach: Reach, gen_id: str, key: str | None, wait: float
    ) -> Generation | None:
        """A copy here of ``gen_id``, followed until it ends; ``None`` where ``reach`` finds
        none (its record waited for ``wait`` seconds)."""


class Forgetting(Protocol):
    """What drops a generation (the registry's
    :class:`~streamsafe.gateway.ended_generations.EndedGenerations`)."""

    async def forget(self, gen: Generation) -> None:
        """Nobody can find ``gen`` any more."""


class GenerationFinder:
    """Finds a request's generation among those ``generations`` holds and those other replicas
    run: another replica's is copied here by ``mirrors``; one a fresh attempt starts over from
    is dropped by ``keeping``. ``clock`` is injectable for tests."""

    def __init__(
        self,
        config: GatewayConfig,
        generations: GenerationIndex,
        counters: Counters,
        clock: Callable[[], float],
        mirrors: Mirroring,
        keeping: Forgetting,
    ) -> None:
        self._config = config
        self._generations = generations
        self._counters = counters
        self._clock = clock
        self._mirrors = mirrors
        self._keeping = keeping

    async def by_key(
        self, req: GenerationRequest, key: str, new_id: str, reach: Reach
    ) -> Generation | None:
        """The generation that claimed ``key`` (see :func:`claim_key`) in ``reach``'s store for
        ``req``'s body; ``None`` where there is none to join, and then ``key`` is claimed for
        ``new_id`` (unless the rounds of a race ran out). Raises
        :class:`~streamsafe.gateway.errors.KeyReused` for another body,
        :class:`~streamsafe.gateway.errors.LiveDuplicate` for a live one where
        ``on_live_duplicate`` is ``409``."""
        resume = req.last_event_id is not None
        generations, store = self._generations, reach.store
        for _ in range(_CLAIM_ROUNDS):  # a claim can race with a release
            # The key's generation held here first: Redis may be away, or have restarted
            # empty and lost the claim (a retry would otherwise start it again).
            held = generations.by_key(key)
            if held is not None:
                owner: str | None = held.id
            else:
                # A claim in Redis lapses with the rest of its generation's keys where its
                # replica died and nobody took it over (Replicas.orphan_ttl).
                owner = await store.claim(key, new_id, reach.orphan_ttl)
            if owner is None:
                return None
            gen = generations.get(owner)
            if gen is None:  # another replica's?
                gen = await self._mirrors.mirror(reach, owner, key, _RECORD_WAIT_S)
            if gen is None:  # owner is gone (forgotten concurrently): take the key over
                await store.release(key, owner)
                continue
            if gen.fingerprint != req.fingerprint:
                self._counters.key_conflicts += 1
                raise KeyReused
            if not resume and (gen.state is State.FAILED or gen.state is State.ABORTED):
                # A fresh attempt after a failure starts over; resuming still replays it.
                await self._keeping.forget(gen)
                continue
            if not resume and gen.live and self._config.on_live_duplicate == "409":
                raise LiveDuplicate
            return gen
        return None

    async def by_body(self, req: GenerationRequest, reach: Reach) -> Generation | None:
        """For a request without a key: the generation an unkeyed retry or a resume continues,
        or (``collapse_identical``, see :func:`collapses`) the one an identical request joins,
        or else one with its body that every caller left before it sent anything; ``None`` for
        none."""
        resume = req.last_event_id is not None
        if req.retry or resume:
            found = self._generations.by_body(req.tenant, req.fingerprint)
            if found is None:
                gen_id = await reach.find_fingerprint(req.tenant, req.fingerprint)
                if gen_id is not None:
                    found = self._generations.get(gen_id) or await self._mirrors.mirror(
                        reach, gen_id, None, 0.0
                    )
            if found is not None and (resume or found.live or found.state is State.DONE):
                return found
            return None
        if collapses(self._config.collapse_identical, req):
            return self._identical(req)
        return self._unread(req)

    def _unread(self, req: GenerationRequest) -> Generation | None:
        # A live generation with this body whose callers all left before it sent anything (it
        # waits at a refusing engine's gate, or for its first token) is given to this request:
        # nobody read any of it, so no two callers share a sample, and the engine is spared the
        # asks of a second copy. Behind a server a client's retry of a stream comes as a fresh
        # call while the copy it abandoned still waits in its grace period: 3 attempts of one
        # stream cost a refusing engine 18 requests, each copy asking its own 6.
        found = self._generations.by_body(req.tenant, req.fingerprint)
        if found is not None and found.live and found.subscribers == 0 and found.length == 0:
            self._counters.unread_adopted += 1
            return found
        return None

    def _identical(self, req: GenerationRequest) -> Generation | None:
        # Behind Llama Stack a client's retry comes as a fresh call with no marker: an
        # identical request is taken for one while the first copy runs, or within the grace
        # period after it finished (Llama Stack waited for that answer and dropped it, as its
        # caller had left).
        # A sampled plain call replays a finished one only where a copy of it already came while
        # it ran (``duplicated``): the client is evidently retrying it. One that ran alone was a
        # call of its own, and the same call again is another wish for a sample.
        found = self._generations.by_body(req.tenant, req.fingerprint)
        if found is None:
            return None
        if found.live:
            found.duplicated = True
            return found
        if (
            found.state is State.DONE
            and found.finished_at is not None
            and self._clock() - found.finished_at <= self._config.grace
            and (req.deterministic or found.duplicated or self._config.collapse_identical == "all")
        ):
            return found
        return None
