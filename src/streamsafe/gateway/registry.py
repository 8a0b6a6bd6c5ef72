"""The generation registry: one upstream request per logical request.

A :class:`Generation` is one upstream request: an append-only event log, a state, its
subscribers, and the task that reads upstream. The :class:`Registry` finds the generation a request
belongs to (by ``(tenant, Idempotency-Key)``, or for an unkeyed retry by ``(tenant, body
fingerprint)``), starts a new one when there is none, aborts what nobody reads after a grace
period, and keeps finished ones for replay within a time and memory bound.

The upstream reader only appends: it decodes each network chunk once, appends the payloads of all
events it completed as one batch, and wakes every subscriber with one ``Event.set()``. Subscribers
keep their own cursor and read at their own pace, so a slow one never holds up the reader or
another subscriber.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from streamsafe.gateway.admission import Admission, Shed, Ticket
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.store import EventLog, MemoryEventLog, Store
from streamsafe.gateway.upstream import Upstream, is_engine_death
from streamsafe.sse import DONE, SSEDecoder, SSEError

__all__ = [
    "ABORTED",
    "DONE_STATE",
    "FAILED",
    "QUEUED",
    "RUNNING",
    "Counters",
    "Failure",
    "Generation",
    "GenerationRequest",
    "KeyReused",
    "LiveDuplicate",
    "NotResumable",
    "Registry",
    "error_body",
]

log = logging.getLogger("streamsafe.gateway")

QUEUED = "queued"
RUNNING = "running"
DONE_STATE = "done"
FAILED = "failed"
ABORTED = "aborted"
_FINISHED = frozenset((DONE_STATE, FAILED, ABORTED))

_ERROR_PREFIXES = (b'{"error"', b'{ "error"')
#: Largest upstream error body kept and passed on.
_MAX_ERROR_BODY = 64 * 1024


def error_body(message: str, type_: str, code: int, param: str | None = None) -> bytes:
    """An OpenAI-style error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


@dataclass(slots=True)
class Failure:
    """Why a generation failed before its first event: the status and body a client that has not
    been answered yet receives, and ``Retry-After`` where one applies."""

    status: int
    body: bytes
    retry_after: int | None = None

    def as_event(self) -> bytes:
        """The failure as a mid-stream error payload (for subscribers already committed)."""
        try:
            parsed = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            return orjson.dumps({"error": parsed["error"]})
        if isinstance(parsed, dict) and "message" in parsed:  # vLLM's flat ErrorResponse
            return orjson.dumps({"error": parsed})
        text = self.body[:1000].decode("utf-8", "replace") or f"upstream answered {self.status}"
        return error_body(text, "upstream_error", self.status)


class KeyReused(Exception):
    """The Idempotency-Key is in use with a different request body (422)."""


class LiveDuplicate(Exception):
    """A duplicate of a live keyed generation where the gateway is set to answer 409."""


class NotResumable(Exception):
    """``Last-Event-ID`` names a generation the gateway no longer holds (410)."""


@dataclass(slots=True)
class GenerationRequest:
    """What the registry needs to know about one incoming request."""

    tenant: str
    path: str
    body: bytes
    fingerprint: bytes
    cost: int
    stream: bool
    idempotency_key: str | None = None
    retry: bool = False
    last_event_id: int | None = None
    no_upstream_retry: bool = False


@dataclass(slots=True)
class Counters:
    """Monotonic counters behind ``/stats`` and ``/metrics``."""

    requests_received: int = 0
    retries_seen: int = 0
    attached: int = 0
    replayed: int = 0
    resumed: int = 0
    generations_started: int = 0
    generations_completed: int = 0
    generations_failed: int = 0
    generations_aborted: int = 0
    shed: int = 0
    breaker_rejections: int = 0
    key_conflicts: int = 0
    evicted: int = 0
    events_relayed: int = 0
    continued: int = 0
    errors: dict[int, int] = field(default_factory=dict)


