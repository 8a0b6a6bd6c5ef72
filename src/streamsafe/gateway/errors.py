"""What the gateway answers when something goes wrong: OpenAI error bodies, a generation's
:class:`Failure`, and the exceptions that become a 4xx.

Every refusal is ``{"error": {"message", "type", "param", "code"}}`` with a real status; a bug
is a JSON 500 naming a request id, never a 500 with a text body.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import orjson

from streamsafe.server.asgi import Send, respond

__all__ = [
    "ERROR_PREFIXES",
    "BadRequest",
    "Draining",
    "Failure",
    "FleetUnsafe",
    "KeyReused",
    "LiveDuplicate",
    "NotResumable",
    "ResumePastEnd",
    "error_body",
    "send_bad_request",
    "send_failure",
    "send_internal_error",
    "shutting_down",
    "upstream_refusal",
]

#: How an error payload (an upstream error event, an error body) starts.
ERROR_PREFIXES = (b'{"error"', b'{ "error"')

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    410: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_body(message: str, type_: str, code: int, param: str | None = None) -> bytes:
    """An OpenAI-style error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def upstream_refusal(status: int, body: bytes) -> tuple[int, bytes]:
    """The status and body a caller gets for an upstream's answer other than 200: as they came
    where the body is JSON (vLLM's and OpenAI's error objects, Llama Stack's ``detail``), an
    error object holding the text where it is not (an HTML error page from a proxy), and 502 for
    an answer that is not an error status at all (a 204, a redirect)."""
    if not 400 <= status <= 599:
        text = body[:500].decode("utf-8", "replace").strip()
        message = f"upstream answered {status} instead of a completion" + (
            f": {text}" if text else ""
        )
        return 502, error_body(message, "upstream_error", 502)
    try:
        if isinstance(orjson.loads(body), dict):
            return status, body
    except orjson.JSONDecodeError:
        pass
    text = body[:1000].decode("utf-8", "replace").strip() or f"upstream answered {status}"
    return status, error_body(text, _ERROR_TYPES.get(status, "upstream_error"), status)


@dataclass(slots=True)
class Failure:
    """Why a generation failed before its first event: the status and body a client that has not
    been answered yet receives, and ``Retry-After`` where one applies."""

    status: int
    body: bytes
    retry_after: int | None = None
    #: The gateway already asked again on its caller's behalf (a refused call that waited its
    #: full round at the engine's gate): ``x-should-retry: false`` tells a client library
    #: (streamsafe's, Stainless's, the openai SDK) not to start another round of the same;
    #: ``Retry-After`` still says when the engine is asked again.
    final: bool = False

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The headers answered with it: ``Retry-After`` where one applies, and
        ``x-should-retry: false`` where it is :attr:`final`."""
        headers = []
        if self.retry_after is not None:
            headers.append((b"retry-after", b"%d" % self.retry_after))
        if self.final:
            headers.append((b"x-should-retry", b"false"))
        return headers

    def as_event(self) -> bytes:
        """The failure as a mid-stream error payload (for subscribers already committed)."""
        try:
            parsed = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            return orjson.dumps({"error": parsed["error"]})
        if isinstance(parsed, dict) and "message" in parsed:  # vLLM's flat ErrorResponse
            return orjson.dumps({"error": parsed})
        text = self.body[:1000].decode("utf-8", "replace") or f"upstream answered {self.status}"
        return error_body(text, "upstream_error", self.status)


class BadRequest(Exception):
    """A request the gateway refuses itself: ``status`` with an OpenAI error body (and
    ``headers``, such as ``Allow`` on a 405)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or []


def shutting_down() -> BadRequest:
    """The 503 a new completion or pass-through request gets while the gateway drains, with
    ``Retry-After: 1``: another replica takes it."""
    msg = "the gateway is shutting down; retry (another replica takes it)"
    return BadRequest(503, msg, headers=[(b"retry-after", b"1")])


class KeyReused(Exception):
    """The Idempotency-Key is in use with a different request body (422)."""


class Draining(Exception):
    """The gateway is draining (shutting down): it starts no new generation (503)."""


class FleetUnsafe(Exception):
    """The replicas cannot tell now whether this request would run a generation a second time
    (Redis lost their state, or this replica cannot read another's record): 503 with
    ``retry_after``, never a silent second generation."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class LiveDuplicate(Exception):
    """A duplicate of a live keyed generation where the gateway is set to answer 409."""


class NotResumable(Exception):
    """``Last-Event-ID`` names a generation the gateway no longer holds (410)."""


class ResumePastEnd(Exception):
    """``Last-Event-ID`` names an event past the end of a finished generation (400): the client
    cannot have seen it."""

    def __init__(self, last_event_id: int, length: int) -> None:
        super().__init__(last_event_id, length)
        self.last_event_id = last_event_id
        self.length = length

    @property
    def message(self) -> str:
        """What the client is told."""
        return (
            f"Last-Event-ID {self.last_event_id} is past the end of the stream "
            f"(its last event is {self.length - 1})"
        )

    def failure(self) -> Failure:
        """The 400 it is, or the error event it becomes once the stream committed."""
        body = error_body(self.message, "invalid_request_error", 400, "Last-Event-ID")
        return Failure(400, body)


async def send_bad_request(send: Send, exc: BadRequest) -> None:
    """Answer ``exc`` (401 also asks for a bearer token)."""
    type_ = _ERROR_TYPES.get(exc.status, "invalid_request_error")
    headers = list(exc.headers)
    if exc.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    body = error_body(exc.message, type_, exc.status, exc.param)
    await respond(send, exc.status, body, headers=headers)


async def send_internal_error(send: Send, request_id: str) -> None:
    """Answer a bug with a JSON 500 naming ``request_id`` (the log has the rest). Where the
    answer was already under way the server refuses a second start and closes the connection,
    which tells the client that it broke."""
    msg = f"internal error in the gateway (request id {request_id})"
    body = error_body(msg, "internal_error", 500)
    with contextlib.suppress(Exception):
        await respond(send, 500, body, headers=[(b"x-request-id", request_id.encode())])


async def send_failure(send: Send, failure: Failure) -> None:
    """Answer a generation that failed before anything was sent, with its real status."""
    await respond(send, failure.status, failure.body, headers=failure.headers())
