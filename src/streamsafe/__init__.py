"""streamsafe: retry-safe, resumable streaming for OpenAI-compatible LLM inference.

The public API is re-exported here; everything not listed in ``__all__`` is private.
"""

from __future__ import annotations

from streamsafe._version import __version__
from streamsafe.sse import SSEDecoder, SSEError, ServerSentEvent, encode_comment, encode_event

__all__ = [
    "SSEDecoder",
    "SSEError",
    "ServerSentEvent",
    "__version__",
    "encode_comment",
    "encode_event",
]
