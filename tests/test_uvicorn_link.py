"""What uvicorn's ``Server`` hands a connection protocol, as streamsafe.server.uvicorn_link takes
it, and what streamsafe.server.DrainingServer overrides and reads of the ``Server``.

uvicorn does not document them, so a release may change them: this runs the pinned uvicorn's
real ``Server`` with a protocol that only records, and says what moved."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import uvicorn

from streamsafe.server import bind_socket
from streamsafe.server.uvicorn_link import UvicornLink
from waiting import wait_until_async

MOVED = "uvicorn {version} changed {what}: see streamsafe/server/uvicorn_link.py, relying on it"


def _moved(what: str) -> str:
    return MOVED.format(version=uvicorn.__version__, what=what)


class _Recorder(asyncio.Protocol):
    """A protocol that records how it was built and whether the server shut it down."""

    built: list[_Recorder] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs
        self.shut_down = False
        self.transport: asyncio.BaseTransport | None = None
        _Recorder.built.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.kwargs["server_state"].connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.kwargs["server_state"].connections.discard(self)

    def shutdown(self) -> None:
        self.shut_down = True
        assert self.transport is not None
        self.transport.close()


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never called: nothing is asked
    raise AssertionError(scope)


async def _one_connection_then_shutdown() -> tuple[_Recorder, uvicorn.Server]:
    sock = bind_socket()
    config = uvicorn.Config(_app, http=_Recorder, lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_until_async(lambda: server.started, 10, "uvicorn started")  # a flag, no event
    _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    await wait_until_async(
        lambda: _Recorder.built and _Recorder.built[-1].transport is not None,
        10,
        "the connection's protocol built",
    )
    server.should_exit = True
    await asyncio.wait_for(serving, 10)
    writer.close()
    return _Recorder.built[-1], server


def test_uvicorn_builds_a_protocol_with_what_the_link_takes_and_shuts_it_down() -> None:
    _Recorder.built.clear()
    protocol, server = asyncio.run(_one_connection_then_shutdown())

    assert protocol.args == (), _moved("how Server builds a protocol (now positionally)")
    given = set(protocol.kwargs)
    wanted = set(inspect.signature(UvicornLink.__init__).parameters) - {"self"}
    assert given == wanted, _moved(f"what Server hands a protocol: {sorted(given)}")

    config = protocol.kwargs["config"]
    assert config.loaded and callable(config.loaded_app), _moved("Config.loaded_app")
    assert isinstance(config.root_path, str), _moved("Config.root_path")
    assert isinstance(protocol.kwargs["app_state"], dict), _moved("the app_state it hands")
    assert isinstance(protocol.kwargs["_loop"], asyncio.AbstractEventLoop | None)

    state = protocol.kwargs["server_state"]
    assert state is server.server_state
    assert isinstance(state.connections, set), _moved("ServerState.connections")
    assert isinstance(state.tasks, set), _moved("ServerState.tasks")
    assert isinstance(state.total_requests, int), _moved("ServerState.total_requests")
    headers = state.default_headers
    assert isinstance(headers, list) and all(
        isinstance(name, bytes) and isinstance(value, bytes) for name, value in headers
    ), _moved("ServerState.default_headers (a list of (bytes, bytes))")
    assert {name for name, _ in headers} >= {b"date", b"server"}, _moved("the default headers")

    assert protocol.shut_down, _moved("the graceful shutdown (no shutdown() on a connection)")
    assert not state.connections


def test_uvicorn_s_server_still_has_what_draining_server_overrides_and_reads() -> None:
    # streamsafe.server.DrainingServer overrides handle_exit (the signal handler) and reads
    # started and should_exit, as ServerThread does.
    params = list(inspect.signature(uvicorn.Server.handle_exit).parameters)
    assert params == ["self", "sig", "frame"], _moved(f"Server.handle_exit{tuple(params[1:])}")
    server = uvicorn.Server(uvicorn.Config(_app))
    assert server.started is False and server.should_exit is False, _moved(
        "Server.started / Server.should_exit"
    )
