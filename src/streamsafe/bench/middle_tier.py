"""The report's real deployment: llama-stack-client -> Llama Stack -> engine, without streamsafe,
with streamsafe in front of Llama Stack, and with streamsafe behind it.

One :class:`~streamsafe.bench.llamastack.Deployment` (the real Llama Stack server in front of an
engine slot) serves every run; each run installs a fresh simulator (and, behind Llama Stack, a
gateway in front of it) in the slot, drives ``calls`` concurrent calls through unmodified
llama-stack-client with its own retries, and reads what the engine saw from the engine's own
counters.

Positions (see docs/design.md, Positions around Llama Stack):

- ``direct``: client -> Llama Stack -> engine, as the report deployed it.
- ``in-front``: client -> streamsafe (``--upstream-kind llama-stack``) -> Llama Stack -> engine.
- ``behind``: client -> Llama Stack -> streamsafe (``--upstream-kind vllm``) -> engine.

A call counts as exact only if its caller got exactly the text Llama Stack gives for it unloaded
(on the native streamed chat route, Llama Stack drops the engine's last token; that loss is Llama
Stack's and is expected here).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from streamsafe.bench.harness import Workload
from streamsafe.bench.llamastack import Deployment
from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.serving import ServerThread

__all__ = [
    "DEMO_ROWS",
    "FIRST_DEMO_ROW",
    "Api",
    "CallResult",
    "DemoRow",
    "Position",
    "TierLoad",
    "TierResult",
    "call_llama_stack",
    "demo_load",
    "engine_for",
    "expected_answer",
    "gateway_for",
    "run_demo_rows",
    "run_tier",
]

Position = Literal["direct", "in-front", "behind"]
Api = Literal["native", "openai"]


@dataclass(frozen=True)
class TierLoad:
    """``calls`` concurrent chat calls through llama-stack-client: ``api`` ``native``
    (``inference.chat_completion``) or ``openai`` (``chat.completions.create``), streamed or not,
    with the client's ``timeout_s`` (its 60 s default, time-compressed) and ``max_retries`` (its
    default, 2)."""

    calls: int = 32
    prompt_tokens: int = 200
    max_tokens: int = 100
    stream: bool = True
    api: Api = "native"
    timeout_s: float = 3.0
    max_retries: int = 2
    model: str = "sim-llama-8b"

    @property
    def workload(self) -> Workload:
        """The prompts (distinct per call, so no two calls are the same work)."""
        return Workload(self.calls, self.prompt_tokens, self.max_tokens, self.model)

    def messages(self, i: int) -> list[dict[str, Any]]:
        """The messages of call ``i``."""
        messages: list[dict[str, Any]] = self.workload.body(i)["messages"]
        return messages


def engine_for(load: TierLoad, **overrides: Any) -> SimConfig:
    """An engine with room for each call of ``load`` once (prompt plus answer, a few tokens
    spare), so copies of the same calls kill it, running at most half the calls at a time (the
    rest wait in its queue, as a busy vLLM's do): the report's engine, time-compressed."""
    per_call = load.prompt_tokens + load.max_tokens + 8
    base: dict[str, Any] = {
        "model": load.model,
        "memory_tokens": load.calls * per_call,
        "max_num_seqs": max(1, load.calls // 2),
        "itl_ms": 30.0,
        "itl_ms_per_seq": 0.2,
        "prefill_ms_per_token": 0.02,
        "default_max_tokens": load.max_tokens,
    }
    base.update(overrides)
    return SimConfig(**base)


def expected_answer(load: TierLoad, i: int, seed: int = 0) -> str:
    """The text Llama Stack gives call ``i`` unloaded: the engine's text, less its last token on
    the native streamed chat route (Llama Stack drops the token sent with ``finish_reason``)."""
    body = {"model": load.model, "messages": load.messages(i)}
    text = expected_text(body, load.max_tokens, seed)
    if load.api == "native" and load.stream:
        text = text.rsplit(" ", 1)[0] if " " in text else ""
    return text


@dataclass
class CallResult:
    """What one call gave its caller: the text, or the error it raised (its type name), or
    ``in-stream error`` where Llama Stack's masked error arrived as an ordinary chunk."""

    text: str
    error: str | None
    seconds: float


async def call_llama_stack(client: Any, load: TierLoad, i: int) -> CallResult:
    """Make call ``i`` of ``load`` with ``client`` (an ``AsyncLlamaStackClient``) as an
    application would, and return what it got."""
    t0 = time.monotonic()
    parts: list[str] = []
    messages = load.messages(i)
    try:
        if load.api == "native":
            params = {"max_tokens": load.max_tokens}
            if load.stream:
                stream = await client.inference.chat_completion(
                    model_id=load.model, messages=messages, sampling_params=params, stream=True
                )
                async for chunk in stream:
                    event = getattr(chunk, "event", None)
                    if event is None:  # Llama Stack's masked error, read as a chunk
                        return CallResult("".join(parts), "in-stream error", _since(t0))
                    text = getattr(event.delta, "text", None)
                    if text:
                        parts.append(text)
            else:
                response = await client.inference.chat_completion(
                    model_id=load.model, messages=messages, sampling_params=params
                )
                parts.append(str(response.completion_message.content))
        else:
            kwargs = {"model": load.model, "messages": messages, "max_tokens": load.max_tokens}
            if load.stream:
                stream = await client.chat.completions.create(**kwargs, stream=True)
                async for chunk in stream:
                    choices = getattr(chunk, "choices", None)
                    if not choices:
                        return CallResult("".join(parts), "in-stream error", _since(t0))
                    content = choices[0].delta.content
                    if content:
                        parts.append(content)
            else:
                response = await client.chat.completions.create(**kwargs)
                parts.append(str(response.choices[0].message.content))
    except Exception as exc:
        return CallResult("".join(parts), type(exc).__name__, _since(t0))
    return CallResult("".join(parts), None, _since(t0))


def _since(t0: float) -> float:
    return time.monotonic() - t0


@dataclass
class TierResult:
    """One run's figures: what the callers got and what the engine saw."""

    position: Position
    load: TierLoad
    exact: int
    wrong_text: int
    errors: dict[str, int]
    engine_requests: int
    #: Requests Llama Stack sent behind it marked as its own retries (``x-stainless-retry-count``
    #: >= 1): its upstream client retries a failed or slow-to-connect engine call by itself.
    llama_stack_retries: int
    engine_generations: int
    engine_crashes: int
    engine_aborted: int
    tokens_unread: int
    memory_peak_tokens: int
    memory_capacity_tokens: int
    gateway: dict[str, Any] | None
    seconds: float

    def row(self) -> dict[str, Any]:
        """The JSON row of the demo report."""
        return {
            "position": self.position,
            "api": self.load.api,
            "stream": self.load.stream,
            "calls": self.load.calls,
            "exact": self.exact,
            "wrong_text": self.wrong_text,
            "errors": self.errors,
            "engine_requests": self.engine_requests,
            "llama_stack_retries": self.llama_stack_retries,
            "engine_generations": self.engine_generations,
            "engine_crashes": self.engine_crashes,
            "engine_aborted": self.engine_aborted,
            "tokens_unread": self.tokens_unread,
            "memory_peak_tokens": self.memory_peak_tokens,
            "memory_capacity_tokens": self.memory_capacity_tokens,
            "gateway_attached": (self.gateway or {}).get("attached"),
            "gateway_breaker_open": (self.gateway or {}).get("breaker_open"),
            "seconds": round(self.seconds, 2),
        }


def gateway_for(load: TierLoad, position: Position, **overrides: Any) -> GatewayConfig:
    """The gateway of a position: in front of Llama Stack it speaks Llama Stack's routes and
    keeps the client's connection alive (a heartbeat well inside the client's timeout); behind
    it, it speaks vLLM's and collapses a client's retry that Llama Stack sends as a fresh call."""
    heartbeat = max(0.05, load.timeout_s / 4)
    base: dict[str, Any] = {
        "upstream": "http://placeholder",
        "heartbeat": heartbeat,
        "grace": load.timeout_s * 5,
        "queue_size": load.calls * 4,
        "queue_timeout": load.timeout_s * 30,
    }
    if position == "in-front":
        base["upstream_kind"] = "llama-stack"
    else:
        base["upstream_kind"] = "vllm"
        base["collapse_identical"] = True
    base.update(overrides)
    return GatewayConfig(**base)


@contextlib.contextmanager
def _position(
    deployment: Deployment, position: Position, sim: Simulator, gateway: GatewayConfig | None
) -> Iterator[tuple[str, Callable[[], dict[str, Any]] | None]]:
    """Arrange ``position`` around the deployment's Llama Stack; yield where callers connect and
    how to read the gateway's ``/stats`` (if there is a gateway)."""
    if position == "direct":
        deployment.install(sim)
        yield deployment.url, None
    elif position == "in-front":
        assert gateway is not None
        deployment.install(sim)
        # Its own process, as deployed: the callers' load in this process must not starve it.
        with _gateway_process(replace(gateway, upstream=deployment.url)) as url:

            def stats() -> dict[str, Any]:
                import httpx2

                doc: dict[str, Any] = httpx2.get(url + "/stats", timeout=10).json()
                return doc

            yield url, stats
    else:
        assert gateway is not None
        with ServerThread(sim) as engine:
            gw = Gateway(replace(gateway, upstream=engine.url))
            deployment.install(gw)
            try:
                yield deployment.url, gw.stats
            finally:
                deployment.install(Simulator(SimConfig(model=sim.config.model)))


def _serve_gateway(config: GatewayConfig, port: int) -> None:
    """The body of a gateway process (see :func:`_gateway_process`)."""
    from streamsafe.serving import run_server

    run_server(Gateway(config), port=port, log_level="warning")


@contextlib.contextmanager
def _gateway_process(config: GatewayConfig) -> Iterator[str]:
    """A gateway with ``config`` in a child process on a free loopback port; its URL."""
    import multiprocessing

    import httpx2

    from streamsafe.serving import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    port: int = sock.getsockname()[1]
    sock.close()
    proc = multiprocessing.get_context("spawn").Process(
        target=_serve_gateway, args=(config, port), daemon=True
    )
    proc.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(url + "/health", timeout=2).status_code == 200:
                    break
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway process did not start")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


@contextlib.asynccontextmanager
async def _client(base_url: str, load: TierLoad) -> AsyncIterator[Any]:
    import httpx
    from llama_stack_client import AsyncLlamaStackClient

    client = AsyncLlamaStackClient(
        base_url=base_url,
        timeout=httpx.Timeout(load.timeout_s, connect=load.timeout_s),
        max_retries=load.max_retries,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=load.calls * 4)),
    )
    try:
        yield client
    finally:
        await client.close()


