"""The gateway as a plain ASGI app: its parts (built by :mod:`streamsafe.gateway.assembly`)
put together, its readings, and routing.

A request for a completion becomes a subscription to a generation
(:mod:`streamsafe.gateway.serving.completions`): :mod:`streamsafe.gateway.serving.requests`
reads it, :class:`~streamsafe.gateway.registry.Registry` finds or starts its generation, and
:mod:`streamsafe.gateway.serving.subscriber` writes the generation to the client. Tenants are
:mod:`streamsafe.gateway.serving.api_keys`'s, ``/ready`` and the model list
:mod:`streamsafe.gateway.serving.engine_routes`'s, the drain's wait
:mod:`streamsafe.gateway.serving.drain`'s. Behind vLLM every other route is handled as the route
table (:mod:`streamsafe.gateway.upstream.routes`) says, by
:mod:`streamsafe.gateway.serving.engine_calls`; behind a kind with pass-through, every other route
is passed through; behind any kind, an engine's operator routes need the admin key.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable
from typing import Any

import orjson

from streamsafe.gateway.assembly import build_admission, build_engines, build_fleet
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.errors import (
    BadRequest,
    send_bad_request,
    send_internal_error,
    shutting_down,
)
from streamsafe.gateway.generations.fleet import Fleet
from streamsafe.gateway.generations.generation import State
from streamsafe.gateway.generations.store import MemoryStore
from streamsafe.gateway.metrics.counters import Readings, stats_document
from streamsafe.gateway.metrics.exposition import CONTENT_TYPE, EngineReading, Metrics
from streamsafe.gateway.metrics.histograms import Histograms
from streamsafe.gateway.metrics.route_metrics import RouteMetrics
from streamsafe.gateway.registry import Registry
from streamsafe.gateway.serving.access import (
    Access,
    access_log,
    completion_tokens,
    prompt_tokens,
    write_access,
)
from streamsafe.gateway.serving.api_keys import ANONYMOUS, ApiKeys
from streamsafe.gateway.serving.completions import Completions
from streamsafe.gateway.serving.drain import let_finish
from streamsafe.gateway.serving.engine_calls import EngineCalls
from streamsafe.gateway.serving.engine_routes import answer_models, answer_ready
from streamsafe.gateway.serving.messages_errors import MESSAGES_PATHS, anthropic_errors
from streamsafe.gateway.serving.passthrough import shared_route
from streamsafe.gateway.serving.paths import canonical_path
from streamsafe.gateway.tracing import Tracing
from streamsafe.gateway.upstream.breaker import BreakerState
from streamsafe.gateway.upstream.routes import Handling, find_route, operator_route, route_label
from streamsafe.gateway.upstream.wire import Wire
from streamsafe.server.asgi import Receive, Scope, Send, respond, serve_lifespan

__all__ = ["Gateway"]

log = logging.getLogger("streamsafe.gateway")

_NOT_PASSED = (
    "this route is not passed through for tenants: under the gateway's one upstream identity "
    "what it holds would be shared between them (tenant_passthrough, --tenant-passthrough)"
)


class Gateway:
    """The streamsafe gateway as an ASGI app.

    >>> gw = Gateway(GatewayConfig(upstream="http://127.0.0.1:8001"))
    >>> ServerThread(gw).start()  # or uvicorn, or `streamsafe serve`

    ``store`` holds key ownership and event logs (default: a :class:`MemoryStore` for this
    process, a fleet of one; with ``config.redis_url`` and no ``store``, Redis shared with the
    other replicas). ASGI lifespan opens and closes the upstream connection pool and stops every
    generation on shutdown. :meth:`stats` may be called from any thread.
    """

    def __init__(
        self, config: GatewayConfig | None = None, *, store: MemoryStore | None = None
    ) -> None:
        self.config = config = config or GatewayConfig()
        self._api_keys = ApiKeys(config)
        # One upstream is a pool of one engine: the same picks, failover, breaker and reader.
        self.engines = build_engines(config)
        #: The first engine's connections: its kind is the gateway's (see Engines.first).
        self.upstream = self.engines.first.upstream
        self.admission = build_admission(config)
        #: The replicas this process is one of: the Redis fleet, or itself alone.
        self.fleet: Fleet = build_fleet(config, store)
        self.registry = Registry(config, self.fleet, self.admission, self.engines)
        self.tracing = Tracing(config.tracing)
        self.histograms = Histograms()
        self.metrics = Metrics(
            self.stats,
            self.histograms,
            self.engine_readings,
            RouteMetrics(self.engines.pool.models()),
        )
        self._completions = Completions(
            config, self.registry, self.admission, self.tracing, self._api_keys
        )
        self._calls = EngineCalls(config, self.engines, self.admission, self._api_keys)
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
        engines, fleet = self.engines, self.fleet
        rc = fleet.counters
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
            upstream_connect_retries=sum(e.upstream.connect_retries_done for e in engines.shells),
            engine_failovers=engines.failovers,
            engine_migrations=engines.migrations,
            generations_mirrored=rc.mirrored,
            generations_taken_over=rc.taken_over,
            leases_lost=rc.leases_lost,
            redis_errors=rc.redis_errors,
            redis_degraded=fleet.degraded,
            fleet_replicas=fleet.fleet_replicas,
            redis_used_memory_bytes=fleet.redis_used_memory,
        )
        doc = stats_document(registry.counters, readings, time.monotonic() - self._started)
        doc["upstream_kind"] = upstream.kind.name if upstream.kind_known else None
        doc["refusals_answered"] = registry.refusals.answered
        doc["engines"] = engines.stats()
        # What one call may cost the engines at most, as every generation's plan bounds it.
        doc["asks_bound"] = engines.bounds.most_asks
        doc["asks_bound_made_of"] = engines.bounds.describe()
        # Which process answered: with --workers N, each worker has its own figures.
        doc["pid"] = os.getpid()
        return doc

    def engine_readings(self) -> list[EngineReading]:
        """Per-engine figures for ``/metrics`` (label ``engine``): each engine of the pool, or
        the one upstream (a pool of one)."""
        return [
            EngineReading(
                engine=e.spec.url,
                requests=e.upstream.requests,
                failures=e.upstream.failures,
                breaker_state=_BREAKER_STATES[e.breaker.state],
                breaker_trips=e.breaker.trips,
                memory_tokens=e.load.memory,
            )
            for e in self.engines.shells
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
        self.fleet.start()

    async def shutdown(self) -> None:
        """Stop every generation and close upstream connections (ASGI lifespan)."""
        await self.registry.close()
        self._completions.close()
        await self.engines.close()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        access = Access(scope, time.monotonic())
        if self.tracing.enabled:
            access.span = self.tracing.request(scope, access.method, access.path)
        reply = access.sender(send)
        if scope["path"].startswith(MESSAGES_PATHS[0]):  # Anthropic's API: its error shape
            reply = anthropic_errors(reply)
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
        self._observe_route(access, now)
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
                generated = gen.request.route.wire is not Wire.OPENAI_POOLING
                if tokens is not None and gen.state is State.DONE and generated:
                    h.completion_tokens.observe(tokens)
        logged = access_log.isEnabledFor(access.level)
        if logged or access.span is not None:
            fields = access.fields(now)
            if logged:
                write_access(access, fields)
            self.tracing.end_request(access.span, fields)

    def _observe_route(self, access: Access, now: float) -> None:
        """The request's per-route series: its labels resolved once, here, at its end."""
        gen = access.gen
        per_token = None
        tokens: tuple[int | None, int | None] = (None, None)
        if gen is not None and access.joined == "new" and gen.state is State.DONE:
            completion = completion_tokens(gen)
            tokens = (prompt_tokens(gen), completion)
            first = gen.first_event_at
            if access.stream and completion is not None and completion > 1 and first is not None:
                per_token = max(0.0, now - first) / (completion - 1)
        self.metrics.routes.observe(
            route_label(access.path),
            access.model,
            access.status,
            now - access.started,
            per_token,
            tokens,
        )

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
            await answer_ready(send, self.engines, self.draining, self.fleet.trouble)
        elif path == "/metrics":
            _allow(method, path, "GET")
            self._api_keys.check_admin(scope)
            await respond(send, 200, self.metrics.render(), content_type=CONTENT_TYPE)
        elif path == "/stats":
            _allow(method, path, "GET")
            self._api_keys.check_admin(scope)
            await respond(send, 200, orjson.dumps(self.stats()))
        else:
            kind = await self.upstream.resolve_kind()
            route = kind.route(path)
            if route is not None and (method == "POST" or not kind.passthrough):
                _allow(method, path, "POST")
                await self._completions.serve(scope, receive, send, route, access)
            elif operator_route(path):
                self._api_keys.check_operator(scope)
                access.tenant = "operator"
                await self._passing_through(self._calls.serve_operator(scope, receive, send))
            elif kind.passthrough:
                await self._pass_through(scope, receive, send, access, method, path)
            else:
                await self._engine_route(scope, receive, send, access, method, path)

    async def _engine_route(
        self, scope: Scope, receive: Receive, send: Send, access: Access, method: str, path: str
    ) -> None:
        """A route of an upstream with no pass-through (vLLM), as the route table says: every
        vLLM route, each with its own guarantees (see upstream/routes.py)."""
        entry = find_route(path)
        if entry is None:
            raise BadRequest(404, f"no route {method} {path}")
        if method not in entry.methods:
            allow = ", ".join(entry.methods).encode()
            msg = f"{path} accepts {' or '.join(entry.methods)} only"
            raise BadRequest(405, msg, headers=[(b"allow", allow)])
        handling = entry.handling
        access.tenant = tenant = self._api_keys.tenant(scope)
        if handling is Handling.GATEWAY:  # the model list; the others are answered above
            await answer_models(send, self.engines)
            return
        if await self._completions.answer_held_response(
            scope, receive, send, access, tenant, method, path
        ):
            return
        if self.draining:
            raise shutting_down()
        if handling is Handling.ADMITTED:
            await self._passing_through(self._calls.serve(scope, receive, send, entry, access))
            return
        if entry.tenant_state:
            self._api_keys.check_tenant_state(tenant)
        await self._passing_through(self._calls.serve_engine_route(scope, receive, send, entry))

    async def _passing_through(self, work: Awaitable[None]) -> None:
        """Run ``work``, a request passed to an engine, counted (a drain waits for it)."""
        self.registry.counters.passed_through += 1
        self._passing += 1
        try:
            await work
        finally:
            self._passing -= 1

    async def _pass_through(
        self, scope: Scope, receive: Receive, send: Send, access: Access, method: str, path: str
    ) -> None:
        """Every other route, and GET on the completion paths (Llama Stack lists and reads
        stored completions there), goes to an engine unchanged (of the model its body names,
        else a live one); except a Responses stream asked again that the gateway holds (see
        responses.py)."""
        access.tenant = tenant = self._api_keys.tenant(scope)
        if await self._completions.answer_held_response(
            scope, receive, send, access, tenant, method, path
        ):
            return
        if (
            tenant != ANONYMOUS
            and self.config.tenant_passthrough == "refuse"
            and not self.config.forward_authorization
            and not shared_route(method, path)
        ):
            raise BadRequest(403, _NOT_PASSED)
        if self.draining:
            raise shutting_down()
        await self._passing_through(self._calls.serve_passed_through(scope, receive, send))

    # -- shutdown ----------------------------------------------------------------------------------

    def _busy(self) -> int:
        """What a drain waits for: clients connected here (readers, pass-through) and, where
        the fleet does not hand over (a process alone), the generations still running (a
        generation can only end here). Where it does, a generation nobody here reads is
        handed over at once: another replica continues it from its log, and its readers,
        elsewhere, never notice."""
        registry = self.registry
        busy = registry.subscribers + self._passing
        return busy if self.fleet.hands_over else busy + registry.live_generations

    async def drain(self, limit: float) -> None:
        """Stop taking new work and let what runs finish, for at most ``limit`` seconds; then
        end the rest (see :meth:`Registry.end_live`). New completions and pass-through
        requests get 503 with ``Retry-After`` meanwhile, ``/ready`` 503, ``/health`` 200; a
        retry, resume or replay of a generation held here is still served. Called by the
        server on SIGTERM or Ctrl-C (:func:`streamsafe.server.run_server`), before it stops
        listening."""
        self.draining = True
        self.registry.draining = True
        await let_finish(self.registry, self._busy, limit, hand_over=self.fleet.hands_over)


_BREAKER_STATES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


def _allow(method: str, path: str, allowed: str) -> None:
    # HEAD is GET without the body (the server drops it): load balancers probe with it.
    if method != allowed and not (method == "HEAD" and allowed == "GET"):
        allow = b"GET, HEAD" if allowed == "GET" else allowed.encode()
        raise BadRequest(405, f"{path} accepts {allowed} only", headers=[(b"allow", allow)])
