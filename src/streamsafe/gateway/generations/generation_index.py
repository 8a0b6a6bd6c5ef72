"""The generations this process holds (run, mirror or keep for replay), found by id, by
Idempotency-Key, by body and (a Responses stream) by its response id: one index, so the ways to
find one never disagree."""

from __future__ import annotations

from collections.abc import Iterator

from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.response_ids import ResponseIds

__all__ = ["GenerationIndex"]


class GenerationIndex:
    """Generations by id, by claimed key (where they have one), by ``(tenant, body
    fingerprint)`` (the newest with that body) and by ``(tenant, response id)`` (a Responses
    stream, see :mod:`~streamsafe.gateway.generations.response_ids`)."""

    __slots__ = ("_by_body", "_by_id", "_by_key", "_by_response")

    def __init__(self) -> None:
        self._by_id: dict[str, Generation] = {}
        self._by_key: dict[str, Generation] = {}
        self._by_body: dict[tuple[str, bytes], Generation] = {}
        self._by_response = ResponseIds()

    def add(self, gen: Generation) -> None:
        """Hold ``gen``; it becomes the newest with its body."""
        self._by_id[gen.id] = gen
        self._by_body[(gen.tenant, gen.fingerprint)] = gen
        if gen.key is not None:
            self._by_key[gen.key] = gen
        self._by_response.add(gen)

    def drop(self, gen: Generation) -> None:
        """Forget ``gen`` wherever it is still the entry (a newer one may have replaced it)."""
        if self._by_id.get(gen.id) is gen:
            del self._by_id[gen.id]
        body = (gen.tenant, gen.fingerprint)
        if self._by_body.get(body) is gen:
            del self._by_body[body]
        if gen.key is not None and self._by_key.get(gen.key) is gen:
            del self._by_key[gen.key]
        self._by_response.drop(gen)

    def get(self, gen_id: str) -> Generation | None:
        """The generation with id ``gen_id``."""
        return self._by_id.get(gen_id)

    def by_key(self, key: str) -> Generation | None:
        """The generation that claimed ``key`` (the store's key, tenant included)."""
        return self._by_key.get(key)

    def by_body(self, tenant: str, fingerprint: bytes) -> Generation | None:
        """The newest generation of ``tenant`` with this body."""
        return self._by_body.get((tenant, fingerprint))

    def by_response(self, tenant: str, response_id: str) -> Generation | None:
        """The Responses stream of ``tenant`` whose first event names ``response_id``; no log
        is read to find it."""
        return self._by_response.find(tenant, response_id)

    def __contains__(self, gen_id: object) -> bool:
        return gen_id in self._by_id

    def __iter__(self) -> Iterator[Generation]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)
