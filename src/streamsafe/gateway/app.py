"""The gateway as a plain ASGI app: routing, request checks, and writing to subscribers.

A request for a completion becomes a subscription to a generation (see
:mod:`streamsafe.gateway.registry`). The subscriber's loop reads from its cursor to the end of the
log, sends all of it in one body message, and waits for the next change. A concurrent receive
task watches for ``http.disconnect`` so a client that leaves is noticed at once, even while its
generation is quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from streamsafe.gateway.admission import Admission, request_cost
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.metrics import Metrics
from streamsafe.gateway.registry import (
    DONE_STATE,
    Failure,
    Generation,
    GenerationRequest,
    KeyReused,
    LiveDuplicate,
    NotResumable,
    Registry,
    error_body,
)
from streamsafe.gateway.store import MemoryEventLog, MemoryStore, Store
from streamsafe.gateway.upstream import Upstream
from streamsafe.sse import DONE, DONE_EVENT

__all__ = ["Gateway"]

log = logging.getLogger("streamsafe.gateway")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Public path -> upstream path. Llama Stack 0.2's aliases go to the engine's plain OpenAI paths.
#: On those aliases the gateway speaks as Llama Stack does: no ``data: [DONE]`` at the end (the
#: stream just ends), because llama-stack-client 0.2.x JSON-decodes every event and would fail
#: on it.
_LLAMA_STACK_PREFIX = "/v1/openai/"
_COMPLETION_ROUTES = {
    "/v1/chat/completions": "/v1/chat/completions",
    "/v1/completions": "/v1/completions",
    "/v1/openai/v1/chat/completions": "/v1/chat/completions",
    "/v1/openai/v1/completions": "/v1/completions",
}
_MODEL_ROUTES = ("/v1/models", "/v1/openai/v1/models")
_MAX_KEY_LEN = 256
_HEARTBEAT = b": keep-alive\n\n"
_SSE_END = {"type": "http.response.body", "body": b"", "more_body": False}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    410: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}
_ANONYMOUS = "anonymous"


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


class _Subscriber:
    __slots__ = ("gen", "gone")

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.gone = False


def _frame(batch: list[bytes], start: int, multiline: bool) -> bytes:
    """SSE frames with ids ``start, start+1, ...`` for the payloads of ``batch``."""
    if not multiline:
        if len(batch) == 1:  # the usual case: the subscriber keeps up, one event per wake
            return b"id: %d\ndata: %s\n\n" % (start, batch[0])
        return b"".join([b"id: %d\ndata: %s\n\n" % (i, p) for i, p in enumerate(batch, start)])
    out = []
    for i, p in enumerate(batch, start):
        lines = p.split(b"\n")
        out.append(b"id: %d\n" % i + b"".join([b"data: " + line + b"\n" for line in lines]) + b"\n")
    return b"".join(out)


def _tenant_id(api_key: str) -> str:
    # Tenants are known by a digest of their key so that no key is ever held in a log line,
    # a metric or a stats dump.
    return "t-" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


class Gateway:
    """The streamsafe gateway as an ASGI app.

    >>> gw = Gateway(GatewayConfig(upstream="http://127.0.0.1:8001"))
    >>> ServerThread(gw).start()  # or uvicorn, or `streamsafe serve`

    ASGI lifespan opens and closes the upstream connection pool and stops every generation on
    shutdown. :meth:`stats` may be called from any thread.
    """

    def __init__(self, config: GatewayConfig | None = None, *, store: Store | None = None) -> None:
        self.config = config = config or GatewayConfig()
        if config.upstream is None:
            raise ValueError("GatewayConfig.upstream is required (streamsafe serve starts one)")
        keys = config.api_keys or tuple(
            k for k in os.environ.get("STREAMSAFE_API_KEYS", "").split(",") if k.strip()
        )
        self._tenants = {
            hashlib.sha256(k.strip().encode()).digest(): _tenant_id(k.strip()) for k in keys
        }
        self.upstream = Upstream(
            config.upstream,
            connect_timeout=config.connect_timeout,
            connect_retries=config.connect_retries,
            connect_backoff=config.connect_backoff,
            probe_interval=config.probe_interval,
            max_keepalive=config.max_keepalive,
            api_key=config.upstream_api_key,
        )
        self.admission = Admission(
            max_inflight=config.max_inflight,
            max_memory_tokens=config.max_memory_tokens,
            queue_size=config.queue_size,
            queue_timeout=config.queue_timeout,
        )
        self.registry = Registry(config, store or MemoryStore(), self.admission, self.upstream)
        self.metrics = Metrics(self)
        self._commit_wait = min(config.heartbeat, 1.0) if config.heartbeat > 0 else 1.0
        self._started = time.monotonic()

    # -- observability --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and gauges (the ``/stats`` document). Reads plain ints only, so it is safe to
        call from another thread."""
        c = self.registry.counters
        return {
            "requests_received": c.requests_received,
            "retries_seen": c.retries_seen,
            "attached": c.attached,
            "replayed": c.replayed,
            "resumed": c.resumed,
            "generations_started": c.generations_started,
            "generations_completed": c.generations_completed,
            "generations_failed": c.generations_failed,
            "generations_aborted": c.generations_aborted,
            "shed": c.shed,
            "breaker_rejections": c.breaker_rejections,
            "key_conflicts": c.key_conflicts,
            "evicted": c.evicted,
            "events_relayed": c.events_relayed,
            "continued": c.continued,
            "live_generations": self.registry.live_generations,
            "kept_generations": max(
                0, self.registry.generation_count - self.registry.live_generations
            ),
            "queued": self.admission.queued,
            "inflight": self.admission.inflight,
            "memory_tokens": self.admission.memory,
            "subscribers": self.registry.subscribers,
            "kept_bytes": self.registry.kept_bytes,
            "breaker_open": self.upstream.breaker.is_open,
            "breaker_trips": self.upstream.breaker.trips,
            "upstream_connect_retries": self.upstream.connect_retries_done,
            "errors": {str(k): v for k, v in list(c.errors.items())},
            "uptime_s": round(time.monotonic() - self._started, 3),
        }

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        """Open the upstream connection pool (called by ASGI lifespan)."""
        await self.upstream.start()

    async def shutdown(self) -> None:
        """Stop every generation and close upstream connections (ASGI lifespan)."""
        await self.registry.close()
        await self.upstream.close()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            upstream_path = _COMPLETION_ROUTES.get(path)
            if upstream_path is not None:
                if method != "POST":
                    raise _BadRequest(405, f"{path} accepts POST only")
                llama_stack = path.startswith(_LLAMA_STACK_PREFIX)
                await self._completion(scope, receive, send, upstream_path, llama_stack)
            elif path in _MODEL_ROUTES:
                if method != "GET":
                    raise _BadRequest(405, f"{path} accepts GET only")
                self._tenant(scope)
                await self._models(send)
            elif path == "/health":
                await self._health(send)
            elif path == "/metrics":
                body, content_type = self.metrics.render()
                await _respond(send, 200, body, content_type=content_type)
            elif path == "/stats":
                await _respond(send, 200, orjson.dumps(self.stats()))
            else:
                raise _BadRequest(404, f"no route {method} {path}")
        except _BadRequest as exc:
            self._count_error(exc.status)
            type_ = _ERROR_TYPES.get(exc.status, "invalid_request_error")
            headers = [(b"www-authenticate", b"Bearer")] if exc.status == 401 else []
            body = error_body(exc.message, type_, exc.status, exc.param)
            await _respond(send, exc.status, body, headers=headers)

    def _count_error(self, status: int) -> None:
        errors = self.registry.counters.errors
        errors[status] = errors.get(status, 0) + 1

    def _tenant(self, scope: Scope) -> str:
        if not self._tenants:
            return _ANONYMOUS
        auth = _header(scope, b"authorization")
        if auth is not None:
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() == b"bearer" and token:
                tenant = self._tenants.get(hashlib.sha256(token.strip()).digest())
                if tenant is not None:
                    return tenant
            raise _BadRequest(401, "invalid API key")
        raise _BadRequest(401, "missing API key: send Authorization: Bearer <key>")

    async def _health(self, send: Send) -> None:
        if self.upstream.breaker.is_open:
            body = error_body("engine is down", "service_unavailable", 503)
            ra = str(self.upstream.breaker.retry_after()).encode()
            await _respond(send, 503, body, headers=[(b"retry-after", ra)])
        else:
            await _respond(send, 200, b'{"status":"ok"}')

    async def _models(self, send: Send) -> None:
        try:
            response = await self.upstream.open("GET", "/v1/models")
            try:
                body = await response.aread()
            finally:
                await response.aclose()
        except Exception as exc:
            msg = f"upstream unreachable: {type(exc).__name__}"
            raise _BadRequest(503, msg) from None
        await _respond(send, response.status_code, body)

    # -- completions ----------------------------------------------------------------------------

    async def _completion(
        self, scope: Scope, receive: Receive, send: Send, upstream_path: str, llama_stack: bool
    ) -> None:
        counters = self.registry.counters
        counters.requests_received += 1
        tenant = self._tenant(scope)
        raw = await self._read_body(scope, receive)
        body = _parse_body(raw, upstream_path)
        retry = _retry_count(scope) >= 1
        if retry:
            counters.retries_seen += 1
        key = _header(scope, b"idempotency-key")
        if key is not None and (not key or len(key) > _MAX_KEY_LEN):
            raise _BadRequest(400, f"Idempotency-Key must be 1 to {_MAX_KEY_LEN} bytes")
        last_id = _last_event_id(scope)
        stream = body.get("stream") is True
        fingerprint = hashlib.blake2b(
            upstream_path.encode() + b"\0" + orjson.dumps(body, option=orjson.OPT_SORT_KEYS),
            digest_size=16,
        ).digest()
        req = GenerationRequest(
            tenant=tenant,
            path=upstream_path,
            body=raw,
            fingerprint=fingerprint,
            cost=request_cost(body, self.config.default_max_tokens),
            stream=stream,
            idempotency_key=key.decode("utf-8", "replace") if key is not None else None,
            retry=retry,
            last_event_id=last_id,
            no_upstream_retry=_header(scope, b"x-llamastack-streaming") == b"true",
        )
        try:
            gen, start = await self.registry.open(req)
        except KeyReused:
            raise _BadRequest(
                422, "Idempotency-Key was already used with a different request body"
            ) from None
        except LiveDuplicate:
            raise _BadRequest(409, "a request with this Idempotency-Key is in progress") from None
        except NotResumable:
            raise _BadRequest(
                410, "the stream to resume is no longer held by the gateway"
            ) from None
        sub = _Subscriber(gen)
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, sub))
        try:
            if stream:
                await self._serve_stream(sub, start, send, llama_stack)
            else:
                await self._serve_json(sub, send)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.registry.leave(gen)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise _BadRequest(400, "invalid Content-Length") from None
            if size > limit:
                raise _BadRequest(413, f"request body is {size} bytes; the limit is {limit}")
        parts: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _BadRequest(400, "client disconnected before the body was complete")
            chunk = message.get("body", b"")
            if chunk:
                total += len(chunk)
                if total > limit:
                    raise _BadRequest(413, f"request body is over the limit of {limit} bytes")
                parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _serve_json(self, sub: _Subscriber, send: Send) -> None:
        gen = sub.gen
        while not sub.gone:
            if gen.finished:
                if gen.failure is not None:
                    await _send_failure(send, gen.failure)
                elif gen.state == DONE_STATE:
                    (body,) = await gen.log.read(0)
                    await _respond(
                        send, 200, body, headers=[(b"x-streamsafe-generation", gen.id.encode())]
                    )
                else:
                    msg = error_body("the generation was aborted", "upstream_error", 502)
                    await _respond(send, 502, msg)
                return
            await gen.next_change()

    async def _serve_stream(
        self, sub: _Subscriber, start: int, send: Send, drop_done: bool
    ) -> None:
        gen = sub.gen
        early = self.config.commit == "early"
        heartbeat = self.config.heartbeat
        committed = False
        cursor = start
        flowing = start > 0  # heartbeats only until events flow
        next_beat = 0.0
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            (b"x-stream-resumable", b"true" if self.config.keep_finished > 0 else b"false"),
            (b"x-streamsafe-generation", gen.id.encode()),
        ]
        start_msg = {"type": "http.response.start", "status": 200, "headers": headers}
        log_ = gen.log
        # An in-process log is read without a coroutine per chunk.
        read_now = log_.read_nowait if isinstance(log_, MemoryEventLog) else None
        while not sub.gone:
            version = gen.version
            if cursor < gen.length:
                batch = read_now(cursor) if read_now is not None else await log_.read(cursor)
                if not committed:
                    await send(start_msg)
                    committed = True
                n = len(batch)
                if drop_done and batch[-1] == DONE:
                    batch.pop()
                body = _frame(batch, cursor, gen.multiline)
                cursor += n
                flowing = True
                await send({"type": "http.response.body", "body": body, "more_body": True})
                continue
            if gen.finished:
                failure = gen.failure
                if not committed:
                    if failure is not None:
                        await _send_failure(send, failure)
                        return
                    await send(start_msg)
                if failure is not None:  # committed early, then upstream refused: vLLM's way
                    tail = b"data: " + failure.as_event() + b"\n\n"
                    if not drop_done:
                        tail += DONE_EVENT
                    await send({"type": "http.response.body", "body": tail, "more_body": False})
                else:
                    await send(_SSE_END)
                return
            now = time.monotonic()
            timeout: float | None = None
            if not committed:
                if early and gen.live:
                    # Queued or running: commit once the engine accepted the request, or after
                    # a short wait, so heartbeats cover the queue and the first token alike (a
                    # slow but healthy request must never trip a client's read timeout).
                    since = gen.admitted_at if gen.admitted_at is not None else gen.created_at
                    deadline = since + self._commit_wait
                    if gen.upstream_status == 200 or now >= deadline:
                        await send(start_msg)
                        committed = True
                        next_beat = now + heartbeat
                        continue
                    timeout = deadline - now
            elif not flowing and heartbeat > 0:
                if now >= next_beat:
                    await send(
                        {"type": "http.response.body", "body": _HEARTBEAT, "more_body": True}
                    )
                    next_beat = now + heartbeat
                timeout = next_beat - now
            if gen.version != version:  # changed while a heartbeat or the headers went out
                continue
            waiter = gen.next_change()
            if timeout is None:
                await waiter
            else:
                try:
                    async with asyncio.timeout(max(0.0, timeout)):
                        await waiter
                except TimeoutError:
                    gen.forget_waiter(waiter)


