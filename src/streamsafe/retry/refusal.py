"""Whether an error a server sent in-band refuses the request before any work.

vLLM's load shedding (``--max-num-queued-reqs``) answers a stream either 503, or 200 with a
first event ``{"error": {"message": ..., "type": "Service Unavailable", "param": null, "code":
503}}``. Sent before any token, such an error says what the status would: nothing started, come
back later. The client and the gateway ask this one function, so both read it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["REFUSAL_STATUSES", "refusal_status"]

#: Statuses that say "I did not take the work": rate limited, unavailable (overload, shedding).
REFUSAL_STATUSES = frozenset({429, 503})

# Words of an error's ``type`` or ``code`` that say the same where its status does not.
_RATE_LIMITED = ("rate_limit", "rate limit", "ratelimit", "too many requests", "too_many_requests")
_OVERLOADED = ("overloaded", "service unavailable", "service_unavailable", "server_busy")


def refusal_status(error: object) -> int | None:
    """The status an error object (an error event's ``error`` member) refuses a request with:
    429 or 503 where its ``code`` is one (as an int or a numeric string), else 429 where its
    ``type`` or ``code`` says rate-limited (OpenAI's ``rate_limit_exceeded``) and 503 where they
    say overloaded (vLLM's ``Service Unavailable``, Anthropic's ``overloaded_error``); ``None``
    for any other error, which is a failure. Only an error that came before any token is a
    refusal: the caller checks that."""
    if not isinstance(error, Mapping):
        return None
    code = error.get("code")
    if isinstance(code, str) and code.strip().isdigit():
        code = int(code)
    if type(code) is int and code in REFUSAL_STATUSES:
        return code
    words = f"{error.get('type')} {error.get('code')}".lower()
    if any(word in words for word in _RATE_LIMITED):
        return 429
    if any(word in words for word in _OVERLOADED):
        return 503
    return None
