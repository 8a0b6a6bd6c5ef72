"""The chaos matrix: every engine fault against every client, through the gateway.

Faults: 503 / 429 / 500 before any work, a reset before the headers, a stream cut, a first token
that does not come, a stream that goes silent, a malformed chunk, a stream without ``[DONE]``,
the engine killed (SIGKILL) and frozen (SIGSTOP) mid-stream. Clients: streamsafe, openai and
llama-stack-client, unmodified. For every cell:

- zero duplicate generations: the engine starts one generation per call (continuations, which
  generate only the missing tokens, apart);
- the caller gets exactly the engine's text, or a typed error, never a partial answer that reads
  as complete (where the gateway can repair the fault, exactly the text);
- every call ends within a bound, far below any client's own timeouts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import httpx2
import pytest
from engine_process import EngineProcess, engine_process
from gateway_helpers import MODEL, fast_sim, make_stack, wait_for

from streamsafe.engine_sim import Fault, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread

#: Every call must end within this many seconds (the clients' own timeouts are 30 s).
_CALL_BOUND = 15.0
_MAX_TOKENS = 12

_GATEWAY = {
    "heartbeat": 0.5,
    "grace": 2.0,
    "first_token_timeout": 1.0,
    "idle_timeout": 0.5,
    "total_timeout": 20.0,
    "probe_interval": 0.1,
    "max_continuations": 3,
    "connect_backoff": 0.01,
}

CLIENTS = ("streamsafe", "openai", "llama-stack-client")

#: fault -> simulator fault specs (each hits one request only: what a retry or a continuation
#: meets next is a healthy engine).
_SIM_FAULTS = {
    "503-before-work": "status:503:1:0#1",
    "429-before-work": "status:429:1:0#1",
    "500-before-work": "status:500:1#1",
    "reset-before-headers": "reset:1#1",
    "cut": "cut:5:1#1",
    "stall-first-token": "stall:20:1#1",
    "stall-mid-stream": "hang:4:1#1",
    "malformed-chunk": "malformed:3:1#1",
    "no-done": "nodone:1#1",
}
#: Faults the gateway repairs: every client gets exactly the text. Not a first token past its
#: timeout: the engine that held the request silent is not asked again for it (asking again
#: would wait as long once more, at the back of its queue), so with one engine the caller gets a
#: clear 504 (docs/design.md, Failover).
_REPAIRED = {
    "503-before-work",
    "429-before-work",
    "reset-before-headers",
    "cut",
    "stall-mid-stream",
    "malformed-chunk",
    "no-done",
}


@dataclass
class Outcome:
    text: str | None = None
    error: BaseException | None = None
    seconds: float = 0.0


def _typed(client: str, error: BaseException) -> bool:
    """Whether ``error`` is one of the client's documented error types."""
    if client == "streamsafe":
        from streamsafe.client import StreamsafeError

        return isinstance(error, StreamsafeError)
    if client == "openai":
        import openai

        return isinstance(error, openai.APIError)
    import llama_stack_client

    # llama-stack-client surfaces a stream cut mid-way as httpx's own transport error.
    return isinstance(error, llama_stack_client.APIError | httpx.TransportError)


def _call(client: str, base_url: str, content: str) -> Outcome:
    """One streaming chat call as each client makes it, timed."""
    messages = [{"role": "user", "content": content}]
    started = time.monotonic()
    out = Outcome()
    try:
        if client == "streamsafe":
            from streamsafe.client import Client

            with (
                Client(base_url=base_url + "/v1", api_key="x", timeout=30) as c,
                c.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=_MAX_TOKENS, stream=True
                ) as stream,
            ):
                for _ in stream:
                    pass
                out.text = stream.text
        elif client == "openai":
            import openai

            oc = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=2, timeout=30)
            parts = []
            for chunk in oc.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=_MAX_TOKENS, stream=True
            ):
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
            out.text = "".join(parts)
        else:
            from llama_stack_client import LlamaStackClient

            lc = LlamaStackClient(base_url=base_url, timeout=30, max_retries=2)
            parts = []
            for chunk in lc.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=_MAX_TOKENS, stream=True
            ):
                for choice in chunk.choices or ():
                    parts.append(choice.delta.content or "")
            out.text = "".join(parts)
    except Exception as exc:
        out.error = exc
    out.seconds = time.monotonic() - started
    return out


def _bounded_call(
    client: str, base_url: str, content: str, during: Callable[[], None] | None = None
) -> Outcome:
    """Run the call on a thread (``during`` runs beside it) and insist it ends in the bound."""
    result: list[Outcome] = []
    thread = threading.Thread(target=lambda: result.append(_call(client, base_url, content)))
    thread.start()
    if during is not None:
        during()
    thread.join(_CALL_BOUND)
    assert not thread.is_alive(), f"{client}: the call did not end within {_CALL_BOUND} s"
    return result[0]


def _check(client: str, fault: str, outcome: Outcome, content: str, repaired: bool) -> None:
    expected = expected_text(
        {"model": MODEL, "messages": [{"role": "user", "content": content}]}, _MAX_TOKENS
    )
    if repaired:
        assert outcome.error is None, f"{client} / {fault}: {outcome.error!r}"
    if outcome.error is None:
        assert outcome.text == expected, f"{client} / {fault}: {outcome.text!r}"
    else:
        assert _typed(client, outcome.error), f"{client} / {fault}: {outcome.error!r}"


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("fault", list(_SIM_FAULTS))
def test_engine_faults_through_the_gateway(fault: str, client: str) -> None:
    sim = fast_sim(itl_ms=2.0, faults=(Fault.parse(_SIM_FAULTS[fault]),))
    content = f"chaos {fault} {client}"
    with make_stack(sim, **_GATEWAY) as s:
        outcome = _bounded_call(client, s.url, content)
        _check(client, fault, outcome, content, fault in _REPAIRED)
        stats = s.sim.stats()
        # One generation per call in the engine; what a fault refused before it started is
        # not one, and a continuation generates only the missing tokens.
        assert stats["generations_started"] - stats["continuations"] <= 1, stats


# -- a real engine process: killed and frozen ------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    with engine_process("--itl-ms", "40") as process:
        yield process


def _after_events(gw: Gateway, n: int, action: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        wait_for(lambda: gw.stats()["events_relayed"] >= n, timeout=10, what="events relayed")
        action()

    return run


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("fault", ["engine-killed", "engine-frozen"])
def test_a_dead_or_frozen_engine_through_the_gateway(
    engine: EngineProcess, fault: str, client: str
) -> None:
    if engine.proc is None or engine.proc.poll() is not None:
        engine.start()
    gw = Gateway(GatewayConfig(upstream=engine.url, **_GATEWAY))  # type: ignore[arg-type]
    content = f"chaos {fault} {client}"
    with ServerThread(gw) as server:
        action = engine.kill if fault == "engine-killed" else engine.freeze
        try:
            outcome = _bounded_call(client, server.url, content, _after_events(gw, 3, action))
            _check(client, fault, outcome, content, repaired=False)
            assert outcome.error is not None  # no other engine: the caller must be told
            assert gw.stats()["generations_started"] == 1  # the client did not start another
            # The gateway knows: readiness fails, and new work fails fast instead of hanging.
            wait_for(lambda: gw.stats()["breaker_open"], timeout=10, what="breaker open")
            assert httpx2.get(server.url + "/ready", timeout=10).status_code == 503
        finally:
            if fault == "engine-frozen":
                engine.thaw()
            else:
                engine.start()
        wait_for(lambda: not gw.stats()["breaker_open"], timeout=15, what="breaker closed")