async def run_tier(
    deployment: Deployment,
    position: Position,
    load: TierLoad,
    engine: SimConfig | None = None,
    gateway: GatewayConfig | None = None,
    *,
    drain_s: float | None = None,
) -> TierResult:
    """Drive ``load`` through ``position`` on a fresh engine (default :func:`engine_for`) and,
    where the position has one, a fresh gateway (default :func:`gateway_for`); wait for the
    engine to finish what it still holds (at most ``drain_s``, default 20 client timeouts or
    60 s) and for Llama Stack to go quiet (at most 30 s), and return the figures. ``seconds``
    is the time until the last caller had its answer or error."""
    sim = Simulator(engine or engine_for(load))
    if position != "direct" and gateway is None:
        gateway = gateway_for(load, position)
    t0 = time.monotonic()
    with _position(deployment, position, sim, gateway) as (url, gateway_stats):
        async with _client(url, load) as client:
            results = await asyncio.gather(
                *(call_llama_stack(client, load, i) for i in range(load.calls))
            )
        seconds = time.monotonic() - t0
        # What Llama Stack still does for callers that left (finishing non-streaming calls,
        # retrying failed engine calls after a backoff) counts for this run, and must not land
        # on the next run's engine: wait until the engine is idle and Llama Stack quiet.
        limit = drain_s if drain_s is not None else max(60.0, load.timeout_s * 20)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            st = sim.stats()
            if st["engine_dead"] or (st["active"] == 0 and st["waiting"] == 0):
                break
            await asyncio.sleep(0.05)
        await asyncio.to_thread(deployment.quiesce, 2.5, 30.0)
        stats = sim.stats()
        gw_stats = gateway_stats() if gateway_stats is not None else None
        ls_retries = sum(
            1 for r in deployment.slot.seen if r.headers.get("x-stainless-retry-count", "0") != "0"
        )
    exact = wrong = 0
    errors: Counter[str] = Counter()
    for i, result in enumerate(results):
        if result.error is not None:
            errors[result.error] += 1
        elif result.text == expected_answer(load, i, sim.config.seed):
            exact += 1
        else:
            wrong += 1
    return TierResult(
        position=position,
        load=load,
        exact=exact,
        wrong_text=wrong,
        errors=dict(errors),
        engine_requests=stats["requests_received"],
        llama_stack_retries=ls_retries,
        engine_generations=stats["generations_started"] - stats["continuations"],
        engine_crashes=stats["crashes"],
        engine_aborted=stats["generations_aborted"],
        tokens_unread=stats["tokens_unread"],
        memory_peak_tokens=stats["memory_peak_tokens"],
        memory_capacity_tokens=stats["memory_capacity_tokens"],
        gateway=gw_stats,
        seconds=seconds,
    )


