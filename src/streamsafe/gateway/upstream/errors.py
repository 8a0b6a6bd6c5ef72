"""What can go wrong talking to an engine: one exception hierarchy for every upstream exchange,
the hot stream's and every other call's (:mod:`streamsafe.gateway.upstream.transport`).

::

    OSError
     └── UpstreamError            any exchange with an engine that did not complete
          ├── ConnectFailed       no connection was made: the engine never saw the request
          │    ├── ConnectTimeout the connect did not finish within the connect timeout
          │    └── TLSFailed      the TLS handshake failed (a certificate, a protocol)
          ├── UpstreamClosed      the connection ended, or carried bytes that are not HTTP,
          │                       before the answer was whole (the request may have been seen)
          └── UpstreamTimeout     no whole answer within the call's timeout

They are ``OSError``s, as asyncio's own network errors are, so a caller that catches ``OSError``
around an exchange catches them all. Only a :class:`ConnectFailed` is safe to send again (nothing
reached the engine), and not a :class:`TLSFailed` (the certificate will not have changed in
50 ms); :func:`~streamsafe.gateway.upstream.connect_failure.connect_failure` says in words why a
connection was not made, from the cause each one keeps in its chain.
"""

from __future__ import annotations

__all__ = [
    "ConnectFailed",
    "ConnectTimeout",
    "TLSFailed",
    "UpstreamClosed",
    "UpstreamError",
    "UpstreamTimeout",
]


class UpstreamError(OSError):
    """An exchange with an engine did not complete (see the module's tree)."""


class ConnectFailed(UpstreamError):
    """No connection was made (refused, unreachable, a name that did not resolve): the engine
    never saw the request. The cause is the exception's ``__cause__``."""


class ConnectTimeout(ConnectFailed, TimeoutError):
    """The connect did not finish within the connect timeout."""


class TLSFailed(ConnectFailed):
    """The TLS handshake failed: the certificate did not verify (its name, its issuer) or the
    two sides share no protocol. The ``ssl.SSLError`` is the ``__cause__``."""


class UpstreamClosed(UpstreamError, ConnectionError):
    """The connection ended before the answer was whole, or the engine sent bytes that are not
    HTTP: the request may have reached the engine."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """No whole answer within the timeout the call was given (the connection is dropped)."""
