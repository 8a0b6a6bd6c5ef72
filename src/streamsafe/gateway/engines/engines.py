"""Several engines behind one gateway: the I/O shell around
:class:`~streamsafe.gateway.engines.pool.Pool` (see docs/design.md, Engine pool).

:class:`Engines` holds one :class:`~streamsafe.gateway.upstream.connection.Upstream` (connection
pool) per engine and the pool's decisions. Each generation gets an :class:`EngineAttempts`, which is
what the relay calls instead of a single upstream: :meth:`EngineAttempts.open` picks an engine for
the model, sends the request, and fails over before the first token (a refused or reset connection,
429/5xx: once more on the same engine where the status allows it, else on another engine, or on a
larger model for a context-length 400) within the gateway's retry budget and attempt bound, so the
relay sees a 200 or the answer to pass on. Once the relay has the first token it says so
(:meth:`EngineAttempts.served`, the engine's breaker closes); when a stream is cut
(:meth:`EngineAttempts.cut`), the continuation goes to another engine of the model where there
is one.

What the relay calls is the :class:`~streamsafe.gateway.engines.attempts.Attempts` interface; the
pool's decisions are :mod:`~streamsafe.gateway.engines.pool` (which engine) and
:mod:`~streamsafe.gateway.engines.failover` (what after a failed attempt).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx2
import orjson

from streamsafe.gateway.engines.attempts import answer_response
from streamsafe.gateway.engines.failover import Failover, failover_step
from streamsafe.gateway.engines.pool import (
    Counts,
    Engine,
    EngineSpec,
    Full,
    Pick,
    Pool,
    Unavailable,
)
from streamsafe.gateway.errors import error_body
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.upstream.breaker import BreakerState, PoolBreaker
from streamsafe.gateway.upstream.connection import (
    Upstream,
    is_engine_death,
    read_bounded,
    retry_after_value,
)
from streamsafe.retry import RetryBudget

__all__ = ["EngineAttempts", "Engines"]

log = logging.getLogger("streamsafe.gateway")


class Engines:
    """The engines behind one gateway (see the module).

    ``fallbacks`` maps a model to the one that answers when none of its engines can (and a
    context-length 400 to the larger model); ``max_attempts`` (default 3) bounds the attempts of
    one generation before its first token, ``failover_window`` (default 30 s, half the read
    timeout of the Stainless clients) the time they may take; ``kind`` (default ``auto``: each
    engine is asked what it is at start) is every engine's upstream kind.
    """

    def __init__(
        self,
        specs: Sequence[EngineSpec],
        *,
        fallbacks: Mapping[str, str] | None = None,
        connect_timeout: float = 5.0,
        max_keepalive: int = 512,
        api_key: str | None = None,
        kind: str = "auto",
        ca_bundle: str | None = None,
        max_attempts: int = 3,
        failover_window: float = 30.0,
        queue_timeout: float = 20.0,
        cooldown: float = 1.0,
        budget: RetryBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.loads = [Counts() for _ in specs]
        self.pool = Pool(specs, fallbacks=fallbacks, loads=self.loads, cooldown=cooldown)
        self.upstreams = [
            Upstream(
                spec.url,
                connect_timeout=connect_timeout,
                connect_retries=0,  # a refused connection fails over instead
                max_keepalive=max_keepalive,
                api_key=api_key,
                kind=kind,  # each engine probed on its own where "auto"
                ca_bundle=ca_bundle,
            )
            for spec in specs
        ]
        for upstream in self.upstreams:
            upstream.announce = False  # the pool's breakers say when an engine goes and comes
        self.max_attempts = max_attempts
        self.failover_window = failover_window
        self.budget = budget or RetryBudget()
        self.clock = clock
        self.sleep = sleep
        self.breaker = PoolBreaker([e.breaker for e in self.pool.engines], clock)
        self.queue_timeout = queue_timeout
        self._room: list[asyncio.Future[None]] = []
        #: Attempts sent to another engine (or model) before a first token.
        self.failovers = 0
        #: Continuations sent to another engine after a stream was cut.
        self.migrations = 0
        self.connect_retries_done = 0

    def can_ever_fit(self, model: str, cost: int) -> bool:
        """False if ``cost`` exceeds the memory of every engine of ``model`` (waiting would
        never help)."""
        caps = [e.spec.memory for e in self.pool.serving(model)]
        return any(cap is None or cost <= cap for cap in caps)

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

    def failed(self, engine: Engine, now: float, why: str, *, dead: bool = False) -> None:
        """An attempt failed on ``engine``'s side: counted, told to its breaker, and its
        breaker's opening logged (naming the engine)."""
        self.upstreams[engine.index].failures += 1
        breaker = engine.breaker
        before = breaker.state
        breaker.on_failure(now, dead=dead)
        if breaker.state is BreakerState.OPEN and before is not BreakerState.OPEN:
            wait = breaker.retry_after(now)
            if before is BreakerState.CLOSED:
                log.warning(
                    "engine %s down (%s%s); its breaker is open, next try in %.3g s",
                    engine.spec.url,
                    "reported dead: " if dead else "",
                    why,
                    wait,
                    extra={"fields": {"event": "engine_down", "engine": engine.spec.url}},
                )
            else:
                log.info(
                    "engine %s still down (%s); next try in %.3g s",
                    engine.spec.url,
                    why,
                    wait,
                    extra={"fields": {"event": "engine_still_down", "engine": engine.spec.url}},
                )

    def for_generation(
        self, body: bytes, cost: int, gen: Generation | None = None
    ) -> EngineAttempts:
        """The attempts of one generation whose request body is ``body`` (``gen``, where
        given, is told each attempt and its engine)."""
        return EngineAttempts(self, _model_of(body), cost, gen)

    async def start(self) -> None:
        """Create every engine's connection pool."""
        for upstream in self.upstreams:
            await upstream.start()

    async def close(self) -> None:
        """Close every engine's connections."""
        for upstream in self.upstreams:
            await upstream.close()

    def stats(self) -> list[dict[str, Any]]:
        """Per-engine figures for ``/stats``."""
        now = self.clock()
        return [
            {
                "url": e.spec.url,
                "models": sorted(e.spec.models),
                "weight": e.spec.weight,
                "memory_tokens": e.load.memory,
                "breaker": e.breaker.state.value,
                "retry_after_s": round(e.breaker.retry_after(now), 3),
                "breaker_trips": e.breaker.trips,
                "kind": upstream.kind.name if upstream.kind_known else None,
            }
            for e, upstream in zip(self.pool.engines, self.upstreams, strict=True)
        ]


