"""Every error the client raises, in one hierarchy::

    StreamsafeError                      anything raised by streamsafe.client
    ├── APIError                         openai's base of API errors (.message, .request,
    │   │                                .body, .code, .param, .type)
    │   ├── APIConnectionError           no usable response: refused, reset before the headers
    │   │   └── APITimeoutError          a timeout; .phase says which (connect, first_byte, ...)
    │   ├── APIStatusError               the server answered an error status (.status_code,
    │   │   │                            .response, .request_id, .headers)
    │   │   ├── BadRequestError          400
    │   │   ├── AuthenticationError      401
    │   │   ├── PermissionDeniedError    403
    │   │   ├── NotFoundError            404
    │   │   ├── ConflictError            409
    │   │   ├── UnprocessableEntityError 422
    │   │   ├── RateLimitError           429 (.retry_after)
    │   │   └── InternalServerError      5xx
    │   │       └── ServiceUnavailableError  503 (.retry_after)
    │   ├── APIResponseError             the response is not what the API promises (bad JSON,
    │   │                                a stream answered without an event stream, an event
    │   │                                stream the SSE decoder cannot read)
    │   └── StreamError                  the server sent an error event inside a stream
    ├── StreamInterrupted                a committed stream broke and could not be resumed
    │                                    (or its client was closed); carries .chunks and
    │                                    .text received so far
    ├── StreamClosed                     a stream read after its caller closed it before its
    │                                    end (close(), a with block, a loop left early)
    ├── RetryBudgetExhausted             the client's RetryBudget stopped a retry (.last_error)
    └── SSEError                         bytes that are not an event stream, from
                                         streamsafe.sse's decoder used directly (also a
                                         ValueError); the client raises APIResponseError
                                         for them, with this as its __cause__

Anything else escaping a client call is a bug or a wrong argument (``TypeError`` for an unknown
option), not a condition of the server or the network.

Every error carries ``attempts`` (requests sent for the call), ``resumes`` and the call's
``idempotency_key``, so a log line says what was tried.

The names under :class:`APIError` are openai-python's, with its attributes, so code written
against ``openai`` catches them unchanged (``except RateLimitError as e: e.status_code``).
As there, ``body`` of a status error is the ``error`` object of an OpenAI-style JSON body (the
whole body where it has none) and ``code``, ``param``, ``type`` are read from it; unlike there,
``code`` keeps its JSON type (vLLM sends the status as an int; openai-python makes it a string),
``request`` may be ``None`` (an error raised before any request was built) and the root is
:class:`StreamsafeError`, not ``openai.OpenAIError``.
"""

from __future__ import annotations

from typing import Any

import httpx2

from streamsafe._errors import StreamsafeError
from streamsafe.sse import SSEError

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InternalServerError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RetryBudgetExhausted",
    "SSEError",
    "ServiceUnavailableError",
    "StreamClosed",
    "StreamError",
    "StreamInterrupted",
    "StreamsafeError",
    "UnprocessableEntityError",
    "status_error",
]