@dataclass(frozen=True)
class DemoRow:
    """One middle-tier row of ``streamsafe demo``."""

    name: str
    position: Position
    stream: bool
    claim: str
    json_keepalive: bool = False


#: The demo's middle-tier rows: the report's deployment as it was, then with streamsafe.
DEMO_ROWS = (
    DemoRow(
        "7. llama-stack-client -> Llama Stack, non-streamed",
        "direct",
        False,
        "the report's storm: copies pile up, the engine dies",
    ),
    DemoRow(
        "8. llama-stack-client -> Llama Stack, streamed",
        "direct",
        True,
        "no copies, but callers time out mid-stream",
    ),
    DemoRow(
        "9. ... -> streamsafe -> Llama Stack, streamed",
        "in-front",
        True,
        "heartbeats: every caller gets its text, one generation each",
    ),
    DemoRow(
        "10. ... -> streamsafe (json keep-alive) -> Llama Stack, non-streamed",
        "in-front",
        False,
        "no timeouts, no copies: every caller gets its text",
        json_keepalive=True,
    ),
)


def demo_load(quick: bool) -> TierLoad:
    """The demo's load: 32 calls with a 2 s client timeout (16 and 1 s with ``quick``), each
    answer taking longer than the timeout once the engine's queue is in the way."""
    if quick:
        return TierLoad(calls=16, max_tokens=30, timeout_s=1.0)
    return TierLoad(calls=32, max_tokens=70, timeout_s=2.0)


