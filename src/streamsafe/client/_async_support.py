"""What the asynchronous client does differently from the synchronous one, written by hand:
how it sleeps, how a loop left early closes its stream, and ``close`` as a second name for
``aclose``. ``_sync_support`` holds the same names for the synchronous client, so
``_async.py`` reads the same in both and ``_sync.py`` is generated from it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import httpx2

__all__ = [
    "GENERATOR_RUNNING",
    "AsyncCloseAlias",
    "AsyncSleep",
    "default_sleep",
    "loop_over",
    "wake_reader",
]

T = TypeVar("T")

#: What closing a stream's generator raises while another task is inside it
#: (an async generator already running raises it on ``aclose()``).
GENERATOR_RUNNING = RuntimeError
#: How the client waits between attempts (``sleep=`` takes one; tests pass a fake clock's).
AsyncSleep = Callable[[float], Awaitable[None]]
#: The default ``sleep``.
default_sleep: AsyncSleep = asyncio.sleep


class AsyncCloseAlias:
    """Gives a class with ``aclose()`` a ``close()`` too: openai-python's ``AsyncOpenAI`` and
    ``AsyncStream`` spell it ``close``, so code written for them works unchanged."""

    aclose: Callable[[], Awaitable[None]]  # what the class itself defines

    async def close(self) -> None:
        """Same as :meth:`aclose`."""
        await self.aclose()


def wake_reader(response: httpx2.Response) -> None:
    """Nothing to do: closing ``response`` wakes a task waiting for its bytes (the synchronous
    twin must shut the socket down for a thread blocked in a read)."""


class _Stream(Protocol):
    _closed: bool
    response: httpx2.Response

    async def aclose(self) -> None: ...


def loop_over(chunks: AsyncGenerator[T, None], stream: _Stream) -> AsyncIterator[T]:
    """What one ``async for`` over ``stream`` iterates: ``chunks``, and the stream is closed
    as soon as the loop is left early (``break``, an exception), so the server sees the
    disconnect even while the caller keeps the stream."""
    return _Loop(chunks, stream)


# Closing tasks started by _Loop.__del__, held until done (the loop keeps only weak references).
_CLOSING: set[asyncio.Task[None]] = set()


class _Loop(Generic[T]):
    """What one ``async for`` holds, and nothing else does: when the loop is left early it is
    dropped at once, and that closes the stream on the running event loop (an async generator
    cannot be closed from ``__del__`` itself). Its ``__anext__`` hands out the generator's own
    awaitable, so a chunk costs one call more, no more."""

    __slots__ = ("_next", "_stream")

    def __init__(self, chunks: AsyncGenerator[T, None], stream: _Stream) -> None:
        self._stream = stream
        self._next = chunks.__anext__

    def __aiter__(self) -> _Loop[T]:
        return self

    def __anext__(self) -> Awaitable[T]:
        return self._next()

    def __del__(self) -> None:
        stream = self._stream
        if stream._closed or stream.response.is_closed:
            return
        # Closed from now on: a second loop over the stream raises StreamClosed at once rather
        # than read on until the close below runs.
        stream._closed = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop left to close it on; the pool's close will
        task = loop.create_task(stream.aclose())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)
