"""Real servers for the fleet tests: ``redis-server`` and ``streamsafe`` processes (from
:mod:`streamsafe_bench.processes`). When ``redis-server`` is missing, tests that need it fail in
CI (the ``CI`` environment variable is set) and are skipped elsewhere; Debian and Ubuntu ship it
as the package ``redis-server``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest

from streamsafe.gateway.generations.finder import claim_key
from streamsafe.gateway.replicas.store_redis import RedisStore
from streamsafe_bench.processes import RedisClusterServers as RedisClusterProcesses
from streamsafe_bench.processes import RedisServer as RedisProcess
from streamsafe_bench.processes import ServerProcess as Process

__all__ = [
    "MODEL",
    "Process",
    "RedisClusterProcesses",
    "RedisProcess",
    "chat_body",
    "claim_name",
    "key_names",
    "redis_binary",
    "sse_events",
    "whole_text",
]

MODEL = "sim-llama-8b"


def chat_body(content: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    """A chat request to the simulator's model."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def sse_events(response: httpx2.Response) -> Iterator[tuple[int, bytes]]:
    """(id, data) of each event of a streamed response, as it is read (-1 before any id)."""
    event_id = -1
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            yield event_id, line[6:].encode()


def whole_text(got: list[tuple[int, bytes]]) -> str:
    """The answer ``got`` holds; fails on an error event or anything after one ``[DONE]``."""
    datas = [data for _, data in got]
    assert datas.count(b"[DONE]") == 1 and datas[-1] == b"[DONE]", datas[-4:]
    parts = []
    for data in datas[:-1]:
        payload = json.loads(data)
        assert "error" not in payload, payload
        parts.append(payload["choices"][0]["delta"].get("content") or "")
    return "".join(parts)


def key_names(secret: str | None = None, cluster: bool = False) -> RedisStore:
    """A store that names the keys of a gateway's Redis (default prefix, ``secret``; on a Redis
    Cluster where ``cluster``): its ``*_key`` functions, so that the schema is the store's,
    never the tests'. It never connects."""
    if cluster:
        return RedisStore("redis+cluster://127.0.0.1:1", secret=secret)
    return RedisStore("redis://127.0.0.1:1/0", secret=secret)


def claim_name(
    idempotency_key: str,
    secret: str | None = None,
    tenant: str = "anonymous",
    cluster: bool = False,
) -> str:
    """The Redis key of the claim a gateway (default prefix, ``secret``, on a cluster where
    ``cluster``) holds for a request with this Idempotency-Key, as the store names it."""
    req: Any = SimpleNamespace(tenant=tenant, idempotency_key=idempotency_key)
    return key_names(secret, cluster).claim_key(claim_key(req) or "")


def redis_binary() -> str:
    """The redis-server binary, or fail (CI) / skip (elsewhere) the test that needs it."""
    found = shutil.which("redis-server")
    if found is None:
        msg = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return found
