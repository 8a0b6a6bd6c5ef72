"""The head of an HTTP/1.1 request as httptools hands it over (see
:mod:`streamsafe._http_protocol`): gathered and counted against the server's limits, then made
the app's ASGI scope, or refused where it cannot be served."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import httptools

from streamsafe._http_limits import ServerLimits

__all__ = ["Refusal", "RequestHead", "framing_refusal", "request_scope", "upgrade_with_body"]

_ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}

Headers = list[tuple[bytes, bytes]]
Address = tuple[str, int] | None
#: A status and a message for the client.
Refusal = tuple[int, str]


class RequestHead:
    """One request's URL and headers as they are parsed, and their size so far: each piece
    added answers the refusal it brings past the limits, if any (then it is not kept)."""

    __slots__ = ("bytes", "expect_100", "headers", "lines", "trailer_bytes", "trailers", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: Headers = []
        self.expect_100 = False
        self.bytes = 0  # of the lines parsed so far
        self.lines = 0
        self.trailer_bytes = 0  # of the trailer fields parsed so far (never kept)
        self.trailers = 0

    def add_url(self, url: bytes, limits: ServerLimits) -> Refusal | None:
        self.url += url
        self.bytes += len(url)
        if len(self.url) > limits.max_header_line_bytes:
            return (
                414,
                f"the request line is over the limit of {limits.max_header_line_bytes} bytes",
            )
        return None

    def add_header(self, name: bytes, value: bytes, limits: ServerLimits) -> Refusal | None:
        line = len(name) + len(value) + 4
        self.bytes += line
        self.lines += 1
        if line > limits.max_header_line_bytes:
            return 431, f"a header line is over the limit of {limits.max_header_line_bytes} bytes"
        if self.bytes > limits.max_header_bytes:
            return 431, f"request headers are over the limit of {limits.max_header_bytes} bytes"
        if self.lines > limits.max_headers:
            return 431, f"more than {limits.max_headers} header lines"
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing whitespace; RFC 9110 does not
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100 = True
        self.headers.append((name, value))
        return None

    def add_trailer(self, name: bytes, value: bytes, limits: ServerLimits) -> Refusal | None:
        """A trailer field of a chunked body, counted like a header section of its own (however
        many arrive in one read) and never kept: the app never sees trailers."""
        self.trailer_bytes += len(name) + len(value) + 4
        self.trailers += 1
        if self.trailer_bytes > limits.max_header_bytes or self.trailers > limits.max_headers:
            return 431, f"request trailers are over the limit of {limits.max_header_bytes} bytes"
        return None


def framing_refusal(parser: httptools.HttpRequestParser, headers: Headers) -> Refusal | None:
    """What RFC 9112 says to answer a request whose head is framed wrongly: 400 to one without a
    ``Host`` (HTTP/1.0 may omit it) or with more than one (3.2), 501 to a transfer coding other
    than ``chunked`` alone (6.1; llhttp would decode the chunks and ignore a ``gzip`` before
    them, so the app would take compressed bytes for the body)."""
    hosts = 0
    codings: list[bytes] = []
    for name, value in headers:
        if name == b"host":
            hosts += 1
        elif name == b"transfer-encoding":
            codings += (coding.strip().lower() for coding in value.split(b","))
    if hosts > 1 or (hosts == 0 and parser.get_http_version() != "1.0"):
        return 400, "a request must carry exactly one Host header"
    if codings and codings != [b"chunked"]:
        return 501, "the only transfer coding accepted is chunked"
    return None


def upgrade_with_body(parser: httptools.HttpRequestParser, headers: Headers) -> bool:
    """Whether the request asks to switch protocols (``Upgrade``) and has a body. No switch is
    offered, so it would be served as plain HTTP, but llhttp takes such a body for the new
    protocol's bytes: serving it would mean parsing what the body holds as the next request."""
    return bool(parser.should_upgrade()) and any(
        name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0"))
        for name, value in headers
    )


def request_scope(
    parser: httptools.HttpRequestParser,
    url: bytes,
    headers: Headers,
    *,
    server: Address,
    client: Address,
    root_path: str,
    state: dict[str, Any],
) -> dict[str, Any]:
    """The ASGI HTTP scope of the request whose head ``parser`` parsed (``url`` as it came, in
    origin or absolute form; ``headers`` with lower-case names)."""
    parsed = httptools.parse_url(url)
    raw_path: bytes = parsed.path or b"/"  # absolute-form with no path
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path)
    return {
        "type": "http",
        "asgi": _ASGI_VERSION,
        "http_version": parser.get_http_version(),
        "server": server,
        "client": client,
        "scheme": "http",
        "method": parser.get_method().decode("ascii"),
        "root_path": root_path,
        "path": root_path + path if root_path else path,
        "raw_path": root_path.encode("ascii") + raw_path if root_path else raw_path,
        "query_string": parsed.query or b"",
        "headers": headers,
        "state": state,
    }
