"""Stopping a test's loopback servers without making the next test wait for it.

Stopping a :class:`~streamsafe.server.ServerThread` costs 0.1-0.3 s however little it served:
uvicorn notices ``should_exit`` on a 0.1 s tick, then gives open connections a fixed 0.1 s
before its lifespan shutdown. Hundreds of tests each start their own servers, so waiting for
every stop in line cost over a minute of the suite. A test that is done with its servers hands
them to :func:`stop_later`; they stop on a thread of their own, in the order given, while the
next test runs on servers of its own (every server has its own port, loop and app, so nothing is
shared). The session owns those threads: :func:`wait_stopped` joins them (tests/conftest.py calls
it when the session ends, and a test that must not overlap with an earlier test's shutdown calls
it first) and re-raises the first error a stop raised.

A test that needs a server gone before it goes on (a refused connection, a port reused) stops it
itself with ``server.stop()``.
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["stop_later", "wait_stopped"]


class Stoppable(Protocol):
    def stop(self) -> None: ...


_lock = threading.Lock()
_stopping: list[threading.Thread] = []
_errors: list[BaseException] = []


def _stop_in_order(servers: tuple[Stoppable, ...]) -> None:
    for server in servers:
        try:
            server.stop()
        except BaseException as exc:  # reported by wait_stopped
            with _lock:
                _errors.append(exc)


def stop_later(*servers: Stoppable) -> None:
    """Stop ``servers`` one after another (a gateway before the engine behind it) on a thread
    of their own, and return at once."""
    thread = threading.Thread(target=_stop_in_order, args=(servers,), name="stop-later")
    with _lock:
        _stopping[:] = [t for t in _stopping if t.is_alive()]
        _stopping.append(thread)
    thread.start()


def wait_stopped(timeout: float = 60.0) -> None:
    """Wait until every stop begun by :func:`stop_later` has finished; raise the first error
    one of them raised (once)."""
    with _lock:
        threads = list(_stopping)
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"a server did not stop within {timeout} s")
    with _lock:
        _stopping[:] = [t for t in _stopping if t.is_alive()]
        errors, _errors[:] = list(_errors), []
    if errors:
        raise errors[0]
