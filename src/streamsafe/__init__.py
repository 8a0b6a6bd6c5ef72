"""streamsafe: retry-safe, resumable streaming for OpenAI-compatible LLM inference.

The client side is re-exported here: the clients and their errors (:mod:`streamsafe.client`), the
HTTP clients that make unmodified SDKs retry-safe (:mod:`streamsafe.sdk`), the retry core
(:mod:`streamsafe.retry`) and the SSE codec (:mod:`streamsafe.sse`). The servers are
imported from their subpackages (:mod:`streamsafe.gateway`, :mod:`streamsafe.engine_sim`).
Names load on first use, so ``import streamsafe.retry`` loads the retry core alone, not the HTTP
client, a JSON library or a server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamsafe.client import (
        APIConnectionError,
        APIError,
        APIResponseError,
        APIStatusError,
        APITimeoutError,
        AsyncClient,
        AsyncStream,
        AuthenticationError,
        BadRequestError,
        Client,
        ConflictError,
        InternalServerError,
        NotFoundError,
        PermissionDeniedError,
        RateLimitError,
        RetryBudgetExhausted,
        ServiceUnavailableError,
        Stream,
        StreamClosed,
        StreamError,
        StreamInterrupted,
        StreamsafeError,
        Timeouts,
        UnprocessableEntityError,
    )
    from streamsafe.retry import (
        Decision,
        Outcome,
        RetryBudget,
        RetryPolicy,
        StreamingConfig,
        decide,
    )
    from streamsafe.sdk import async_http_client, http_client
    from streamsafe.sse import (
        ServerSentEvent,
        SSEDecoder,
        SSEError,
        encode_comment,
        encode_event,
    )

#: Public name -> the module that defines it.
_EXPORTS = {
    "APIConnectionError": "streamsafe.client",
    "APIError": "streamsafe.client",
    "APIResponseError": "streamsafe.client",
    "APIStatusError": "streamsafe.client",
    "APITimeoutError": "streamsafe.client",
    "AsyncClient": "streamsafe.client",
    "AsyncStream": "streamsafe.client",
    "AuthenticationError": "streamsafe.client",
    "BadRequestError": "streamsafe.client",
    "Client": "streamsafe.client",
    "ConflictError": "streamsafe.client",
    "InternalServerError": "streamsafe.client",
    "NotFoundError": "streamsafe.client",
    "PermissionDeniedError": "streamsafe.client",
    "RateLimitError": "streamsafe.client",
    "RetryBudgetExhausted": "streamsafe.client",
    "ServiceUnavailableError": "streamsafe.client",
    "Stream": "streamsafe.client",
    "StreamClosed": "streamsafe.client",
    "StreamError": "streamsafe.client",
    "StreamInterrupted": "streamsafe.client",
    "StreamsafeError": "streamsafe.client",
    "Timeouts": "streamsafe.client",
    "UnprocessableEntityError": "streamsafe.client",
    "async_http_client": "streamsafe.sdk",
    "http_client": "streamsafe.sdk",
    "Decision": "streamsafe.retry",
    "Outcome": "streamsafe.retry",
    "RetryBudget": "streamsafe.retry",
    "RetryPolicy": "streamsafe.retry",
    "StreamingConfig": "streamsafe.retry",
    "decide": "streamsafe.retry",
    "ServerSentEvent": "streamsafe.sse",
    "SSEDecoder": "streamsafe.sse",
    "SSEError": "streamsafe.sse",
    "encode_comment": "streamsafe.sse",
    "encode_event": "streamsafe.sse",
}

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncStream",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConflictError",
    "Decision",
    "InternalServerError",
    "NotFoundError",
    "Outcome",
    "PermissionDeniedError",
    "RateLimitError",
    "RetryBudget",
    "RetryBudgetExhausted",
    "RetryPolicy",
    "SSEDecoder",
    "SSEError",
    "ServerSentEvent",
    "ServiceUnavailableError",
    "Stream",
    "StreamClosed",
    "StreamError",
    "StreamInterrupted",
    "StreamingConfig",
    "StreamsafeError",
    "Timeouts",
    "UnprocessableEntityError",
    "__version__",
    "async_http_client",
    "decide",
    "encode_comment",
    "encode_event",
    "http_client",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from streamsafe._version import __version__

        return __version__
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamsafe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