class APIError(StreamsafeError):
    """An error of the API, named and shaped as openai-python's ``APIError``: ``message``,
    ``request`` (the ``httpx2.Request`` of the failed attempt, ``None`` where none was built),
    ``body`` (the error object, or what the server sent; ``None`` where nothing came), and
    ``code``, ``param``, ``type`` read from ``body`` where it is an object."""

    def __init__(
        self,
        message: str,
        *,
        body: Any = None,
        request: httpx2.Request | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.request = request
        self.body = body
        fields = body if isinstance(body, dict) else {}
        self.code: Any = fields.get("code")
        self.param: Any = fields.get("param")
        self.type: Any = fields.get("type")


class APIConnectionError(APIError):
    """No usable response: the connection failed, or was lost before the response headers.
    ``refused`` is True where the port refused the connection (nothing can have started)."""

    refused: bool = False


class APITimeoutError(APIConnectionError):
    """A timeout. ``phase`` is one of ``pool``, ``connect``, ``write``, ``first_byte`` (waiting
    for the response headers), ``idle`` (between bytes of a body) or ``total``."""

    def __init__(self, message: str, *, phase: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.phase = phase


class APIStatusError(APIError):
    """The server answered ``status_code``. ``body`` is the ``error`` object of an OpenAI-style
    JSON body (else the parsed JSON, or text), as openai-python has it; ``headers`` the response
    headers (lower-case names), ``response`` the ``httpx2.Response`` itself (its body already
    read and closed; ``None`` for an error carried inside a 2xx answer's stream or body), and
    ``request_id`` its ``x-request-id`` header."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        body: Any = None,
        headers: dict[str, str] | None = None,
        response: httpx2.Response | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body = body["error"]
        if response is not None and "request" not in kwargs:
            kwargs["request"] = _request_of(response)
        super().__init__(message, body=body, **kwargs)
        self.status_code = status_code
        self.response = response
        self.headers = headers or {}
        self.request_id: str | None = self.headers.get("x-request-id")

    @property
    def retry_after(self) -> str | None:
        """The server's ``Retry-After`` header, if it sent one."""
        return self.headers.get("retry-after")


class BadRequestError(APIStatusError):
    """400: the request is malformed; fix it, retrying will not help."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing or wrong."""


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this."""


class NotFoundError(APIStatusError):
    """404: no such path or model."""


class ConflictError(APIStatusError):
    """409: conflicts with another request (e.g. same Idempotency-Key, different body)."""


class UnprocessableEntityError(APIStatusError):
    """422: well-formed but refused (e.g. an Idempotency-Key reused with another body)."""


class RateLimitError(APIStatusError):
    """429: too many requests; ``retry_after`` says when to come back."""


class InternalServerError(APIStatusError):
    """5xx: the server failed."""


class ServiceUnavailableError(InternalServerError):
    """503: the server is overloaded or its engine is down; ``retry_after`` says when to retry."""


class APIResponseError(APIError):
    """The response breaks the API's contract: a body or event that is not JSON, or a stream
    answered with something other than ``text/event-stream``. ``body`` is what the server sent
    instead (parsed JSON where it is JSON, else text; ``None`` where not kept)."""


class _Partial(StreamsafeError):
    def __init__(self, message: str, *, chunks: list[Any], text: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.chunks = chunks
        self.text = text


class StreamError(_Partial, APIError):
    """The server reported an error inside a committed stream (``data: {"error": ...}``, vLLM's
    way; openai-python raises ``APIError`` for it). ``error`` (and ``body``) is that object,
    ``code`` and ``type`` read from it; ``chunks`` and ``text`` what arrived before it."""

    def __init__(self, message: str, *, error: Any, **kwargs: Any) -> None:
        super().__init__(message, body=error, **kwargs)
        self.error = error


class StreamInterrupted(_Partial):
    """A committed stream broke (reset, idle timeout, truncated before ``[DONE]``) and could not
    be resumed (the server is not resumable, or resumes ran out). ``chunks`` are the chunks
    received, ``text`` their text joined, ``reason`` what broke; the cause is chained."""

    def __init__(self, message: str, *, reason: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.reason = reason


class StreamClosed(_Partial):
    """A stream was read after its caller closed it before its end (``close()``, leaving its
    ``with`` block, or a loop over it left early): nothing more can come. ``chunks`` and ``text``
    are what arrived before the close. A stream read to its end just ends again, as an
    exhausted iterator does."""


class RetryBudgetExhausted(StreamsafeError):
    """A retry was due but the client's :class:`~streamsafe.retry.RetryBudget` refused it: the
    backend keeps failing. ``last_error`` is the error of the last attempt."""

    def __init__(self, message: str, *, last_error: StreamsafeError, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.last_error = last_error


def _request_of(response: httpx2.Response) -> httpx2.Request | None:
    try:
        return response.request
    except RuntimeError:  # a response built by hand has none
        return None


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def status_error(
    status_code: int, body: Any, headers: dict[str, str], **kwargs: Any
) -> APIStatusError:
    """The :class:`APIStatusError` subclass for ``status_code`` (openai-python's mapping, with
    503 a :class:`ServiceUnavailableError`), its message from the body; ``kwargs`` go to the
    error (``response``, ``attempts``, ...)."""
    cls = _BY_STATUS.get(status_code)
    if cls is None:
        cls = InternalServerError if status_code >= 500 else APIStatusError
    message = f"status {status_code}"
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("message"):
        message += f": {err['message']}"
    elif isinstance(body, str) and body:
        message += f": {body[:200]}"
    return cls(message, status_code=status_code, body=body, headers=headers, **kwargs)
