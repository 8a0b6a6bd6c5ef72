"""Responses streams found by their response id (issue 33, row 1): a resume
(``GET /v1/responses/{id}?stream=true``) or a cancel finds its stream through the generation
index, from the id its first event named, so a look-up reads no kept log (it decoded every kept
log of the tenant on the event loop, for any id anyone asked, stalling every stream); the entry
lives as long as the generation is held, and one tenant never finds another's. In front of
:class:`~streamsafe_bench.responses_upstream.ResponsesUpstream`, a server in OGX's shape."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson
from gateway_helpers import wait_for

from server_stops import stop_later
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.generation_index import GenerationIndex
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.response_ids import note_first_event
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from streamsafe_bench.responses_upstream import ResponsesUpstream, answer_input

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

RESPONSES = KINDS["ogx"].route("/v1/responses")


@dataclass
class Stack:
    upstream: ResponsesUpstream
    gw: Gateway
    url: str

    def respond(self, input_: str = "hi", key: str | None = None) -> list[dict[str, Any]]:
        """The events of one streamed response, read to its end."""
        body = {"model": "m", "input": input_, "stream": True}
        r = httpx2.post(self.url + "/v1/responses", json=body, headers=auth(key), timeout=10)
        assert r.status_code == 200, r.text
        return [orjson.loads(ev.data) for ev in SSEDecoder().feed(r.content)]

    def resume(self, response_id: str, after: int | None = None, key: str | None = None) -> Any:
        query = "stream=true" + ("" if after is None else f"&starting_after={after}")
        url = f"{self.url}/v1/responses/{response_id}?{query}"
        return httpx2.get(url, headers=auth(key), timeout=10)

    def cancel(self, response_id: str, key: str | None = None) -> Any:
        url = f"{self.url}/v1/responses/{response_id}/cancel"
        return httpx2.post(url, headers=auth(key), timeout=10)


def auth(key: str | None) -> dict[str, str]:
    return {} if key is None else {"authorization": f"Bearer {key}"}


@contextlib.contextmanager
def responses_stack(**config: Any) -> Iterator[Stack]:
    upstream = ResponsesUpstream()
    up = ServerThread(upstream).start()
    try:
        gw = Gateway(GatewayConfig(upstream=up.url, upstream_kind="ogx", **config))
        server = ServerThread(gw).start()
    except BaseException:
        up.stop()
        raise
    try:
        yield Stack(upstream, gw, server.url)
    finally:
        stop_later(server, up)


class CountingLog:
    """A kept generation's log that counts the reads of it through :meth:`read` (how a log is
    read where it may be networked: the look-up's way; a subscriber here, and the access log's
    look at the last events, read without a coroutine, uncounted)."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.reads = 0

    async def read(self, start: int) -> list[bytes]:
        self.reads += 1
        return list(await self.log.read(start))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.log, name)


def count_reads(gw: Gateway) -> dict[str, CountingLog]:
    """Every generation the gateway holds (all finished), its log counting reads."""
    counting = {}
    for gen in gw.registry.generations:
        assert gen.finished
        gen.log = counting[gen.response_id or gen.id] = CountingLog(gen.log)  # type: ignore[assignment]
    return counting


def test_a_look_up_of_an_id_nobody_holds_reads_no_kept_log() -> None:
    with responses_stack() as s:
        ids = [s.respond(answer_input(40, 8))[0]["response"]["id"] for _ in range(3)]
        logs = count_reads(s.gw)
        assert sorted(logs) == sorted(ids)
        assert s.resume("resp_nobody_has").status_code == 404  # the server's answer
        assert s.cancel("resp_nobody_has").status_code == 404
        assert s.upstream.passed[-2:] == [
            ("GET", "/v1/responses/resp_nobody_has"),
            ("POST", "/v1/responses/resp_nobody_has/cancel"),
        ]
        assert [log.reads for log in logs.values()] == [0, 0, 0]
        # A resume of one reads that one's log alone.
        r = s.resume(ids[0], after=10)
        assert r.status_code == 200
        assert orjson.loads(SSEDecoder().feed(r.content)[0].data)["sequence_number"] == 11
        assert logs[ids[1]].reads == logs[ids[2]].reads == 0 < logs[ids[0]].reads


