"""What one HTTP connection may cost a server here, and the JSON answers past it.

:class:`ServerLimits` is enforced by :mod:`streamsafe.server.protocol` before the app sees a
request; :func:`error_response` is the whole HTTP response (JSON body, ``connection: close``) the
server sends itself when it refuses one: a limit passed, an unparsable request, an app that
failed before answering.
"""

from __future__ import annotations

import dataclasses

import orjson

__all__ = ["FIRST_BYTE_S", "LINGER_BYTES", "LINGER_S", "ServerLimits", "error_response"]


@dataclasses.dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one HTTP connection may cost the server before the app is involved.

    Defaults suit an API server behind which requests are small JSON bodies and responses long
    streams: generous for any real client (browsers send under 16 KiB of headers), tight enough
    that a thousand hostile connections hold well under 100 MiB.
    """

    #: Largest header line (name, value and separator) or request line, in bytes (default
    #: 16 KiB, room for a large bearer token). Past it: 431 (414 for the request line).
    max_header_line_bytes: int = 16 * 1024
    #: Largest header section (request line and every header line), in bytes (default 64 KiB).
    #: Past it: 431.
    max_header_bytes: int = 64 * 1024
    #: Most header lines in one request (default 128). Past it: 431.
    max_headers: int = 128
    #: Seconds a request's header section may take to arrive in full, counted from the
    #: connection's or the request's first byte (default 10; nginx allows 60, but a client that
    #: needs more than a few seconds for a few KiB is broken or hostile). Past it: 408.
    header_timeout: float = 10.0
    #: Seconds between two reads of an unfinished request body (default 10; Apache's
    #: ``RequestReadTimeout`` allows 20, nginx's ``client_body_timeout`` 60). Not counted while
    #: the app holds the body back. Past it: 408. It is also how long a body may trickle before
    #: ``min_body_rate`` binds, so it is how long bodies trickled from many addresses can hold
    #: a capped gateway: 30 of them on a 30-connection cap are cut after it, and a client
    #: elsewhere is served (30 s kept everyone else out past a 20 s client's patience).
    body_timeout: float = 10.0
    #: Bytes per second a request body must keep up once its first ``body_timeout`` seconds
    #: are past (default 1024; 0: none): the body's deadline is ``body_timeout`` after its
    #: head, moved on one second for every ``min_body_rate`` bytes that arrive (Apache's
    #: ``RequestReadTimeout body=...,MinRate=``). A client that keeps sending a byte now and
    #: then within ``body_timeout`` would otherwise hold its connection for as long as it
    #: likes; a 4 MiB body at 1 KiB/s still gets over an hour. Not counted while the app holds
    #: the body back. Past it: 408.
    min_body_rate: float = 1024.0
    #: Seconds a response may wait for the client to take what was written before (its socket
    #: backed up: the client stopped reading) before the connection is aborted (default 30;
    #: nginx's ``send_timeout`` is 60). A client reading a stream never waits that long: the
    #: gateway's heartbeats keep bytes moving; one suspended past it resumes with
    #: ``Last-Event-ID``.
    send_timeout: float = 30.0
    #: Seconds a kept-alive connection may sit idle between requests before it is closed
    #: (default 5, uvicorn's). Behind a load balancer that reuses connections, set it above the
    #: balancer's own idle timeout, so that the balancer closes first and never sends a request
    #: on a connection the server is closing.
    keep_alive_timeout: float = 5.0
    #: Open connections at once (default 4096). The one past it gets 503 and is closed. ``None``
    #: for no cap.
    max_connections: int | None = 4096
    #: Share of ``max_connections`` one client address (an IPv6 client's /64) may hold with a
    #: request still arriving (default 0.25; 1: no bound under the cap): a connection counts
    #: from its request's first byte (or from ``FIRST_BYTE_S`` after its accept where it sent
    #: none) until that request's last byte (headers and body). Past it the connection is
    #: answered 503 with ``Retry-After``, so that a few addresses trickling requests cannot take
    #: every connection; a well-behaved client elsewhere still gets in. Behind a proxy that
    #: connects from one address for every client, set it to 1 (or let the proxy bound its
    #: clients).
    unfinished_share: float = 0.25

    def __post_init__(self) -> None:
        for name in ("max_header_line_bytes", "max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        timeouts = (self.header_timeout, self.body_timeout, self.send_timeout)
        if min(*timeouts, self.keep_alive_timeout) <= 0:
            raise ValueError(
                "header_timeout, body_timeout, send_timeout and keep_alive_timeout must be > 0"
            )
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be >= 1 or None")
        if self.min_body_rate < 0:
            raise ValueError("min_body_rate must be >= 0")
        if not 0 < self.unfinished_share <= 1:
            raise ValueError("unfinished_share must be > 0 and <= 1")

    @property
    def max_unfinished_per_client(self) -> int | None:
        """Connections one client address may hold with a request still arriving
        (``unfinished_share`` of ``max_connections``, at least 1); ``None``: no bound."""
        cap = self.max_connections
        if cap is None or self.unfinished_share >= 1:
            return None
        return max(1, int(cap * self.unfinished_share))


_REASONS = {
    400: b"Bad Request",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
_TYPES = {500: "internal_error", 503: "service_unavailable"}
#: Seconds a connection answered before its request body was read is still read from (the
#: bytes dropped) before it is closed, so that the client's kernel does not turn the close into a
#: reset that destroys the answer. nginx's ``lingering_time`` is 30 s; a client that has not
#: read an answer within 2 s is not waiting for it.
LINGER_S = 2.0
#: Seconds a new connection may send nothing before it counts among its client address's requests
#: still arriving (``ServerLimits.unfinished_share``). A client sends its request as soon as it has
#: connected, so it is counted from that request's first byte: a burst of connections from one
#: client, each sending a whole request at once, never counts as many requests owed. One silent
#: for a second holds a place for nothing yet, and counts.
FIRST_BYTE_S = 1.0
#: Bytes dropped while lingering before the close comes at once (a client sending a 16 MiB body
#: whole before it reads an answer is not one to wait for).
LINGER_BYTES = 16 * 1024 * 1024


def error_response(status: int, message: str, retry_after: int | None = None) -> bytes:
    """The whole response refusing a request: ``status``, an OpenAI-style JSON error naming
    ``message``, ``connection: close``, and ``Retry-After`` where given."""
    body = orjson.dumps(
        {
            "error": {
                "message": message,
                "type": _TYPES.get(status, "invalid_request_error"),
                "param": None,
                "code": status,
            }
        }
    )
    head = [
        b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
    ]
    if retry_after is not None:
        head.append(b"retry-after: %d\r\n" % retry_after)
    return b"".join(head) + b"\r\n" + body
