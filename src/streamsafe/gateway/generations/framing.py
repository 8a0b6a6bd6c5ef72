"""How a route's events are framed for its subscribers (:class:`Framing`): the log holds each
event's ``data`` alone, whatever the route; the framing writes it with the gateway's ``id:``,
its heartbeat between events, and an error after commit.

Two framings. OpenAI's (every route but one): ``id: N`` + ``data:``; a ``: keep-alive``
comment line as the heartbeat; an error as ``data: {"error": {...}}``. Anthropic's Messages
API: each event named by its ``type`` (``event: content_block_delta``; the Anthropic SDK drops
an event without a name), the heartbeat Anthropic's own ``ping`` event, an error as ``event:
error`` with ``{"type": "error", "error": {"type", "message"}}``. The choice is made once per
generation, so the per-chunk path of OpenAI's framing is exactly what it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from streamsafe.gateway.errors import ERROR_PREFIXES, Failure
from streamsafe.gateway.generations.keepalive import KEEPALIVE_LINE
from streamsafe.gateway.upstream.kinds import CompletionRoute, Wire
from streamsafe.sse import encode_event, encode_events

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "PING",
    "Framing",
    "anthropic_error",
    "encode_named_events",
    "framing_for",
]

#: Anthropic's heartbeat, as its API writes it.
PING = b'event: ping\ndata: {"type": "ping"}\n\n'

#: Anthropic's error types by status (its documented pairs; 503 is its ``overloaded_error``,
#: which it answers with 529).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> bytes:
    """Anthropic's error object for ``status``: ``{"type": "error", "error": {"type",
    "message"}}`` (``api_error`` for a status it names no type for)."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _event_name(payload: bytes) -> bytes | None:
    """The ``type`` an Anthropic event's data names (first, as vLLM and Anthropic write it);
    ``None`` where there is none to read."""
    if payload.startswith(b'{"type":"'):
        end = payload.find(b'"', 9)
        name = payload[9:end] if end > 9 else b""
    else:
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        kind = doc.get("type") if isinstance(doc, dict) else None
        name = kind.encode() if isinstance(kind, str) else b""
    return name if name and name.replace(b"_", b"").replace(b".", b"").isalnum() else None


def _as_anthropic(payload: bytes) -> bytes:
    """An error event the gateway wrote in OpenAI's shape (``{"error": {"message", "code"}}``:
    a stream it could not continue) in Anthropic's."""
    try:
        error = orjson.loads(payload).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return payload
    if not isinstance(error, dict):
        return payload
    code = error.get("code")
    status = code if isinstance(code, int) else 500
    return anthropic_error(status, str(error.get("message") or "the stream failed"))


def encode_named_events(payloads: Sequence[bytes], first_id: int, multiline: bool = True) -> bytes:
    """:func:`~streamsafe.sse.encode_events` with each event named by its data's ``type``;
    the gateway's own error events (OpenAI's shape in the log) in Anthropic's."""
    out = []
    for i, p in enumerate(payloads, first_id):
        if p.startswith(ERROR_PREFIXES):
            p = _as_anthropic(p)
        name = _event_name(p)
        if multiline or name is None:
            out.append(encode_event(p, event=None if name is None else name.decode(), id=i))
        else:
            out.append(b"event: %s\nid: %d\ndata: %s\n\n" % (name, i, p))
    return b"".join(out)


def _openai_error(failure: Failure) -> bytes:
    return encode_event(failure.as_event())


def _anthropic_error(failure: Failure) -> bytes:
    message = "the stream failed"
    try:
        error = orjson.loads(failure.as_event()).get("error")
        if isinstance(error, dict):
            message = str(error.get("message") or message)
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return encode_event(anthropic_error(failure.status, message), event="error")


@dataclass(frozen=True, slots=True)
class Framing:
    """How one route's events reach its subscribers. ``encode``: events with ids (payloads,
    first id, whether any may hold a newline). ``heartbeat``: what goes out while a stream is
    quiet, between whole events. ``error``: a failure after commit, as the stream's last
    event."""

    encode: Callable[[Sequence[bytes], int, bool], bytes]
    heartbeat: bytes
    error: Callable[[Failure], bytes]


OPENAI = Framing(encode_events, KEEPALIVE_LINE, _openai_error)
ANTHROPIC = Framing(encode_named_events, PING, _anthropic_error)


def framing_for(route: CompletionRoute) -> Framing:
    """The framing of ``route``'s streams."""
    return ANTHROPIC if route.wire is Wire.ANTHROPIC_MESSAGES else OPENAI
