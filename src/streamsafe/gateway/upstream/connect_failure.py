"""Why no connection to an upstream was made, in words an operator can act on.

A connection that was never made reaches the gateway as a
:class:`~streamsafe.gateway.upstream.errors.ConnectFailed` (a ``TLSFailed`` where the handshake
failed), the real cause somewhere in its chain. A refused connection and a TLS failure look
alike there, yet call for different fixes: an engine to start, or a certificate to trust or a
name to use. OGX serves TLS by default with a self-signed certificate that names ``localhost``
only, so ``https://127.0.0.1`` fails verification twice over. :func:`connect_failure` names the
cause, for the log line, the engine's "down" line and the caller's error message alike;
:func:`is_tls_failure` says whether asking again can help (a certificate does not change in
50 ms).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

__all__ = ["connect_failure", "is_tls_failure"]

#: OpenSSL's verify codes of a certificate whose issuer is not trusted here: self-signed, or
#: signed by a CA the trust store lacks (X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT,
#: SELF_SIGNED_CERT_IN_CHAIN, UNABLE_TO_GET_ISSUER_CERT_LOCALLY, UNABLE_TO_GET_ISSUER_CERT,
#: UNABLE_TO_VERIFY_LEAF_SIGNATURE).
_UNTRUSTED = frozenset({18, 19, 20, 2, 21})
#: X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH.
_WRONG_NAME = frozenset({62, 64})
#: Links of an exception chain looked at, at most.
_CHAIN_DEPTH = 8


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < _CHAIN_DEPTH:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _tls(exc: BaseException) -> ssl.SSLError | None:
    return next((e for e in _chain(exc) if isinstance(e, ssl.SSLError)), None)


def is_tls_failure(exc: BaseException) -> bool:
    """True where the connection failed in its TLS handshake (the certificate, the protocol):
    asking again at once would fail the same way."""
    return _tls(exc) is not None


def connect_failure(exc: BaseException) -> str:
    """Why ``exc`` left no connection, in a few words: a TLS failure named as one (the
    certificate does not name the host; it is self-signed or its CA unknown; another
    handshake failure), else refused, timed out, a host name that did not resolve; else the
    exception's type, as before."""
    tls = _tls(exc)
    if isinstance(tls, ssl.SSLCertVerificationError):
        said = (tls.verify_message or tls.reason or "verify failed").rstrip(".")
        if tls.verify_code in _WRONG_NAME:
            return (
                f"TLS: the upstream's certificate does not name the host asked for ({said}); "
                "use a host name the certificate names"
            )
        if tls.verify_code in _UNTRUSTED:
            return (
                f"TLS: the upstream's certificate is not trusted ({said}): a self-signed "
                "certificate or a private CA; give it with --upstream-ca-bundle"
            )
        return f"TLS: the upstream's certificate failed verification ({said})"
    if tls is not None:
        return f"TLS handshake failed ({tls.reason or type(tls).__name__})"
    for link in _chain(exc):
        if isinstance(link, ConnectionRefusedError):
            return "the connection was refused"
        if isinstance(link, socket.gaierror):
            return "the host name did not resolve"
        if isinstance(link, TimeoutError):
            return "the connect timed out"
    return type(exc).__name__
