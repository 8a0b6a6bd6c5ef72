"""``streamsafe.client``: OpenAI-compatible clients whose retries can never duplicate work.

:class:`Client` (sync) and :class:`AsyncClient` send each logical call with one
``Idempotency-Key``, retry only as :func:`streamsafe.retry.decide` allows (a stream only where
nothing can have started, unless the caller opts in), resume a committed stream that broke
where the server is resumable, and raise one hierarchy of typed errors
(:mod:`streamsafe.client.errors`).
"""

from __future__ import annotations

from streamsafe.client._async import AsyncClient, AsyncStream
from streamsafe.client._settings import DEFAULT_BASE_URL, NOT_GIVEN, RetryEvent
from streamsafe.client._sync import Client, Stream
from streamsafe.client.errors import (
    APIConnectionError,
    APIError,
    APIResponseError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RetryBudgetExhausted,
    ServiceUnavailableError,
    SSEError,
    StreamClosed,
    StreamError,
    StreamInterrupted,
    StreamsafeError,
    UnprocessableEntityError,
)
from streamsafe.client.timeouts import Timeouts
from streamsafe.client.types import (
    APIObject,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CreateEmbeddingResponse,
    Model,
    ModelList,
    Response,
    ResponseStreamEvent,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "NOT_GIVEN",
    "APIConnectionError",
    "APIError",
    "APIObject",
    "APIResponseError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncStream",
    "AuthenticationError",
    "BadRequestError",
    "ChatCompletion",
    "ChatCompletionChunk",
    "Client",
    "Completion",
    "ConflictError",
    "CreateEmbeddingResponse",
    "InternalServerError",
    "Model",
    "ModelList",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "Response",
    "ResponseStreamEvent",
    "RetryBudgetExhausted",
    "RetryEvent",
    "SSEError",
    "ServiceUnavailableError",
    "Stream",
    "StreamClosed",
    "StreamError",
    "StreamInterrupted",
    "StreamsafeError",
    "Timeouts",
    "UnprocessableEntityError",
]
