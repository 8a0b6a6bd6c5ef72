"""TLS on a server's listener: the options (``--tls-certfile``, ``--tls-keyfile``,
``--tls-keyfile-password``, ``--tls-ca-certs``), and the ``ssl.SSLContext`` they describe.

The context speaks TLS 1.2 and later, offers ALPN ``http/1.1`` only (the servers here speak
HTTP/1.1; HTTP/2 is the proxy's in front), and with ``--tls-ca-certs`` requires a client
certificate signed by one of those CAs. It is built, and every file read, before the server
binds its port, so a missing file, a key that is not the certificate's or a wrong password is
one line at start (:class:`TlsError`), never a traceback after the announce.
"""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["TlsError", "TlsFiles", "add_tls_options", "server_context", "tls_files"]


class TlsError(ValueError):
    """A TLS setting that cannot be used; ``str()`` is one line for the operator."""


class _Options(Protocol):
    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action: ...


@dataclass(frozen=True)
class TlsFiles:
    """What a listener's TLS is made of: PEM files, read when the context is built."""

    #: The server's certificate chain (PEM), leaf first.
    certfile: str
    #: Its private key (PEM); ``None``: in ``certfile`` after the chain.
    keyfile: str | None = None
    #: The password of an encrypted ``keyfile`` (``None``: not encrypted).
    keyfile_password: str | None = None
    #: CA certificates (PEM) a client's certificate must be signed by; ``None`` (default): no
    #: client certificate is asked for.
    ca_certs: str | None = None


def add_tls_options(group: _Options) -> None:
    """The TLS options of a server's command line (``serve``, ``simulate``)."""
    group.add_argument(
        "--tls-certfile",
        default=None,
        metavar="FILE",
        help="serve HTTPS (TLS 1.2+, HTTP/1.1) with this PEM certificate chain (default: plain "
        "HTTP; HTTP/2 is left to a proxy in front)",
    )
    group.add_argument(
        "--tls-keyfile",
        default=None,
        metavar="FILE",
        help="the PEM private key of --tls-certfile (default: in the certificate file)",
    )
    group.add_argument(
        "--tls-keyfile-password",
        default=None,
        metavar="PASSWORD",
        help="password of an encrypted --tls-keyfile (also STREAMSAFE_TLS_KEYFILE_PASSWORD)",
    )
    group.add_argument(
        "--tls-ca-certs",
        default=None,
        metavar="FILE",
        help="require a client certificate signed by one of these PEM CA certificates "
        "(mutual TLS; default: none asked for)",
    )


def tls_files(args: argparse.Namespace, password: str | None = None) -> TlsFiles | None:
    """The :class:`TlsFiles` the parsed options describe, or ``None`` (plain HTTP);
    ``password``: the key's password where ``--tls-keyfile-password`` gives none (the
    environment's). A key, a password or client CAs without a certificate are refused
    (:class:`TlsError`): a listener the operator meant to secure must not come up in clear."""
    certfile = args.tls_certfile
    password = args.tls_keyfile_password or password
    if certfile is None:
        given = [
            name
            for name, value in (
                ("--tls-keyfile", args.tls_keyfile),
                ("--tls-keyfile-password", args.tls_keyfile_password),
                ("--tls-ca-certs", args.tls_ca_certs),
            )
            if value
        ]
        if given:
            raise TlsError(f"{', '.join(given)} without --tls-certfile: give the certificate")
        return None
    return TlsFiles(certfile, args.tls_keyfile, password, args.tls_ca_certs)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server-side context for ``files``: TLS 1.2 or later, ALPN ``http/1.1``, Python's
    default ciphers; client certificates required where ``files.ca_certs`` is given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    password: Any = files.keyfile_password
    if password is None:  # asked only for an encrypted key: refuse, never OpenSSL's prompt

        def password() -> str:
            raise TlsError(
                f"{files.keyfile or files.certfile}: the key is encrypted; give "
                "--tls-keyfile-password (or STREAMSAFE_TLS_KEYFILE_PASSWORD)"
            )

    try:
        ctx.load_cert_chain(files.certfile, files.keyfile, password)
    except FileNotFoundError as exc:
        raise TlsError(f"cannot read {exc.filename or files.certfile}: no such file") from None
    except OSError as exc:  # ssl.SSLError is one: a bad PEM, a key not the certificate's
        raise TlsError(_chain_error(files, exc)) from None
    if files.ca_certs is not None:
        try:
            ctx.load_verify_locations(cafile=files.ca_certs)
        except FileNotFoundError:
            raise TlsError(f"cannot read {files.ca_certs}: no such file") from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc.__class__.__name__
            raise TlsError(f"{files.ca_certs}: no usable CA certificate ({reason})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _chain_error(files: TlsFiles, exc: OSError) -> str:
    where = files.certfile if files.keyfile is None else f"{files.certfile}, {files.keyfile}"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        if reason == "KEY_VALUES_MISMATCH":
            return f"{where}: the key is not the certificate's"
        # OpenSSL names a wrong password as it names a bad PEM file (``PEM lib``).
        wrong = ", or a wrong --tls-keyfile-password" if files.keyfile_password else ""
        return f"{where}: not a usable PEM certificate and key{wrong} ({reason})"
    return f"cannot read {where}: {exc.strerror or exc}"
