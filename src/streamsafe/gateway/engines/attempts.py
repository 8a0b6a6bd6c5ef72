"""One generation's attempts across the engines (a single upstream is a pool of one).

:meth:`Attempts.open_stream` (a streaming completion, on the hot stream reader) and
:meth:`Attempts.open` (anything else) pick an engine for the model, send the request and fail
over before the first token (a refused or reset connection, 429/5xx: once more on the same engine
where the status allows it, else on another engine, or on a larger model for a context-length
400) within the gateway's retry budget and attempt bound, so the relay sees a 200 or the answer to
pass on. The relay then says what happened: the first token came (:meth:`Attempts.served`, the
engine's breaker closes), the attempt failed (:meth:`Attempts.failed`), the stream broke and is
continued (:meth:`Attempts.cut`: the continuation goes to another engine of the same model where
there is one, and never to another model), the engine stayed silent past the first-token timeout
(:meth:`Attempts.failed` with ``shun``: that engine is not asked again for this generation).

Which engine is :mod:`~streamsafe.gateway.engines.pool`; what after a failed attempt is
:mod:`~streamsafe.gateway.engines.failover`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import httpx2
import orjson

from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.failover import Failover, failover_step
from streamsafe.gateway.engines.pool import Engine, Full, Pick, Unavailable
from streamsafe.gateway.errors import error_body
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.metrics import Counters
from streamsafe.gateway.upstream.connection import (
    MAX_ERROR_BODY,
    Upstream,
    is_engine_death,
    read_bounded,
)
from streamsafe.gateway.upstream.event_stream import EventStream, UpstreamClosed
from streamsafe.retry import REFUSAL_STATUSES, retry_after_seconds

__all__ = ["Attempts", "Refused", "answer_response"]

log = logging.getLogger("streamsafe.gateway")

H = TypeVar("H")

#: Longest an engine that shed a request is passed over for new work (its ``Retry-After``,
#: bounded: a full engine frees room as its answers end).
_MAX_FULL_FOR = 10.0


@dataclass(frozen=True, slots=True)
class Refused:
    """An answer other than 200 that the relay passes on (or acts on): its status, its body
    (bounded) and its ``Retry-After`` header as sent."""

    status: int
    body: bytes
    retry_after: str | None = None


@dataclass(frozen=True, slots=True)
class _Sent(Generic[H]):
    """What one send to one engine got: an open 200 (``handle``), or a refusal."""

    handle: H | None
    refused: Refused | None = None


class _Answer(httpx2.AsyncByteStream):
    """The body of an answer the gateway passes on after reading it."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._body


def answer_response(refused: Refused) -> httpx2.Response:
    """A response the gateway passes on in place of an upstream one (its body already read, or
    made up here)."""
    headers = {"content-type": "application/json"}
    if refused.retry_after is not None:
        headers["retry-after"] = refused.retry_after
    return httpx2.Response(refused.status, headers=headers, stream=_Answer(refused.body))


def _refusal(status: int, message: str, kind: str, retry_after: float | None = None) -> Refused:
    seconds = None if retry_after is None else str(max(1, int(retry_after + 0.999)))
    return Refused(status, error_body(message, kind, status), seconds)


