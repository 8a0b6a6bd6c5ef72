"""What gateway/upstream/asyncio_backend.py borrows from httpcore's internals: the test fails,
naming what moved, when the pinned httpcore2 changes it."""

from __future__ import annotations

import inspect
import socket

import httpcore2
import pytest


def test_httpcore_still_offers_is_socket_readable_as_the_backend_takes_it() -> None:
    # The backend answers get_extra_info("is_readable") with it, as httpcore's own backends do:
    # the pool asks it before reusing an idle connection, so a connection the upstream closed
    # meanwhile is not handed a request.
    where = f"httpcore2 {httpcore2.__version__}: httpcore2._utils.is_socket_readable"
    try:
        from httpcore2._utils import is_socket_readable
    except ImportError:
        pytest.fail(f"{where} is gone: asyncio_backend.py imports it")
    assert list(inspect.signature(is_socket_readable).parameters) == ["sock"], where

    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not is_socket_readable(ours), f"{where} says a quiet socket is readable"
        theirs.send(b"x")
        assert is_socket_readable(ours), f"{where} misses bytes waiting to be read"
        ours.recv(1)
        theirs.close()
        assert is_socket_readable(ours), f"{where} misses a socket the peer closed"
    assert is_socket_readable(None), f"{where} no longer takes a missing socket for a closed one"


def test_httpx_still_keeps_its_connection_pool_in_transport_pool() -> None:
    # pooled_transport replaces AsyncHTTPTransport._pool (httpx2 takes no network backend): a
    # release that renames it would leave the gateway on anyio's backend without a word.
    import httpx2

    from streamsafe.gateway.upstream.asyncio_backend import AsyncioBackend, pooled_transport
    from streamsafe.gateway.upstream.connection import upstream_ssl_context

    where = f"httpx2 {httpx2.__version__}: AsyncHTTPTransport._pool"
    plain = httpx2.AsyncHTTPTransport()
    assert isinstance(getattr(plain, "_pool", None), httpcore2.AsyncConnectionPool), where
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=8, keepalive_expiry=4)
    ours = pooled_transport("http://127.0.0.1:9", limits, upstream_ssl_context())
    pool = ours._pool
    assert isinstance(pool, httpcore2.AsyncConnectionPool), where
    assert isinstance(pool._network_backend, AsyncioBackend), where
    assert pool._keepalive_expiry == 4, where
    tls = pooled_transport("https://127.0.0.1:9", limits, upstream_ssl_context())
    assert not isinstance(tls._pool._network_backend, AsyncioBackend)  # TLS keeps httpx2's own
