"""What uvicorn's ``Server`` and a connection protocol share: the one place this project relies
on uvicorn's undocumented protocol contract (uvicorn is pinned; tests/test_uvicorn_link.py fails,
naming what moved, when a release changes it, and checks the ``Server`` attributes
:class:`streamsafe.server.DrainingServer` relies on too).

uvicorn takes a protocol class (``Config(http=...)``) but does not document what it hands it.
Its ``Server`` builds one per accepted connection as ``cls(config=, server_state=, app_state=,
_loop=)``: ``config.loaded_app`` is the app (behind uvicorn's own middleware), ``app_state`` what
the lifespan put in its state, ``server_state`` (``uvicorn.server.ServerState``) what the server
keeps of all its connections: the open ones (a graceful shutdown waits for them to close, after
calling ``shutdown()`` on each), the running requests' tasks (cancelled once
``timeout_graceful_shutdown`` is past), ``default_headers`` (``date`` and ``server``: a new list
once a second) and ``total_requests`` (for ``limit_max_requests``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["UvicornLink", "header_lines"]

_last_lines: tuple[object, bytes] = ((), b"")


def header_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """``headers`` as HTTP/1.1 header lines. The last list is remembered (by identity, so it
    must not be changed in place): uvicorn hands the same one for every response of a second."""
    global _last_lines
    cached, lines = _last_lines
    if headers is not cached:
        lines = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
        _last_lines = (headers, lines)
    return lines


class UvicornLink:
    """A connection protocol's side of what uvicorn's ``Server`` shares with it (see the
    module): mixed into :class:`~streamsafe.server.protocol.HttpProtocol`, which adds
    ``shutdown()``. The constructor is the one uvicorn calls."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.app_state = app_state
        self.root_path: str = config.root_path
        self._server_state = server_state
        self._connections: set[Any] = server_state.connections
        self._tasks: set[asyncio.Task[None]] = server_state.tasks

    def opened(self) -> int:
        """This connection is open: counted among the server's; how many are open now."""
        self._connections.add(self)
        return len(self._connections)

    def closed(self) -> None:
        """This connection is closed (or refused): no longer among the server's."""
        self._connections.discard(self)

    def run_request(self, request: Coroutine[Any, Any, None]) -> None:
        """Run a request's app as a task the server's graceful shutdown waits for, and cancels
        past its timeout."""
        task = self.loop.create_task(request)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def answered(self) -> None:
        """A response went out: counted for the server's request limit."""
        self._server_state.total_requests += 1

    def default_head(self) -> bytes:
        """The headers every response carries (``date``, ``server``)."""
        return header_lines(self._server_state.default_headers)
