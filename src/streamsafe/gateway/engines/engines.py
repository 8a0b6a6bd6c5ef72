"""The engines behind one gateway: the I/O shell around :class:`~streamsafe.gateway.engines.pool.
Pool` (see docs/design.md, Engine pool).

One upstream is a pool of one engine: the same picks, the same failover, the same breaker per
engine, the same hot stream reader. :class:`Engines` holds one
:class:`~streamsafe.gateway.engines.engine_shell.EngineShell` per engine (its pure view, its
:class:`~streamsafe.gateway.upstream.connection.Upstream`: connections, breaker, health probe;
its load; its refusal gate) and the pool's decisions; each generation gets an
:class:`~streamsafe.gateway.engines.attempts.Attempts`, which is what the relay calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from streamsafe.gateway.engines.answers import Refused, made_refusal
from streamsafe.gateway.engines.attempt_plan import PlanBounds
from streamsafe.gateway.engines.engine_shell import EngineShell
from streamsafe.gateway.engines.pool import Counts, Engine, EngineSpec, Pool
from streamsafe.gateway.engines.refusal_gate import AskLedgers, RefusalGate
from streamsafe.gateway.upstream.capacity import learn_kv_capacity
from streamsafe.gateway.upstream.connection import Upstream
from streamsafe.gateway.upstream.errors import UpstreamError
from streamsafe.retry import RetryBudget

__all__ = ["Engines"]

log = logging.getLogger("streamsafe.gateway")

#: Seconds one ask of an engine's ``/metrics`` may take.
_LEARN_TIMEOUT = 5.0
#: Most seconds between asks of an engine that has not said its KV capacity yet.
_LEARN_EVERY_MAX = 30.0


class Engines:
    """The engines behind one gateway (see the module).

    ``fallbacks`` maps a model to the one that answers when none of its engines can (and a
    context-length 400 to the larger model); ``connect_retries``, ``connect_backoff``,
    ``max_attempts``, ``failover_window``, ``queue_timeout``, ``continuations`` and
    ``total_timeout`` are the bounds of each generation's asks, held in one value,
    :attr:`bounds` (see :class:`~streamsafe.gateway.engines.attempt_plan.PlanBounds` for each
    one's default and why); ``kind`` (default ``auto``: each
    engine is asked what it is at start) is every engine's upstream kind; ``probe_interval`` is
    the seconds between health probes of an engine held down, and its breaker's first cool-down;
    ``answer_refusals`` is ``--engine-refusals answer``.
    """

    def __init__(
        self,
        specs: Sequence[EngineSpec],
        *,
        fallbacks: Mapping[str, str] | None = None,
        connect_timeout: float = 5.0,
        connect_retries: int = 2,
        connect_backoff: float = 0.05,
        max_keepalive: int = 512,
        api_key: str | None = None,
        kind: str = "auto",
        ca_bundle: str | None = None,
        max_attempts: int = 3,
        failover_window: float = 30.0,
        queue_timeout: float = 20.0,
        continuations: int = 5,
        total_timeout: float | None = 600.0,
        probe_interval: float = 1.0,
        answer_refusals: bool = False,
        budget: RetryBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        # Long because of its settings, one a line, each documented in the class docstring;
        # the body builds each engine's upstream and stores the rest where it is read.
        self.budget = budget or RetryBudget()
        upstreams = [
            Upstream(
                spec.url,
                connect_timeout=connect_timeout,
                connect_retries=connect_retries,
                connect_backoff=connect_backoff,
                probe_interval=probe_interval,
                max_keepalive=max_keepalive,
                api_key=api_key,
                budget=self.budget,
                kind=kind,  # each engine probed on its own where "auto"
                ca_bundle=ca_bundle,
                userinfo=spec.userinfo,
                clock=clock,
            )
            for spec in specs
        ]
        loads = [Counts() for _ in specs]
        self.pool = Pool(specs, loads, [u.breaker for u in upstreams], fallbacks=fallbacks)
        #: Every bound of one generation's asks (each generation's
        #: :class:`~streamsafe.gateway.engines.attempt_plan.AttemptPlan` starts from it).
        self.bounds = PlanBounds(
            connect_retries=connect_retries,
            connect_backoff=connect_backoff,
            failover_attempts=max_attempts,
            failover_window=failover_window,
            continuations=continuations,
            queue_timeout=queue_timeout,
            total=total_timeout,
        )
        self.clock = clock
        self.sleep = sleep
        #: An engine's shed (429, 503) is its caller's answer (``--engine-refusals answer``):
        #: not asked again of the same engine, even where it said when.
        self.answer_refusals = answer_refusals
        self._room: list[asyncio.Future[None]] = []
        #: Each engine, in pool order: its pure view, connections, load and refusal gate.
        self.shells = [
            EngineShell(core, upstream, load, RefusalGate(self.bounds.refusals))
            for core, upstream, load in zip(self.pool.engines, upstreams, loads, strict=True)
        ]
        #: The refused asks of each call, shared by its identical copies.
        self.ledgers = AskLedgers()
        #: Attempts sent to another engine (or model) before a first token.
        self.failovers = 0
        #: Continuations sent to another engine after a stream was cut.
        self.migrations = 0
        self._learning: list[asyncio.Task[None]] = []

    @property
    def first(self) -> EngineShell:
        """The first engine: whose kind the gateway serves as (every engine is given one
        ``--upstream-kind``), and where operator routes go (an operator's change to an engine,
        a cache reset, a sleep, lands on the one engine it can name)."""
        return self.shells[0]

    def of(self, engine: Engine) -> EngineShell:
        """The whole engine whose pure view the pool picked."""
        return self.shells[engine.index]

    def serving(self, model: str) -> list[EngineShell]:
        """The engines that serve ``model`` (whatever their breakers say), in pool order."""
        return [self.of(e) for e in self.pool.serving(model)]

    def live(self, model: str | None = None) -> EngineShell:
        """The engine a call with no admission goes to (pass-through, an engine route): of
        those that serve ``model`` (any, where ``None``), the first whose breaker lets traffic
        through, else the first not known down, else the first. In pool order, so that while
        it is up one engine takes every call that names no model (an upstream's stored state,
        its files or agents, stays in one place)."""
        now = self.clock()
        pool = self.pool.engines
        serving = [e for e in pool if model is None or e.spec.serves(model)] or pool
        for usable in (lambda e: e.breaker.allows(now), lambda e: not e.breaker.down(now)):
            for engine in serving:
                if usable(engine):
                    return self.of(engine)
        return self.of(serving[0])

    def all_down(self) -> bool:
        """True while every engine is known down (:meth:`EngineBreaker.down`): new work fails
        fast; an engine merely cooling down after failures still takes traffic where no other
        can."""
        now = self.clock()
        return all(e.breaker.down(now) for e in self.pool.engines)

    def why_down(self) -> str | None:
        """Why the first engine held down is down (a refused connection, a TLS failure,
        ``/health`` silent), where one is."""
        upstreams = (e.upstream for e in self.shells)
        return next((u.down_why for u in upstreams if u.breaker.held and u.down_why), None)

    def retry_after(self) -> int:
        """Seconds until the first engine takes traffic again, rounded up, at least 1."""
        now = self.clock()
        wait = min(e.breaker.retry_after(now) for e in self.pool.engines)
        return max(1, int(wait + 0.999))

    def open_breakers(self) -> int:
        """Engines whose breaker is open now (held down, or cooling down after failures)."""
        now = self.clock()
        return sum(not e.breaker.takes_traffic(now) for e in self.pool.engines)

    @property
    def trips(self) -> int:
        """Times any engine's breaker opened."""
        return sum(e.breaker.trips for e in self.pool.engines)

    async def ready(self) -> bool:
        """Whether some engine is believed alive (``/health`` asked where none answered
        lately)."""
        checks = [engine.upstream.healthy() for engine in self.shells]
        return any(await asyncio.gather(*checks))

    def refusing(self, model: str) -> RefusalGate | None:
        """Where every engine of ``model`` refuses (or has refused calls waiting), the gate a new
        call waits at: the one whose engine is asked again first. ``None`` where one admits."""
        gates = [engine.gate for engine in self.serving(model)]
        if not gates or not all(g.active for g in gates):
            return None
        return min(gates, key=lambda g: g.retry_after())

    def can_ever_fit(self, model: str, cost: int) -> bool:
        """False if ``cost`` exceeds the memory of every engine of ``model`` and of its
        fallbacks (waiting would never help)."""
        chain = self.pool.chain(model)
        return any(e.could_hold(cost) for m in chain for e in self.pool.serving(m))

    async def wait_for_room(self, model: str, cost: int, started: float) -> Refused | None:
        """Every engine of ``model`` is full: wait for room until ``queue_timeout`` after
        ``started``; the answer to pass on where waiting cannot help or took too long."""
        if not self.can_ever_fit(model, cost):
            msg = (
                f"request needs about {cost} tokens of engine memory, more than "
                f"any engine of {model!r} (or its fallback) holds; lower max_tokens or send "
                "fewer or shorter prompts"
            )
            return made_refusal(400, msg, "invalid_request_error")
        if not await self.room_freed(started + self.bounds.queue_timeout):
            msg = f"every engine of {model!r} is full; retry later"
            return made_refusal(429, msg, "rate_limit_error", 1.0)
        return None

    async def room_freed(self, deadline: float) -> bool:
        """Wait until some generation releases engine memory; ``False`` at ``deadline``."""
        remaining = deadline - self.clock()
        if remaining <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room.append(fut)
        try:
            async with asyncio.timeout(remaining):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            if fut in self._room:
                self._room.remove(fut)

    def room_made(self) -> None:
        """Engine memory was released: every waiter picks again (the first that fits wins)."""
        waiters, self._room = self._room, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def start(self) -> None:
        """Create every engine's connection pool (and probe its kind where ``auto``); learn the
        KV capacity of each vLLM engine given no ``memory=``, in the background."""
        await asyncio.gather(*(engine.upstream.start() for engine in self.shells))
        loop = asyncio.get_running_loop()
        self._learning = [
            loop.create_task(self._learn_capacity(engine))
            for engine in self.shells
            if engine.spec.memory is None
        ]

    async def _learn_capacity(self, engine: EngineShell) -> None:
        """Ask a vLLM engine what its KV cache holds until it says (an engine that is still
        starting answers later), backing off to :data:`_LEARN_EVERY_MAX` seconds between tries;
        other kinds publish no such figure and keep no bound of their own."""
        upstream = engine.upstream
        wait = max(0.5, upstream.probe_interval)
        while True:
            kind = await upstream.resolve_kind()
            if upstream.kind_known and kind.name != "vllm":
                return
            if kind.name == "vllm":
                with contextlib.suppress(UpstreamError, TimeoutError):
                    async with asyncio.timeout(_LEARN_TIMEOUT):
                        found = await learn_kv_capacity(upstream.pool)
                    if found is not None:
                        engine.core.learned_memory = found.tokens
                        log.info(
                            "engine %s holds %d tokens in its KV cache (its /metrics: %s): "
                            "generations sent to it hold at most that at once (memory= on "
                            "--upstream sets another bound)",
                            engine.spec.url,
                            found.tokens,
                            found.source,
                        )
                        self.room_made()
                        return
            await self.sleep(wait)
            wait = min(_LEARN_EVERY_MAX, wait * 2)

    async def close(self) -> None:
        """Stop learning and close every engine's connections."""
        for task in self._learning:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for engine in self.shells:
            await engine.upstream.close()

    def stats(self) -> list[dict[str, Any]]:
        """Per-engine figures for ``/stats``."""
        now = self.clock()
        return [
            {
                "url": e.spec.url,
                "models": sorted(e.spec.models),
                "weight": e.spec.weight,
                "memory_tokens": e.load.memory,
                "memory_limit_tokens": e.core.memory,
                "breaker": e.breaker.state.value,
                "held_down": e.breaker.held,
                "retry_after_s": round(e.breaker.retry_after(now), 3),
                "breaker_trips": e.breaker.trips,
                "kind": e.upstream.kind.name if e.upstream.kind_known else None,
            }
            for e in self.shells
        ]