#: The number of the first middle-tier row in the demo (after the six simulator scenarios).
FIRST_DEMO_ROW = 7


async def run_demo_rows(
    quick: bool,
    *,
    only: list[int] | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Start Llama Stack once, run the :data:`DEMO_ROWS` rows (all, or those numbered in
    ``only``) on a fresh engine each, and return the rows (see :meth:`TierResult.row`, plus
    ``name``, ``claim`` and Llama Stack's ``startup_s``)."""
    specs = [
        spec for number, spec in enumerate(DEMO_ROWS, FIRST_DEMO_ROW) if not only or number in only
    ]
    if not specs:
        return []
    from streamsafe.bench.llamastack import llama_stack_deployment

    base = demo_load(quick)
    engine = engine_for(base, itl_ms=40.0)
    rows: list[dict[str, Any]] = []
    with llama_stack_deployment(Simulator(engine), base.model) as deployment:
        for spec in specs:
            load = replace(base, stream=spec.stream)
            gateway = None
            if spec.position != "direct":
                gateway = gateway_for(load, spec.position, json_keepalive=spec.json_keepalive)
            result = await run_tier(deployment, spec.position, load, engine, gateway)
            row = {"name": spec.name, "claim": spec.claim, **result.row()}
            row["startup_s"] = round(deployment.ls.startup_s or 0.0, 2)
            rows.append(row)
            if on_done is not None:
                on_done(row)
    return rows
