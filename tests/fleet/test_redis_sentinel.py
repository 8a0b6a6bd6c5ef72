"""Two gateway replicas on a Redis Sentinel group (``--redis redis+sentinel://...``): the
primary is killed -9 while streams run; every stream ends whole, the sentinels promote the
replica, the gateways find it, and a keyed retry after the promotion replays on the other
gateway replica: no key runs a second generation.

A real group: one primary, one replica, three sentinels (quorum 2, down after 500 ms), all
``redis-server`` processes on loopback."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from fleet_helpers import Process, RedisProcess, redis_binary

from streamsafe import AsyncClient, Client, Timeouts
from streamsafe.engine_sim import expected_text
from streamsafe_bench.processes import free_port
from waiting import wait_until

pytestmark = pytest.mark.timeout(120)

MODEL = "sim-llama-8b"
SERVICE = "streamsafe-test"


class SentinelGroup:
    """A primary, a replica of it and three sentinels watching them as :data:`SERVICE`."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.primary = RedisProcess(binary).start()
        args = ("--replicaof", "127.0.0.1", str(self.primary.port))
        self.replica = RedisProcess(binary, args=args).start()
        self._dir = Path(tempfile.mkdtemp(prefix="streamsafe-sentinel-"))
        self.ports = [free_port() for _ in range(3)]
        self.sentinels = [self._sentinel(port) for port in self.ports]

    def _sentinel(self, port: int) -> subprocess.Popen[bytes]:
        conf = self._dir / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self._dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 500\n"
            f"sentinel failover-timeout {SERVICE} 3000\n"
        )
        return subprocess.Popen(
            [self.binary, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._dir,
        )

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def _ask(self, port: int, *command: str) -> Any:
        with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
            return client.execute_command(*command)

    def _settled(self) -> bool:
        """Every sentinel knows the replica and both other sentinels (a failover needs the
        others' votes), and the replica is in sync."""
        try:
            for port in self.ports:
                if len(self._ask(port, "SENTINEL", "REPLICAS", SERVICE)) < 1:
                    return False
                if len(self._ask(port, "SENTINEL", "SENTINELS", SERVICE)) < 2:
                    return False
            info = self._ask(self.replica.port, "INFO", "replication")
        except redis.RedisError:
            return False
        return bool(info.get("master_link_status") == "up")

    def wait_settled(self) -> SentinelGroup:
        wait_until(self._settled, timeout=30, what="the sentinel group to settle")
        return self

    def primary_port(self) -> int | None:
        try:
            _, port = self._ask(self.ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        except redis.RedisError:
            return None
        return int(port)

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.terminate()
        for proc in self.sentinels:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.replica.stop()
        self.primary.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    found = SentinelGroup(redis_binary())
    try:
        yield found.wait_settled()
    finally:
        found.stop()


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "15", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def _serve(sim: Process, url: str) -> Process:
    return Process("serve", "--upstream", sim.url, "--redis", url, "--lease", "1")


def _stats(proc: Process) -> dict[str, Any]:
    return dict(httpx2.get(proc.url + "/stats", timeout=10).json())


def _body(i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"through a failover {i}"}],
        "max_tokens": max_tokens,
    }


async def _streams_through_a_kill(
    replicas: list[Process], bodies: list[dict[str, Any]], kill: Any
) -> list[tuple[str, str, int]]:
    """Each body streamed by the streamsafe client (which resumes a broken stream) from the
    replicas in turn, ``kill()`` called once every stream has sent three chunks; each
    stream's text, Idempotency-Key and the replica it went to."""
    timeouts = Timeouts(connect=5, first_byte=30, idle=30)
    clients = [AsyncClient(base_url=r.url + "/v1", api_key="x", timeout=timeouts) for r in replicas]
    flowing = [asyncio.Event() for _ in bodies]

    async def one(i: int) -> tuple[str, str, int]:
        at = i % len(clients)
        stream = await clients[at].chat.completions.create(**bodies[i], stream=True)
        parts = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                if len(parts) == 3:
                    flowing[i].set()
        assert stream.idempotency_key is not None
        return "".join(parts), stream.idempotency_key, at

    async def killer() -> None:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in flowing)), 30)
        kill()

    try:
        *results, _ = await asyncio.gather(*(one(i) for i in range(len(bodies))), killer())
    finally:
        for client in clients:
            await client.close()
    return list(results)


def test_streams_and_keys_survive_a_sentinel_failover(sim: Process, group: SentinelGroup) -> None:
    replicas = [_serve(sim, group.url), _serve(sim, group.url)]
    try:
        wait_until(lambda: all(not _stats(r)["redis_degraded"] for r in replicas), 20)
        old_primary = group.primary.port
        before = int(_stats(sim)["generations_started"])
        bodies = [_body(i, 150) for i in range(6)]
        results = asyncio.run(_streams_through_a_kill(replicas, bodies, group.primary.kill))
        for body, (text, _, _) in zip(bodies, results, strict=True):
            assert text == expected_text(body, 150, 0)
        # The sentinels promote the replica; both gateways reach it, and write back what they
        # held while Redis was away (a new run id: the last writes of the old primary may be
        # lost, as replication is asynchronous).
        wait_until(lambda: group.primary_port() == group.replica.port, 20, "promotion")
        assert group.replica.port != old_primary
        wait_until(lambda: all(not _stats(r)["redis_degraded"] for r in replicas), 20)
        # A keyed retry on the other gateway replica replays the answer: no second generation.
        for body, (text, key, at) in zip(bodies, results, strict=True):
            with Client(base_url=replicas[1 - at].url + "/v1", api_key="x") as client:
                again = client.chat.completions.create(**body, stream=True, idempotency_key=key)
                assert "".join(c.choices[0].delta.content or "" for c in again if c.choices) == text
        # After the promotion, a live stream's keyed retry on the other replica attaches to it.
        body = _body(99, 60)
        key = "after-the-failover"
        with Client(base_url=replicas[0].url + "/v1", api_key="x") as first_client:
            first = first_client.chat.completions.create(**body, stream=True, idempotency_key=key)
            chunks = iter(first)
            head = [next(chunks) for _ in range(3)]
            with Client(base_url=replicas[1].url + "/v1", api_key="x") as second_client:
                second = second_client.chat.completions.create(
                    **body, stream=True, idempotency_key=key
                )
                attached = "".join(c.choices[0].delta.content or "" for c in second if c.choices)
            rest = list(chunks)
        whole = "".join(c.choices[0].delta.content or "" for c in [*head, *rest] if c.choices)
        assert whole == attached == expected_text(body, 60, 0)
        assert int(_stats(sim)["generations_started"]) == before + len(bodies) + 1
        assert sum(int(_stats(r)["redis_errors"]) for r in replicas) >= 1  # it did fail over
    finally:
        for proc in replicas:
            proc.stop()
