"""The pieces every end-to-end scenario is made of: a stack of servers on loopback (the engine
simulator, and the gateway where the path has one), a workload of chat requests, and one driver
per client library that sends a request the way an application would and records what came back.

Drivers never retry on their own: whatever retrying happens is the client library's. What the
servers saw (attempts, generations, crashes, memory) is read from their own counters, not
inferred from the client side.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread

__all__ = [
    "ClientKind",
    "Driver",
    "Outcome",
    "PathKind",
    "Stack",
    "Workload",
    "compare_tokens",
    "engine_drained",
    "make_driver",
    "run_stack",
]

ClientKind = Literal["llama-stack-client", "openai", "streamsafe"]
PathKind = Literal["direct", "gateway"]

_FILLER = (
    "Summarise the incident report below for an on-call engineer, in plain words, with the "
    "cause, the impact and the fix. "
)


@dataclass(frozen=True)
class Workload:
    """Many concurrent streaming chats: ``requests`` distinct prompts of about
    ``prompt_tokens`` tokens each, each asking for ``max_tokens`` tokens."""

    requests: int = 48
    prompt_tokens: int = 200
    max_tokens: int = 100
    model: str = "sim-llama-8b"

    def body(self, i: int) -> dict[str, Any]:
        """The request body of logical request ``i`` (distinct per ``i``, so no two requests of
        the workload are the same work)."""
        head = f"Request {i}. "
        text = head + (_FILLER * (1 + self.prompt_tokens * 4 // len(_FILLER)))
        text = text[: max(len(head), self.prompt_tokens * 4 - 16)]
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }


@dataclass
class Outcome:
    """What one logical request gave its caller."""

    ok: bool
    text: str
    seconds: float
    error: str = ""


def compare_tokens(expected: str, got: str) -> tuple[int, int]:
    """(tokens lost, tokens repeated or foreign) of ``got`` against ``expected``, counting the
    simulator's tokens (words with their leading space)."""
    exp = expected.split(" ")
    have = got.split(" ")
    matched = sum(
        block.size
        for block in difflib.SequenceMatcher(a=exp, b=have, autojunk=False).get_matching_blocks()
    )
    return len(exp) - matched, len(have) - matched


@dataclass
class Stack:
    """Servers of one scenario, started by :func:`run_stack`."""

    simulator: Simulator
    sim_server: ServerThread
    gateway: Gateway | None = None
    gateway_server: ServerThread | None = None
    started_at: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        """Where clients send requests: the gateway if there is one, else the engine."""
        server = self.gateway_server or self.sim_server
        return server.url


@contextlib.contextmanager
def run_stack(sim: SimConfig, gateway: GatewayConfig | None) -> Iterator[Stack]:
    """Start the simulator (and the gateway in front of it, if configured); stop both after."""
    simulator = Simulator(sim)
    with ServerThread(simulator) as sim_server:
        if gateway is None:
            yield Stack(simulator, sim_server)
            return
        gw = Gateway(replace(gateway, upstream=sim_server.url))
        with ServerThread(gw) as gw_server:
            yield Stack(simulator, sim_server, gw, gw_server)


Driver = Callable[[dict[str, Any]], Awaitable[Outcome]]


@contextlib.asynccontextmanager
async def make_driver(kind: ClientKind, base_url: str, timeout_s: float) -> Any:
    """An async driver for ``kind`` against ``base_url``: ``await driver(body) -> Outcome``.

    Each library keeps its defaults (retries included) except the timeout, which is the scaled
    equivalent of llama-stack-client's 60 s read timeout for every client alike.
    """
    if kind == "llama-stack-client":
        import httpx
        from llama_stack_client import AsyncLlamaStackClient

        ls = AsyncLlamaStackClient(
            base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=timeout_s)
        )

        async def drive_ls(body: dict[str, Any]) -> Outcome:
            return await _consume(lambda: ls.chat.completions.create(**body))

        try:
            yield drive_ls
        finally:
            await ls.close()
    elif kind == "openai":
        import httpx2
        from openai import AsyncOpenAI

        oa = AsyncOpenAI(
            base_url=base_url + "/v1",
            api_key="demo",
            timeout=httpx2.Timeout(timeout_s, connect=timeout_s),
        )

        async def drive_openai(body: dict[str, Any]) -> Outcome:
            return await _consume(lambda: oa.chat.completions.create(**body))

        try:
            yield drive_openai
        finally:
            await oa.close()
    else:
        from streamsafe.client import AsyncClient, Timeouts

        ss = AsyncClient(
            base_url=base_url + "/v1",
            api_key="demo",
            timeout=Timeouts(connect=timeout_s, first_byte=None, idle=timeout_s),
        )

        async def drive_ss(body: dict[str, Any]) -> Outcome:
            return await _consume(lambda: ss.chat.completions.create(**body))

        try:
            yield drive_ss
        finally:
            await ss.close()


async def _consume(start: Callable[[], Awaitable[Any]]) -> Outcome:
    t0 = time.monotonic()
    parts: list[str] = []
    try:
        stream = await start()
        async for chunk in stream:
            choices = chunk.choices
            if choices:
                content = choices[0].delta.content
                if content:
                    parts.append(content)
    except Exception as exc:
        return Outcome(False, "".join(parts), time.monotonic() - t0, f"{type(exc).__name__}")
    return Outcome(True, "".join(parts), time.monotonic() - t0)


async def drive_workload(
    driver: Driver, workload: Workload, *, spread_s: float = 0.0
) -> list[Outcome]:
    """Send every request of ``workload`` concurrently (starts spread over ``spread_s``)."""

    async def one(i: int) -> Outcome:
        if spread_s:
            await asyncio.sleep(spread_s * i / workload.requests)
        return await driver(workload.body(i))

    return list(await asyncio.gather(*(one(i) for i in range(workload.requests))))


def expected_reply(workload: Workload, i: int, seed: int) -> str:
    """The exact text the simulator generates for logical request ``i``."""
    return expected_text(workload.body(i), workload.max_tokens, seed)


async def engine_drained(simulator: Simulator, limit: float) -> None:
    """Until the engine holds no request (or died), at most ``limit`` seconds: what it still
    runs for callers that left counts for the run that left it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        st = simulator.stats()
        if st["engine_dead"] or (st["active"] == 0 and st["waiting"] == 0):
            return
        await asyncio.sleep(0.05)
