"""Errors reported inside a stream, after the response started (:class:`ErrorEvent`,
:func:`parse_error_event`): vLLM's ``{"error": {...}}`` (its ``code`` the status), Anthropic's
typed errors, Llama Stack's masked ``"500: ..."`` messages (the status their prefix, where the
kind :attr:`~streamsafe.gateway.upstream.kinds.UpstreamKind.masks_errors`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from streamsafe.gateway.upstream.kinds import UpstreamKind
from streamsafe.gateway.upstream.wire import ANTHROPIC_ERROR_PREFIXES

__all__ = ["ErrorEvent", "parse_error_event"]

_STATUS_PREFIX = re.compile(r"^\s*(\d{3})\s*:\s*")
_ERROR_PREFIXES = (b'{"error"', b'{ "error"', *ANTHROPIC_ERROR_PREFIXES)
#: Anthropic's error types and the statuses they stand for (its documented pairs); any other
#: type (vLLM's ``internal_error`` under a stream included) reads as 500.
_ANTHROPIC_STATUSES = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "internal_error": 500,
    "overloaded_error": 529,
}


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """An error reported inside a stream.

    ``status``: the HTTP status it stands for (Llama Stack's prefix, vLLM's ``code``; 500 where
    none is given). ``upstream_failure``: the upstream or the engine failed (status >= 500), as
    opposed to a problem with the request. ``message``: the upstream's text.
    """

    status: int
    message: str

    @property
    def upstream_failure(self) -> bool:
        """True for failures of the upstream or the engine behind it (5xx)."""
        return self.status >= 500


def parse_error_event(kind: UpstreamKind, payload: bytes) -> ErrorEvent | None:
    """The error an SSE ``data`` payload reports, or ``None`` if it is not an error event.

    Llama Stack masks every failure as ``{"error": {"message": "500: Internal server error:
    ..."}}``; the status is the message's prefix. vLLM sends ``{"error": {"message", "type",
    "code"}}`` (``code`` the status) or a flat ``{"message", "code", ...}`` object.
    """
    if not payload.startswith(_ERROR_PREFIXES):
        return None
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return ErrorEvent(500, payload[:1000].decode("utf-8", "replace"))
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):
        return ErrorEvent(500, error)
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or error.get("detail") or "")
    status = 500
    if body.get("type") == "error":  # Anthropic's shape: the error's type says the status
        status = _ANTHROPIC_STATUSES.get(str(error.get("type")), 500)
    code = error.get("code")
    if isinstance(code, int) and 400 <= code <= 599:
        status = code
    elif isinstance(code, str) and code.isdigit() and 400 <= int(code) <= 599:
        status = int(code)
    if kind.masks_errors:
        match = _STATUS_PREFIX.match(message)
        if match is not None and 400 <= int(match.group(1)) <= 599:
            status = int(match.group(1))
    return ErrorEvent(status, message)
