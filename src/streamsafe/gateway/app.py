"""The gateway as a plain ASGI app: routing and tenants.

A request for a completion becomes a subscription to a generation:
:mod:`streamsafe.gateway.serving.requests` reads it, :class:`~streamsafe.gateway.registry.Registry`
finds or starts its generation, and :mod:`streamsafe.gateway.serving.subscriber` writes the
generation to the client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import time
from typing import Any

import orjson

from streamsafe._asgi import (
    Receive,
    Scope,
    Send,
    body_writer,
    header,
    reset_connection,
    respond,
    serve_lifespan,
)
from streamsafe.gateway.admission.admission import Admission, Shed
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.pool import parse_engine, parse_fallback
from streamsafe.gateway.errors import (
    BadRequest,
    Draining,
    KeyReused,
    LiveDuplicate,
    NotResumable,
    ResumePastEnd,
    error_body,
    send_bad_request,
    send_internal_error,
)
from streamsafe.gateway.generations.generation import State
from streamsafe.gateway.generations.refusals import EngineRefused
from streamsafe.gateway.generations.store import MemoryStore, Store
from streamsafe.gateway.metrics import (
    CONTENT_TYPE,
    EngineReading,
    Histograms,
    Metrics,
    Readings,
    stats_document,
)
from streamsafe.gateway.registry import Registry
from streamsafe.gateway.replicas.replicas import Replicas
from streamsafe.gateway.replicas.store_redis import RedisStore
from streamsafe.gateway.serving.access import Access, access_log, completion_tokens, write_access
from streamsafe.gateway.serving.body_work import BodyWorker
from streamsafe.gateway.serving.completion_id import own_completion_id
from streamsafe.gateway.serving.pacing import StreamRules
from streamsafe.gateway.serving.passthrough import pass_through, shared_route
from streamsafe.gateway.serving.paths import canonical_path
from streamsafe.gateway.serving.requests import (
    client_read_timeout,
    completion_request,
    last_attempt,
    read_request_body,
    tenant_id,
)
from streamsafe.gateway.serving.responses import (
    cancel_request,
    cancelled,
    find_response,
    resume_request,
    start_after,
)
from streamsafe.gateway.serving.stream_terms import StreamTerms
from streamsafe.gateway.serving.subscriber import Subscriber, serve_json, serve_stream
from streamsafe.gateway.tracing import Tracing
from streamsafe.gateway.upstream.breaker import BreakerState
from streamsafe.gateway.upstream.kinds import CompletionRoute

__all__ = ["Gateway"]

log = logging.getLogger("streamsafe.gateway")

#: Model lists the gateway answers itself for an upstream with no pass-through (vLLM): Llama
#: Stack 0.2's alias included, so llama-stack-client can list models through it.
_MODEL_ROUTES = ("/v1/models", "/v1/openai/v1/models")
_ANONYMOUS = "anonymous"
_NOT_PASSED = (
    "this route is not passed through for tenants: under the gateway's one upstream identity "
    "what it holds would be shared between them (tenant_passthrough, --tenant-passthrough)"
)


class Gateway:
    """The streamsafe gateway as an ASGI app.

    >>> gw = Gateway(GatewayConfig(upstream="http://127.0.0.1:8001"))
    >>> ServerThread(gw).start()  # or uvicorn, or `streamsafe serve`

    ``store`` holds key ownership and event logs (default: a :class:`MemoryStore` for this
    process). ASGI lifespan opens and closes the upstream connection pool and stops every
    generation on shutdown. :meth:`stats` may be called from any thread.
    """

    def __init__(self, config: GatewayConfig | None = None, *, store: Store | None = None) -> None:
        self.config = config = config or GatewayConfig()
        if config.upstream is None:
            raise ValueError("GatewayConfig.upstream is required (streamsafe serve starts one)")
        # Held by digest only: no API key stays in the gateway's memory as text.
        self._tenants = {
            hashlib.sha256(k.strip().encode()).digest(): tenant_id(k.strip().encode())
            for k in config.api_keys
        }
        admin = config.admin_key
        self._admin_digest = hashlib.sha256(admin.encode()).digest() if admin else None
        if self._tenants and self._admin_digest is None:
            log.warning("API keys are set but no admin key: /stats and /metrics are open")
        # One upstream is a pool of one engine: the same picks, failover, breaker and reader.
        specs = config.engines or (config.upstream,)
        self.engines = Engines(
            [parse_engine(text) for text in specs],
            fallbacks=dict(parse_fallback(text) for text in config.fallback_models),
            connect_timeout=config.connect_timeout,
            connect_retries=config.connect_retries,
            connect_backoff=config.connect_backoff,
            max_keepalive=config.max_keepalive,
            api_key=config.upstream_api_key,
            kind=config.upstream_kind,
            ca_bundle=config.upstream_ca_bundle,
            max_attempts=config.failover_attempts,
            probe_interval=config.probe_interval,
            queue_timeout=config.queue_timeout,
            answer_refusals=config.engine_refusals == "answer",
        )
        #: The first engine: the routes the gateway passes through, and the model list, go to it.
        self.upstream = self.engines.first
        self.admission = Admission(
            max_inflight=config.max_inflight,
            max_memory_tokens=config.max_memory_tokens,
            queue_size=config.queue_size,
            queue_timeout=config.queue_timeout,
            weights={tenant_id(k.strip().encode()): w for k, w in config.tenant_weights},
        )
        replicas = None
        if store is None and config.redis_url is not None:
            redis_store = RedisStore(config.redis_url, secret=config.redis_secret)
            if config.redis_secret is None:
                log.warning(
                    "no Redis secret: prompts are kept in Redis in clear and provider data not at "
                    "all (another replica cannot continue a generation that carried it); give "
                    "every replica the same --redis-secret to seal both"
                )
            replicas = Replicas(
                redis_store,
                lease=config.lease,
                keep_finished=config.keep_finished,
                orphan_ttl=config.orphan_ttl,
            )
            store = redis_store
        self.replicas = replicas
        self.registry = Registry(
            config,
            store or MemoryStore(),
            self.admission,
            self.engines,
            replicas=replicas,
        )
        self.tracing = Tracing(config.tracing)
        self.histograms = Histograms()
        self.metrics = Metrics(self.stats, self.histograms, self.engine_readings)
        self._rules = StreamRules.from_config(config)
        self._bodies = BodyWorker()  # large bodies are read off the event loop
        self._started = time.monotonic()
        #: Shutting down (see :meth:`drain`): no new work, ``/ready`` answers 503.
        self.draining = False
        #: Requests passed through now (a drain waits for them).
        self._passing = 0

    # -- observability --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and gauges (the ``/stats`` document). Reads plain ints only, so it is safe to
        call from another thread."""
        registry, admission, upstream = self.registry, self.admission, self.upstream
        engines = self.engines
        readings = Readings(
            live_generations=registry.live_generations,
            kept_generations=len(registry.kept),
            queued=admission.queued,
            inflight=admission.inflight,
            memory_tokens=admission.memory,
            subscribers=registry.subscribers,
            kept_bytes=registry.kept.bytes,
            breaker_open=engines.open_breakers(),
            breaker_trips=engines.trips,
            upstream_connect_retries=sum(u.connect_retries_done for u in engines.upstreams),
            engine_failovers=engines.failovers,
            engine_migrations=engines.migrations,
        )
        replicas = self.replicas
        if replicas is not None:
            rc = replicas.counters
            readings = dataclasses.replace(
                readings,
                generations_mirrored=rc.mirrored,
                generations_taken_over=rc.taken_over,
                leases_lost=rc.leases_lost,
                redis_errors=rc.redis_errors,
                redis_degraded=replicas.degraded,
                fleet_replicas=replicas.fleet_replicas,
                redis_used_memory_bytes=replicas.redis_used_memory,
            )
        doc = stats_document(registry.counters, readings, time.monotonic() - self._started)
        doc["upstream_kind"] = upstream.kind.name if upstream.kind_known else None
        doc["refusals_answered"] = registry.refusals.answered
        doc["engines"] = engines.stats()
        return doc

    def engine_readings(self) -> list[EngineReading]:
        """Per-engine figures for ``/metrics`` (label ``engine``): each engine of the pool, or
        the one upstream (a pool of one)."""
        engines = self.engines
        return [
            EngineReading(
                engine=e.spec.url,
                requests=upstream.requests,
                failures=upstream.failures,
                breaker_state=_BREAKER_STATES[e.breaker.state],
                breaker_trips=e.breaker.trips,
                memory_tokens=e.load.memory,
            )
            for e, upstream in zip(engines.pool.engines, engines.upstreams, strict=True)
        ]

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await serve_lifespan(receive, send, self.startup, self.shutdown)

    async def startup(self) -> None:
        """Open the upstream connection pool (called by ASGI lifespan)."""
        await self.engines.start()
        if self.replicas is not None:
            self.replicas.start()

    async def shutdown(self) -> None:
        """Stop every generation and close upstream connections (ASGI lifespan)."""
        await self.registry.close()
        self._bodies.close()
        await self.engines.close()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        access = Access(scope, time.monotonic())
        if self.tracing.enabled:
            access.span = self.tracing.request(scope, access.method, access.path)
        reply = access.sender(send)
        try:
            await self._route(scope, receive, reply, access)
        except BadRequest as exc:
            self.registry.counters.count_error(exc.status)
            await send_bad_request(reply, exc)
        except Exception:
            # A bug: the client gets a JSON 500 naming a request id; the log has the rest.
            request_id = access.request_id
            log.exception(
                "%s: unexpected error in %s %s", request_id, scope["method"], scope["path"]
            )
            self.registry.counters.count_error(500)
            access.status = 500
            await send_internal_error(send, request_id)
        finally:
            self._ended(access)

    def _ended(self, access: Access) -> None:
        """A request ended: its access line, and the histograms it feeds."""
        now = time.monotonic()
        gen = access.gen
        if access.completion and gen is not None and access.status is not None:
            h = self.histograms
            h.request_duration_seconds.observe(now - access.started)
            if access.stream and access.joined in ("new", "attached"):
                ttft = access.ttft_ms()
                if ttft is not None:
                    h.time_to_first_token_seconds.observe(ttft / 1000)
            if access.joined == "new":
                if gen.admitted_at is not None:
                    h.admission_wait_seconds.observe(max(0.0, gen.admitted_at - gen.created_at))
                tokens = completion_tokens(gen)
                if tokens is not None and gen.state is State.DONE:
                    h.completion_tokens.observe(tokens)
        logged = access_log.isEnabledFor(access.level)
        if logged or access.span is not None:
            fields = access.fields(now, None)
            if logged:
                write_access(access, fields)
            self.tracing.end_request(access.span, fields)

    async def _route(self, scope: Scope, receive: Receive, send: Send, access: Access) -> None:
        # One spelling for routing and forwarding (see paths.py): no other reaches an
        # upstream's completion route around admission, nor leaves the upstream's prefix.
        path, scope["raw_path"] = canonical_path(scope)
        scope["path"] = access.path = path
        method: str = scope["method"]
        if path == "/health":
            _allow(method, path, "GET")
            body = b'{"status":"draining"}' if self.draining else b'{"status":"ok"}'
            await respond(send, 200, body)
        elif path == "/ready":
            _allow(method, path, "GET")
            await self._ready(send)
        elif path == "/metrics":
            _allow(method, path, "GET")
            self._admin(scope)
            await respond(send, 200, self.metrics.render(), content_type=CONTENT_TYPE)
        elif path == "/stats":
            _allow(method, path, "GET")
            self._admin(scope)
            await respond(send, 200, orjson.dumps(self.stats()))
        else:
            kind = await self.upstream.resolve_kind()
            route = kind.route(path)
            if route is not None and (method == "POST" or not kind.passthrough):
                _allow(method, path, "POST")
                await self._completion(scope, receive, send, route, access)
            elif kind.passthrough:
                # Every other route, and GET on the completion paths (Llama Stack lists and
                # reads stored completions there), goes to the upstream unchanged; except a
                # Responses stream asked again that the gateway holds (see responses.py).
                access.tenant = tenant = self._tenant(scope)
                again = resume_request(method, path, scope["query_string"])
                if again is not None and await self._resume_response(
                    scope, receive, send, access, tenant, *again
                ):
                    return
                cancel = cancel_request(method, path)
                if cancel is not None and await self._cancel_response(send, tenant, cancel):
                    return
                if (
                    tenant != _ANONYMOUS
                    and self.config.tenant_passthrough == "refuse"
                    and not self.config.forward_authorization
                    and not shared_route(method, path)
                ):
                    raise BadRequest(403, _NOT_PASSED)
                if self.draining:
                    raise _draining()
                self.registry.counters.passed_through += 1
                self._passing += 1
                try:
                    await pass_through(
                        self.upstream.client,
                        scope,
                        receive,
                        send,
                        keep_authorization=self.config.forward_authorization,
                    )
                finally:
                    self._passing -= 1
            elif path in _MODEL_ROUTES:
                _allow(method, path, "GET")
                access.tenant = self._tenant(scope)
                await self._models(send)
            else:
                raise BadRequest(404, f"no route {method} {path}")

    def _tenant(self, scope: Scope) -> str:
        if not self._tenants:
            if self.config.forward_authorization:
                # The upstream authenticates: each credential is its own tenant, known here by
                # its digest only (the credential itself goes upstream).
                auth = header(scope, b"authorization")
                return _ANONYMOUS if auth is None else tenant_id(auth.strip())
            return _ANONYMOUS
        auth = header(scope, b"authorization")
        if auth is not None:
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() == b"bearer" and token:
                tenant = self._tenants.get(hashlib.sha256(token.strip()).digest())
                if tenant is not None:
                    return tenant
            raise BadRequest(401, "invalid API key")
        raise BadRequest(401, "missing API key: send Authorization: Bearer <key>")

    def _admin(self, scope: Scope) -> None:
        if self._admin_digest is None:
            return
        auth = header(scope, b"authorization")
        if auth is None:
            raise BadRequest(401, "missing admin key: send Authorization: Bearer <admin key>")
        scheme, _, token = auth.partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        if scheme.lower() != b"bearer" or not hmac.compare_digest(digest, self._admin_digest):
            raise BadRequest(401, "invalid admin key")

    async def _ready(self, send: Send) -> None:
        """Readiness: 200 only while the gateway takes work and some engine can do it: not
        draining, and some engine not held down whose health route answered within the last
        probe interval or answers now. (``/health`` is liveness: 200 while the process serves
        at all, so a supervisor never restarts a gateway, and throws away its replay logs, for
        an engine's outage.)"""
        if self.draining:
            body = error_body("the gateway is draining", "service_unavailable", 503)
            await respond(send, 503, body, headers=[(b"retry-after", b"1")])
            return
        engines = self.engines
        if await engines.ready():
            await respond(send, 200, b'{"status":"ok"}')
            return
        down = ", ".join(u.base_url for u in engines.upstreams)
        body = error_body(
            f"no engine answers its health check ({down})", "service_unavailable", 503
        )
        ra = str(engines.retry_after()).encode()
        await respond(send, 503, body, headers=[(b"retry-after", ra)])

    # -- shutdown ----------------------------------------------------------------------------------

    def _busy(self) -> int:
        """What a drain waits for: clients connected here (readers, pass-through) and, without
        replicas, the generations still running (a generation can only end here). With
        replicas a generation nobody here reads is handed over at once: another replica
        continues it from its log, and its readers, elsewhere, never notice."""
        registry = self.registry
        busy = registry.subscribers + self._passing
        return busy if self.replicas is not None else busy + registry.live_generations

    async def drain(self, limit: float) -> None:
        """Stop taking new work and let what runs finish, for at most ``limit`` seconds; then
        end the rest (see :meth:`Registry.end_live`). New completions and pass-through
        requests get 503 with ``Retry-After`` meanwhile, ``/ready`` 503, ``/health`` 200; a
        retry, resume or replay of a generation held here is still served. Called by the
        server on SIGTERM or Ctrl-C (:func:`streamsafe.serving.run_server`), before it stops
        listening."""
        self.draining = True
        self.registry.draining = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        log.warning(
            "draining: no new work; waiting up to %g s for %d generation(s) and %d reader(s)",
            limit,
            self.registry.live_generations,
            self.registry.subscribers,
            extra={"fields": {"event": "drain_begun"}},
        )
        # Polled: what it waits for ends in many places (generations, readers, pass-through),
        # and 50 ms is nothing next to the seconds a drain takes.
        while self._busy() and loop.time() - started < limit:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        ended = 0
        timed_out = self._busy() > 0
        if self.registry.live_generations:
            how = "handed over" if self.replicas is not None else "ended with an error event"
            ended = await self.registry.end_live("the gateway is shutting down")
            log.log(
                logging.WARNING if timed_out else logging.INFO,
                "%s: %d generation(s) %s",
                "drain timeout" if timed_out else "nobody here reads the rest",
                ended,
                how,
                extra={
                    "fields": {
                        "event": "drain_timeout" if timed_out else "drain_handover",
                        "ended": ended,
                    }
                },
            )
            # Their readers get the end; give them a moment to write it.
            until = loop.time() + 2.0
            while self._busy() and loop.time() < until:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        log.info(
            "drained in %.1f s",
            loop.time() - started,
            extra={"fields": {"event": "drained", "ended": ended}},
        )

    async def _models(self, send: Send) -> None:
        listed = self.engines.pool.models()
        if listed:  # the pool's models, wherever they are served
            data = [{"id": m, "object": "model", "owned_by": "streamsafe"} for m in listed]
            body = orjson.dumps({"object": "list", "data": data})
            await respond(send, 200, _both_model_lists(body))
            return
        try:
            response = await self.upstream.open("GET", "/v1/models")
            try:
                body = await response.aread()
            finally:
                await response.aclose()
        except Exception as exc:
            msg = f"upstream unreachable: {type(exc).__name__}"
            raise BadRequest(503, msg) from None
        if response.status_code == 200:
            body = _both_model_lists(body)
        await respond(send, response.status_code, body)

    # -- completions ----------------------------------------------------------------------------

    async def _completion(
        self, scope: Scope, receive: Receive, send: Send, route: CompletionRoute, access: Access
    ) -> None:
        counters = self.registry.counters
        counters.requests_received += 1
        access.completion = True
        tenant = access.tenant = self._tenant(scope)
        raw = await read_request_body(scope, receive, self.config.max_body_bytes)
        req = await self._bodies.run(
            len(raw),
            completion_request,
            scope,
            raw,
            route,
            tenant,
            self.config.default_max_tokens,
            self.config.forward_authorization,
        )
        access.stream = req.stream
        if req.retry:
            counters.retries_seen += 1
        try:
            gen, start = await self.registry.open(req)
        except KeyReused:
            raise BadRequest(
                422, "Idempotency-Key was already used with a different request body"
            ) from None
        except LiveDuplicate:
            raise BadRequest(409, "a request with this Idempotency-Key is in progress") from None
        except NotResumable:
            raise BadRequest(410, "the stream to resume is no longer held by the gateway") from None
        except ResumePastEnd as exc:
            raise BadRequest(400, exc.message, param="Last-Event-ID") from None
        except Draining:
            raise _draining() from None
        except EngineRefused as exc:
            failure = exc.failure
            ra = (
                []
                if failure.retry_after is None
                else [(b"retry-after", b"%d" % failure.retry_after)]
            )
            await respond(send, failure.status, failure.body, headers=ra)
            return
        except Shed as exc:
            counters.shed += 1
            msg = f"gateway at capacity ({exc.reason}); retry after {exc.retry_after} s"
            ra = [(b"retry-after", str(exc.retry_after).encode())]
            raise BadRequest(429, msg, headers=ra) from None
        access.join(gen, gen.request is req, req.last_event_id is not None, gen.finished)
        if access.span is not None:
            if access.joined == "new":  # before its reader task first runs: its attempts see it
                gen.trace = self.tracing.generation(gen.id, access.span)
            else:
                self.tracing.link(access.span, gen.trace)
        sub = access.sub = Subscriber(gen, client_read_timeout(scope), last_attempt(scope))
        if gen.request is not req and not (
            req.idempotency_key or req.retry or req.last_event_id is not None
        ):
            # Joined only by being identical (collapse_identical): another caller's answer,
            # so a completion id of its own.
            sub.rename = own_completion_id()
        await self._serve(sub, start, route, req.stream, scope, receive, send)

    async def _resume_response(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        access: Access,
        tenant: str,
        response_id: str,
        after: int | None,
    ) -> bool:
        """Serve ``GET /v1/responses/{id}?stream=true&starting_after=N`` from the log of the
        stream held here; False where none is (the server answers instead)."""
        found = await find_response(self.registry.generations, tenant, response_id)
        if found is None:
            return False
        gen, payloads = found
        start = start_after(payloads, after)
        if start is None:
            msg = f"response {response_id} has no event numbered {after} (yet)"
            raise BadRequest(400, msg, param="starting_after")
        route = gen.request.route
        assert route is not None
        access.completion = access.stream = True
        start = self.registry.rejoin(gen, start)
        access.join(gen, False, True, gen.finished)
        sub = access.sub = Subscriber(gen, client_read_timeout(scope), last_attempt(scope))
        await self._serve(sub, start, route, True, scope, receive, send)
        return True

    async def _cancel_response(self, send: Send, tenant: str, response_id: str) -> bool:
        """``POST /v1/responses/{id}/cancel`` of a stream this process runs: end it for every
        subscriber and close its upstream request; False where none is (passed through)."""
        found = await find_response(self.registry.generations, tenant, response_id)
        if found is None or not found[0].live or found[0].task is None:
            return False
        why = error_body(f"response {response_id} was cancelled", "cancelled", 409)
        await self.registry.end(found[0], why, 409)
        await respond(send, 200, cancelled(response_id))
        return True

    async def _serve(
        self,
        sub: Subscriber,
        start: int,
        route: CompletionRoute,
        stream: bool,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Send ``sub`` its generation from offset ``start``, streamed or as one JSON answer;
        it leaves the generation when done."""
        gen = sub.gen
        sub.listen(scope, receive)
        try:
            if stream:
                # Where the gateway speaks Llama Stack's way (no [DONE]) for an upstream that
                # ends with it, a failed stream ends with a reset: llama-stack-client ignores
                # error events, so its caller sees a transport error instead of a short answer
                # that reads as complete. Behind Llama Stack itself, its own way (a masked error
                # event, then a clean end) is relayed as it came.
                reset = reset_connection(scope) if route.reset_on_failure else None
                terms = StreamTerms(
                    self._rules,
                    self.admission,
                    drop_done=not route.client_done,
                    reset_on_failure=reset,
                    preamble=route.preamble,
                    writer=body_writer(scope),
                )
                await serve_stream(sub, start, send, terms)
            else:
                await serve_json(sub, send, self._rules, self.admission)
        finally:
            await sub.unlisten()
            if sub.hold:  # told to come back: refused for now, by admission
                self.registry.counters.shed += 1
            self.registry.leave(gen, sub.hold)


def _both_model_lists(body: bytes) -> bytes:
    """An OpenAI model list that Llama Stack's clients read too: each model also carries the
    fields of Llama Stack's own (``identifier``, ``provider_resource_id``, ``provider_id``,
    ``model_type``, ``type``, ``metadata``), as llama-stack-client 0.2 lists models from the
    same ``/v1/models`` (it read every identifier as ``None``). A body that is no such list is
    left as it came."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return body
    for model in data:
        if isinstance(model, dict) and isinstance(model.get("id"), str):
            model.setdefault("identifier", model["id"])
            model.setdefault("provider_resource_id", model["id"])
            model.setdefault("provider_id", str(model.get("owned_by") or "streamsafe"))
            model.setdefault("model_type", "llm")
            model.setdefault("type", "model")
            model.setdefault("metadata", {})
    return orjson.dumps(doc)


_BREAKER_STATES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


def _draining() -> BadRequest:
    msg = "the gateway is shutting down; retry (another replica takes it)"
    return BadRequest(503, msg, headers=[(b"retry-after", b"1")])


def _allow(method: str, path: str, allowed: str) -> None:
    # HEAD is GET without the body (the server drops it): load balancers probe with it.
    if method != allowed and not (method == "HEAD" and allowed == "GET"):
        allow = b"GET, HEAD" if allowed == "GET" else allowed.encode()
        raise BadRequest(405, f"{path} accepts {allowed} only", headers=[(b"allow", allow)])
