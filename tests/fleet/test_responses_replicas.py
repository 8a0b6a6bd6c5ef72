"""Responses streams found by their response id where replicas share Redis (issue 33, row 1):
the index is each replica's own, as the look-up by reading logs was (it scanned what the replica
held): a replica finds the streams it runs and those it mirrors (a caller of its own attached to
one another replica runs), named as their first event reaches it; any other id is passed through
to the server. Two gateways in this process share the session's redis-server, in front of
:class:`~streamsafe_bench.responses_upstream.ResponsesUpstream`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx2
import orjson
import pytest
from fleet_helpers import RedisProcess

from server_stops import stop_later
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from streamsafe_bench.responses_upstream import ResponsesUpstream, answer_input

pytestmark = pytest.mark.timeout(60)


def events(body: bytes) -> list[tuple[str | None, bytes]]:
    return [(e.id, e.raw) for e in SSEDecoder().feed(body)]


@pytest.fixture
def two_replicas(redis_server: RedisProcess) -> Iterator[tuple[ResponsesUpstream, list[str]]]:
    upstream = ResponsesUpstream()
    up = ServerThread(upstream).start()
    servers = []
    try:
        for _ in range(2):
            config = GatewayConfig(
                upstream=up.url, upstream_kind="ogx", redis_url=redis_server.url, lease=1.0
            )
            servers.append(ServerThread(Gateway(config)).start())
        yield upstream, [s.url for s in servers]
    finally:
        stop_later(*servers, up)


def test_a_replica_finds_a_response_it_mirrors_and_passes_through_one_it_does_not(
    two_replicas: tuple[ResponsesUpstream, list[str]],
) -> None:
    upstream, (a, b) = two_replicas
    key = {"idempotency-key": f"resp-{uuid.uuid4()}"}
    body = {"model": "m", "input": answer_input(20, 8), "stream": True}
    first = httpx2.post(a + "/v1/responses", json=body, headers=key, timeout=10)
    response_id = orjson.loads(SSEDecoder().feed(first.content)[0].data)["response"]["id"]
    # B neither runs nor mirrors it: the server's to answer, as before the index.
    assert httpx2.get(f"{b}/v1/responses/{response_id}?stream=true", timeout=10).status_code == 404
    # A caller of B sends the key again: B mirrors A's generation, and finds it by its id.
    again = httpx2.post(b + "/v1/responses", json=body, headers=key, timeout=10)
    assert events(again.content) == events(first.content)  # the same events, heartbeats aside
    r = httpx2.get(f"{b}/v1/responses/{response_id}?stream=true&starting_after=5", timeout=10)
    assert r.status_code == 200
    assert [orjson.loads(e.data)["sequence_number"] for e in SSEDecoder().feed(r.content)] == list(
        range(6, 23)
    )
    assert upstream.started == 1
