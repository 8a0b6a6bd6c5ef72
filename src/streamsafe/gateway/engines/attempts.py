"""What the relay calls for one generation's upstream requests: the :class:`Attempts` interface,
and :class:`OneEngine`, its form for a gateway with one upstream (the pool's is
:class:`~streamsafe.gateway.engines.engines.EngineAttempts`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import httpx2

from streamsafe.gateway.upstream.connection import Upstream

__all__ = ["Attempts", "OneEngine", "answer_response"]


class _Answer(httpx2.AsyncByteStream):
    """The body of an answer the gateway passes on after reading it (a 4xx, the last 5xx)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._body


def answer_response(status: int, body: bytes, retry_after: float | None = None) -> httpx2.Response:
    """A response the gateway passes on in place of an upstream one (its body already read, or
    made up here), with ``Retry-After`` in whole seconds where given."""
    headers = {"content-type": "application/json"}
    if retry_after is not None:
        headers["retry-after"] = str(max(1, int(retry_after + 0.999)))
    return httpx2.Response(status, headers=headers, stream=_Answer(body))


class Attempts(Protocol):
    """What the relay calls for one generation's upstream requests: one engine
    (:class:`OneEngine`) or the pool
    (:class:`~streamsafe.gateway.engines.engines.EngineAttempts`)."""

    async def open(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        retry_connect: bool = True,
    ) -> httpx2.Response:
        """Send a request; the response with its body unread."""
        ...

    def served(self) -> None:
        """The first token arrived."""
        ...

    def cut(self) -> None:
        """The stream broke (a continuation follows)."""
        ...

    def engine_died(self, why: str) -> None:
        """The engine said it died."""
        ...

    def failed(self, why: str) -> None:
        """The engine failed this attempt (a 5xx, a reset before the answer, a stall, an error
        event standing for a 5xx)."""
        ...

    def succeeded(self) -> None:
        """The engine answered a whole request."""
        ...

    def release(self) -> None:
        """The generation ended."""
        ...

    @property
    def upstream(self) -> Upstream:
        """The engine of the latest attempt (its kind reads its answers)."""
        ...


class OneEngine:
    """:class:`Attempts` on the one upstream of a gateway without a pool."""

    __slots__ = ("_upstream",)

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream

    async def open(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        retry_connect: bool = True,
    ) -> httpx2.Response:
        """:meth:`Upstream.open`."""
        return await self._upstream.open(
            method, path, content=content, headers=headers, retry_connect=retry_connect
        )

    def served(self) -> None:
        """Nothing to learn: the breaker follows the engine's own word."""

    def cut(self) -> None:
        """Nothing to learn (see :meth:`served`)."""

    def engine_died(self, why: str) -> None:
        """:meth:`Upstream.engine_died`."""
        self._upstream.failures += 1
        self._upstream.engine_died(why)

    def failed(self, why: str) -> None:
        """:meth:`Upstream.failed`."""
        self._upstream.failed(why)

    def succeeded(self) -> None:
        """:meth:`Upstream.succeeded`."""
        self._upstream.succeeded()

    def release(self) -> None:
        """Nothing held."""

    @property
    def upstream(self) -> Upstream:
        """The one upstream."""
        return self._upstream