class Attempts:
    """One generation's attempts across the engines (see the module)."""

    __slots__ = (
        "_cost",
        "_counters",
        "_current",
        "_cut_from",
        "_engines",
        "_failed_why",
        "_gen",
        "_held",
        "_shunned",
        "_started",
        "_tried",
        "_verdict",
        "answering_model",
        "attempts",
        "model",
    )

    def __init__(
        self,
        engines: Engines,
        body: bytes,
        cost: int,
        gen: Generation | None = None,
        counters: Counters | None = None,
    ) -> None:
        self._engines = engines
        self._gen = gen
        self._counters = counters
        #: The model the request body names (a fallback may answer instead).
        self.model = _model_of(body)
        #: The model whose engine sent the first token: a continuation stays in it.
        self.answering_model: str | None = None
        self._cost = cost
        self._tried: set[int] = set()
        self._shunned: set[int] = set()
        self._current: Engine | None = None
        #: The engine a cut stream is leaving (its continuation's engine is logged with it).
        self._cut_from: Engine | None = None
        self._held: Engine | None = None
        #: Whether the current attempt's engine was already told how it went.
        self._verdict = False
        #: Why the latest attempt failed over (logged with the engine it moves to).
        self._failed_why = ""
        self._started = engines.clock()
        self.attempts = 0

    # -- sending ----------------------------------------------------------------------------------

    async def open_stream(
        self,
        path: str,
        body: bytes,
        headers: bytes,
        *,
        retry_connect: bool = True,
        on_engine: Callable[[Upstream], None] | None = None,
    ) -> EventStream | Refused:
        """POST a streaming completion on the hot stream reader: the exchange with its 200 head
        read (its body unread, for the caller to release), or the refusal to pass on. Raises
        ``OSError`` where no engine could be reached (``UpstreamClosed`` where one dropped the
        request before answering). ``on_engine`` is told each engine an attempt goes to."""

        async def send(upstream: Upstream, content: bytes) -> _Sent[EventStream]:
            conn = await upstream.open_events(
                path, content, retry_connect=retry_connect, headers=headers
            )
            try:
                await conn.head()
            except BaseException:
                conn.release()
                raise
            upstream.alive_at = conn.read_at
            if conn.status == 200:
                return _Sent(conn)
            try:
                answer = await conn.read_body(MAX_ERROR_BODY)
            finally:
                conn.release()
            ra = conn.header(b"retry-after")
            return _Sent(
                None, Refused(conn.status, answer, None if ra is None else ra.decode("latin-1"))
            )

        return await self._failover(send, body, on_engine)

    async def open(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        retry_connect: bool = True,
    ) -> httpx2.Response:
        """Send a request (a non-streamed completion): a 200 response from some engine, its body
        unread, or the answer to pass on. Raises the last transport error where no engine could
        be reached."""

        async def send(upstream: Upstream, body: bytes) -> _Sent[httpx2.Response]:
            response = await upstream.open(
                method, path, content=body, headers=headers, retry_connect=retry_connect
            )
            if response.status_code == 200:
                return _Sent(response)
            try:
                answer = await read_bounded(response)
            finally:
                await response.aclose()
            ra = response.headers.get("retry-after")
            return _Sent(None, Refused(response.status_code, answer, ra))

        opened = await self._failover(send, content or b"", None)
        return opened if isinstance(opened, httpx2.Response) else answer_response(opened)

    async def _failover(
        self,
        send: Callable[[Upstream, bytes], Awaitable[_Sent[H]]],
        content: bytes,
        on_engine: Callable[[Upstream], None] | None,
    ) -> H | Refused:
        """Pick, send, and fail over until an engine answers 200 or the answer is final."""
        engines = self._engines
        model = self.answering_model or self.model
        same_tries = 0
        last_error: Exception | None = None
        last_refused: Refused | None = None
        pick: Pick | Full | Unavailable | None = None
        self.release()  # a continuation weighs again on whichever engine it goes to
        while True:
            if pick is None:
                pick = self._pick(model)
            if isinstance(pick, Full):
                full = await self._wait_for_room(model)
                if full is not None:
                    return full
                pick = None
                continue
            if isinstance(pick, Unavailable):
                # Nowhere else to go: the last engine's own answer, where it gave one.
                if last_refused is not None:
                    return last_refused
                if last_error is not None:
                    raise last_error
                return self._unavailable(model, pick)
            engine = pick.engine
            self._begin(engine)
            upstream = engines.upstreams[engine.index]
            if on_engine is not None:
                on_engine(upstream)
            body = content if pick.model == self.model else _with_model(content, pick.model)
            refused: Refused | None = None
            try:
                sent = await send(upstream, body)
            except (OSError, httpx2.HTTPError) as exc:
                last_error, last_refused = exc, None
                self._fail(engine, type(exc).__name__)
                if not _never_connected(exc):  # a refused connect was counted by its retries
                    engines.budget.record_failure()
            else:
                if sent.refused is None:
                    assert sent.handle is not None
                    engines.budget.record_success()
                    return sent.handle
                refused = last_refused = sent.refused
                last_error = None
                if refused.status >= 500 or refused.status == 429:
                    engines.budget.record_failure()
                if refused.status >= 500 and refused.status not in REFUSAL_STATUSES:
                    dead = is_engine_death(refused.body)
                    self._fail(engine, f"status {refused.status}", dead=dead)
                elif refused.status in REFUSAL_STATUSES:
                    self.full(retry_after_seconds(refused.retry_after, time.time()))
                else:
                    upstream.abandoned()  # a 4xx is the caller's: no verdict on the engine
            self.release()  # this attempt holds nothing on the engine any more
            status = refused.status if refused is not None else None
            step = failover_step(
                status,
                refused.body if refused is not None else b"",
                retry_after=self._wait_asked(refused),
                same_engine_tries=same_tries,
                attempts=self.attempts,
                max_attempts=engines.max_attempts,
                now=engines.clock(),
                deadline=self._started + engines.failover_window,
                budget_allows=engines.budget.allow_retry(),
                larger_model=model in engines.pool.fallbacks and self.answering_model is None,
            )
            if step.action is Failover.PASS_THROUGH:
                if refused is None:
                    assert last_error is not None
                    raise last_error
                return refused
            self._failed_why = f"answered {status}" if status else type(last_error).__name__
            if step.action is Failover.SAME_ENGINE:
                same_tries += 1
                if status in REFUSAL_STATUSES and self._counters is not None:
                    self._counters.engine_sheds += 1  # waited out, as the relay's waits are
                await engines.sleep(step.delay)
                if engine.breaker.allows(engines.clock()):
                    continue  # pick stays: the same engine once more
            elif step.action is Failover.LARGER_MODEL:
                model = engines.pool.fallbacks[model]
            else:
                self._tried.add(engine.index)
            pick = None

    def _wait_asked(self, refused: Refused | None) -> float | None:
        """The ``Retry-After`` the failover may honour on the same engine: none for a shed
        where the engine's refusals are the caller's answer (``--engine-refusals answer``)."""
        if refused is None:
            return None
        if refused.status in REFUSAL_STATUSES and self._engines.answer_refusals:
            return None
        return retry_after_seconds(refused.retry_after, time.time())

    def _pick(self, model: str) -> Pick | Full | Unavailable:
        """The engine for the next attempt: one not tried yet by this generation where there is
        one, else (before any attempt of this request) one it was cut on; never one it shunned.
        A continuation keeps to the model that began the answer."""
        engines = self._engines
        now = engines.clock()
        fallback = self.answering_model is None
        exclude = self._tried | self._shunned
        pick = engines.pool.pick(model, now, exclude, self._cost, fallback=fallback)
        if isinstance(pick, Unavailable) and self._tried and self.attempts == 0:
            # Only engines it was cut on are left (a pool of one): use them.
            pick = engines.pool.pick(model, now, self._shunned, self._cost, fallback=fallback)
        return pick

    async def _wait_for_room(self, model: str) -> Refused | None:
        """Every engine of ``model`` is full: wait for room within the queue timeout; the answer
        to pass on where waiting cannot help or took too long."""
        engines = self._engines
        if not engines.can_ever_fit(model, self._cost):
            msg = (
                f"request needs about {self._cost} tokens of engine memory, more than "
                f"any engine of {model!r} holds; lower max_tokens"
            )
            return _refusal(400, msg, "invalid_request_error")
        if not await engines.room_freed(self._started + engines.queue_timeout):
            msg = f"every engine of {model!r} is full; retry later"
            return _refusal(429, msg, "rate_limit_error", 1.0)
        return None

    def _unavailable(self, model: str, pick: Unavailable) -> Refused:
        if not pick.known:
            return _refusal(404, f"no engine serves model {model!r}", "not_found_error")
        serving = self._engines.pool.serving(model)
        if any(e.index in self._shunned and not e.breaker.held for e in serving):
            msg = f"no engine of {model!r} sent a first token within the first-token timeout"
            return _refusal(504, msg, "upstream_error")
        msg = f"every engine of {model!r} is down; retry after {pick.retry_after:.0f} s"
        return _refusal(503, msg, "service_unavailable", max(1.0, pick.retry_after))

    def _begin(self, engine: Engine) -> None:
        """An attempt goes to ``engine``: counted, logged where a cut stream moves, and its
        memory held there (routing and room see it)."""
        engines = self._engines
        current = self._current
        if self.attempts and current is not None and engine is not current:
            engines.failovers += 1
            log.info(
                "engine %s %s before the first token; trying engine %s",
                current.spec.url,
                self._failed_why,
                engine.spec.url,
                extra={"fields": {"event": "failover", "engine": engine.spec.url}},
            )
        cut_from, self._cut_from = self._cut_from, None
        if cut_from is not None and cut_from is not engine:
            engines.migrations += 1
            _migrated(self._gen, cut_from.spec.url, engine.spec.url)
        self._current = engine
        self._verdict = False
        self._hold(engine)
        self.attempts += 1
        gen = self._gen
        if gen is not None:
            gen.attempts += 1
            gen.engine = engine.spec.url

    def _fail(self, engine: Engine, why: str, *, dead: bool = False) -> None:
        if engine is self._current:
            self._verdict = True
        self._engines.upstreams[engine.index].failed(why, dead=dead)

    def _hold(self, engine: Engine) -> None:
        """Count this generation's memory on ``engine`` (routing weighs it) until it ends."""
        self.release()
        self._held = engine
        self._engines.loads[engine.index].memory += self._cost

    # -- what the relay tells -----------------------------------------------------------------

    def release(self) -> None:
        """The generation ended (or moved): its memory no longer weighs on its engine."""
        held, self._held = self._held, None
        if held is not None:
            self._engines.loads[held.index].memory -= self._cost
            self._engines.room_made()

    def served(self) -> None:
        """The first token arrived: the engine works (its breaker closes), and the answer's
        model is set (a continuation stays in it)."""
        engine = self._current
        if engine is None:
            return
        if self.answering_model is None:
            self.answering_model = next(
                (m for m in self._engines.pool.chain(self.model) if engine.spec.serves(m)),
                self.model,
            )
        self._verdict = True
        self._engines.upstreams[engine.index].succeeded()

    def succeeded(self) -> None:
        """The answer ended whole."""
        self.served()

    def failed(self, why: str, *, shun: bool = False) -> None:
        """The current attempt failed on the engine's side (a 5xx, a reset, a stall, an error
        event standing for a 5xx); ``shun`` where the engine held the request silent past the
        first-token timeout: it is not asked again for this generation."""
        engine = self._current
        if engine is None:
            return
        if shun:
            self._shunned.add(engine.index)
        if not self._verdict:
            self._fail(engine, why)

    def full(self, retry_after: float | None) -> None:
        """The current engine shed the attempt (429 or 503, as a status or in-band): full, not
        failing, so its breaker is not told; new work goes to other engines for the
        ``Retry-After`` it sent (a second where it sent none)."""
        engine = self._current
        if engine is None:
            return
        self._verdict = True
        self._engines.upstreams[engine.index].abandoned()
        full_for = min(_MAX_FULL_FOR, 1.0 if retry_after is None else retry_after)
        engine.full_until = self._engines.clock() + full_for

    def engine_died(self, why: str) -> None:
        """The current engine said it died: held down until its ``/health`` answers."""
        engine = self._current
        if engine is not None:
            self._fail(engine, why, dead=True)

    def cut(self) -> None:
        """The attempt broke and another follows: counted against the engine (where nothing
        else was), and the next attempt goes elsewhere where possible."""
        engine = self._current
        if engine is None:
            return
        if not self._verdict:
            self._fail(engine, "stream cut")
        self._tried.add(engine.index)
        self._cut_from = engine
        self.attempts = 0  # a continuation has its own attempts before its first token

    def stranded(self) -> str | None:
        """Why no engine can take the next attempt of this generation, where none can: every
        engine that could (of the answer's model once it began, else of the model asked for or
        its fallbacks) is held down by its health probe or was shunned. ``None`` where one may
        (a breaker cooling down is waited for)."""
        pool = self._engines.pool
        models = (
            [self.answering_model] if self.answering_model else self._engines.pool.chain(self.model)
        )
        candidates = [e for e in pool.engines if any(e.spec.serves(m) for m in models)]
        if not candidates or any(
            not e.breaker.held and e.index not in self._shunned for e in candidates
        ):
            return None
        down = [e.spec.url for e in candidates if e.breaker.held]
        silent = [e.spec.url for e in candidates if not e.breaker.held]
        parts = []
        if down:
            parts.append(f"engine {', '.join(down)} down (its /health does not answer)")
        if silent:
            parts.append(f"engine {', '.join(silent)} silent past the first-token timeout")
        return f"no engine of {models[0]!r} can go on: " + "; ".join(parts)

    def elsewhere(self) -> bool:
        """True where another engine of the model takes traffic now (a refusal made in-band,
        which the failover did not see, is then asked there)."""
        current = self._current
        now = self._engines.clock()
        model = self.answering_model or self.model
        return any(
            e is not current and e.breaker.takes_traffic(now)
            for e in self._engines.pool.serving(model)
        )

    @property
    def upstream(self) -> Upstream:
        """The engine of the latest attempt (the first engine of the model before any)."""
        current = self._current
        if current is not None:
            return self._engines.upstreams[current.index]
        serving = self._engines.pool.serving(self.model)
        return self._engines.upstreams[serving[0].index if serving else 0]


def _migrated(gen: Generation | None, source: str, target: str) -> None:
    gen_id = gen.id if gen is not None else "-"
    log.warning(
        "%s: stream cut on engine %s continues on engine %s",
        gen_id,
        source,
        target,
        extra={"fields": {"event": "migration", "generation": gen_id, "engine": target}},
    )


def _never_connected(exc: Exception) -> bool:
    """True for a connection that was never made (refused, unreachable): the engine never saw
    the request. A connection dropped before the answer (``UpstreamClosed``, a read error) is
    not."""
    if isinstance(exc, httpx2.HTTPError):
        return isinstance(exc, httpx2.ConnectError)
    return not isinstance(exc, UpstreamClosed)


def _model_of(body: bytes) -> str:
    try:
        model = orjson.loads(body).get("model")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return model if isinstance(model, str) else ""


def _with_model(content: bytes, model: str) -> bytes:
    """The request body asking for ``model`` instead (one re-encode per failover, not per
    chunk)."""
    body = orjson.loads(content)
    body["model"] = model
    return orjson.dumps(body)