class EngineAttempts:
    """One generation's attempts across the pool (see the module)."""

    __slots__ = (
        "_cost",
        "_current",
        "_cut_from",
        "_engines",
        "_gen",
        "_held",
        "_started",
        "_tried",
        "attempts",
        "model",
    )

    def __init__(
        self, engines: Engines, model: str, cost: int, gen: Generation | None = None
    ) -> None:
        self._engines = engines
        self._gen = gen
        #: The model asked for (a fallback may answer instead).
        self.model = model
        self._cost = cost
        self._tried: set[int] = set()
        self._current: Engine | None = None
        #: The engine a cut stream is leaving (its continuation's engine is logged with it).
        self._cut_from: str | None = None
        self._held: Engine | None = None
        self._started = engines.clock()
        self.attempts = 0

    async def open(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        retry_connect: bool = True,
    ) -> httpx2.Response:
        """A 200 response from some engine, or the answer to pass on (see the module). Raises
        the last transport error where no engine could be reached."""
        engines = self._engines
        model = self.model
        same_tries = 0
        last_error: httpx2.HTTPError | None = None
        pick: Pick | Full | Unavailable | None = None
        self.release()  # a continuation weighs again on whichever engine it goes to
        while True:
            now = engines.clock()
            if pick is None:
                pick = engines.pool.pick(model, now, self._tried, self._cost)
                if isinstance(pick, Unavailable) and self._tried and self.attempts == 0:
                    # Only cut engines left: use them.
                    pick = engines.pool.pick(model, now, (), self._cost)
            if isinstance(pick, Full):
                if not engines.can_ever_fit(model, self._cost):
                    msg = (
                        f"request needs about {self._cost} tokens of engine memory, more than "
                        f"any engine of {model!r} holds; lower max_tokens"
                    )
                    return answer_response(400, error_body(msg, "invalid_request_error", 400))
                if not await engines.room_freed(self._started + engines.queue_timeout):
                    msg = f"every engine of {model!r} is full; retry later"
                    return answer_response(429, error_body(msg, "rate_limit_error", 429), 1.0)
                pick = None
                continue
            if isinstance(pick, Unavailable):
                if last_error is not None:
                    raise last_error
                if not pick.known:
                    msg = f"no engine serves model {model!r}"
                    return answer_response(404, error_body(msg, "not_found_error", 404))
                msg = f"every engine of {model!r} is down; retry after {pick.retry_after:.0f} s"
                return answer_response(
                    503, error_body(msg, "service_unavailable", 503), max(1.0, pick.retry_after)
                )
            engine = pick.engine
            if self.attempts and engine is not self._current:
                engines.failovers += 1
            cut_from, self._cut_from = self._cut_from, None
            if cut_from is not None:
                _migrated(self._gen, cut_from, engine.spec.url)
            self._current = engine
            self._hold(engine)  # its memory counts from now: routing and room see it
            self.attempts += 1
            gen = self._gen
            if gen is not None:
                gen.attempts += 1
                gen.engine = engine.spec.url
            body = content if not pick.fallback else _with_model(content, pick.model)
            upstream = engines.upstreams[engine.index]
            status: int | None = None
            answer = b""
            retry_after: float | None = None
            try:
                response = await upstream.open(
                    method, path, content=body, headers=headers, retry_connect=False
                )
            except httpx2.HTTPError as exc:
                last_error = exc
                engines.failed(engine, now, type(exc).__name__)
                engines.budget.record_failure()
            else:
                if response.status_code == 200:
                    engines.budget.record_success()
                    return response
                status = response.status_code
                answer = await read_bounded(response)
                await response.aclose()
                retry_after = retry_after_value(response.headers.get("retry-after"))
                if status >= 500 or status == 429:
                    engines.failed(engine, now, f"status {status}", dead=is_engine_death(answer))
                    engines.budget.record_failure()
                else:
                    engine.breaker.on_abandon()  # the engine answered: no verdict on its health
            self.release()  # this attempt holds nothing on the engine any more
            step = failover_step(
                status,
                answer,
                retry_after=retry_after,
                same_engine_tries=same_tries,
                attempts=self.attempts,
                max_attempts=engines.max_attempts,
                now=engines.clock(),
                deadline=self._started + engines.failover_window,
                budget_allows=engines.budget.allow_retry(),
                larger_model=model in engines.pool.fallbacks,
            )
            if step.action is Failover.PASS_THROUGH:
                if status is None:
                    assert last_error is not None
                    raise last_error
                return answer_response(status, answer, retry_after)
            log.info(
                "engine %s answered %s before the first token; %s",
                engine.spec.url,
                status or type(last_error).__name__,
                step.action.value,
            )
            if step.action is Failover.SAME_ENGINE:
                same_tries += 1
                await engines.sleep(step.delay)
                if engine.breaker.allows(engines.clock()):
                    continue  # pick stays: the same engine once more
                pick = None
                continue
            if step.action is Failover.LARGER_MODEL:
                model = engines.pool.fallbacks[model]
            else:
                self._tried.add(engine.index)
            pick = None

    def _hold(self, engine: Engine) -> None:
        """Count this generation's memory on ``engine`` (routing weighs it) until it ends."""
        self.release()
        self._held = engine
        self._engines.loads[engine.index].memory += self._cost

    def release(self) -> None:
        """The generation ended (or moved): its memory no longer weighs on its engine."""
        held, self._held = self._held, None
        if held is not None:
            self._engines.loads[held.index].memory -= self._cost
            self._engines.room_made()

    def served(self) -> None:
        """The first token arrived: the engine works (its breaker closes)."""
        engine = self._current
        if engine is not None:
            before = engine.breaker.state
            engine.breaker.on_success()
            if before is not BreakerState.CLOSED:
                log.info(
                    "engine %s back: an attempt got its first token; breaker closed",
                    engine.spec.url,
                    extra={"fields": {"event": "engine_up", "engine": engine.spec.url}},
                )

    def cut(self) -> None:
        """The stream from the current engine broke: count it against the engine, and send the
        continuation elsewhere where possible."""
        engine = self._current
        if engine is None:
            return
        self._engines.failed(engine, self._engines.clock(), "stream cut")
        self._tried.add(engine.index)
        self._engines.migrations += 1
        self._cut_from = engine.spec.url
        self.attempts = 0  # a continuation has its own attempts before its first token

    def engine_died(self, why: str) -> None:
        """The current engine said it died: its breaker opens at once."""
        if self._current is not None:
            self._engines.failed(self._current, self._engines.clock(), why, dead=True)

    def failed(self, why: str) -> None:
        """Counted where the attempt broke: by :meth:`open` (before the first token) and
        :meth:`cut` (after it)."""

    def succeeded(self) -> None:
        """The answer ended whole: the engine's breaker closes (if the first token did not
        already close it)."""
        self.served()

    @property
    def upstream(self) -> Upstream:
        """The engine of the latest attempt (the first engine before any)."""
        current = self._current
        return self._engines.upstreams[current.index if current is not None else 0]


def _migrated(gen: Generation | None, source: str, target: str) -> None:
    gen_id = gen.id if gen is not None else "-"
    log.info(
        "%s: stream cut on engine %s continues on %s",
        gen_id,
        source,
        target,
        extra={"fields": {"event": "migration", "generation": gen_id, "to": target}},
    )


def _model_of(body: bytes) -> str:
    try:
        model = orjson.loads(body).get("model")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return model if isinstance(model, str) else ""


def _with_model(content: bytes | None, model: str) -> bytes | None:
    """The request body asking for ``model`` instead (one re-encode per failover, not per
    chunk)."""
    if content is None:
        return None
    body = orjson.loads(content)
    body["model"] = model
    return orjson.dumps(body)
