"""``streamsafe.sdk``: unmodified SDKs made retry-safe by their ``http_client=``.

:func:`http_client` and :func:`async_http_client` return an HTTP client to hand to
``openai.OpenAI(http_client=...)``, ``anthropic.Anthropic(...)``,
``llama_stack_client.LlamaStackClient(...)`` (and the async twins, and
``ogx_client.AsyncOgxClient``). Its transport gives every logical call one ``Idempotency-Key``,
lets the SDK retry only where nothing can have started, turns a retry of an attempt that may
still be running into a wait on that attempt, and resumes a broken stream of a resumable server
(the streamsafe gateway) before the SDK sees the break. See docs/sdk.md.

Which package: each SDK type-checks ``http_client`` against the httpx it is built on (measured
on the installed versions): openai 3.x accepts an ``httpx2`` or an ``httpx`` client, anthropic
2.x only ``httpx2``, llama-stack-client (0.2.12, 0.7.5) and ogx-client 1.5 only ``httpx``. No
one package serves them all, so ``package`` says which: ``"httpx2"`` (the default: streamsafe's
own dependency, for openai and anthropic) or ``"httpx"`` (for llama-stack-client and
ogx-client). ``httpx`` is imported only when asked for, here: streamsafe does not depend on it.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, Literal

from streamsafe.retry import StreamingConfig
from streamsafe.sdk._async_transport import AsyncShell
from streamsafe.sdk._settings import TransportSettings
from streamsafe.sdk._sync_transport import SyncShell

__all__ = ["TransportSettings", "async_http_client", "http_client"]

Package = Literal["httpx", "httpx2"]

#: Keyword arguments that configure the connection pool (the package's ``HTTPTransport``), not
#: the client: with a transport given, the client would ignore them.
_TRANSPORT_ARGS = (
    "verify",
    "cert",
    "trust_env",
    "http1",
    "http2",
    "limits",
    "proxy",
    "uds",
    "local_address",
    "retries",
    "socket_options",
)


def _package(name: Package) -> ModuleType:
    if name not in ("httpx", "httpx2"):
        raise ValueError(f"package must be 'httpx' or 'httpx2', not {name!r}")
    return importlib.import_module(name)


@functools.cache
def _transport_class(package: ModuleType, asynchronous: bool) -> type[Any]:
    if asynchronous:
        return type("AsyncStreamsafeTransport", (AsyncShell, package.AsyncBaseTransport), {})
    return type("StreamsafeTransport", (SyncShell, package.BaseTransport), {})


def _split(package: ModuleType, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pool = {k: kwargs.pop(k) for k in _TRANSPORT_ARGS if k in kwargs}
    # The openai SDK's own pool size (1000 connections, 100 kept alive), not httpx's 100.
    pool.setdefault("limits", package.Limits(max_connections=1000, max_keepalive_connections=100))
    kwargs.setdefault("follow_redirects", True)
    return pool, kwargs


def http_client(
    *,
    package: Package = "httpx2",
    grace: float = 10.0,
    patience: float | None = 600.0,
    streaming: StreamingConfig | None = None,
    **kwargs: Any,
) -> Any:
    """A synchronous ``httpx2.Client`` (``httpx.Client`` with ``package="httpx"``: see the
    module for which SDK takes which) to pass as an SDK's ``http_client=``. ``kwargs`` go to
    the client or its connection pool as the package takes them (``verify``, ``limits``,
    ``headers``, ...); leave ``timeout`` out so the SDK's own applies. ``grace``,
    ``patience`` and ``streaming``: see :class:`TransportSettings`."""
    h = _package(package)
    settings = TransportSettings(grace, patience, streaming or StreamingConfig())
    pool, client_kw = _split(h, kwargs)
    transport = _transport_class(h, False)(h, h.HTTPTransport(**pool), settings)
    return h.Client(transport=transport, **client_kw)


def async_http_client(
    *,
    package: Package = "httpx2",
    grace: float = 10.0,
    patience: float | None = 600.0,
    streaming: StreamingConfig | None = None,
    **kwargs: Any,
) -> Any:
    """The asynchronous twin of :func:`http_client`: an ``httpx2.AsyncClient`` (or
    ``httpx.AsyncClient``) for ``openai.AsyncOpenAI(http_client=...)`` and the like, on
    asyncio."""
    h = _package(package)
    settings = TransportSettings(grace, patience, streaming or StreamingConfig())
    pool, client_kw = _split(h, kwargs)
    transport = _transport_class(h, True)(h, h.AsyncHTTPTransport(**pool), settings)
    return h.AsyncClient(transport=transport, **client_kw)
