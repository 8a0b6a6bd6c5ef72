"""What the synchronous client does differently from the asynchronous one, written by hand
under the names ``_async_support`` gives the asynchronous client (``_sync.py`` is generated
from ``_async.py`` and imports these)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Generator, Iterator
from typing import Protocol, TypeVar

import httpx2

__all__ = ["GENERATOR_RUNNING", "CloseAlias", "Sleep", "default_sleep", "loop_over", "wake_reader"]

T = TypeVar("T")

#: What closing a stream's generator raises while another thread is inside it
#: (a generator already executing raises it on ``close()``).
GENERATOR_RUNNING = ValueError
#: How the client waits between attempts (``sleep=`` takes one; tests pass a fake clock's).
Sleep = Callable[[float], None]
#: The default ``sleep``.
default_sleep: Sleep = time.sleep


class CloseAlias:
    """Nothing to add: a synchronous class's ``close()`` is its only name (the asynchronous
    twin adds ``close`` beside ``aclose``)."""


def wake_reader(response: httpx2.Response) -> None:
    """Wake a thread blocked reading ``response``: closing a socket does not interrupt a
    ``recv`` another thread is inside, shutting it down does (the connection is given up
    anyway: a response closed before its end is never reused)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


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
