"""TLS on the listener (``--tls-certfile``, ``--tls-keyfile``, ``--tls-ca-certs``): a real
gateway process with a certificate made for the test, reached by the real openai SDK and curl
over HTTPS; a plain HTTP request to the TLS port fails and the server goes on; mutual TLS on the
simulator (the same server code); every bad file is one line at start, never a traceback."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from openai import OpenAI

from streamsafe.cli import main
from streamsafe.server import ServerLimits, ServerThread
from streamsafe.server.tls import TlsFiles, server_context
from streamsafe_bench.processes import ServerProcess
from tls_certs import TestCA

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def gateway(ca: TestCA) -> Iterator[ServerProcess]:
    """``streamsafe serve`` (its in-process simulator behind it) on HTTPS."""
    certfile, keyfile = ca.issue("gateway")
    server = ServerProcess("serve", "--tls-certfile", certfile, "--tls-keyfile", keyfile)
    yield server
    server.stop()


def _trusting(ca: TestCA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca.ca_file)


def test_the_gateway_announces_https_and_streams_to_the_openai_sdk(
    ca: TestCA, gateway: ServerProcess
) -> None:
    assert gateway.url.startswith("https://127.0.0.1:")
    with httpx2.Client(verify=_trusting(ca)) as http:
        client = OpenAI(base_url=gateway.url + "/v1", api_key="x", http_client=http, max_retries=0)
        stream = client.chat.completions.create(
            model="sim-llama-8b",
            messages=[{"role": "user", "content": "hello over tls"}],
            max_tokens=8,
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(text.split()) == 8


def test_curl_reaches_the_gateway_with_the_ca_and_gets_http_1_1_even_asking_for_h2(
    ca: TestCA, gateway: ServerProcess
) -> None:
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "--http2",
            "--cacert",
            ca.ca_file,
            "-w",
            "\n%{http_version}",
            *[gateway.url + "/health"],
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 0, out.stderr
    body, _, version = out.stdout.rpartition("\n")
    assert version == "1.1"  # ALPN offers http/1.1 only: HTTP/2 is the proxy's
    assert "ok" in body.lower()
    # Without the CA, curl refuses the certificate: it is the test's, not a public one.
    refused = subprocess.run(
        ["curl", "-sS", gateway.url + "/health"], capture_output=True, text=True, timeout=20
    )
    assert refused.returncode == 60, refused.stderr  # CURLE_PEER_FAILED_VERIFICATION


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
def test_a_client_offering_only_tls_1_1_is_refused(ca: TestCA, gateway: ServerProcess) -> None:
    old = _trusting(ca)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(httpx2.ConnectError), httpx2.Client(verify=old) as http:
        http.get(gateway.url + "/health", timeout=10)


def test_plain_http_to_the_tls_port_fails_and_the_server_goes_on(
    ca: TestCA, gateway: ServerProcess
) -> None:
    plain = gateway.url.replace("https://", "http://")
    with pytest.raises(httpx2.TransportError):
        httpx2.get(plain + "/health", timeout=10)
    assert gateway.proc.poll() is None
    ok = httpx2.get(gateway.url + "/health", verify=_trusting(ca), timeout=10)
    assert ok.status_code == 200
    assert "Traceback" not in "".join(gateway.output)


def test_the_simulator_requires_a_client_certificate_with_tls_ca_certs(ca: TestCA) -> None:
    certfile, keyfile = ca.issue("sim", password="s3cret")
    client_cert, client_key = ca.issue("client-a", client=True)
    server = ServerProcess(
        "simulate",
        "--tls-certfile",
        certfile,
        "--tls-keyfile",
        keyfile,
        "--tls-keyfile-password",
        "s3cret",
        "--tls-ca-certs",
        ca.ca_file,
    )
    try:
        assert server.url.startswith("https://")
        with pytest.raises(httpx2.TransportError):
            httpx2.get(server.url + "/health", verify=_trusting(ca), timeout=10).raise_for_status()
        mutual = _trusting(ca)
        mutual.load_cert_chain(client_cert, client_key)
        assert httpx2.get(server.url + "/health", verify=mutual, timeout=10).status_code == 200
    finally:
        server.stop()


def test_an_app_in_a_server_thread_sees_https_as_its_scheme(ca: TestCA) -> None:
    app = _echo_app()
    certfile, keyfile = ca.issue("thread")
    tls = server_context(TlsFiles(certfile, keyfile))
    with ServerThread(app, tls=tls) as server:  # the asyncio loop, where serve runs uvloop
        assert server.url.startswith("https://127.0.0.1:")
        assert httpx2.get(server.url + "/", verify=_trusting(ca), timeout=10).text == "https"
    with ServerThread(app) as plain:
        assert httpx2.get(plain.url + "/", timeout=10).text == "http"


def _echo_app() -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["scheme"].encode()})

    return app


def test_tls_connections_count_against_the_connection_cap(ca: TestCA) -> None:
    certfile, keyfile = ca.issue("capped")
    tls = server_context(TlsFiles(certfile, keyfile))
    with (
        ServerThread(_echo_app(), tls=tls, limits=ServerLimits(max_connections=1)) as server,
        httpx2.Client(verify=_trusting(ca), timeout=10) as holder,
    ):
        assert holder.get(server.url + "/").text == "https"  # its connection stays open
        refused = httpx2.get(server.url + "/", verify=_trusting(ca), timeout=10)
        assert refused.status_code == 503  # over TLS, as a plain port answers it
        assert refused.headers["retry-after"] == "1"


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["serve", "--upstream", "http://127.0.0.1:1", *argv]) == 2
    out = capsys.readouterr()
    said = (out.out + out.err).strip()
    assert said.count("\n") == 0 and "Traceback" not in said, said
    return said


def test_bad_tls_files_are_one_line_at_start(
    ca: TestCA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    certfile, keyfile = ca.issue("bad-start")
    other_cert, _ = ca.issue("other")
    locked_cert, locked_key = ca.issue("locked", password="right")
    missing = str(tmp_path / "nowhere.pem")
    assert "nowhere.pem: no such file" in _refused(capsys, "--tls-certfile", missing)
    said = _refused(capsys, "--tls-certfile", other_cert, "--tls-keyfile", keyfile)
    assert "the key is not the certificate's" in said
    said = _refused(capsys, "--tls-certfile", keyfile, "--tls-keyfile", keyfile)
    assert "not a usable PEM certificate and key" in said
    said = _refused(
        capsys, *("--tls-certfile", locked_cert, "--tls-keyfile", locked_key),
        *("--tls-keyfile-password", "wrong"),
    )  # fmt: skip
    assert "a wrong --tls-keyfile-password" in said and "'wrong'" not in said
    said = _refused(capsys, "--tls-certfile", locked_cert, "--tls-keyfile", locked_key)
    assert "the key is encrypted" in said  # no password: refused, never a prompt
    pair = ("--tls-certfile", certfile, "--tls-keyfile", keyfile)
    said = _refused(capsys, *pair, "--tls-ca-certs", missing)
    assert "nowhere.pem: no such file" in said
    said = _refused(capsys, *pair, "--tls-ca-certs", keyfile)
    assert "no usable CA certificate" in said
    said = _refused(capsys, "--tls-keyfile", keyfile)
    assert "without --tls-certfile" in said


def test_a_bad_certificate_path_stops_the_process_with_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "streamsafe.cli", "serve", "--port", "0"),
            *("--upstream", "http://127.0.0.1:1", "--tls-certfile", str(tmp_path / "gone.pem")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stdout + out.stderr
    assert "gone.pem: no such file" in out.stdout


def test_tls_settings_come_from_the_config_file_too(
    ca: TestCA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(f'tls-certfile = "{tmp_path / "missing.pem"}"\n')
    said = _refused(capsys, "--config", str(config))
    assert "missing.pem: no such file" in said
