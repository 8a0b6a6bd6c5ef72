"""What one attempt sends to one engine, and what it got back: a :class:`Sender` per transport
(the hot stream reader's, :func:`event_sender`; a plain exchange for anything else,
:func:`request_sender`; both on the engine's one connection pool),
and the request body's model, read and rewritten (a fallback model answers under its own name).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import orjson

from streamsafe.gateway.engines.answers import Refused
from streamsafe.gateway.upstream.connection import MAX_ERROR_BODY, Upstream
from streamsafe.gateway.upstream.errors import ConnectFailed
from streamsafe.gateway.upstream.exchange import Exchange

__all__ = [
    "H",
    "Sender",
    "Sent",
    "event_sender",
    "model_of",
    "never_connected",
    "request_sender",
    "with_model",
]

#: What a sender hands back open: the exchange, its head read and its body not.
H = TypeVar("H")


@dataclass(frozen=True, slots=True)
class Sent(Generic[H]):
    """What one send to one engine got: an open 200 (``handle``), or a refusal."""

    handle: H | None
    refused: Refused | None = None


#: Sends a body to one engine (the one attempt's transport).
Sender = Callable[[Upstream, bytes], Awaitable[Sent[H]]]


def event_sender(path: str, headers: bytes) -> Sender[Exchange]:
    """POST a streaming completion on the hot stream reader and wait for its head: the open
    exchange where it is a 200 (its body unread), else its refusal, read whole. One connect:
    a refused one raises ``NotConnected``, for the generation's plan to decide."""

    async def send(upstream: Upstream, content: bytes) -> Sent[Exchange]:
        conn = await upstream.open_events(path, content, headers=headers, connect_once=True)
        try:
            await conn.head()
        except BaseException:
            conn.release()
            raise
        upstream.alive_at = conn.read_at
        if conn.status == 200:
            return Sent(conn)
        try:
            answer = await conn.read_body(MAX_ERROR_BODY, broken_ok=True)
        finally:
            conn.release()
        ra = conn.header(b"retry-after")
        return Sent(
            None, Refused(conn.status, answer, None if ra is None else ra.decode("latin-1"))
        )

    return send


def request_sender(method: str, path: str, headers: Mapping[str, str] | None) -> Sender[Exchange]:
    """Send any other request: the exchange where it is a 200 (its body unread), else its
    refusal, read whole. One connect, as :func:`event_sender`."""
    pairs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]

    async def send(upstream: Upstream, body: bytes) -> Sent[Exchange]:
        conn = await upstream.open(method, path, content=body, headers=pairs, connect_once=True)
        if conn.status == 200:
            return Sent(conn)
        try:
            answer = await conn.read_body(MAX_ERROR_BODY, broken_ok=True)
        finally:
            conn.release()
        ra = conn.header(b"retry-after")
        return Sent(
            None, Refused(conn.status, answer, None if ra is None else ra.decode("latin-1"))
        )

    return send


def never_connected(exc: Exception) -> bool:
    """True for a connection that was never made (refused, unreachable): the engine never saw
    the request. A connection dropped before the answer (``UpstreamClosed``) is not."""
    return isinstance(exc, ConnectFailed)


def model_of(body: bytes) -> str:
    """The model a request body names ("" where it names none)."""
    try:
        model = orjson.loads(body).get("model")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return model if isinstance(model, str) else ""


def with_model(content: bytes, model: str) -> bytes:
    """The request body asking for ``model`` instead (one re-encode per failover, not per
    chunk)."""
    body = orjson.loads(content)
    body["model"] = model
    return orjson.dumps(body)
