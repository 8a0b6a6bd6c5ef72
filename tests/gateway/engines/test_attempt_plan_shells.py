"""The shells consult the generation's one plan (gateway/engines/attempt_plan.py): a refused
connection is an outcome the plan turns into "the same engine after the backoff", not a loop
inside the connection, and the history it leaves counts each request."""

from __future__ import annotations

import pytest

from streamsafe.gateway.engines.attempt_plan import AskKind, Outcome
from streamsafe.gateway.engines.attempts import Attempts
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.pool import EngineSpec
from streamsafe.gateway.generations.generation import Generation, GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.metrics import Counters
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


def _attempts(engines: Engines) -> Attempts:
    """The attempts of a fresh generation for model ``m`` on ``engines``."""
    body = b'{"model": "m"}'
    request = GenerationRequest("t", "/v1/chat/completions", body, b"fp", 1, True, route=CHAT)
    gen = Generation("gen-1", request, MemoryEventLog(), None)
    return Attempts(engines, body, 1, gen, Counters())


async def test_a_refused_connection_is_retried_by_the_plan_then_the_engine_held_down() -> None:
    engines, slept = _engines(_refusing_url())
    try:
        attempts = _attempts(engines)
        with pytest.raises(OSError):
            await attempts.open_stream("/v1/chat/completions", b'{"model": "m"}', b"")
        plan = attempts.plan
        assert [a.kind for a in plan.history] == [
            AskKind.FIRST,
            AskKind.CONNECT_RETRY,
            AskKind.CONNECT_RETRY,
        ]
        assert {a.outcome for a in plan.history} == {Outcome.NOT_CONNECTED}
        assert slept == [0.05, 0.1]  # the plan's backoff, waited by the shell
        upstream = engines.first.upstream
        assert upstream.connect_retries_done == 2 and upstream.breaker.held
        assert upstream.requests == 1  # one attempt, however many connects (its metric)
    finally:
        await engines.close()


async def test_no_connect_retry_where_the_request_says_none_and_the_next_engine_is_asked() -> None:
    engines, slept = _engines(_refusing_url(), _refusing_url())
    try:
        attempts = _attempts(engines)
        with pytest.raises(OSError):
            await attempts.open_stream(
                "/v1/chat/completions", b'{"model": "m"}', b"", retry_connect=False
            )
        history = attempts.plan.history
        assert [a.kind for a in history] == [AskKind.FIRST, AskKind.FAILOVER]
        assert {a.engine for a in history} == {e.upstream.base_url for e in engines.shells}
        assert slept == []
        assert attempts.plan.summary() == "failover"
    finally:
        await engines.close()
