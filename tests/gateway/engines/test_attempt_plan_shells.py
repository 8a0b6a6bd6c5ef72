"""The shells consult the generation's one plan (gateway/engines/attempt_plan.py): a refused
connection is an outcome the plan turns into "the same engine after the backoff", not a loop
inside the connection; one ask sends one request, and the relay's one loop asks again; the
history the plan keeps counts each request."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from streamsafe.gateway.admission.admission import Admission
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.engines.attempt_plan import AskKind, Outcome
from streamsafe.gateway.engines.attempts import AskAgain, Attempts
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.pool import EngineSpec
from streamsafe.gateway.errors import Failure
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.relay.relay import Relay
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.server import bind_socket

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

pytestmark = pytest.mark.timeout(30)


def _refusing_url() -> str:
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    return f"http://127.0.0.1:{port}"


def _engines(*urls: str, connect_retries: int = 2) -> tuple[Engines, list[float]]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    engines = Engines(
        [EngineSpec(url) for url in urls], connect_retries=connect_retries, sleep=sleep
    )
    return engines, slept


def _generation() -> Generation:
    """A fresh streamed chat generation for model ``m``."""
    body = b'{"model": "m"}'
    request = GenerationRequest("t", "/v1/chat/completions", body, b"fp", 1, True, route=CHAT)
    return Generation("gen-1", request, MemoryEventLog(), None)


def _attempts(engines: Engines) -> Attempts:
    """The attempts of a fresh generation for model ``m`` on ``engines``."""
    gen = _generation()
    return Attempts(engines, gen.request.body, 1, gen, Counters())


class _Owner:
    """An owner that moves each generation to its end (as the registry's does)."""

    def end(self, gen: Generation, state: State, failure: Failure | None = None) -> None:
        gen.end(state, failure)

    def refused(self, gen: Generation) -> None:
        pass


async def _run(engines: Engines, *, no_upstream_retry: bool = False) -> Generation:
    """One generation run to its end by the relay's loop on ``engines``, with the defaults."""
    gen = _generation()
    if no_upstream_retry:
        gen.request = dataclasses.replace(gen.request, no_upstream_retry=True)
    admission = Admission(
        max_inflight=None, max_memory_tokens=None, queue_size=10, queue_timeout=5.0
    )
    relay = Relay(GatewayConfig(), admission, engines, Counters(), _Owner())
    await relay.run(gen)
    return gen


async def test_one_ask_sends_one_request_and_leaves_the_next_to_the_loop() -> None:
    engines, slept = _engines(_refusing_url())
    try:
        attempts = _attempts(engines)
        asked = await attempts.open_stream("/v1/chat/completions", b'{"model": "m"}', b"")
        assert isinstance(asked, AskAgain)
        assert asked.delay == 0.05  # the plan's backoff, for the loop to wait
        assert [a.kind for a in attempts.plan.history] == [AskKind.FIRST]
        assert slept == []
        asked = await attempts.open_stream("/v1/chat/completions", b'{"model": "m"}', b"")
        assert isinstance(asked, AskAgain) and asked.delay == 0.1
        assert [a.kind for a in attempts.plan.history] == [
            AskKind.FIRST,
            AskKind.CONNECT_RETRY,
        ]
        assert engines.first.upstream.requests == 1  # a connect retry repeats the attempt
    finally:
        await engines.close()


async def test_a_refused_connection_is_retried_by_the_plan_then_the_engine_held_down() -> None:
    engines, slept = _engines(_refusing_url())
    try:
        gen = await _run(engines)
        assert gen.state is State.FAILED
        assert gen.failure is not None and gen.failure.status == 503
        plan = gen.plan
        assert plan is not None
        assert [a.kind for a in plan.history] == [
            AskKind.FIRST,
            AskKind.CONNECT_RETRY,
            AskKind.CONNECT_RETRY,
        ]
        assert {a.outcome for a in plan.history} == {Outcome.NOT_CONNECTED}
        assert slept == [0.05, 0.1]  # the plan's backoff, waited by the relay's loop
        upstream = engines.first.upstream
        assert upstream.connect_retries_done == 2 and upstream.breaker.held
        assert upstream.requests == 1  # one attempt, however many connects (its metric)
    finally:
        await engines.close()


async def test_no_connect_retry_where_the_request_says_none_and_the_next_engine_is_asked() -> None:
    engines, slept = _engines(_refusing_url(), _refusing_url())
    try:
        gen = await _run(engines, no_upstream_retry=True)
        assert gen.state is State.FAILED
        assert gen.plan is not None
        history = gen.plan.history
        assert [a.kind for a in history] == [AskKind.FIRST, AskKind.FAILOVER]
        assert {a.engine for a in history} == {e.upstream.base_url for e in engines.shells}
        assert slept == []
        assert gen.plan.summary() == "failover"
    finally:
        await engines.close()


async def test_a_wait_before_asking_again_keeps_the_round_s_first_token_bound() -> None:
    # An engine answers 500 and says to come back in a second (a same-engine retry): the wait
    # runs under the round's first-token bound, which passes first, so the engine is not asked
    # a second time and the caller gets the stall, not a second request.
    asked = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal asked
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        asked += 1
        body = b'{"error": {"message": "busy", "type": "InternalServerError", "code": 500}}'
        writer.write(
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
            b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engines = Engines([EngineSpec(f"http://127.0.0.1:{port}")], kind="vllm")
    try:
        gen = _generation()
        admission = Admission(
            max_inflight=None, max_memory_tokens=None, queue_size=10, queue_timeout=5.0
        )
        config = GatewayConfig(first_token_timeout=0.3)
        relay = Relay(config, admission, engines, Counters(), _Owner())
        await relay.run(gen)
        assert gen.state is State.FAILED
        assert gen.failure is not None and gen.failure.status == 504, gen.failure
        assert asked == 1
        assert gen.plan is not None and gen.plan.asks == 1
    finally:
        await engines.close()
        server.close()
        await server.wait_closed()
