"""The root of every error streamsafe raises to a caller.

It lives below both the SSE codec and the client (imports point one way: ``sse`` <- ``client``),
so that :class:`~streamsafe.sse.SSEError` can be one of its branches. Callers import it from
:mod:`streamsafe.client.errors`, where the whole tree is drawn.
"""

from __future__ import annotations

__all__ = ["StreamsafeError"]


class StreamsafeError(Exception):
    """Base of every client error. ``attempts``: requests sent for the call (retries
    included); ``resumes``: resumes made; ``idempotency_key``: the key every one of them
    carried (``None`` for a GET). All three are 0 / ``None`` where no call was under way (an
    :class:`~streamsafe.sse.SSEError` from decoding bytes directly)."""

    def __init__(
        self,
        message: str,
        *,
        attempts: int = 0,
        resumes: int = 0,
        idempotency_key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts
        self.resumes = resumes
        self.idempotency_key = idempotency_key

    def __str__(self) -> str:
        return self.message
