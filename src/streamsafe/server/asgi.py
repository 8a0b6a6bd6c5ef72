"""Plain ASGI underneath both apps (the gateway and the engine simulator), and the extensions
this package's server (:mod:`streamsafe.server.protocol`) offers them.

The types of the three ASGI callables, one way to answer a request, one way to read a request
body within a limit, and the lifespan loop. No framework: each server is an ASGI callable that
routes by path itself, so reading one file teaches that server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = [
    "BODY_WRITER_EXTENSION",
    "DISCONNECT_EXTENSION",
    "INTERIM_EXTENSION",
    "RESET_EXTENSION",
    "BodyTooLarge",
    "BodyWriter",
    "Disconnected",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "body_writer",
    "header",
    "interim_writer",
    "read_body",
    "reset_connection",
    "respond",
    "serve_lifespan",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = b"application/json"

#: ``scope["extensions"]`` key of a no-argument callable that resets the request's connection
#: (TCP RST, no answer): offered by this package's server, used to inject a reset
#: and to end a stream that must not read as complete.
RESET_EXTENSION = "streamsafe.reset"


#: ``scope["extensions"]`` key of a callable ``write(body: bytes) -> bool`` that writes one piece
#: of a started streaming response straight to the connection, without a coroutine: offered by
#: this package's server, so a subscriber that keeps up is written to from the
#: upstream's read callback. It answers ``False`` and writes nothing where :data:`Send` must be
#: used instead: the response has not started or has ended, the client left, or the connection's
#: write buffer is full (``send`` waits for it to drain).
BODY_WRITER_EXTENSION = "streamsafe.body_writer"

#: See :data:`BODY_WRITER_EXTENSION`.
BodyWriter = Callable[[bytes], bool]

#: ``scope["extensions"]`` key of a callable ``on_disconnect(callback)`` that has the server call
#: ``callback()`` once, from the event loop, when the client leaves before the response is
#: complete (at once where it already left; ``None`` withdraws it): offered by
#: this package's server, so an app learns of a disconnect without a task waiting
#: on ``receive`` for ``http.disconnect``.
DISCONNECT_EXTENSION = "streamsafe.on_disconnect"

#: See :data:`DISCONNECT_EXTENSION`.
OnDisconnect = Callable[[Callable[[], None] | None], None]


#: ``scope["extensions"]`` key of a no-argument callable ``interim() -> bool`` that writes a
#: ``102 Processing`` interim response before the answer (``False``, nothing written, where the
#: answer started, the client left or speaks HTTP/1.0): offered by this package's server,
#: so a non-streaming call that waits long keeps its client's read timeout from firing
#: while its status stays open (an error is still an error status). httpx-based clients (every
#: Stainless SDK) read past interim responses, each read starting their read timeout afresh.
INTERIM_EXTENSION = "streamsafe.interim"

#: See :data:`INTERIM_EXTENSION`.
InterimWriter = Callable[[], bool]


def _callable_extension(scope: Scope, name: str) -> Any:
    """The callable the server offers as extension ``name`` for this request, else ``None``."""
    extensions = scope.get("extensions")
    found = extensions.get(name) if isinstance(extensions, dict) else None
    return found if callable(found) else None


def interim_writer(scope: Scope) -> InterimWriter | None:
    """The server's interim-response writer for this request, where it offers one."""
    return _callable_extension(scope, INTERIM_EXTENSION)  # type: ignore[no-any-return]


def body_writer(scope: Scope) -> BodyWriter | None:
    """The server's direct body writer for this request, where it offers one."""
    return _callable_extension(scope, BODY_WRITER_EXTENSION)  # type: ignore[no-any-return]


def on_disconnect(scope: Scope) -> OnDisconnect | None:
    """The server's disconnect notice for this request, where it offers one."""
    return _callable_extension(scope, DISCONNECT_EXTENSION)  # type: ignore[no-any-return]


def reset_connection(scope: Scope) -> Callable[[], None] | None:
    """The server's connection reset for this request, where it offers one."""
    return _callable_extension(scope, RESET_EXTENSION)  # type: ignore[no-any-return]


class BodyTooLarge(Exception):
    """The request body went past the limit given to :func:`read_body`."""


class Disconnected(Exception):
    """The client left before the request body was complete."""


async def respond(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_type: bytes | None = _JSON,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """A whole response in two messages: ``content-type`` (default JSON, ``None`` for none),
    ``content-length`` and ``headers``, then ``body``."""
    all_headers = [(b"content-length", b"%d" % len(body))]
    if content_type is not None:
        all_headers.insert(0, (b"content-type", content_type))
    all_headers.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes. Raises :class:`BodyTooLarge` past the limit
    (without reading the rest) and :class:`Disconnected` if the client left first."""
    parts: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        if chunk:
            total += len(chunk)
            if total > limit:
                raise BodyTooLarge
            parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or ``None``."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def serve_lifespan(
    receive: Receive,
    send: Send,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
) -> None:
    """Answer ASGI lifespan messages: ``startup`` at start (its exception is reported as
    ``lifespan.startup.failed``), ``shutdown`` at the end."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await startup()
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
