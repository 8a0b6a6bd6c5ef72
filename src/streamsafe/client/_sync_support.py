"""What the synchronous client does differently from the asynchronous one, written by hand
under the names ``_async_support`` gives the asynchronous client (``_sync.py`` is generated
from ``_async.py`` and imports these)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Protocol, TypeVar

__all__ = ["CloseAlias", "Sleep", "default_sleep", "loop_over"]

T = TypeVar("T")

#: How the client waits between attempts (``sleep=`` takes one; tests pass a fake clock's).
Sleep = Callable[[float], None]
#: The default ``sleep``.
default_sleep: Sleep = time.sleep


class CloseAlias:
    """Nothing to add: a synchronous class's ``close()`` is its only name (the asynchronous
    twin adds ``close`` beside ``aclose``)."""


class _Stream(Protocol):
    def close(self) -> None: ...


def loop_over(chunks: Generator[T, None, None], stream: _Stream) -> Iterator[T]:
    """What one ``for`` loop over ``stream`` iterates: ``chunks``, and the stream is closed as
    soon as the loop is left early (``break``, an exception): the generator only the loop holds
    is dropped at once and its ``finally`` runs, so the server sees the disconnect even while
    the caller keeps the stream."""
    try:
        yield from chunks
    finally:
        stream.close()
