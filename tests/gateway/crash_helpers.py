"""The machinery of the crash-test scenarios (test_crash_faults.py): a :class:`Lab` that starts
simulators and gateways as real processes (with the gateway's default flags) and stops them, a
streaming openai call that records how it ended (:class:`Call`), and the gateway's own routes
read from asyncio.

Every scenario of the module runs at once on one event loop, so blocking work (starting a
process, reading a simulator's ``/stats``) goes to a thread."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from engine_process import EngineProcess

from streamsafe_bench.processes import ServerProcess
from waiting import poll_async

#: Processes started at once: each costs about a core for a second while it imports, and the
#: machine has two; the scenarios started first (the longest) get theirs first.
STARTS_AT_ONCE = 4


@dataclass
class Call:
    """How one streaming call ended, as its caller saw it."""

    #: The content received, in order.
    text: str = ""
    #: Content chunks received.
    chunks: int = 0
    #: The ``model`` of every chunk.
    models: set[str] = field(default_factory=set)
    #: Seconds from the call to its end (or to giving up on it).
    seconds: float = 0.0
    #: When it ended (``time.monotonic()``).
    ended_at: float = 0.0
    #: The stream ended with ``[DONE]`` and no error.
    done: bool = False
    #: What went wrong, in words (``None``: nothing).
    error: str | None = None
    #: The gateway said what went wrong: an error status before the stream began, or an error
    #: event in it (not a dropped connection, not a caller that gave up waiting).
    clear: bool = False
    #: The status of an error answered before the stream began.
    status: int | None = None
    #: That error's ``Retry-After``.
    retry_after: str | None = None


def client(gateway: ServerProcess) -> openai.AsyncOpenAI:
    """An openai client of ``gateway`` that never retries and never times out first: every
    bound in these tests is the gateway's, or the scenario's own limit."""
    return openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=300.0
    )


def chat(model: str, content: str, max_tokens: int) -> dict[str, Any]:
    """A streaming chat request's body."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
    }


async def stream_chat(
    api: openai.AsyncOpenAI,
    body: dict[str, Any],
    limit: float,
    on_chunk: Callable[[int], None] | None = None,
) -> Call:
    """Make the streaming call ``body`` and record how it ended, giving up after ``limit``
    seconds. ``on_chunk(n)`` is told the count of content chunks as each arrives."""
    call = Call()
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            stream = await api.chat.completions.create(**body)
            async for chunk in stream:
                call.models.add(chunk.model)
                for choice in chunk.choices:
                    if choice.delta.content:
                        call.text += choice.delta.content
                        call.chunks += 1
                        if on_chunk is not None:
                            on_chunk(call.chunks)
            call.done = True
    except TimeoutError:
        call.error = f"no end within {limit:g} s"
    except openai.APIStatusError as exc:
        call.error, call.clear = f"status {exc.status_code}: {exc.message}", True
        call.status = exc.status_code
        call.retry_after = exc.response.headers.get("retry-after")
    except openai.APIConnectionError as exc:
        call.error = f"connection: {type(exc).__name__}: {exc}"
    except openai.APIError as exc:  # an error event in the stream
        call.error, call.clear = f"error event: {exc.message} {exc.body}", True
    call.ended_at = time.monotonic()
    call.seconds = call.ended_at - started
    return call


async def eventually(check: Callable[[], Awaitable[Any]], within: float, every: float = 0.1) -> Any:
    """The first truthy value of ``await check()``, asked every ``every`` s; the last (falsy)
    one if none came within ``within`` s (the scenario records it; its test says what it
    expected)."""
    return await poll_async(check, within, every)


async def get(url: str) -> httpx2.Response | None:
    """``GET url`` (``None`` where nothing answered within 5 s: a load balancer's health
    check would have given up too)."""
    try:
        async with httpx2.AsyncClient(timeout=5.0) as http:
            return await http.get(url)
    except httpx2.HTTPError:
        return None


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    """``POST url`` with ``body``: (status, the JSON answer)."""
    async with httpx2.AsyncClient(timeout=10.0) as http:
        response = await http.post(url, json=body)
    return response.status_code, response.json()


async def ready_status(gateway: ServerProcess) -> int | None:
    """The gateway's ``/ready`` status (``None``: no answer within 5 s)."""
    response = await get(gateway.url + "/ready")
    return None if response is None else response.status_code


async def stats(engine: EngineProcess) -> dict[str, Any]:
    """A simulator's ``/stats`` (it answers through every outage; not while frozen)."""
    return await asyncio.to_thread(engine.stats)


def engine_samples(metrics_text: str, url: str) -> dict[str, float]:
    """The per-engine samples of ``/metrics`` labelled ``engine="url"``, by name."""
    label = f'engine="{url}"'
    found: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("#") or label not in line:
            continue
        name, _, value = line.rpartition(" ")
        found[name.partition("{")[0]] = float(value)
    return found


class Lab:
    """Starts the processes of every scenario a few at a time (:data:`STARTS_AT_ONCE`)."""

    def __init__(self) -> None:
        self.starts = asyncio.Semaphore(STARTS_AT_ONCE)

    @contextlib.asynccontextmanager
    async def rig(self) -> AsyncIterator[Rig]:
        """One scenario's processes, all killed when it exits."""
        rig = Rig(self.starts)
        try:
            yield rig
        finally:
            await asyncio.to_thread(rig.kill)


class Rig:
    """One scenario's simulators and gateway. Killed at its end (SIGKILL: nothing of theirs is
    checked after, and a drain would only cost time)."""

    def __init__(self, starts: asyncio.Semaphore) -> None:
        self._starts = starts
        self._engines: list[EngineProcess] = []
        self._gateways: list[ServerProcess] = []

    async def engine(self, *args: str) -> EngineProcess:
        """``streamsafe simulate ARGS`` (fast timings unless ARGS say otherwise)."""
        engine = EngineProcess(*args)
        self._engines.append(engine)
        async with self._starts:
            return await asyncio.to_thread(engine.start)

    async def gateway(self, *upstreams: str, extra: tuple[str, ...] = ()) -> ServerProcess:
        """``streamsafe serve`` with one ``--upstream`` per entry and nothing else but
        ``extra`` (what the topology needs): every other setting is the default."""
        args = ["serve"]
        for upstream in upstreams:
            args += ["--upstream", upstream]
        async with self._starts:
            gateway = await asyncio.to_thread(ServerProcess, *args, *extra)
        self._gateways.append(gateway)
        return gateway

    def kill(self) -> None:
        """Kill the gateways, then the simulators."""
        for gateway in self._gateways:
            gateway.kill()
        for engine in self._engines:
            if engine.proc is not None:
                engine.kill()
                if engine.proc.stdout is not None:
                    engine.proc.stdout.close()
