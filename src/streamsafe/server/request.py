"""The head of an HTTP/1.1 request as httptools hands it over (see
:mod:`streamsafe.server.protocol`): gathered and counted against the server's limits, then made
the app's ASGI scope, or refused where it cannot be served."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import unquote

import httptools

from streamsafe.server.limits import ServerLimits

__all__ = [
    "Refusal",
    "RequestHead",
    "framing_refusal",
    "request_scope",
    "target_refusal",
    "upgrade_with_body",
]

_ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}

Headers = list[tuple[bytes, bytes]]
Address = tuple[str, int] | None
#: A status and a message for the client.
Refusal = tuple[int, str]

# RFC 9110, 7.2: Host = uri-host [ ":" port ], uri-host = IP-literal / IPv4address / reg-name
# (RFC 3986, 3.2.2; an IPv4 address is a reg-name by its characters). A reg-name may be empty by
# the grammar, but an "http" URI with an empty host is invalid (RFC 9110, 4.2.1): an empty Host
# names no host this server could answer for.
_REG_NAME = rb"(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+"
_IP_LITERAL = rb"\[(?:(?P<ipv6>[0-9A-Fa-f:.]+)|v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+)\]"
_HOST = re.compile(rb"(?:%s|%s)(?::(?P<port>[0-9]{1,5}))?" % (_REG_NAME, _IP_LITERAL))
# An absolute-form target (RFC 9112, 3.2.2): scheme "://" authority, then the path and query.
_ABSOLUTE = re.compile(
    rb"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<authority>[^/?#]*)(?P<rest>.*)", re.S
)
_TARGET_FORMS = (
    "the request target must be a path (/v1/models), an http or https URL, or * for OPTIONS"
)


def _valid_host(value: bytes) -> bool:
    """Whether ``value`` is a valid ``host[:port]`` (RFC 9110, 7.2): a reg-name, an IPv4
    address, or an IP literal in brackets, not empty; a port of 0 to 65535 (the grammar allows
    an empty one or any number of digits, which no client sends and no socket has)."""
    match = _HOST.fullmatch(value)
    if match is None or int(match["port"] or 0) > 65535:
        return False
    ipv6 = match["ipv6"]
    if ipv6 is not None:
        try:
            ipaddress.IPv6Address(ipv6.decode("ascii"))
        except ValueError:
            return False
    return True


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
            if not _valid_host(value):
                return 400, "the Host header must be a host name or an IP address, and a port"
        elif name == b"transfer-encoding":
            codings += (coding.strip().lower() for coding in value.split(b","))
    if hosts > 1 or (hosts == 0 and parser.get_http_version() != "1.0"):
        return 400, "a request must carry exactly one Host header"
    if codings and codings != [b"chunked"]:
        return 501, "the only transfer coding accepted is chunked"
    return None


def target_refusal(parser: httptools.HttpRequestParser, head: RequestHead) -> Refusal | None:
    """What to answer a request whose target has no form RFC 9112 (3.2) gives a server, and
    ``None`` for one served, after it is made origin-form: a path (and query).

    An absolute-form target (``GET http://host/path``), which a server MUST accept (3.2.2), is
    served as its path, and its authority replaces the Host header (the server MUST ignore the
    one received), so the app sees one authority, never two that disagree; with a scheme other
    than http or https, user information (RFC 9110, 4.2.4) or no valid host it is refused with
    400, and so is a target with a fragment, or ``*`` for any method but OPTIONS."""
    url = head.url
    if url[:1] == b"/":  # origin-form, nearly every request
        if b"#" in url:
            return 400, "the request target must not carry a fragment (#)"
        return None
    if url == b"*":
        return None if parser.get_method() == b"OPTIONS" else (400, _TARGET_FORMS)
    match = _ABSOLUTE.fullmatch(url)
    if match is None or match["scheme"].lower() not in (b"http", b"https"):
        return 400, _TARGET_FORMS
    authority, rest = match["authority"], match["rest"]
    if b"@" in authority:
        return 400, "the request target must not carry user information (user@host)"
    if not _valid_host(authority):
        return 400, "the request target's host must be a host name or an IP address, and a port"
    if b"#" in rest:
        return 400, "the request target must not carry a fragment (#)"
    head.url = rest if rest[:1] == b"/" else b"/" + rest
    headers = head.headers
    for i, (name, _) in enumerate(headers):
        if name == b"host":
            headers[i] = (b"host", authority)
            break
    else:  # HTTP/1.0 may omit it
        headers.append((b"host", authority))
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
    scheme: str = "http",
    root_path: str,
    state: dict[str, Any],
) -> dict[str, Any]:
    """The ASGI HTTP scope of the request whose head ``parser`` parsed (``url`` in origin-form,
    or ``*``: see :func:`target_refusal`; ``headers`` with lower-case names; ``scheme``
    ``https`` on a TLS connection)."""
    parsed = httptools.parse_url(url)
    raw_path: bytes = parsed.path or b"/"
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path)
    return {
        "type": "http",
        "asgi": _ASGI_VERSION,
        "http_version": parser.get_http_version(),
        "server": server,
        "client": client,
        "scheme": scheme,
        "method": parser.get_method().decode("ascii"),
        "root_path": root_path,
        "path": root_path + path if root_path else path,
        "raw_path": root_path.encode("ascii") + raw_path if root_path else raw_path,
        "query_string": parsed.query or b"",
        "headers": headers,
        "state": state,
    }
