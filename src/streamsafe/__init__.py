"""streamsafe: retry-safe, resumable streaming for OpenAI-compatible LLM inference.

The public API is re-exported here; everything not listed in ``__all__`` is private.
"""

from __future__ import annotations

from streamsafe._version import __version__
from streamsafe.client import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncClient,
    AsyncStream,
    Client,
    RateLimitError,
    RetryBudgetExhausted,
    ServiceUnavailableError,
    Stream,
    StreamError,
    StreamInterrupted,
    StreamsafeError,
    Timeouts,
)
from streamsafe.engine_sim import Fault, SimConfig, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.retry import Decision, Outcome, RetryBudget, RetryPolicy, StreamingConfig, decide
from streamsafe.sse import ServerSentEvent, SSEDecoder, SSEError, encode_comment, encode_event

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncStream",
    "Client",
    "Decision",
    "Fault",
    "Gateway",
    "GatewayConfig",
    "Outcome",
    "RateLimitError",
    "RetryBudget",
    "RetryBudgetExhausted",
    "RetryPolicy",
    "SSEDecoder",
    "SSEError",
    "ServerSentEvent",
    "ServiceUnavailableError",
    "SimConfig",
    "Simulator",
    "Stream",
    "StreamError",
    "StreamInterrupted",
    "StreamingConfig",
    "StreamsafeError",
    "Timeouts",
    "__version__",
    "decide",
    "encode_comment",
    "encode_event",
    "expected_text",
]
