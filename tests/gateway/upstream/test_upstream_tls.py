"""An ``https://`` upstream whose certificate the gateway cannot accept: OGX's default, a
self-signed certificate that names ``localhost`` only, reached as ``https://127.0.0.1``. The log
and the caller are told it is TLS, and which part of it (the name, or a certificate nobody
vouches for), never that the upstream "refused the connection"."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import pathlib
import socket
import ssl
import threading
from collections.abc import Iterator

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from gateway_helpers import chat_body

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.upstream.connect_failure import connect_failure, is_tls_failure
from streamsafe.gateway.upstream.connection import upstream_ssl_context
from streamsafe.gateway.upstream.errors import TLSFailed
from streamsafe.gateway.upstream.transport import ConnectionPool
from streamsafe.server import ServerThread

NAME_MISMATCH = "TLS: the upstream's certificate does not name the host asked for"
UNTRUSTED = "TLS: the upstream's certificate is not trusted"


def _self_signed_for_localhost(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A certificate for ``localhost`` only, as OGX makes for itself, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@contextlib.contextmanager
def _tls_listener(cert: pathlib.Path, key: pathlib.Path) -> Iterator[int]:
    """A loopback port that completes the server's half of every TLS handshake (the client's
    verification fails before any HTTP), on a thread that stops when the socket closes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            conn.settimeout(5)
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                pass
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept, as close alone does not
        listener.close()
        thread.join(10)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    return _self_signed_for_localhost(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_port(certificate: tuple[pathlib.Path, pathlib.Path]) -> Iterator[int]:
    with _tls_listener(*certificate) as port:
        yield port


async def _handshake_failure(port: int, cafile: pathlib.Path | None) -> BaseException:
    context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    except OSError as exc:
        return exc
    writer.close()
    raise AssertionError("the handshake succeeded")


def test_a_certificate_for_another_name_is_said_to_be_one(
    certificate: tuple[pathlib.Path, pathlib.Path], tls_port: int
) -> None:
    exc = asyncio.run(asyncio.wait_for(_handshake_failure(tls_port, certificate[0]), 10))
    assert is_tls_failure(exc)
    assert connect_failure(exc).startswith(NAME_MISMATCH) and "127.0.0.1" in connect_failure(exc)


def test_a_self_signed_certificate_is_said_to_be_untrusted(tls_port: int) -> None:
    exc = asyncio.run(asyncio.wait_for(_handshake_failure(tls_port, None), 10))
    said = connect_failure(exc)
    assert said.startswith(UNTRUSTED) and "self-signed" in said and "--upstream-ca-bundle" in said


@pytest.mark.parametrize("bundle", [True, False], ids=["ca-bundle", "system-cas"])
def test_the_upstream_pool_raises_a_tls_failure_that_names_its_cause(
    certificate: tuple[pathlib.Path, pathlib.Path], tls_port: int, bundle: bool
) -> None:
    async def call() -> BaseException:
        context = upstream_ssl_context(str(certificate[0]) if bundle else None)
        pool = ConnectionPool(f"https://127.0.0.1:{tls_port}", ssl_context=context)
        with pytest.raises(TLSFailed) as failed:
            await pool.call("GET", "/health")
        return failed.value

    exc = asyncio.run(asyncio.wait_for(call(), 10))
    assert is_tls_failure(exc)
    assert connect_failure(exc).startswith(NAME_MISMATCH if bundle else UNTRUSTED)


def test_a_refused_connection_is_still_called_refused() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    exc = asyncio.run(asyncio.wait_for(_handshake_failure(port, None), 10))
    assert not is_tls_failure(exc) and connect_failure(exc) == "the connection was refused"


@pytest.mark.parametrize("stream_first", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("bundle", [True, False], ids=["ca-bundle", "system-cas"])
def test_the_caller_and_the_log_are_told_the_upstream_failed_tls(
    certificate: tuple[pathlib.Path, pathlib.Path],
    tls_port: int,
    caplog: pytest.LogCaptureFixture,
    stream_first: bool,
    bundle: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="streamsafe")
    config = GatewayConfig(
        upstream=f"https://127.0.0.1:{tls_port}",
        upstream_kind="vllm",
        upstream_ca_bundle=str(certificate[0]) if bundle else None,
    )
    cause = NAME_MISMATCH if bundle else UNTRUSTED
    with ServerThread(Gateway(config)) as server, httpx2.Client(timeout=10) as client:
        url = server.url + "/v1/chat/completions"
        first = client.post(url, json=chat_body(stream=stream_first))
        again = client.post(url, json=chat_body(stream=not stream_first))
    assert first.status_code == 503 and again.status_code == 503
    said_first = first.json()["error"]["message"]
    assert said_first.startswith(f"upstream unreachable: {cause}")
    assert ("certificate is not valid for '127.0.0.1'" if bundle else "self-signed") in said_first
    # The engine is held down now; the next caller hears why, not only that it is down.
    assert again.json()["error"]["message"].startswith(f"engine is down ({cause}")
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert f"down ({cause}" in said and "refused" not in said


@pytest.mark.parametrize(
    ("write", "says"),
    [(None, "cannot read it (No such file or directory)"), ("not a pem", "no PEM certificate")],
)
def test_a_ca_bundle_that_cannot_be_used_is_one_line_at_start(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], write: str | None, says: str
) -> None:
    from streamsafe.cli import main

    bundle = tmp_path / "ca.pem"
    if write is not None:
        bundle.write_text(write)
    argv = ["serve", "--upstream", "https://127.0.0.1:9", "--upstream-ca-bundle", str(bundle)]
    assert main(argv) == 2
    said = capsys.readouterr()
    assert f"streamsafe serve: upstream CA bundle {bundle}: {says}" in said.out + said.err
    assert "Traceback" not in said.out + said.err