class Generation:
    """One upstream request and everything that follows from it.

    Every change (events appended, state changed) bumps ``version`` and resolves the futures of
    the subscribers waiting for it. A subscriber notes ``version``, checks, and waits on
    :meth:`next_change` only if ``version`` has not moved meanwhile, so no change is missed and a
    change costs one integer increment plus one ``set_result`` per waiting subscriber (no new
    ``asyncio.Event`` per batch).
    """

    __slots__ = (
        "_waiters",
        "admitted_at",
        "continuations",
        "cost",
        "created_at",
        "failure",
        "fingerprint",
        "finished_at",
        "grace_handle",
        "id",
        "key",
        "length",
        "log",
        "multiline",
        "request",
        "state",
        "stream",
        "subscribers",
        "task",
        "tenant",
        "upstream_status",
        "version",
    )

    def __init__(self, gen_id: str, request: GenerationRequest, log_: EventLog, key: str | None):
        self.id = gen_id
        self.request = request
        self.tenant = request.tenant
        self.fingerprint = request.fingerprint
        self.stream = request.stream
        self.cost = request.cost
        self.key = key
        self.log = log_
        self.length = 0
        self.state = QUEUED
        self.failure: Failure | None = None
        self.upstream_status: int | None = None
        self.subscribers = 0
        self.version = 0
        self._waiters: list[asyncio.Future[None]] = []
        self.task: asyncio.Task[None] | None = None
        self.grace_handle: asyncio.TimerHandle | None = None
        #: When it was created (the registry's clock); early commit counts its wait from here.
        self.created_at = 0.0
        self.admitted_at: float | None = None
        self.finished_at: float | None = None
        self.continuations = 0
        self.multiline = False

    @property
    def finished(self) -> bool:
        """Done, failed or aborted: no event will be appended any more."""
        return self.state in _FINISHED

    @property
    def live(self) -> bool:
        """Queued or running."""
        return self.state == QUEUED or self.state == RUNNING

    def wake(self) -> None:
        """Wake every subscriber waiting on this generation."""
        self.version += 1
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():  # cancelled by its subscriber's timeout
                    waiter.set_result(None)

    def next_change(self) -> asyncio.Future[None]:
        """A future the next :meth:`wake` resolves. Check ``version`` first (see the class)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        """Drop a waiter that stopped waiting (timed out), so idle generations do not collect
        them."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def __repr__(self) -> str:
        return f"Generation({self.id}, {self.state}, events={self.length}, subs={self.subscribers})"


_ids = itertools.count()
_ID_PREFIX = os.urandom(3).hex()


def _new_id() -> str:
    return f"gen-{_ID_PREFIX}{next(_ids):x}"


