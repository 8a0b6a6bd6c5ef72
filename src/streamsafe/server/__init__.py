"""The HTTP/1.1 server every app here runs on (the gateway, the simulator, the benchmarks' peers):
uvicorn's ``Server`` with the project's own connection protocol, in a thread or in the
foreground.

Its modules: :mod:`~streamsafe.server.run` (running an app: :class:`ServerThread`,
:func:`run_server`, :func:`bind_socket`), :mod:`~streamsafe.server.protocol` (the connection),
:mod:`~streamsafe.server.request`, :mod:`~streamsafe.server.cycle`,
:mod:`~streamsafe.server.flow`, :mod:`~streamsafe.server.unfinished`,
:mod:`~streamsafe.server.limits` (:class:`ServerLimits`), :mod:`~streamsafe.server.tls`,
:mod:`~streamsafe.server.uvicorn_link`, and :mod:`~streamsafe.server.asgi` (the ASGI types and
helpers the apps write against, and the extensions this server offers them).

The runner's names are re-exported here and load on first use: an app importing
:mod:`streamsafe.server.asgi` or :mod:`streamsafe.server.tls` (the gateway's modules and option
parsers do) loads neither uvicorn nor httptools.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamsafe.server.run import (
        CannotListen,
        DrainingServer,
        ServerLimits,
        ServerThread,
        base_url,
        bind_socket,
        run_server,
        serve_in_thread,
        server_config,
        tune_collector,
    )

__all__ = [
    "CannotListen",
    "DrainingServer",
    "ServerLimits",
    "ServerThread",
    "base_url",
    "bind_socket",
    "run_server",
    "serve_in_thread",
    "server_config",
    "tune_collector",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'streamsafe.server' has no attribute {name!r}")
    value = getattr(importlib.import_module("streamsafe.server.run"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
