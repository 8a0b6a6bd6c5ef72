"""Responses-API streams found by their response id: the id the first event of each
(``response.created``) names, noted as that event is appended, and looked up by ``(tenant,
response id)``.

A resume (``GET /v1/responses/{id}?stream=true``) or a cancel names a response by the id the
server gave it, not by anything the gateway chose, so the gateway learns it from the stream
itself. Reading it back out of the logs at look-up time decoded every kept log of the tenant on
the event loop, for any id anyone asked (hundreds of milliseconds with tens of MiB kept, every
other stream paused meanwhile): the id is noted once instead, where the first event passes by
(:func:`note_first_event`, by whoever appends it: the relay, or a mirror's follower), and a
look-up touches no log. The generation index owns the entries (:class:`ResponseIds`), so a
generation forgotten or evicted cannot be found by its response id either; one tenant can never
find another's.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.upstream.wire import Wire

__all__ = ["ResponseIds", "note_first_event", "response_id_of"]


def response_id_of(first: bytes) -> str | None:
    """The response id the first event of a Responses stream names (``{"type":
    "response.created", "response": {"id": ...}}``); ``None`` where it names none (an error
    event, a malformed one)."""
    try:
        doc = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None
    response = doc.get("response") if isinstance(doc, dict) else None
    found = response.get("id") if isinstance(response, dict) else None
    return found if isinstance(found, str) and found else None


def is_responses_stream(gen: Generation) -> bool:
    """``gen`` streams the Responses API (the only kind a response id finds)."""
    return gen.stream and gen.request.route.wire is Wire.OPENAI_RESPONSES


def note_first_event(gen: Generation, payloads: Sequence[bytes]) -> None:
    """``payloads`` begin ``gen``'s log: where it is a Responses stream, note the response id
    its first event names (once per generation, never per chunk)."""
    if payloads and gen.response_id is None and is_responses_stream(gen):
        gen.response_id = response_id_of(payloads[0])


class ResponseIds:
    """The Responses streams of a :class:`~streamsafe.gateway.generations.generation_index.
    GenerationIndex` by ``(tenant, response id)``.

    A stream is held from when the index holds it; its id is noted on the generation when its
    first event is appended (:func:`note_first_event`), possibly later, and moved into the map
    by the next look-up. Until then it waits among the unnamed: only streams whose first event
    has not come yet (queued, or just sent upstream), so a look-up checks a handful of
    attributes at most, and never a log."""

    __slots__ = ("_by_id", "_unnamed")

    def __init__(self) -> None:
        self._by_id: dict[tuple[str, str], Generation] = {}
        self._unnamed: dict[str, Generation] = {}

    def add(self, gen: Generation) -> None:
        """Hold ``gen`` if it is a Responses stream (named now or once its first event comes)."""
        if not is_responses_stream(gen):
            return
        if gen.response_id is not None:
            self._by_id[(gen.tenant, gen.response_id)] = gen
        else:
            self._unnamed[gen.id] = gen

    def drop(self, gen: Generation) -> None:
        """Forget ``gen`` wherever it is still the entry."""
        if self._unnamed.get(gen.id) is gen:
            del self._unnamed[gen.id]
        if gen.response_id is not None:
            named = (gen.tenant, gen.response_id)
            if self._by_id.get(named) is gen:
                del self._by_id[named]

    def find(self, tenant: str, response_id: str) -> Generation | None:
        """The Responses stream of ``tenant`` whose first event names ``response_id``."""
        if self._unnamed:
            self._name_the_started()
        return self._by_id.get((tenant, response_id))

    def _name_the_started(self) -> None:
        """Move the streams whose first event came since into the map; let go of those that
        ended without one (no id will ever find them)."""
        for gen_id, gen in list(self._unnamed.items()):
            if gen.response_id is not None:
                del self._unnamed[gen_id]
                self._by_id[(gen.tenant, gen.response_id)] = gen
            elif gen.finished:
                del self._unnamed[gen_id]

    def __len__(self) -> int:
        return len(self._by_id) + len(self._unnamed)
