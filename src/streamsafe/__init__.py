"""streamsafe: retry-safe, resumable streaming for OpenAI-compatible LLM inference.

The public API is re-exported here; everything not listed in ``__all__`` is private.
"""

from __future__ import annotations

from streamsafe._version import __version__
from streamsafe.engine_sim import Fault, SimConfig, Simulator, expected_text
from streamsafe.sse import ServerSentEvent, SSEDecoder, SSEError, encode_comment, encode_event

__all__ = [
    "Fault",
    "SSEDecoder",
    "SSEError",
    "ServerSentEvent",
    "SimConfig",
    "Simulator",
    "__version__",
    "encode_comment",
    "encode_event",
    "expected_text",
]