async def _watch_disconnect(receive: Receive, sub: _Subscriber) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            sub.gone = True
            sub.gen.wake()
            return


async def _send_failure(send: Send, failure: Failure) -> None:
    headers = []
    if failure.retry_after is not None:
        headers.append((b"retry-after", str(failure.retry_after).encode()))
    await _respond(send, failure.status, failure.body, headers=headers)


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    all_headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if headers:
        all_headers.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _retry_count(scope: Scope) -> int:
    best = 0
    for key, value in scope["headers"]:
        if key == b"x-retry-count" or key == b"x-stainless-retry-count":
            with contextlib.suppress(ValueError):
                best = max(best, int(value))
    return best


def _last_event_id(scope: Scope) -> int | None:
    value = _header(scope, b"last-event-id")
    if value is None or not value.strip():
        return None
    try:
        n = int(value)
    except ValueError:
        raise _BadRequest(400, "Last-Event-ID must be an event id this gateway sent") from None
    if n < -1:
        raise _BadRequest(400, "Last-Event-ID must be >= -1")
    return n


def _parse_body(raw: bytes, upstream_path: str) -> dict[str, Any]:
    if not raw:
        raise _BadRequest(400, "request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _BadRequest(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _BadRequest(400, "missing required field 'model'", "model")
    if upstream_path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest(
                400, "missing required field 'messages' (a non-empty list)", "messages"
            )
        if not all(isinstance(m, dict) and "role" in m for m in messages):
            raise _BadRequest(400, "each message must be an object with a 'role'", "messages")
    elif not isinstance(body.get("prompt"), str | list):
        raise _BadRequest(400, "missing required field 'prompt'", "prompt")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise _BadRequest(400, "'stream' must be a boolean", "stream")
    return body
