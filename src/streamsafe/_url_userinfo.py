"""A configured URL as used and as named: the credentials it may carry
(``http://user:password@host``) are taken out once, here, and never shown.

:func:`split_userinfo` is the one place a configured URL (an engine's, Redis's) is parted from
its userinfo: the rest is the name every log line, ``/stats``, ``/metrics`` and error message
uses (:func:`redact` where only the name is wanted), and the userinfo goes on the connection
only, as HTTP Basic authorization (:func:`basic_authorization`), as httpx itself would send it.
Plain string work, no URL parser: a malformed URL is still redacted, never raises.
"""

from __future__ import annotations

import base64
from urllib.parse import unquote

__all__ = ["basic_authorization", "redact", "split_userinfo"]


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its userinfo, and the userinfo (``user:password`` as written, still
    percent-encoded), or ``None`` where it has none: ``http://u:p@h:8000/v1`` gives
    ``("http://h:8000/v1", "u:p")``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    # The authority ends at the first "/", "?" or "#"; a password may hold none of them
    # unencoded (RFC 3986), so the last "@" before it ends the userinfo.
    end = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at >= 0:
            end = min(end, at)
    userinfo, sign, host = rest[:end].rpartition("@")
    if not sign:
        return url, None
    return f"{scheme}{sep}{host}{rest[end:]}", userinfo


def redact(url: str) -> str:
    """``url`` as the gateway names it anywhere it is seen (logs, ``/stats``, ``/metrics``,
    errors): without the credentials it may carry."""
    return split_userinfo(url)[0]


def basic_authorization(userinfo: str) -> str:
    """The ``Authorization`` value for ``userinfo`` (``user:password``, percent-encoded as in
    a URL): ``Basic`` with the decoded pair, as httpx sends a URL's userinfo."""
    user, _, password = userinfo.partition(":")
    pair = f"{unquote(user)}:{unquote(password)}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")
