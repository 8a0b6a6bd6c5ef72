"""Every route the gateway does not serve itself, forwarded to the upstream unchanged (Llama Stack
has many APIs besides inference: models, agents, files, vector stores, ...).

No coalescing, no replay, no admission: the request goes upstream as it came (less hop-by-hop
headers and the client's ``Authorization``, since client keys are never forwarded; the gateway's
``upstream_api_key`` is sent instead, as on every upstream request), and the response comes back
as the upstream sends it, byte for byte and chunk by chunk, so a streamed response stays
streamed. A client that leaves is passed on: the upstream request is closed at once, as the
client would have closed it. A failure before the upstream answered is a 502 with a JSON error;
after the response started, the connection is closed mid-body, so the client sees a broken
response rather than a short one that looks whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from streamsafe.gateway.errors import error_body
from streamsafe.gateway.upstream.connect_failure import connect_failure
from streamsafe.gateway.upstream.errors import ConnectFailed, UpstreamError
from streamsafe.gateway.upstream.transport import ConnectionPool
from streamsafe.server.asgi import Message, Receive, Scope, Send, respond

__all__ = ["ClientGone", "UpstreamBroke", "pass_through", "read_small_body", "shared_route"]

log = logging.getLogger("streamsafe.gateway")

#: Headers that describe one connection, not the message (RFC 9110, 7.6.1), plus those the
#: gateway sets itself on the upstream request.
_HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"authorization",
    )
)
_RESPONSE_DROP = frozenset(
    (b"connection", b"keep-alive", b"transfer-encoding", b"trailer", b"upgrade")
)
#: A request body up to this size (declared by ``Content-Length``) is read before it is sent,
#: so the upstream gets a ``Content-Length``; a larger or chunked one is streamed.
_BUFFER_LIMIT = 1024 * 1024


#: Paths passed through for every tenant, whatever ``tenant_passthrough`` says (with ``GET`` or
#: ``HEAD``): they hold no tenant's data, and clients need them (llama-stack-client lists models).
_SHARED_PATHS = frozenset(("/v1/models", "/v1/openai/v1/models", "/v1/health", "/v1/version"))
_SHARED_PREFIXES = ("/v1/models/", "/v1/openai/v1/models/")


#: POSTs that hold no tenant's data: Anthropic's token count (a prompt in, a number out).
_SHARED_POSTS = frozenset(("/v1/messages/count_tokens",))


def shared_route(method: str, path: str) -> bool:
    """Whether ``method`` on ``path`` (as the gateway routes it) reads only what every tenant
    may see: the upstream's model list, one model, its health and version; or counts a
    prompt's tokens."""
    if method == "POST":
        return path in _SHARED_POSTS
    return method in ("GET", "HEAD") and (
        path in _SHARED_PATHS or path.startswith(_SHARED_PREFIXES)
    )


class UpstreamBroke(Exception):
    """The upstream response broke after its headers went to the client; raised to the server
    so it closes the client's connection instead of ending the body as if it were whole."""


class ClientGone(Exception):
    """The client left before its request body was whole."""


async def pass_through(
    pool: ConnectionPool,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    keep_authorization: bool = False,
    body: bytes | None = None,
    head: bytes = b"",
) -> int:
    """Forward the request in ``scope`` through ``pool`` (the upstream's connections; a
    connection that cannot be made is not asked again, as a streamed body cannot be sent
    twice) and relay the response; return the status sent to the client (0 if the client left
    first, -1 if the upstream never answered: the client got a 502).
    ``keep_authorization``: the caller's ``Authorization`` goes upstream too (for an upstream
    that authenticates its own users; see ``GatewayConfig.forward_authorization``). ``body``:
    the whole body, read already; else ``head``: the start of the body, read already (the rest
    still to come from ``receive``, streamed)."""
    url, headers = _forwarded(scope, keep_authorization)
    body_done = asyncio.Event()
    content: bytes | AsyncIterator[bytes]
    declared = _content_length(scope)
    if body is not None:
        content = body
        body_done.set()
    elif head:
        content = _stream_body(receive, body_done, head)
    elif declared is not None and declared <= _BUFFER_LIMIT:
        try:
            content = await _read_all(receive)
        except ClientGone:
            return 0
        body_done.set()
    else:
        content = _stream_body(receive, body_done)
    request = _Request(scope["method"], url, headers, content)
    relay = asyncio.get_running_loop().create_task(_relay(pool, request, send))
    try:
        await _wait_for(relay, body_done)
        if not relay.done():
            watcher = asyncio.get_running_loop().create_task(_disconnected(receive))
            try:
                await asyncio.wait((relay, watcher), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not relay.done():  # the client left first: close the upstream request
                    relay.cancel()
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        return await relay
    except asyncio.CancelledError:
        relay.cancel()
        raise
    finally:
        if not relay.done():
            relay.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await relay


def _forwarded(scope: Scope, keep_authorization: bool) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The upstream URL (path and query as the client sent them) and the request's headers
    less the hop-by-hop ones (``Authorization`` too, unless ``keep_authorization``)."""
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    url = path + b"?" + query if query else path
    headers = [
        (k, v)
        for k, v in scope["headers"]
        if k.lower() not in _HOP_BY_HOP or (keep_authorization and k.lower() == b"authorization")
    ]
    return url, headers


async def _wait_for(relay: asyncio.Task[int], body_done: asyncio.Event) -> None:
    """Until the request body was sent or the relay ended (it reads the body itself)."""
    if body_done.is_set():
        return
    done_waiter = asyncio.get_running_loop().create_task(body_done.wait())
    try:
        await asyncio.wait((relay, done_waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        done_waiter.cancel()


@dataclass(frozen=True, slots=True)
class _Request:
    """What goes upstream: the method, the target (path and query, as the client sent them),
    the headers passed on, and the body (whole, or streamed as it comes)."""

    method: str
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes | AsyncIterator[bytes]


async def _relay(pool: ConnectionPool, request: _Request, send: Send) -> int:
    response = None
    try:
        response = await pool.open(request.method, request.target, request.body, request.headers)
        await response.head()
    except ClientGone:
        return 0
    except UpstreamError as exc:
        why = connect_failure(exc) if isinstance(exc, ConnectFailed) else None
        msg = f"upstream unreachable: {why or type(exc).__name__}"
        if response is not None:
            response.release()
        await respond(send, 502, error_body(msg, "upstream_error", 502))
        return -1
    try:
        headers = [(k, v) for k, v in response.headers if k not in _RESPONSE_DROP]
        start: Message = {
            "type": "http.response.start",
            "status": response.status,
            "headers": headers,
        }
        await send(start)
        try:
            async for chunk in response.body_chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:
            path = request.target.partition(b"?")[0].decode("latin-1")
            log.info("pass-through %s broke mid-body: %s", path, type(exc).__name__)
            raise UpstreamBroke(f"upstream response broke: {type(exc).__name__}") from exc
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return response.status
    finally:
        response.release()


async def read_small_body(scope: Scope, receive: Receive) -> bytes | None:
    """The request's body where :func:`pass_through` would read it whole before sending it
    (its ``Content-Length`` at most 1 MiB), else ``None`` (it is streamed). Raises
    :class:`ClientGone` where the client leaves first."""
    declared = _content_length(scope)
    if declared is None or declared > _BUFFER_LIMIT:
        return None
    return await _read_all(receive)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
        if key == b"transfer-encoding":
            return None
    return 0


async def _read_all(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _stream_body(
    receive: Receive, done: asyncio.Event, head: bytes = b""
) -> AsyncIterator[bytes]:
    if head:
        yield head
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            done.set()
            return


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
