"""How the simulator answers a request it will not serve, in vLLM's shapes: the JSON error of a
request it cannot take (:func:`refuse`), and vLLM 0.32's load shedding inside a stream
(:func:`refuse_in_stream`, an injected fault).
"""

from __future__ import annotations

import json
from http import HTTPStatus

import orjson

from streamsafe.engine_sim.validation import BadRequest
from streamsafe.engine_sim.wire import DONE_EVENT, error_body
from streamsafe.server.asgi import BodyTooLarge, Send, respond

__all__ = ["refuse", "refuse_in_stream"]

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


async def refuse_in_stream(send: Send, code: int, stream: bool) -> None:
    """vLLM 0.32's load shedding in its second form: a streaming request answered 200, then one
    error event carrying ``code`` (its shape exactly: ``type`` the status's phrase, ``param``
    null) and ``[DONE]``; a non-streaming one gets the status."""
    msg = "injected fault: the engine is currently busy and cannot accept new requests"
    if not stream:
        await respond(send, code, error_body(msg, code))
        return
    error = {"message": msg, "type": HTTPStatus(code).phrase, "param": None, "code": code}
    event = b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    start = {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS}
    await send(start)
    await send({"type": "http.response.body", "body": event + DONE_EVENT, "more_body": False})


async def refuse(send: Send, exc: Exception) -> None:
    """The JSON error vLLM gives a request it cannot take: a body over the limit (413), JSON
    that does not parse, a request it refuses (its status), a bad ``x-sim-fault`` header."""
    if isinstance(exc, BodyTooLarge):
        code, message = 413, "request body too large"
    elif isinstance(exc, orjson.JSONDecodeError):
        code, message = 400, f"malformed JSON body: {exc}"
    elif isinstance(exc, BadRequest):
        await respond(send, exc.code, error_body(str(exc), exc.code, exc.name))
        return
    else:
        code, message = 400, str(exc)
    await respond(send, code, error_body(message, code))
