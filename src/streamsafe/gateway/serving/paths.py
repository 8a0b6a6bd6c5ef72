"""One spelling per path: what the gateway routes on and what it forwards upstream.

A path reaches two readers: the gateway, which decides whether a request is a completion it
serves (admission, coalescing) or one it passes through, and the upstream, which routes what it
is forwarded. Where the two read a spelling differently, a request gets around the gateway:
``/v1/x/../chat/completions`` is no route here, but httpx (which builds the forwarded URL) and
most servers resolve it to the completion route, where it ran without admission or coalescing;
``/../../metrics`` under ``--upstream http://h/tenant-x/api`` left the prefix for the upstream's
root. So before routing (:func:`canonical_path`):

- a path with a dot segment (``.`` or ``..``, literally or percent-encoded, also as ``..;x``),
  a backslash (some servers read it as a slash) or a control character is refused (400). No
  client sends one: HTTP clients resolve dot segments before they send;
- runs of slashes are one slash (nginx's ``merge_slashes``), in what is routed and forwarded;
- the gateway routes on the percent-decoded path (``%2F`` a slash, as a server that decodes it
  routes it) without a trailing slash, and forwards the path with its own escapes kept, so an
  encoded slash inside a segment (openai-python's model ids ``vllm%2Fname``) still reaches the
  upstream as sent.

Whatever an upstream does of the forwarded path (decoding ``%2F`` or not, merging slashes or
not), it cannot resolve it outside the prefix or onto a route the gateway did not route there.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from streamsafe.gateway.errors import BadRequest
from streamsafe.server.asgi import Scope

__all__ = ["canonical_path"]

_SLASHES = re.compile(rb"/{2,}")
#: Bytes no path here may hold once decoded: controls (a CR-LF would split the forwarded request
#: line; a NUL ends a C string) and the backslash.
_FORBIDDEN = re.compile(rb"[\x00-\x1f\x7f\\]")
_REFUSED = (
    "the request path may not hold dot segments ('.', '..'), backslashes or control "
    "characters, literal or percent-encoded"
)


def canonical_path(scope: Scope) -> tuple[str, bytes]:
    """``(path to route on, raw path to forward)`` for the request in ``scope``; raises
    :class:`BadRequest` (400) for a spelling that two readers could resolve differently."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    if not raw.startswith(b"/"):
        raise BadRequest(400, "the request path must begin with '/'")
    raw = _SLASHES.sub(b"/", raw)
    decoded = unquote_to_bytes(raw) if b"%" in raw else raw
    if _FORBIDDEN.search(decoded) or any(
        segment.partition(b";")[0] in (b".", b"..") for segment in decoded.split(b"/")
    ):
        raise BadRequest(400, _REFUSED)
    if b"//" in decoded:  # slashes that were encoded
        decoded = _SLASHES.sub(b"/", decoded)
    if len(decoded) > 1 and decoded.endswith(b"/"):
        decoded = decoded[:-1]
    return decoded.decode("utf-8", "replace"), raw
