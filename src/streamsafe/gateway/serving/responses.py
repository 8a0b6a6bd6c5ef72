"""OpenAI's own resume and cancel forms for a Responses-API stream the gateway holds.

A client that lost a streamed response asks ``GET /v1/responses/{id}?stream=true&starting_after=N``
for the events numbered after ``N`` (each event carries its ``sequence_number``). No engine
behind a Llama Stack server offers that for a live stream; the gateway holds the stream's events,
so it answers from them: the response is found by the id its first event
(``response.created``) names, among the streams of the same tenant this process holds (by the
generation index, noted as that event passed: see
:mod:`streamsafe.gateway.generations.response_ids`; no log is read to find it), and the
subscriber starts at the event after the one numbered ``N``, then follows the live stream. A
response the gateway does not hold is the server's to answer (passed through).

``POST /v1/responses/{id}/cancel`` of a stream this process runs ends it for every subscriber
(each gets an error event saying it was cancelled) and closes its upstream request, so the server
and the engine stop it; the caller gets the response as cancelled. Any other cancel is passed
through.

Parsing here is per resume request, never per chunk.
"""

from __future__ import annotations

from urllib.parse import parse_qs

import orjson

from streamsafe.gateway.errors import BadRequest
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.generation_index import GenerationIndex
from streamsafe.gateway.generations.store import EventLog

__all__ = ["cancel_request", "cancelled", "find_response", "resume_request", "start_after"]

_PREFIX = "/v1/responses/"


def resume_request(method: str, path: str, query: bytes) -> tuple[str, int | None] | None:
    """``(response id, starting_after)`` where the request asks to stream a response again
    (``GET /v1/responses/{id}?stream=true``, ``starting_after`` optional); ``None`` for any
    other request. A ``starting_after`` that is no integer >= -1 is refused with 400."""
    if method != "GET" or not path.startswith(_PREFIX):
        return None
    response_id = path[len(_PREFIX) :]
    if not response_id or "/" in response_id:
        return None
    params = parse_qs(query.decode("latin-1"))
    if params.get("stream", [""])[-1].lower() not in ("true", "1"):
        return None
    given = params.get("starting_after")
    if not given:
        return response_id, None
    try:
        after = int(given[-1])
    except ValueError:
        after = -2
    if after < -1:
        raise BadRequest(400, "starting_after must be an event's sequence_number", "starting_after")
    return response_id, after


def cancel_request(method: str, path: str) -> str | None:
    """The response id where the request is ``POST /v1/responses/{id}/cancel``, else ``None``."""
    if method != "POST" or not path.startswith(_PREFIX) or not path.endswith("/cancel"):
        return None
    response_id = path[len(_PREFIX) : -len("/cancel")]
    return response_id if response_id and "/" not in response_id else None


def cancelled(response_id: str) -> bytes:
    """The answer to a cancel the gateway carried out: the response, as cancelled."""
    return orjson.dumps({"id": response_id, "object": "response", "status": "cancelled"})


def find_response(generations: GenerationIndex, tenant: str, response_id: str) -> Generation | None:
    """The Responses-API stream of ``tenant`` whose first event names ``response_id``; ``None``
    where this process holds none. Found by the index, so no log is read to tell (an id nobody
    holds costs one dictionary look-up, not a decoding of every kept log)."""
    return generations.by_response(tenant, response_id)


def _sequence_number(payload: bytes) -> object:
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return doc.get("sequence_number") if isinstance(doc, dict) else None


async def start_after(log: EventLog, sequence_number: int | None) -> int | None:
    """The log offset a subscriber starts at to get the events after the one numbered
    ``sequence_number`` (0 for ``None`` or -1: the whole stream); ``None`` where no event of
    ``log`` carries that number (yet)."""
    if sequence_number is None or sequence_number == -1:
        return 0
    # The server numbers its events from 0 and the log holds every one in order, so event N is
    # at offset N: read from there first (the rest of the stream, which the caller gets
    # anyway), not the whole log.
    if sequence_number < log.length:
        at = await log.read(sequence_number)
        if at and _sequence_number(at[0]) == sequence_number:
            return sequence_number + 1
    for i, payload in enumerate(await log.read(0)):
        if _sequence_number(payload) == sequence_number:
            return i + 1
    return None