def test_a_response_is_found_by_its_id_until_its_generation_is_let_go() -> None:
    with responses_stack(max_kept_generations=1) as s:
        first = s.respond()
        first_id = first[0]["response"]["id"]
        r = s.resume(first_id, after=-1)
        assert r.status_code == 200 and len(SSEDecoder().feed(r.content)) == len(first)
        second_id = s.respond()[0]["response"]["id"]  # evicts the first (one kept)
        assert s.gw.stats()["evicted"] == 1
        tenant = next(iter(s.gw.registry.generations)).tenant
        held = s.gw.registry.generations
        wait_for(lambda: held.by_response(tenant, first_id) is None, what="the first let go")
        assert s.resume(first_id).status_code == 404  # no longer held: the server's to answer
        assert s.cancel(first_id).status_code == 404
        assert s.resume(second_id, after=3).status_code == 200


def test_one_tenant_never_finds_another_s_response() -> None:
    with responses_stack(api_keys=("key-a", "key-b")) as s:
        body = {"model": "m", "input": answer_input(10**4, 8, every=0.01), "stream": True}
        with (
            httpx2.Client(timeout=10) as client,
            client.stream(
                "POST", s.url + "/v1/responses", json=body, headers=auth("key-a")
            ) as live,
        ):
            lines = live.iter_lines()
            first = orjson.loads(next(line for line in lines if line.startswith("data: "))[6:])
            response_id = first["response"]["id"]
            gen = wait_for(
                lambda: s.gw.registry.generations.by_response(gen_tenant(s), response_id)
            )
            # Key b asks for key a's response: not found for it, and pass-through of a route
            # that holds a tenant's data is refused, so a clear 403.
            for r in (s.resume(response_id, key="key-b"), s.cancel(response_id, key="key-b")):
                assert r.status_code == 403
                assert orjson.loads(r.content)["error"]["type"] == "permission_error"
            assert gen.live and not [p for _, p in s.upstream.passed if "responses" in p]
            assert s.gw.registry.generations.by_response("another tenant", response_id) is None
            # Its own tenant cancels it.
            r = s.cancel(response_id, key="key-a")
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
            rest = [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]
            assert rest[-1]["error"]["type"] == "cancelled"
        assert gen.state is State.FAILED


def gen_tenant(s: Stack) -> str:
    """The tenant of the one generation the gateway holds."""
    gens = list(s.gw.registry.generations)
    return gens[0].tenant if gens else ""


def _responses_gen(gen_id: str, tenant: str = "t") -> Generation:
    req = GenerationRequest(tenant, "/v1/responses", b"{}", b"f" * 16, 1, True, route=RESPONSES)
    return Generation(gen_id, req, MemoryEventLog(), None)


def test_the_index_names_a_stream_from_its_first_event_and_forgets_it_with_the_generation() -> None:
    index = GenerationIndex()
    gen, other = _responses_gen("gen-1"), _responses_gen("gen-2", tenant="u")
    index.add(gen)
    index.add(other)
    assert index.by_response("t", "resp_1") is None  # no event yet
    created = b'{"type":"response.created","sequence_number":0,"response":{"id":"resp_1"}}'
    note_first_event(gen, [created, b'{"type":"response.in_progress"}'])
    note_first_event(other, [created.replace(b"resp_1", b"resp_2")])
    assert index.by_response("t", "resp_1") is gen
    assert index.by_response("u", "resp_1") is None  # another tenant's name for nothing
    assert index.by_response("t", "resp_2") is None and index.by_response("u", "resp_2") is other
    index.drop(gen)
    assert index.by_response("t", "resp_1") is None


def test_only_responses_streams_are_named_and_a_stream_that_ended_unnamed_is_let_go() -> None:
    index = GenerationIndex()
    chat_request = GenerationRequest(
        "t", "/v1/chat/completions", b"{}", b"f" * 16, 1, True, route=CHAT
    )
    chat = Generation("gen-c", chat_request, MemoryEventLog(), None)
    note_first_event(chat, [b'{"response":{"id":"resp_c"}}'])
    index.add(chat)
    assert chat.response_id is None and index.by_response("t", "resp_c") is None
    failed = _responses_gen("gen-f")
    index.add(failed)
    note_first_event(failed, [b'{"error":{"message":"no"}}'])  # an error first: no id
    failed.end(State.FAILED)
    assert index.by_response("t", "x") is None
    assert len(index._by_response) == 0  # the unnamed that ended are let go at a look-up
