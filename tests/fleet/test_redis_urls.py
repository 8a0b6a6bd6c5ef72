"""The Redis URL forms against real servers: ``rediss://`` to a ``redis-server`` that speaks
TLS only (its certificate from a CA made for the test, client certificates required), shared
by two gateway replicas; ``unix://`` to one on a local socket."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import redis
from fleet_helpers import Process, redis_binary

from streamsafe.gateway.replicas.store_redis import RedisStore
from streamsafe_bench.processes import free_port
from tls_certs import TestCA
from waiting import wait_until

pytestmark = pytest.mark.timeout(60)


class TlsRedis:
    """A ``redis-server`` with no plain port, TLS on ``port``, client certificates required."""

    def __init__(self, binary: str, ca: TestCA) -> None:
        self.ca = ca
        self.port = free_port()
        certfile, keyfile = ca.issue("redis")
        self.client_cert, self.client_key = ca.issue("gateway-client", client=True)
        self._dir = tempfile.mkdtemp(prefix="streamsafe-redis-tls-")
        self.proc = subprocess.Popen(
            [
                *(binary, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1"),
                *("--tls-cert-file", certfile, "--tls-key-file", keyfile),
                *("--tls-ca-cert-file", ca.ca_file, "--tls-auth-clients", "yes"),
                *("--save", "", "--appendonly", "no", "--dir", self._dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, 10, "redis-server to answer over TLS")

    @property
    def url(self) -> str:
        """Its ``rediss://`` URL with the client's certificate (the CA goes separately)."""
        query = f"ssl_certfile={self.client_cert}&ssl_keyfile={self.client_key}"
        return f"rediss://127.0.0.1:{self.port}/0?{query}"

    def _answers(self) -> bool:
        assert self.proc.poll() is None, "redis-server exited: was it built without TLS?"
        try:
            with redis.Redis.from_url(
                self.url + f"&ssl_ca_certs={self.ca.ca_file}", socket_timeout=1
            ) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA.make(tmp_path_factory.mktemp("redis-tls"))


@pytest.fixture(scope="module")
def tls_redis(ca: TestCA) -> Iterator[TlsRedis]:
    server = TlsRedis(redis_binary(), ca)
    yield server
    server.stop()


async def test_rediss_reaches_the_server_with_the_ca_and_not_without(
    ca: TestCA, tls_redis: TlsRedis
) -> None:
    trusting = RedisStore(tls_redis.url, ca_certs=ca.ca_file)
    assert trusting.target.tls
    assert await trusting.server.ping()
    assert await trusting.claim("rediss-key", "gen-1") is None  # free: claimed now
    assert await trusting.claim("rediss-key", "gen-2") == "gen-1"
    await trusting.close()
    # The system's CAs do not know the test's: the certificate is refused.
    stranger = RedisStore(tls_redis.url)
    assert not await stranger.server.ping()
    await stranger.close()
    # Without its client certificate the server refuses the gateway.
    anonymous = RedisStore(f"rediss://127.0.0.1:{tls_redis.port}/0", ca_certs=ca.ca_file)
    assert not await anonymous.server.ping()
    await anonymous.close()


def test_two_gateway_replicas_share_a_key_over_rediss(ca: TestCA, tls_redis: TlsRedis) -> None:
    sim = Process("simulate", "--itl-ms", "1")
    serve = ("serve", "--upstream", sim.url, "--redis", tls_redis.url)
    replicas = [Process(*serve, "--redis-ca-certs", ca.ca_file) for _ in range(2)]
    try:
        body = {
            "model": "sim-llama-8b",
            "messages": [{"role": "user", "content": "over rediss"}],
            "max_tokens": 5,
        }
        key = {"Idempotency-Key": "over-rediss"}
        answers = [
            httpx2.post(r.url + "/v1/chat/completions", json=body, headers=key, timeout=30)
            for r in (*replicas, *replicas)
        ]
        assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
        assert len({a.json()["choices"][0]["message"]["content"] for a in answers}) == 1
        assert httpx2.get(sim.url + "/stats", timeout=10).json()["generations_started"] == 1
        for r in replicas:
            assert httpx2.get(r.url + "/stats", timeout=10).json()["redis_errors"] == 0
            assert not any(tls_redis.client_key in line for line in r.output)
    finally:
        for r in replicas:
            r.stop()
        sim.stop()


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[Path]:
    """A ``redis-server`` on a local socket only; the socket's path."""
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen(
        [
            *(redis_binary(), "--port", "0", "--unixsocket", str(sock)),
            *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(sock.exists, 10, "the socket")  # made once the server listens on it
        yield sock
    finally:
        proc.terminate()
        proc.wait(10)


async def test_a_unix_socket_url_reaches_redis(unix_redis: Path) -> None:
    store = RedisStore(f"unix://{unix_redis}?db=3", prefix="unix:")
    assert await store.server.ping()
    assert await store.claim("unix-key", "gen-u") is None
    await store.close()
    with redis.Redis(unix_socket_path=str(unix_redis), db=3) as direct:
        assert direct.dbsize() >= 1  # in the database the URL named