class Registry:
    """Finds, starts, aborts and forgets generations."""

    def __init__(
        self,
        config: GatewayConfig,
        store: Store,
        admission: Admission,
        upstream: Upstream,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.store = store
        self.admission = admission
        self.upstream = upstream
        self.counters = Counters()
        self._clock = clock
        self._gens: dict[str, Generation] = {}
        self._by_fingerprint: dict[tuple[str, bytes], Generation] = {}
        self._finished: collections.OrderedDict[str, Generation] = collections.OrderedDict()
        self._kept_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.live_generations = 0
        self.subscribers = 0

    # -- finding a generation -------------------------------------------------------------------

    async def open(self, req: GenerationRequest) -> tuple[Generation, int]:
        """The generation ``req`` belongs to (attached, replayed, resumed or new) and the offset
        its subscriber starts reading from. The caller must :meth:`leave` it when done."""
        counters = self.counters
        resume = req.last_event_id is not None
        start = 0 if req.last_event_id is None else req.last_event_id + 1
        gen: Generation | None = None
        store_key: str | None = None
        new_id = _new_id()
        if req.idempotency_key is not None:
            store_key = f"k\x00{req.tenant}\x00{req.idempotency_key}"
            for _ in range(3):  # a claim can race with a release; settle in a few rounds
                owner = await self.store.claim(store_key, new_id)
                if owner is None:
                    break
                gen = self._gens.get(owner)
                if gen is None:  # owner is gone (forgotten concurrently): take the key over
                    await self.store.release(store_key, owner)
                    continue
                if gen.fingerprint != req.fingerprint:
                    counters.key_conflicts += 1
                    raise KeyReused
                if not resume and gen.state in (FAILED, ABORTED):
                    # A fresh attempt after a failure starts over; resuming still replays it.
                    await self._forget(gen)
                    gen = None
                    continue
                if not resume and gen.live and self.config.on_live_duplicate == "409":
                    raise LiveDuplicate
                break
        elif req.retry or resume:
            found = self._by_fingerprint.get((req.tenant, req.fingerprint))
            if found is not None and (resume or found.state in (QUEUED, RUNNING, DONE_STATE)):
                gen = found
        if gen is not None:
            if resume:
                counters.resumed += 1
            elif gen.finished:
                counters.replayed += 1
            else:
                counters.attached += 1
            self._join(gen)
            return gen, min(start, gen.length) if gen.finished else start
        if resume:
            if store_key is not None:
                await self.store.release(store_key, new_id)
            raise NotResumable
        gen = Generation(new_id, req, self.store.log(new_id), store_key)
        gen.created_at = self._clock()
        self._gens[new_id] = gen
        self._by_fingerprint[(req.tenant, req.fingerprint)] = gen
        self.live_generations += 1
        self._join(gen)
        gen.task = asyncio.get_running_loop().create_task(self._run(gen), name=new_id)
        return gen, 0

    def _join(self, gen: Generation) -> None:
        gen.subscribers += 1
        self.subscribers += 1
        # On a finished generation the handle is its retention timer, which a replay keeps.
        if gen.grace_handle is not None and not gen.finished:
            gen.grace_handle.cancel()
            gen.grace_handle = None

    def leave(self, gen: Generation) -> None:
        """A subscriber is gone (finished or disconnected). When the last one leaves a live
        generation, the grace period starts; past it the upstream request is closed."""
        gen.subscribers -= 1
        self.subscribers -= 1
        if gen.subscribers > 0 or gen.finished:
            return
        grace = self.config.grace
        if grace <= 0:
            self._abort(gen)
        else:
            gen.grace_handle = asyncio.get_running_loop().call_later(grace, self._abort, gen)

    def _abort(self, gen: Generation) -> None:
        gen.grace_handle = None
        if gen.subscribers > 0 or gen.finished:
            return
        log.info("%s: no subscriber left after the grace period; aborting upstream", gen.id)
        self.counters.generations_aborted += 1
        self._finish(gen, ABORTED)
        if gen.task is not None:
            gen.task.cancel()  # closes the upstream response: the engine aborts the request

    # -- the upstream reader --------------------------------------------------------------------

    async def _run(self, gen: Generation) -> None:
        ticket: Ticket | None = None
        try:
            if self.upstream.breaker.is_open:
                await self._fail_dead(gen)
                return
            try:
                ticket = await self.admission.acquire(gen.cost)
            except Shed as exc:
                self.counters.shed += 1
                msg = f"gateway at capacity ({exc.reason}); retry after {exc.retry_after} s"
                await self._fail(
                    gen, Failure(429, error_body(msg, "rate_limit_error", 429), exc.retry_after)
                )
                return
            except ValueError as exc:
                await self._fail(
                    gen, Failure(400, error_body(str(exc), "invalid_request_error", 400))
                )
                return
            if self.upstream.breaker.is_open:
                await self._fail_dead(gen)
                return
            gen.state = RUNNING
            gen.admitted_at = self._clock()
            self.counters.generations_started += 1
            gen.wake()
            await self._call_upstream(gen)
        except asyncio.CancelledError:
            if not gen.finished:
                self._finish(gen, ABORTED)
            raise
        except Exception as exc:  # a bug must not leave subscribers hanging
            log.exception("%s: reader failed", gen.id)
            await self._fail_mid_stream(gen, f"gateway error: {type(exc).__name__}")
        finally:
            if ticket is not None:
                self.admission.release(ticket)

    async def _call_upstream(self, gen: Generation) -> None:
        body = gen.request.body
        while True:
            cut = await self._upstream_once(gen, body)
            if cut is None:
                return
            # The upstream stream broke with no error and no [DONE] (a proxy or the connection
            # died). The engine aborted its copy when the connection closed, so continuing
            # the partial answer duplicates no work: it generates only the missing tokens.
            partial = None
            if gen.continuations < self.config.max_continuations:
                partial = await _read_partial(gen)
            if partial is not None and partial.finished:  # only [DONE] was missing
                gen.length = await gen.log.append((DONE,))
                self._finish(gen, DONE_STATE)
                return
            continuation = _continuation_body(gen.request, partial) if partial else None
            if continuation is None:
                await self._fail_mid_stream(gen, cut)
                return
            gen.continuations += 1
            self.counters.continued += 1
            log.info("%s: %s; continuing upstream (%d)", gen.id, cut, gen.continuations)
            body = continuation

    async def _upstream_once(self, gen: Generation, body: bytes) -> str | None:
        """One upstream request for ``gen``. Returns why the stream broke where it can be
        continued, ``None`` where the generation has ended (done or failed)."""
        req = gen.request
        continuing = gen.continuations > 0
        try:
            response = await self.upstream.open(
                "POST",
                req.path,
                content=body,
                headers={"content-type": "application/json"},
                retry_connect=not req.no_upstream_retry,
            )
        except httpx2.HTTPError as exc:
            msg = f"upstream unreachable: {type(exc).__name__}"
            await self._fail(gen, Failure(503, error_body(msg, "service_unavailable", 503), 1))
            return None
        try:
            status = response.status_code
            gen.upstream_status = status
            if status != 200:
                body = await _read_bounded(response)
                if status >= 500:
                    if is_engine_death(body):
                        self.upstream.engine_died(f"upstream {status}")
                    else:
                        self.upstream.suspect()
                retry_after = _parse_retry_after(response.headers.get("retry-after"))
                await self._fail(gen, Failure(status, body, retry_after))
                return None
            gen.wake()  # upstream accepted the request: an early commit may go now
            if gen.stream:
                return await self._pump(gen, response, skip_role=continuing)
            body = await response.aread()
            gen.length = await gen.log.append((body,))
            self._finish(gen, DONE_STATE)
            return None
        except httpx2.HTTPError as exc:
            cut = f"upstream connection failed: {type(exc).__name__}"
            if gen.stream and gen.upstream_status == 200 and not gen.finished:
                return cut
            await self._fail_mid_stream(gen, cut)
            return None
        finally:
            await response.aclose()

    async def _pump(
        self, gen: Generation, response: httpx2.Response, *, skip_role: bool = False
    ) -> str | None:
        decoder = SSEDecoder()
        log_ = gen.log
        # An in-process log is appended to without a coroutine per chunk.
        append_now = log_.append_nowait if isinstance(log_, MemoryEventLog) else None
        counters = self.counters
        errored = False
        try:
            async for chunk in response.aiter_raw():
                events = decoder.feed(chunk)
                if not events:
                    continue
                payloads = [ev.raw for ev in events]
                if skip_role:
                    # A continuation opens with the assistant's role chunk again; the log has
                    # it already.
                    skip_role = False
                    if _is_role_chunk(payloads[0]):
                        del payloads[0]
                        if not payloads:
                            continue
                for p in payloads:
                    if p.startswith(_ERROR_PREFIXES):
                        errored = True
                        if is_engine_death(p):
                            self.upstream.engine_died("error event")
                    elif b"\n" in p:
                        gen.multiline = True
                if append_now is not None:
                    gen.length = append_now(payloads)
                else:
                    gen.length = await log_.append(payloads)
                counters.events_relayed += len(payloads)
                gen.wake()
                if payloads[-1] == DONE:
                    self._finish(gen, FAILED if errored else DONE_STATE)
                    return None
        except SSEError as exc:
            await self._fail_mid_stream(gen, f"upstream sent a broken event stream: {exc}")
            return None
        if errored:
            await self._fail_mid_stream(gen, "upstream stream ended after an error event")
            return None
        return "upstream stream ended before [DONE]"

    # -- endings --------------------------------------------------------------------------------

    async def _fail_dead(self, gen: Generation) -> None:
        self.counters.breaker_rejections += 1
        retry_after = self.upstream.breaker.retry_after()
        msg = f"engine is down; retry after {retry_after} s"
        await self._fail(
            gen, Failure(503, error_body(msg, "service_unavailable", 503), retry_after)
        )

    async def _fail(self, gen: Generation, failure: Failure) -> None:
        """Failure before any event: answered with its real status where not yet committed."""
        if gen.length:
            await self._fail_mid_stream(gen, failure.as_event().decode())
            return
        gen.failure = failure
        self._finish(gen, FAILED)

    async def _fail_mid_stream(self, gen: Generation, message: str) -> None:
        """After events went out: end the log with an error event and ``[DONE]`` (vLLM's way).
        A non-streaming generation has no events to follow, so it fails with 502 instead."""
        if gen.finished:
            return
        log.info("%s: failed mid-stream: %s", gen.id, message)
        if gen.stream:
            if message.startswith('{"error"'):
                payload = message.encode()
            else:
                payload = error_body(message, "upstream_error", 502)
            gen.length = await gen.log.append((payload, DONE))
        else:
            gen.failure = Failure(502, error_body(message, "upstream_error", 502))
        self._finish(gen, FAILED)

    def _finish(self, gen: Generation, state: str) -> None:
        if gen.finished:
            return
        was_live = gen.live
        gen.state = state
        gen.finished_at = self._clock()
        if was_live:
            self.live_generations -= 1
        counters = self.counters
        if state == DONE_STATE:
            counters.generations_completed += 1
        elif state == FAILED:
            counters.generations_failed += 1
        gen.wake()
        loop = asyncio.get_running_loop()
        if state == ABORTED or gen.failure is not None or self.config.keep_finished <= 0:
            # Nothing worth replaying (or replay is off): a later attempt starts over.
            self._spawn(self._forget(gen))
            return
        self._finished[gen.id] = gen
        self._kept_bytes += gen.log.nbytes
        if gen.key is not None:
            self._spawn(self.store.expire(gen.key, gen.id, self.config.keep_finished))
        gen.grace_handle = loop.call_later(
            self.config.keep_finished, lambda: self._spawn(self._forget(gen))
        )
        while self._kept_bytes > self.config.max_kept_bytes and self._finished:
            oldest = next(iter(self._finished.values()))
            counters.evicted += 1
            self._spawn(self._forget(oldest))
            self._unkeep(oldest)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run store bookkeeping in the background; owned here and awaited by :meth:`close`."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _unkeep(self, gen: Generation) -> None:
        if self._finished.pop(gen.id, None) is not None:
            self._kept_bytes -= gen.log.nbytes

    async def _forget(self, gen: Generation) -> None:
        """Nobody can find ``gen`` any more; subscribers holding it read on undisturbed."""
        if gen.finished and gen.grace_handle is not None:
            gen.grace_handle.cancel()
            gen.grace_handle = None
        self._unkeep(gen)
        if self._gens.get(gen.id) is gen:
            del self._gens[gen.id]
        fp_key = (gen.tenant, gen.fingerprint)
        if self._by_fingerprint.get(fp_key) is gen:
            del self._by_fingerprint[fp_key]
        if gen.key is not None:
            await self.store.release(gen.key, gen.id)
        await self.store.drop_log(gen.id)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def kept_bytes(self) -> int:
        """Bytes held by finished generations kept for replay."""
        return self._kept_bytes

    @property
    def generation_count(self) -> int:
        """Generations that can still be found (live and kept)."""
        return len(self._gens)

    def get(self, gen_id: str) -> Generation | None:
        """A generation by id (for tests and diagnostics)."""
        return self._gens.get(gen_id)

    async def close(self) -> None:
        """Cancel every reader (shutdown)."""
        tasks = [g.task for g in self._gens.values() if g.task is not None and not g.task.done()]
        for gen in list(self._gens.values()):
            if gen.grace_handle is not None:
                gen.grace_handle.cancel()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _is_role_chunk(payload: bytes) -> bool:
    """A chat chunk that carries only the assistant's role (and empty content)."""
    if b'"role"' not in payload:
        return False
    try:
        delta = orjson.loads(payload)["choices"][0]["delta"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False
    return isinstance(delta, dict) and not delta.get("content") and not delta.get("tool_calls")


@dataclass(slots=True)
class _Partial:
    """What a broken stream delivered: its text, content chunks and whether it had ended."""

    text: str
    chunks: int
    finished: bool


async def _read_partial(gen: Generation) -> _Partial | None:
    """The partial answer in ``gen``'s log, or ``None`` where it cannot be continued (an error
    event, tool calls, several choices, unparsable chunks). Read once, when a stream breaks: the
    per-chunk path never parses JSON for this."""
    parts: list[str] = []
    chunks = 0
    finished = False
    for payload in await gen.log.read(0):
        if payload == DONE or payload.startswith(_ERROR_PREFIXES):
            return None
        try:
            choices = orjson.loads(payload).get("choices") or ()
        except (orjson.JSONDecodeError, AttributeError):
            return None
        for choice in choices:
            if choice.get("index", 0) != 0:
                return None
            delta = choice.get("delta") or {}
            if delta.get("tool_calls"):
                return None
            content = delta.get("content")
            if content:
                parts.append(content)
                chunks += 1
            finished = finished or bool(choice.get("finish_reason"))
    return _Partial("".join(parts), chunks, finished)


def _continuation_body(req: GenerationRequest, partial: _Partial) -> bytes | None:
    """The request that continues a partial chat answer (vLLM's ``continue_final_message``
    with ``add_generation_prompt=false``), asking only for the tokens still owed; ``None`` for
    what cannot be continued (not a chat request, ``n`` > 1)."""
    if not req.path.endswith("/chat/completions"):
        return None
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError:
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or body.get("n", 1) != 1:
        return None
    body["messages"] = [*messages, {"role": "assistant", "content": partial.text}]
    body["continue_final_message"] = True
    body["add_generation_prompt"] = False
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if isinstance(limit, int):
            # vLLM streams one token per content chunk; that is the count already delivered.
            body[name] = max(1, limit - partial.chunks)
    return orjson.dumps(body)


async def _read_bounded(response: httpx2.Response) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        parts.append(chunk)
        size += len(chunk)
        if size >= _MAX_ERROR_BODY:
            break
    return b"".join(parts)[:_MAX_ERROR_BODY]


def _parse_retry_after(value: str | None) -> int | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(1, int(seconds + 0.999)) if seconds >= 0 else None
